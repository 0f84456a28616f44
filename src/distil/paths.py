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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distil.config import DistilConfig


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


def source_problems(cfg: DistilConfig) -> tuple[list[str], list[str]]:
    """(problems, notes) about the config's paths. Local paths must exist with the right kind
    (directory for models, file or dataset directory for data); hub ids are not checked over
    the network and get a note instead."""
    problems: list[str] = []
    notes: list[str] = []
    models = [("student", cfg.student)]
    if cfg.teacher.path and (cfg.loss.name != "sft" or cfg.train.seq_kd):
        models.append(("teacher", cfg.teacher))
    for name, section in models:
        if not section.path:
            continue
        keys = [("path", section.path)]
        if section.tokenizer and section.tokenizer != section.path:
            keys.append(("tokenizer", section.tokenizer))
        for field, value in keys:
            _check_source(f"{name}.{field}", value, "model", problems, notes)
    data = [("data.train", cfg.data.train), ("data.eval", cfg.data.eval)]
    if cfg.train.eval_every:
        data.append(("eval.data", cfg.eval.data))
    for key, value in data:
        if value:
            _check_source(key, value, "data", problems, notes)
    if problem := output_dir_problem(cfg.train.output_dir, "train.output_dir"):
        problems.append(problem)
    return problems, notes


def _check_source(key: str, value: str, kind: str, problems: list[str], notes: list[str]) -> None:
    if problem := path_problem(value, key):
        problems.append(problem)
        return
    path = Path(os.path.expanduser(value))
    if path.exists():
        if kind == "model" and not path.is_dir():
            problems.append(
                f"{key} = {value!r} is a file; a model or tokenizer is a directory written by "
                "save_pretrained. Fix: point it to that directory"
            )
        return
    if looks_local(value):
        what = "directory" if kind == "model" else "file or directory"
        fix = (
            "`distil init-model` creates a small model"
            if kind == "model"
            else "`distil countdown generate --out DIR` writes DIR/train.jsonl and DIR/test.jsonl"
        )
        problems.append(f"{key} = {value!r}: no such local {what}. Fix: check the path ({fix})")
    else:
        notes.append(f"{key} = {value!r} is taken as a hub id; not checked (no network access)")


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
