"""The stages of `distil demo` (see demo.py for the story). Each training stage loads a config
from configs/demo/, applies the paths and budgets of the chosen preset as overrides, runs
`distil.train.loop.train` and records the equivalent `distil train` command."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from distil.demo import CONFIG_DIR, DemoRun, copy_tree, settings_key
from distil.progress import console

SEED = 0


def _timed(run: DemoRun, name: str):
    class _T:
        def __enter__(self):
            self.stage = run.stage(name)
            self.t0 = time.perf_counter()
            return self.stage

        def __exit__(self, *exc):
            self.stage.seconds = time.perf_counter() - self.t0

    return _T()


def train_stage(run: DemoRun, config: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Run configs/demo/<config>.yaml with `overrides`; returns the last metrics."""
    from distil.config import load_config
    from distil.train.loop import train

    items = [f"{k}={v}" for k, v in overrides.items()]
    items += [f"train.num_threads={run.threads}", "train.resume=never"]
    shutil.rmtree(overrides["train.output_dir"], ignore_errors=True)  # a fresh run each time
    run.commands.append(f"distil train configs/demo/{config}.yaml " + " ".join(items))
    cfg = load_config(CONFIG_DIR / f"{config}.yaml", items)
    return train(cfg)


# ----------------------------------------------------------------------------- data


def make_data(run: DemoRun) -> None:
    from distil.data.countdown import generate_dataset, read_rows

    p = run.preset
    data = run.paths["data"]
    with _timed(run, "Countdown data") as stage:
        wanted = {"n": p.n_train, "test_n": p.n_test, "seed": SEED}
        meta = data / "demo.json"
        if not (meta.exists() and json.loads(meta.read_text()) == wanted):
            generate_dataset(
                data,
                n=p.n_train,
                test_n=p.n_test,
                numbers=(3,),
                seed=SEED,
                template="countdown_plain",
            )
            rows = read_rows(data / "train.jsonl")
            _write_jsonl(data / "labelled.jsonl", rows[: p.n_labelled])
            prompts = [
                {k: r[k] for k in ("nums", "target", "prompt")} for r in rows[p.n_labelled :]
            ]
            _write_jsonl(
                data / "prompts.jsonl", prompts
            )  # no solutions: distillation is prompt-only
            meta.write_text(json.dumps(wanted))
        run.commands.append(
            f"distil countdown generate --n {p.n_train} --test-n {p.n_test} "
            f"--numbers 3 --template countdown_plain --seed {SEED} --out {data}"
        )
        stage.note = (
            f"{p.n_train} train ({p.n_labelled} labelled, the rest prompts only), {p.n_test} test"
        )
        console.print(stage.note)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def make_tokenizers(run: DemoRun) -> None:
    from distil.models.scratch import train_tokenizer_from_data

    toks = run.paths["tokenizers"]
    train = run.paths["data"] / "train.jsonl"
    with _timed(run, "tokenizers") as stage:
        bpe = train_tokenizer_from_data(
            "bpe",
            str(train),
            toks / "bpe",
            vocab_size=run.preset.bpe_vocab,
            template="countdown_plain",
            chat_template="compact",
        )
        char = train_tokenizer_from_data(
            "char", str(train), toks / "char", template="countdown_plain", chat_template="compact"
        )
        for fam in ("bpe", "char"):
            run.commands.append(
                f"distil tokenizer train --family {fam} --data {train} "
                f"--template countdown_plain --chat-template compact "
                f"--vocab-size {run.preset.bpe_vocab} --out {toks / fam}"
            )
        example = "nums: 40 13 94 target: 67 -> <answer>94-40+13</answer>"
        stage.note = f"bpe {len(bpe)} tokens, char {len(char)} tokens"
        console.print(
            f"{stage.note}\n  bpe : {bpe.tokenize(example)}\n  char: "
            f"{char.tokenize(example)[:24]}..."
        )


# ----------------------------------------------------------------------------- models


def _init(
    run: DemoRun, tokenizer: str, name: str, size: tuple[int, int, int, int], seed: int
) -> Path:
    from distil.models.scratch import init_model

    hidden, layers, heads, inter = size
    path = run.paths["models"] / name
    n = init_model(
        run.paths["tokenizers"] / tokenizer,
        path,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=inter,
        seed=seed,
    )
    run.commands.append(
        f"distil init-model --tokenizer {run.paths['tokenizers'] / tokenizer} "
        f"--hidden-size {hidden} --layers {layers} --heads {heads} "
        f"--intermediate-size {inter} --seed {seed} --out {path}"
    )
    console.print(f"{name}: {n / 1e6:.2f}M parameters")
    return path


def _teacher_cache_key(run: DemoRun) -> str:
    p = run.preset
    tokenizer = (run.paths["tokenizers"] / "bpe" / "tokenizer.json").read_bytes()
    return settings_key(
        p.teacher,
        SEED,
        (CONFIG_DIR / "teacher.yaml").read_text(),
        hashlib.sha256(tokenizer).hexdigest(),
    )


