"""`distil demo`: the whole pipeline on a CPU in minutes, with models it trains itself.

1. Countdown data (3 numbers from 1-99): a large train split, a held-out test split, a small
   labelled set and the prompts (no answers) the students are distilled on.
2. Two tokenizers that cut text differently: a byte-level BPE for the teacher, characters for
   the cross-tokenizer student (the same-tokenizer student uses the teacher's BPE).
3. The teacher (~5M parameters) trained on reference solutions, cached by its settings.
4. Two students (~1M parameters) with a short supervised start on the labelled set only.
5. On-policy distillation from prompts only: the char student across tokenizers, the bpe
   student with the same tokenizer; and, for the char student at equal wall time, two
   controls: sequence-level KD and continued supervised training on the labelled set.
6. Every model evaluated with the Countdown checker: a table (with the share of the
   teacher-student gap each student recovered) as Markdown and JSON, and a plot.

Every training stage is an ordinary config under configs/demo/ run through `distil train`'s
code path; the demo only fills paths and budgets, and prints the equivalent commands.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distil.progress import console

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "demo"


@dataclass(frozen=True)
class Preset:
    """Budgets of one demo size (minutes are training clocks: evaluation excluded)."""

    n_train: int
    n_test: int
    n_labelled: int
    teacher: tuple[int, int, int, int]  # hidden, layers, heads, intermediate
    student: tuple[int, int, int, int]
    teacher_minutes: float
    start_steps: int
    cross_minutes: float  # the char student's distillation; its controls get the same clock
    same_minutes: float
    eval_every: int | None  # None: the configs' own
    eval_n: int
    bpe_vocab: int = 512


PRESETS = {
    "full": Preset(
        200_000,
        500,
        4000,
        (256, 6, 4, 672),
        (128, 6, 4, 352),
        teacher_minutes=9.0,
        start_steps=300,
        cross_minutes=1.0,
        same_minutes=2.0,
        eval_every=None,
        eval_n=100,
    ),
    "quick": Preset(
        50_000,
        300,
        4000,
        (256, 6, 4, 672),
        (128, 6, 4, 352),
        teacher_minutes=1.0,
        start_steps=250,
        cross_minutes=0.3,
        same_minutes=0.4,
        eval_every=20,
        eval_n=50,
    ),
    # for tests: everything in seconds, numbers meaningless
    "smoke": Preset(
        600,
        24,
        64,
        (32, 2, 2, 64),
        (32, 2, 2, 64),
        teacher_minutes=0.02,
        start_steps=3,
        cross_minutes=0.01,
        same_minutes=0.01,
        eval_every=2,
        eval_n=8,
        bpe_vocab=300,
    ),
}


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
    threads: int
    cache_dir: Path
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

    @property
    def paths(self) -> dict[str, Path]:
        d = self.out
        return {
            "data": d / "data",
            "tokenizers": d / "tokenizers",
            "models": d / "models",
            "runs": d / "runs",
        }


def default_cache_dir() -> Path:
    import os

    root = os.environ.get("DISTIL_CACHE") or Path.home() / ".cache" / "distil"
    return Path(root) / "demo"


def run_demo(
    out: str | Path, *, preset: str = "full", threads: int = 2, cache_dir: str | Path | None = None
) -> dict[str, Any]:
    """Run every stage; returns the results table as a dict (also written to out/)."""
    import torch

    from distil.demo_stages import (
        make_data,
        make_tokenizers,
        report,
        run_controls,
        run_distillation,
        start_students,
        train_teacher,
    )

    torch.set_num_threads(threads)
    run = DemoRun(
        Path(out),
        preset,
        PRESETS[preset],
        threads,
        Path(cache_dir) if cache_dir else default_cache_dir(),
    )
    run.out.mkdir(parents=True, exist_ok=True)
    make_data(run)
    make_tokenizers(run)
    train_teacher(run)
    start_students(run)
    run_distillation(run)
    run_controls(run)
    return report(run)


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
