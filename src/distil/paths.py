"""Local paths versus hub ids, and what makes a path unusable, checked before anything loads.

A model or data source that looks like a local path (`looks_local`) is never sent to the hub,
so a mistyped path is reported at once as "no such local file" instead of after the hub's
retries. `path_problem` catches what would make `exists()` itself raise (a NUL byte, a name
too long, `~user` of no user); `output_dir_problem` refuses an output directory that is a file
or sits under one, before any work is done.
"""

from __future__ import annotations

import os
from pathlib import Path


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".csv")


def looks_local(source: str) -> bool:
    """Whether a model or data source can only be a local path, not a hub id.

    Hub ids are `name` or `org/name`; a source that starts with '.', '/' or '~', ends in a data
    file suffix, has more than one '/', or whose first part is an existing local directory is
    a path, and a missing one is reported at once instead of after the hub's retries.
    """
    if source.startswith((".", "/", "~")) or "\\" in source or source.count("/") > 1:
        return True
    if source.lower().endswith(DATA_SUFFIXES):
        return True
    head, sep, _ = source.partition("/")
    return bool(sep) and Path(head).is_dir()


def path_problem(value: str | Path, key: str) -> str | None:
    """Why `value` cannot name a path here (a NUL byte, a name too long, no permission), or
    None. Checked first, so later `exists()`/`is_dir()` calls cannot raise."""
    text = str(value)
    if "\x00" in text:
        return f"{key} = {_short(text)!r} holds a NUL byte, which no path can. Fix: check the path"
    try:
        os.stat(os.path.expanduser(text))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        return f"{key} = {_short(text)!r}: {reason}. Fix: check the path"
    return None


def output_dir_problem(path: str | Path, key: str) -> str | None:
    """Why `path` cannot be (or become) a writable directory, or None.

    Checked before anything is loaded or written, so a bad output directory costs nothing.
    """
    if problem := path_problem(path, key):
        return problem
    path = Path(os.path.expanduser(path))
    if path.exists():
        if not path.is_dir():
            return f"{key} = '{path}' is a file, not a directory. Fix: choose another path"
        existing = path
    else:
        existing = path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            return (
                f"{key} = '{path}' sits under '{existing}', which is a file, not a directory. "
                "Fix: choose another path"
            )
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{key} = '{path}': '{existing}' is not writable. Fix: choose another path"
    return None