def _cached_teacher(run: DemoRun, key: str) -> Path | None:
    """The cached teacher for these settings trained for the most minutes (at least the
    preset's), so a quick run reuses a full run's teacher."""
    found = []
    for path in run.cache_dir.glob(f"teacher-{key}-*min"):
        minutes = float(path.name.rsplit("-", 1)[1][: -len("min")])
        if minutes >= run.preset.teacher_minutes and (path / "config.json").exists():
            found.append((minutes, path))
    return max(found)[1] if found else None


def train_teacher(run: DemoRun) -> None:
    p = run.preset
    models, runs = run.paths["models"], run.paths["runs"]
    key = _teacher_cache_key(run)
    with _timed(run, f"teacher (~{p.teacher_minutes:g} min of training)") as stage:
        cached = _cached_teacher(run, key)
        if cached is not None:
            copy_tree(cached, models / "teacher")
            stage.note = f"cached: {cached}"
            console.print(f"using the cached teacher {cached} (delete it to retrain)")
            return
        init = _init(run, "bpe", "teacher_init", p.teacher, SEED)
        train_stage(
            run,
            "teacher",
            {
                "data.train": run.paths["data"] / "train.jsonl",
                "student.path": init,
                "train.output_dir": runs / "teacher",
                "train.max_minutes": p.teacher_minutes,
                "eval.data": run.paths["data"] / "test.jsonl",
            },
        )
        copy_tree(runs / "teacher" / "final", models / "teacher")
        target = run.cache_dir / f"teacher-{key}-{p.teacher_minutes:g}min"
        run.cache_dir.mkdir(parents=True, exist_ok=True)
        copy_tree(runs / "teacher" / "final", target)
        stage.note = f"trained; cached as {target}"


def start_students(run: DemoRun) -> None:
    p = run.preset
    for tok, seed in (("char", 1), ("bpe", 2)):
        with _timed(run, f"{tok} student: supervised start on {p.n_labelled} labelled problems"):
            init = _init(run, tok, f"student_{tok}_init", p.student, seed)
            train_stage(
                run,
                "student_start",
                {
                    "data.train": run.paths["data"] / "labelled.jsonl",
                    "student.path": init,
                    "train.output_dir": run.paths["runs"] / f"student_{tok}_start",
                    "train.max_steps": p.start_steps,
                    # the config's 50 warmup steps, or fewer for the smoke preset's short start
                    "train.warmup_steps": min(50, p.start_steps),
                    "eval.data": run.paths["data"] / "test.jsonl",
                },
            )
            copy_tree(
                run.paths["runs"] / f"student_{tok}_start" / "final",
                run.paths["models"] / f"student_{tok}_start",
            )


def _student_overrides(run: DemoRun, student: str, name: str, minutes: float) -> dict[str, Any]:
    p = run.preset
    out = {
        "student.path": run.paths["models"] / student,
        "train.output_dir": run.paths["runs"] / name,
        "train.max_minutes": round(minutes, 6),
        "eval.n": p.eval_n,
        "eval.data": run.paths["data"] / "test.jsonl",
    }
    if p.eval_every is not None:
        out["train.eval_every"] = p.eval_every
    return out


def run_distillation(run: DemoRun) -> None:
    p = run.preset
    teacher = run.paths["models"] / "teacher"
    prompts = run.paths["data"] / "prompts.jsonl"
    for config, student, label, minutes in (
        (
            "distill_cross_tokenizer",
            "student_char_start",
            "char student <- bpe teacher",
            p.cross_minutes,
        ),
        (
            "distill_same_tokenizer",
            "student_bpe_start",
            "bpe student <- bpe teacher",
            p.same_minutes,
        ),
    ):
        with _timed(run, f"on-policy distillation, {label} ({minutes:g} min)"):
            train_stage(
                run,
                config,
                {
                    **_student_overrides(run, student, config, minutes),
                    "teacher.path": teacher,
                    "data.train": prompts,
                    "logging.print_example": config.startswith("distill_cross"),
                },
            )


def run_controls(run: DemoRun) -> None:
    """Seq-KD and continued SFT for the char student, at the distillation's training clock."""
    clock = _last_metrics(run.paths["runs"] / "distill_cross_tokenizer")["time/train_clock"]
    minutes = clock / 60.0
    data = run.paths["data"]
    for config, label, extra in (
        (
            "control_seqkd",
            "sequence-level KD",
            {"teacher.path": run.paths["models"] / "teacher", "data.train": data / "prompts.jsonl"},
        ),
        (
            "control_sft",
            "continued SFT on the labelled set",
            {"data.train": data / "labelled.jsonl"},
        ),
    ):
        with _timed(run, f"control: char student, {label} ({minutes:.2f} min, equal wall time)"):
            train_stage(
                run,
                config,
                {**_student_overrides(run, "student_char_start", config, minutes), **extra},
            )


def _last_metrics(run_dir: Path) -> dict[str, Any]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- report


def report(run: DemoRun) -> dict[str, Any]:
    from distil.demo_report import evaluate_all, write_outputs

    with _timed(run, "evaluation of every model") as stage:
        results = evaluate_all(run)
        stage.note = f"{len(results)} models x {run.preset.n_test} test problems"
    return write_outputs(run, results)
