"""What the Python API accepts, turned into what the command line would have been given: a
config (a YAML path or run directory, a dict or a `DistilConfig`, plus overrides), models and
tokenizers (paths or hub ids, or objects already loaded) and data (a path or hub id, a
`datasets.Dataset` or a list of dicts).

Objects become files, so that every check the command line makes (validation, `distil plan`,
preflight) reads the same things: a data object is written as JSONL, a loaded model as its
config.json and generation config (no weights: the object itself is trained or run), a
tokenizer object with save_pretrained. They go under `root`, a temporary directory (a
`Distiller` publishes them into `output_dir/inputs` when it trains: api/run_inputs.py), each
file written through a temporary name, so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from distil.config import DistilConfig, build_config
from distil.config.loading import ConfigLike, Overrides, raw_config
from distil.errors import ConfigError, DataError
from distil.files import atomic_write
from distil.paths import output_dir_problem
from distil.train.card import INPUT_FILE

DATA_FILES = {"data.train": "train.jsonl", "eval.data": "eval.jsonl"}  # written data objects


def is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


__all__ = ["ConfigLike", "Overrides", "is_path", "make_config", "raw_config", "write_rows"]


def make_config(
    config: ConfigLike,
    overrides: Overrides = (),
    *,
    models: Mapping[str, tuple[Any, Any]] | None = None,
    data: Mapping[str, Any] | None = None,
    root: str | Path | None = None,
) -> tuple[DistilConfig, dict[str, Any]]:
    """(the validated config, the loaded models by side) from the API's arguments.

    `models`: {"student"/"teacher": (model, tokenizer)}, each a path, a hub id, an object or
    None (the config's); `data`: {"data.train" or "eval.data": a path, a hub id, a Dataset or
    a list of dicts}. Objects are written under `root` (a temporary directory: a Distiller
    moves them into its run directory when it trains, api/run_inputs.py). Every
    problem of the config is raised at once, as a ConfigError, as `load_config` does."""
    raw, problems = raw_config(config, overrides)
    models, data = dict(models or {}), dict(data or {})
    for side, (model, tok) in models.items():
        _set_side(raw, side, model if is_path(model) else None, tok if is_path(tok) else None)
    for key, value in data.items():
        if is_path(value):
            _set(raw, key, str(value))
    cfg = build_config(raw, problems)  # the config's own problems first, all of them
    given = [*(v for pair in models.values() for v in pair), *data.values()]
    if all(v is None or is_path(v) for v in given):
        return cfg, {}
    if problem := output_dir_problem(cfg.train.output_dir, "train.output_dir"):
        raise ConfigError(problem)  # the run's inputs go there when it trains
    if root is None:
        raise TypeError("make_config: objects are written under root; pass root=")
    root = Path(root)
    loaded: dict[str, Any] = {}
    for side, (model, tok) in models.items():
        if model is not None and not is_path(model):
            loaded[side] = model
        if (paths := write_side(root, side, model, tok)) is not None:
            _set_side(raw, side, *paths)
    for key, value in data.items():
        if value is not None and not is_path(value):
            _set(raw, key, str(write_rows(root / DATA_FILES[key], value, key)))
    return build_config(raw), loaded


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    section, name = key.split(".")
    raw.setdefault(section, {})[name] = value


def _set_side(raw: dict[str, Any], side: str, path: str | None, tokenizer: str | None) -> None:
    """Point `side`'s path and tokenizer at new values; a tokenizer that followed the old path
    (the config's default) follows the new one."""
    section = raw.setdefault(side, {})
    if path is not None:
        if tokenizer is None and section.get("tokenizer") in (None, section.get("path")):
            tokenizer = str(path)
        section["path"] = str(path)
    if tokenizer is not None:
        section["tokenizer"] = str(tokenizer)


def write_side(root: Path, side: str, model: Any, tokenizer: Any) -> tuple | None:
    """(path, tokenizer path) of the files written for `side`'s objects, or None when both
    are paths (or unset). A loaded model gets root/<side>: its config.json and generation
    config, the name it was loaded from (INPUT_FILE), and its tokenizer when that is an
    object too; a tokenizer object alone gets root/<side>_tokenizer."""
    model_obj = model is not None and not is_path(model)
    tok_obj = tokenizer is not None and not is_path(tokenizer)
    if model_obj and tokenizer is None:
        raise ConfigError(
            f"{side}: a loaded model was passed without its tokenizer. Fix: pass "
            f"{side}_tokenizer= (the tokenizer object, or its path or hub id)"
        )
    if model_obj:
        if not hasattr(model, "config") or not hasattr(model.config, "save_pretrained"):
            raise ConfigError(
                f"{side}: got a {type(model).__name__}. Fix: pass a transformers "
                "PreTrainedModel (AutoModelForCausalLM.from_pretrained), or its path or hub id"
            )
        where = root / side
        publish(where, lambda tmp: _model_files(tmp, model, tokenizer if tok_obj else None))
        return str(where), str(where) if tok_obj else str(tokenizer)
    if tok_obj:
        where = root / f"{side}_tokenizer"
        publish(where, lambda tmp: tokenizer.save_pretrained(tmp))
        return None, str(where)
    return None


def _model_files(tmp: Path, model: Any, tokenizer: Any) -> None:
    model.config.save_pretrained(tmp)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
    record = {"name_or_path": str(name), "class": type(model).__name__, "weights": "in memory"}
    (tmp / INPUT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)


def publish(where: Path, write) -> None:
    """`write(tmp)` into a fresh temporary directory, then each file moved onto `where` by an
    atomic rename (files `where` held that were not rewritten are removed)."""
    where.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=where.parent, prefix=f".{where.name}."))
    try:
        write(tmp)
        names = {p.name for p in tmp.iterdir()}
        for p in tmp.iterdir():
            os.replace(p, where / p.name)
        for old in where.iterdir():
            if old.name not in names and old.is_file():
                old.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_rows(path: Path, data: Any, key: str) -> Path:
    """A `datasets.Dataset` or an iterable of dicts, as JSONL at `path` (atomically)."""
    if isinstance(data, Mapping):
        what = "a DatasetDict" if hasattr(data, "column_names") else "a dict"
        raise DataError(
            f"{key}: got {what}, not rows. Fix: pass one split (e.g. dataset['train']), a "
            "list of dicts, or a path or hub id"
        )
    if not isinstance(data, Iterable):
        raise DataError(
            f"{key}: got a {type(data).__name__}. Fix: pass a datasets.Dataset, a list of "
            "dicts, or a path or hub id"
        )
    lines = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise DataError(f"{key}: row {i} is a {type(row).__name__}, not a dict of columns")
        try:
            lines.append(json.dumps(dict(row), ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise DataError(
                f"{key}: row {i} holds a value JSON cannot write ({exc}). Fix: keep text, "
                "numbers, lists and dicts in the rows"
            ) from exc
    if not lines:
        raise DataError(f"{key}: the data holds no rows")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path
