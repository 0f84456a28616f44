"""The state of one `distil demo` run: where it writes, its preset, the stages it went through
(with their times), the commands that reproduce them, and small file helpers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from distil.demo.presets import Manifest, Preset
from distil.progress import console

# the teacher's last training metrics (steps, cost), kept next to the cached model
TEACHER_SUMMARY = "distil_demo_train.json"


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    note: str = ""


@dataclass
class DemoRun:
    out: Path
    preset_name: str
    preset: Preset
    manifest: Manifest
    threads: int
    cache_dir: Path
    distill_scale: float = 1.0
    command: str = ""
    seed: int = 0  # this run's seed (data order, sampling, the starts' init); see for_seed
    n_seeds: int = 1
    resume: bool = False  # reuse the stages an earlier run of the same command finished
    lanes: int = 1  # worker processes running the students' stages side by side (lanes.py)
    stages: list[Stage] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    def stage(self, name: str) -> Stage:
        s = Stage(name)
        self.stages.append(s)
        elapsed = time.perf_counter() - self.t0
        console.rule(
            f"[bold]stage {len(self.stages)}: {name}[/]  (demo time {elapsed / 60:.1f} min)"
        )
        return s

    def timed(self, name: str):
        """`with run.timed(name) as stage:` records the stage and its seconds."""
        return _Timed(self, name)

    def for_seed(self, seed: int) -> DemoRun:
        """The same demo for one seed (stages and commands recorded in the shared lists)."""
        return replace(self, seed=seed)

    @property
    def several(self) -> bool:
        """Whether this seed is one of several, or not seed 0 (the tuning seed): its own
        directory, tag and train.seed."""
        return self.n_seeds > 1 or self.seed != 0

    @property
    def seed_dir(self) -> Path:
        """Where a seed's students and runs go: --out itself for the single-seed demo (seed 0),
        --out/seed<k> otherwise."""
        return self.out / f"seed{self.seed}" if self.several else self.out

    @property
    def tag(self) -> str:
        """'seed k: ' before a stage's name when there are several seeds."""
        return f"seed {self.seed}: " if self.several else ""

    @property
    def paths(self) -> dict[str, Path]:
        """data, tokenizers and the teacher are shared by the seeds; models and runs per seed."""
        d, s = self.out, self.seed_dir
        return {
            "data": d / "data",
            "tokenizers": d / "tokenizers",
            "teacher": d / "models" / "teacher",
            "teacher_run": d / "runs" / "teacher",
            "models": s / "models",
            "runs": s / "runs",
        }


class _Timed:
    def __init__(self, run: DemoRun, name: str):
        self.run, self.name = run, name

    def __enter__(self) -> Stage:
        self.stage = self.run.stage(self.name)
        self.t0 = time.perf_counter()
        return self.stage

    def __exit__(self, *exc) -> None:
        self.stage.seconds = time.perf_counter() - self.t0


def default_cache_dir() -> Path:
    root = os.environ.get("DISTIL_CACHE") or Path.home() / ".cache" / "distil"
    return Path(root) / "demo"


@cache
def code_version() -> str:
    """A hash of distil's own code and package data (every file of the installed package), so
    a cached teacher or a finished stage is reused only by the code that made it."""
    import distil

    root = Path(distil.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if (
            path.is_file()
            and path.suffix in (".py", ".yaml", ".json")
            and "__pycache__" not in path.parts
        ):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def content_hash(path: Path) -> str | None:
    """sha256 of a file, or of a directory's model files (config, weights, tokenizer); None
    when `path` does not exist."""
    path = Path(path)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and (f.suffix in (".safetensors", ".json") or f.name == "tokenizer.json"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def settings_key(*parts: Any) -> str:
    """A short hash of everything that determines a cached artefact."""
    blob = json.dumps(
        [asdict(p) if hasattr(p, "__dataclass_fields__") else p for p in parts],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def copy_tree(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.replace(dst)


def last_metrics(run_dir: Path) -> dict[str, Any]:
    """The last line of a run's metrics.jsonl (its final step, cost and clock)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])
