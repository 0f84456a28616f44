"""The stages of `distil demo` (the story is in __init__.py). Each training stage loads a config
from configs/, moves its `runs/demo/` paths under the demo's output directory, sets the
preset's budget, runs `distil.train.loop.train` and records the equivalent `distil train`
command."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

from distil.demo.presets import CONFIG_DIR, DEMO_ROOT, Run, Writes, budget_steps
from distil.demo.records import STAGE_RECORD, finished, mark_finished
from distil.demo.run import DemoRun, copy_tree, last_metrics
from distil.files import atomic_write
from distil.progress import console

SEED = 0
# seed k of `--seeds N`: a student's init seed is its demo.yaml seed + SEED_STRIDE * k (seed 0:
# today's single-seed demo), and train.seed (data order, sampling) is k
SEED_STRIDE = 100


def moved_paths(run: DemoRun, raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every `runs/demo/...` string of a config (nested sections too: teachers.models.x.path)
    or of a dict of dotted overrides, as a dotted override under the run's output directory."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(moved_paths(run, value, dotted + "."))
        elif isinstance(value, str) and value.startswith(DEMO_ROOT + "/"):
            out[dotted] = moved(run, value)
    return out


def demo_path(run: DemoRun, rel: str) -> Path:
    """A config's path under `runs/demo/` (given without that root) in this run: data,
    tokenizers and the teachers (models/teacher*, runs/teacher*) shared by the seeds, the
    students' models and runs in the seed's directory."""
    head, _, rest = rel.partition("/")
    first = rest.partition("/")[0]
    if head in ("models", "runs") and first.startswith("teacher"):
        return run.out / head / rest
    return run.paths[head] / rest if head in run.paths else run.seed_dir / rel


def moved(run: DemoRun, value: str) -> Path:
    """A config's `runs/demo/...` path in this run (see demo_path)."""
    return demo_path(run, value[len(DEMO_ROOT) + 1 :])


def _config(name: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())


def scaled_warmup(train_cfg: dict[str, Any], max_steps: int) -> int | None:
    """Warmup steps for a budget shorter than the config's warmup (the quick and smoke presets):
    the config's share of its own run (e.g. 200 of 1,250 steps -> 24 of 150), at least 1, so the
    run still has its constant and decay phases. None: the config's warmup fits the budget."""
    warmup = int(train_cfg.get("warmup_steps", 0))
    if max_steps >= warmup:
        return None
    share = warmup / max(int(train_cfg.get("max_steps", warmup)), warmup)
    return max(1, round(share * max_steps))


