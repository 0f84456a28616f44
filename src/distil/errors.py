"""Errors a user can cause. Each message says what was wrong, the value seen and how to fix it.

The CLI prints a `DistilError` as one paragraph and exits with code 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class DistilError(Exception):
    """Base class of every error caused by user input (config, data, tokenizers, extras)."""

    exit_code = 2
    label = "error"  # the CLI prints "distil: <label>: <message>"


class ConfigError(DistilError, ValueError):
    """A config value, key or combination of values is invalid.

    `problems` holds one line per problem so that all of them are shown together.
    """

    def __init__(self, problems: list[str] | str, header: str = "invalid config"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.header = header
        if len(self.problems) == 1:
            text = f"{header}: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"{header} ({len(self.problems)} problems):\n{lines}"
        super().__init__(text)


class DataError(DistilError, ValueError):
    """A data file or row is malformed. The message names the file and line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        self.path, self.line, self.message = path, line, message
        super().__init__(where + message)


class AlignmentError(DistilError, ValueError):
    """A teacher/student tokenizer pair (or a text) cannot be aligned; the message says why."""


class MissingExtraError(DistilError, ImportError):
    """An optional dependency is needed for the requested feature."""

    def __init__(self, package: str, extra: str, feature: str):
        super().__init__(
            f"{feature} needs the optional package '{package}', which is not installed. "
            f"Install it with: pip install 'distil[{extra}]' (or pip install {package})."
        )


def require(module: str, extra: str, feature: str):
    """Import an optional dependency lazily, or raise `MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module.split(".")[0], extra, feature) from exc
