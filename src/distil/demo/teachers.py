"""The demo's teacher: trained once on the reference solutions and cached by everything that
determines it (sizes, steps, seed, threads, its config, the tokenizer, the data it reads and the
code that trains it), and the expected time of a run printed before it starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from distil.demo.presets import CONFIG_DIR
from distil.demo.run import (
    TEACHER_SUMMARY,
    DemoRun,
    code_version,
    content_hash,
    copy_tree,
    last_metrics,
    settings_key,
)
from distil.demo.stages import SEED, _init, train_stage
from distil.progress import console


def _teacher_cache_key(run: DemoRun) -> str:
    p = run.preset
    tokenizer = (run.paths["tokenizers"] / "bpe" / "tokenizer.json").read_bytes()
    return settings_key(
        p.teacher,
        p.steps["teacher"],
        SEED,
        run.threads,  # results are exact for a machine and thread count
        (CONFIG_DIR / "teacher.yaml").read_text(),
        hashlib.sha256(tokenizer).hexdigest(),
        content_hash(run.paths["data"] / "train.jsonl"),  # what it learns from
        content_hash(run.paths["data"] / "dev.jsonl"),  # its in-training curve
        code_version(),  # the code that trains it
    )


def teacher_cache(run: DemoRun) -> Path:
    """Where the teacher of this run's settings is (or will be) cached (data and tokenizers
    made first: the key holds their hashes)."""
    steps = run.preset.steps["teacher"]
    return run.cache_dir / f"teacher-{_teacher_cache_key(run)}-{steps}steps"


def train_teacher(run: DemoRun) -> None:
    p = run.preset
    teacher, teacher_run = run.paths["teacher"], run.paths["teacher_run"]
    steps = p.steps["teacher"]
    cached = teacher_cache(run)
    with run.timed(f"teacher ({steps} steps)") as stage:
        if use_cached_teacher(cached, teacher, stage):
            return
        init = _init(run, "bpe", teacher.parent / "teacher_init", p.teacher, SEED)
        train_stage(
            run,
            "teacher",
            {
                "data.train": run.paths["data"] / "train.jsonl",
                "student.path": init,
                "train.output_dir": teacher_run,
                "train.max_steps": steps,
            },
        )
        keep_teacher(run, teacher_run, teacher, cached, stage)


def use_cached_teacher(cached: Path, final: Path, stage) -> bool:
    """Copy a trained teacher from the cache to `final` when the cache holds it."""
    if not (cached / TEACHER_SUMMARY).exists():
        return False
    copy_tree(cached, final)
    stage.note = f"cached: {cached}"
    console.print(f"using the cached teacher {cached} (delete it to retrain)")
    return True


def keep_teacher(run: DemoRun, out: Path, final: Path, cached: Path, stage) -> None:
    """A teacher just trained in `out`: its summary next to its weights, copied to `final` and
    to the cache."""
    (out / "final" / TEACHER_SUMMARY).write_text(json.dumps(last_metrics(out)) + "\n")
    copy_tree(out / "final", final)
    run.cache_dir.mkdir(parents=True, exist_ok=True)
    copy_tree(out / "final", cached)
    stage.note = f"trained; cached as {cached}"


def expected_time(run: DemoRun, seeds: int, *, tune: bool = False) -> str | None:
    """One line before a run: its expected minutes from the preset's measured ones (the
    teacher's counted only when it is not cached), or None when the preset has none."""
    minutes = run.preset.minutes
    if not minutes:
        return None
    teacher = 0.0 if (teacher_cache(run) / TEACHER_SUMMARY).exists() else minutes["teacher"]
    per_seed = minutes["seed"] * run.distill_scale
    n = len(run.manifest.analysis.lr_grid) if tune and run.manifest.analysis else seeds
    what = f"{n} lr settings" if tune else f"{n} seed(s)"
    return (
        f"expected time: about {teacher + n * per_seed:.0f} more minutes ({what} x "
        f"{per_seed:.0f} min" + (f" + the teacher {teacher:.0f} min" if teacher else
        ", the teacher cached") + f"), as measured on {minutes['machine']}"
    )  # fmt: skip