def train_stage(run: DemoRun, config: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Run configs/<config>.yaml with its paths moved and `overrides`; the last metrics."""
    from distil.config import load_config
    from distil.train.loop import train

    values = {**moved_paths(run, _config(config)), **overrides}
    if "train.max_steps" in values:
        warmup = scaled_warmup(_config(config).get("train", {}), values["train.max_steps"])
        if warmup is not None:
            values["train.warmup_steps"] = warmup
    items = [f"{k}={v}" for k, v in values.items()]
    # no checkpoints on the wall clock: nothing in a demo run depends on timing
    items += [f"train.num_threads={run.threads}", "train.resume=never"]
    items += ["train.save_every_minutes=null"]
    out, path = Path(values["train.output_dir"]), CONFIG_DIR / f"{config}.yaml"
    command = f"distil train {path} " + " ".join(items)
    run.commands.append(command)
    if (out / "final").is_dir() and finished(run, out, command, path):
        return last_metrics(out)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time
    metrics = train(load_config(path, items))
    mark_finished(out, command, path)
    return metrics


# ----------------------------------------------------------------------------- data


def make_data(run: DemoRun) -> None:
    from distil.tasks.countdown import generate_dataset, read_rows

    p = run.preset
    data = run.paths["data"]
    with run.timed("Countdown data") as stage:
        wanted = {"n": p.n_train, "test_n": p.n_test, "dev_n": p.n_dev,
                  "n_labelled": p.n_labelled, "seed": SEED}  # fmt: skip
        meta = data / "demo.json"
        if not (meta.exists() and json.loads(meta.read_text()) == wanted):
            generate_dataset(
                data,
                n=p.n_train,
                test_n=p.n_test,
                dev_n=p.n_dev,
                numbers=(3,),
                seed=SEED,
                template="countdown_plain",
            )
            rows = read_rows(data / "train.jsonl")
            _write_jsonl(data / "labelled.jsonl", rows[: p.n_labelled])
            # no solutions: distillation is prompt-only
            prompts = [
                {k: r[k] for k in ("nums", "target", "prompt")} for r in rows[p.n_labelled :]
            ]
            _write_jsonl(data / "prompts.jsonl", prompts)
            meta.write_text(json.dumps(wanted))
        run.commands.append(
            f"distil countdown generate --n {p.n_train} --test-n {p.n_test} --dev-n {p.n_dev} "
            f"--numbers 3 --template countdown_plain --seed {SEED} --out {data}"
        )
        stage.note = (
            f"{p.n_train} train ({p.n_labelled} labelled, the rest prompts only), {p.n_dev} dev, "
            f"{p.n_test} test"
        )
        console.print(stage.note)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def make_tokenizers(run: DemoRun) -> None:
    from distil.models.scratch import make_tokenizer
    from distil.tasks.prompts import corpus_from_data

    toks = run.paths["tokenizers"]
    train = run.paths["data"] / "train.jsonl"
    with run.timed("tokenizers") as stage:
        made = {}
        for fam in ("bpe", "char"):
            made[fam] = make_tokenizer(
                fam,
                corpus_from_data(str(train), template="countdown_plain"),
                toks / fam,
                vocab_size=run.preset.bpe_vocab,
                chat_template="compact",
            )
            run.commands.append(
                f"distil tokenizer train --family {fam} --data {train} "
                f"--template countdown_plain --chat-template compact "
                f"--vocab-size {run.preset.bpe_vocab} --out {toks / fam}"
            )
        example = "nums: 40 13 94 target: 67 -> <answer>94-40+13</answer>"
        stage.note = f"bpe {len(made['bpe'])} tokens, char {len(made['char'])} tokens"
        console.print(
            f"{stage.note}\n  bpe : {made['bpe'].tokenize(example)}\n  char: "
            f"{made['char'].tokenize(example)[:24]}..."
        )


# ----------------------------------------------------------------------------- models


def _init(
    run: DemoRun, tokenizer: str, path: Path, size: tuple[int, int, int, int], seed: int
) -> Path:
    from distil.models.scratch import init_model

    hidden, layers, heads, inter = size
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
    console.print(f"{path.name}: {n / 1e6:.2f}M parameters")
    return path


def start_students(run: DemoRun) -> None:
    for name in run.manifest.students:
        start_student(run, name)


def start_label(run: DemoRun, name: str) -> str:
    return f"{run.tag}{name} student: supervised start on {run.preset.n_labelled} labelled problems"


def run_label(run: DemoRun, r: Run) -> str:
    return f"{run.tag}{r.student} student: {r.label}"


def start_student(run: DemoRun, name: str) -> None:
    """The student's supervised start on the labelled set (its seed's init)."""
    p = run.preset
    steps = p.steps["start"]
    student = run.manifest.students[name]
    with run.timed(f"{start_label(run, name)} ({steps} steps)"):
        seed = student.seed + SEED_STRIDE * run.seed
        init = _init(
            run, student.tokenizer, run.paths["models"] / f"student_{name}_init", p.student, seed
        )
        # a study's own start data (runs/demo/...), moved; its prompts read as written (a
        # template would render every row from nums and target alike)
        own = student.start_data
        data = {"data.train": moved(run, own), "data.template": "null"} if own else {}
        train_stage(
            run,
            "student_start",
            {
                **data,
                "student.path": init,
                "train.output_dir": run.paths["runs"] / f"student_{name}_start",
                "train.max_steps": steps,
                **_seed(run),
            },
        )
        copy_tree(
            run.paths["runs"] / f"student_{name}_start" / "final",
            run.paths["models"] / f"student_{name}_start",
        )


# ----------------------------------------------------------------------------- runs


WRITE_BATCH = 512  # prompts per generate call of the teacher writing its completions
WRITE_MARGIN = 1.05  # rows written beyond the budget's windows


def run_all(run: DemoRun) -> None:
    """The teacher's completions (when configs/demo.yaml has `writes:`), then every run of
    configs/demo.yaml, in order (a control after the run it matches)."""
    if run.manifest.writes is not None:
        teacher_writes(run, run.manifest.writes)
    for r in run.manifest.runs:
        run_one(run, r)


def run_one(run: DemoRun, r: Run) -> None:
    """One run of configs/demo.yaml (a control after the run whose compute it gets)."""
    budget = _budget(run, r)
    with run.timed(f"{run_label(run, r)} ({_describe(budget)})"):
        train_stage(run, r.config, {**_run_overrides(run, r), **budget})


def reads_written(r: Run) -> bool:
    """Whether the run trains on the teacher's written completions (runs/demo/written/)."""
    train = (_config(r.config).get("data") or {}).get("train")
    return isinstance(train, str) and train.startswith(f"{DEMO_ROOT}/written/")


