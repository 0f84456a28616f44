"""The objects a `Distiller` was given, as files of its run. They are staged in a temporary
directory when the Distiller is made (`validate` and `plan` read them there), and published
into `output_dir/inputs` only when training starts, under the run lock: making a Distiller
never touches a run directory, nor one another process is training in.

`inputs/inputs.json` records the sha256 of each data file written there. A run that resumes
(a checkpoint to continue from) refuses train rows other than those it started with: the
steps taken so far were sampled from them, and the rows of the steps to come would silently
change. Evaluation rows may change, as eval.* may on resume.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from distil.api.inputs import DATA_FILES, publish
from distil.config import DistilConfig
from distil.errors import DataError
from distil.files import atomic_write

RECORD = "inputs.json"  # {"train.jsonl": sha256, "eval.jsonl": sha256} of the files written
PATH_KEYS = (  # the keys `make_config` points at the files it writes
    ("student", "path"),
    ("student", "tokenizer"),
    ("teacher", "path"),
    ("teacher", "tokenizer"),
    ("data", "train"),
    ("eval", "data"),
)


class StagedInputs:
    """A temporary directory for the objects' files (removed with this object)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="distil-inputs-")
        self.root = Path(self._tmp.name)

    @property
    def empty(self) -> bool:
        """No object was given: nothing of the run's own to write."""
        return not any(self.root.iterdir())

    def run_config(self, staged: DistilConfig) -> DistilConfig:
        """`staged` (whose paths name files under `root`) with those paths moved to
        output_dir/inputs, where `publish` puts the files."""
        cfg = staged.model_copy(deep=True)
        dest = inputs_dir(cfg)
        for section, key in PATH_KEYS:
            value = getattr(getattr(cfg, section), key)
            if value and Path(value).is_relative_to(self.root):
                setattr(getattr(cfg, section), key, str(dest / Path(value).relative_to(self.root)))
        return cfg

    def publish(self, cfg: DistilConfig) -> None:
        """Write the staged files into output_dir/inputs (each atomically) and record the data
        files' sha256; a DataError, before anything is written, when the run resumes on train
        rows other than those it started with. Call under the run lock."""
        dest = inputs_dir(cfg)
        digests = {
            name: sha256(self.root / name)
            for name in DATA_FILES.values()
            if (self.root / name).is_file()
        }
        resuming = resumes(cfg)
        if "train.jsonl" in digests and resuming:
            _check_same_rows(dest, digests["train.jsonl"])
        dest.mkdir(parents=True, exist_ok=True)
        for item in sorted(self.root.iterdir()):
            if item.is_dir():
                publish(dest / item.name, lambda tmp, src=item: _copy_files(src, tmp))
            else:
                atomic_write(dest / item.name, lambda tmp, src=item: shutil.copyfile(src, tmp))
        record = {**read_record(dest), **digests} if resuming else digests  # a new run: its own
        text = json.dumps(record, indent=2, sort_keys=True) + "\n"
        atomic_write(dest / RECORD, lambda tmp: Path(tmp).write_text(text))


def inputs_dir(cfg: DistilConfig) -> Path:
    return Path(cfg.train.output_dir) / "inputs"


def resumes(cfg: DistilConfig) -> bool:
    """Whether the run will continue from a checkpoint (train.resume: a checkpoint named, or
    auto with one under output_dir/checkpoints)."""
    from distil.train.checkpoint import step_dirs

    how = cfg.train.resume
    return how != "never" and (how != "auto" or bool(step_dirs(cfg.train.output_dir)))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_record(dest: Path) -> dict[str, Any]:
    try:
        record = json.loads((dest / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_same_rows(dest: Path, now: str) -> None:
    """DataError when the run's recorded train rows (or, without a record, its train.jsonl)
    differ from those given now."""
    kept = read_record(dest).get("train.jsonl")
    if kept is None and (dest / "train.jsonl").is_file():
        kept = sha256(dest / "train.jsonl")
    if kept is None or kept == now:
        return
    raise DataError(
        f"train_data: the run in {dest.parent} resumes from a checkpoint, but the rows given "
        f"now (sha256 {now[:12]}...) are not those it trained on ({dest / 'train.jsonl'}, "
        f"sha256 {kept[:12]}...); the steps to come would be drawn from other rows. Fix: pass "
        "the rows the run started with, or set a new train.output_dir for a new run "
        "(train.resume=never starts this one over)"
    )


def _copy_files(src: Path, tmp: Path) -> None:
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, tmp / f.name)