def teacher_writes(run: DemoRun, w: Writes) -> None:
    """The seed's prompts (a seeded sample of prompts.jsonl, as many as the budget's windows
    read) and the teacher's completion for each, written once in large batches
    (`distil generate`) to runs/demo/written/teacher.jsonl."""
    from distil.config import load_config
    from distil.teacher.generate import generate_completions

    steps = budget_steps(run.preset, Run(w.config, "", "", steps=w.steps), run.distill_scale)
    prompts = (run.paths["data"] / "prompts.jsonl").read_text().splitlines(keepends=True)
    n = min(len(prompts), math.ceil(steps * w.batch * WRITE_MARGIN))
    with run.timed(f"{run.tag}teacher writes {n} completions ({steps} windows)") as stage:
        subset, out = (
            demo_path(run, "written/prompts.jsonl"),
            demo_path(run, "written/teacher.jsonl"),
        )
        values = {**moved_paths(run, _config(w.config)), **_seed(run)}
        items = [f"{k}={v}" for k, v in values.items()]
        path = CONFIG_DIR / f"{w.config}.yaml"
        command = f"distil generate {path} {' '.join(items)} --out {out} --batch-size {WRITE_BATCH}"
        run.commands.append(command)
        command += f" (prompts: {n} of the seed's order)"
        if out.is_file() and finished(run, out.parent, command, path):
            return
        subset.parent.mkdir(parents=True, exist_ok=True)
        (out.parent / STAGE_RECORD).unlink(missing_ok=True)
        random.Random(f"distil-demo-prompts:{run.seed}").shuffle(prompts)
        subset.write_text("".join(prompts[:n]))
        cfg = load_config(path, [*items, "logging.progress=false"])
        counts = generate_completions(cfg, out, batch_size=WRITE_BATCH)
        mark_finished(out.parent, command, path)
        stage.note = f"{counts['completions']} completions of {n} prompts: {out}"


def _budget(run: DemoRun, r: Run) -> dict[str, Any]:
    if r.steps is not None:
        return {"train.max_steps": budget_steps(run.preset, r, run.distill_scale)}
    spent = last_metrics(run.paths["runs"] / r.cost_of)["cost/student_flops"]
    return {"train.max_steps": 1_000_000, "train.max_student_flops": spent}


def _describe(budget: dict[str, Any]) -> str:
    if "train.max_student_flops" in budget:
        return f"{budget['train.max_student_flops'] / 1e12:.3g} TFLOP of student compute"
    return f"{budget['train.max_steps']} steps"


def _run_overrides(run: DemoRun, r: Run) -> dict[str, Any]:
    p = run.preset
    out: dict[str, Any] = {
        "student.path": run.paths["models"] / f"student_{r.student}_start",
        "train.output_dir": run.paths["runs"] / r.key,
        "eval.n": p.eval_n,
    }
    if p.eval_every is not None:
        out["train.eval_every"] = p.eval_every
    return {**out, **_seed(run), **r.overrides, **moved_paths(run, r.overrides)}


def _seed(run: DemoRun) -> dict[str, Any]:
    """train.seed (data order, sampling, the lambda draws) of a seed of several; nothing for a
    single-seed demo (the configs' own seed, 0)."""
    return {"train.seed": run.seed} if run.several else {}


# ----------------------------------------------------------------------------- report


def report(runs: list[DemoRun]) -> dict[str, Any]:
    """Evaluate every model of every seed; write and print the table."""
    from distil.demo.report import evaluate_all, write_outputs

    with runs[0].timed("evaluation of every model") as stage:
        results = evaluate_all(runs)
        n = len({r.name for seed in results for r in seed})
        stage.note = f"{n} rows x {len(runs)} seeds x {runs[0].preset.n_test} test problems"
    return write_outputs(runs, results)
