"""The tables of `distil demo --study NAME` (studies.py): every model through the Countdown
checker on each test split the study names, over its seeds (mean ± sd, each seed's), with the
optimizer steps and the student compute of the run that made it; the study's comparisons as
paired leads (95% t interval, two-sided p, Holm over all of them); Markdown and JSON under
--out.

- multi-teacher: accuracy on the three-number test split, the four-number one and their mix
  (all problems of both; the slices have equally many), teachers first; leads on the mix.
- self-distill: accuracy on the demo's test problems; the privileged teacher (the frozen start
  reading the reference solution in its context) scored as the self-distilled arms' teacher
  sees each problem; the demo's teacher (the positive control's).
- reward: accuracy on the three-number and the four-number test split, teachers first; each
  comparison on the test split of the slice its runs trained on; curves.png (study_plot.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from distil.demo.report import COST_NOTE, machine, training_summary
from distil.demo.report import Row as _ReportRow
from distil.demo.run import DemoRun, code_version, content_hash
from distil.demo.stats import holm, mean_sd, paired
from distil.demo.summary import leads_table, run_label, start_label
from distil.files import atomic_write
from distil.progress import console
from distil.tasks.countdown import Countdown

# the multi-teacher study's slices: name -> numbers per problem (the teacher of each, the
# `slice` column the student's rows are routed by)
SLICES = {"three": 3, "four": 4}
SLICE_COLUMN = "slice"
MAX_NEW_TOKENS = 40  # a four-number answer in the bpe tokens is under 20
PRIVILEGED = "teacher: the frozen start, the reference solution in its context"
TEACHER_SCORES = "teacher_scores"  # out/<this>/<key's sha>.json: a teacher's scores (evaluate)
WEIGHT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
SEED_SUMMARY = "seed_summary.json"  # one seed's rows, scores and curves (write_seed_summary)
CURVE_POINTS = 200  # the reward points a run's curve keeps


@dataclass(frozen=True)
class Row:
    label: str
    model: Path
    metrics: Path  # the run that made it (its metrics.jsonl), or a teacher's final dir
    context: str | None = None  # a teacher's context template its prompts are shown with


def rows(name: str, run: DemoRun) -> list[Row]:
    """Teachers (shared by the seeds), then the student's start and each run, in manifest
    order (the seed's)."""
    p, shared = run.paths, run.out / "models"
    out = []
    if name == "multi-teacher":
        for s, k in [*SLICES.items(), ("general", "both")]:
            label = f"teacher ({k}-number slice)" if s in SLICES else "teacher (generalist)"
            out.append(Row(label, shared / f"teacher_{s}", shared / f"teacher_{s}"))
    elif name == "reward":
        out.append(Row("teacher (three numbers: the demo's)", p["teacher"], p["teacher"]))
        four = shared / "teacher_four"
        out.append(Row("teacher (four numbers)", four, four))
    else:
        out.append(Row("teacher (the demo's: the positive control's)", p["teacher"], p["teacher"]))
        context = next(
            (t["context"] for r in run.manifest.runs if (t := _teacher(r.config)).get("context")),
            None,
        )
        student = next(iter(run.manifest.students))
        start = p["models"] / f"student_{student}_start"
        out.append(Row(PRIVILEGED, start, p["runs"] / f"student_{student}_start", context))
    for student in run.manifest.students:
        out.append(Row(start_label(student), p["models"] / f"student_{student}_start",
                       p["runs"] / f"student_{student}_start"))  # fmt: skip
        for r in run.manifest.runs:
            if r.student == student:
                d = p["runs"] / r.key
                out.append(Row(run_label(r), d / "final", d))
    return out


def _teacher(config: str) -> dict[str, Any]:
    from distil.demo.stages import _config

    return _config(config).get("teacher") or {}


def splits(name: str, run: DemoRun) -> dict[str, Path]:
    """Column name -> the test file it is scored on."""
    data = run.paths["data"]
    if name == "multi-teacher":
        return {f"{k} numbers": data / s / "test.jsonl" for s, k in SLICES.items()}
    if name == "reward":
        return {"3 numbers": data / "test.jsonl", "4 numbers": data / "four" / "test.jsonl"}
    return {"Accuracy": data / "test.jsonl"}


def compared_on(name: str, r) -> str:
    """The table column a run's comparisons read: the mix (multi-teacher), the slice it trained
    on (reward: four numbers when its data.train is under data/four/), else the accuracy."""
    if name == "multi-teacher":
        return "mix"
    if name == "reward":
        train = str(r.overrides.get("data.train", ""))
        return "4 numbers" if "/four/" in train else "3 numbers"
    return "Accuracy"


def _task(path: Path, n: int, context: str | None):
    """The Countdown task on `path`; with `context`, each problem shown as a teacher with that
    privileged context sees it (the template filled from the problem's row)."""
    from distil.config import EvalConfig

    cfg = EvalConfig(data=str(path), n=n, max_new_tokens=MAX_NEW_TOKENS, batch_size=128,
                     template="countdown_plain")  # fmt: skip
    return Countdown(cfg) if context is None else _ContextCountdown(cfg, context)


class _ContextCountdown(Countdown):
    """Countdown whose prompt is the privileged teacher's: `context` filled from each test row
    (its reference `completion`, the student's `{prompt}`), as training builds it."""

    def __init__(self, cfg, context: str):
        super().__init__(cfg)
        self.context = context

    def load(self):
        from distil.data.context import context_prompt
        from distil.data.datasets import load_examples
        from distil.tasks.prompts import countdown_renderer

        problems, info = super().load()
        render = countdown_renderer(self.cfg.template)
        examples = load_examples(self.cfg.data, render=render, limit=len(problems))
        for problem, e in zip(problems, examples, strict=True):
            problem["shown"] = context_prompt(e, self.context, None)
        return problems, info

    def messages(self, problem):
        return problem["shown"]


def evaluate(name: str, run: DemoRun) -> list[dict[str, dict[str, Any]]]:
    """One seed's rows, per split: the checker's summary. A teacher (shared by the seeds) is
    scored once for its weights: its scores are kept in out/teacher_scores/, one file per
    teacher, under its weights' hash, the splits' and the code (`_teacher_key`)."""
    from distil.eval.runner import evaluate_model, load_problems

    tasks: dict[tuple[str, str | None], tuple] = {}
    shared = run.out / TEACHER_SCORES
    out = []
    for row in rows(name, run):
        key = _teacher_key(name, run, row) if shared_teacher(row) else None
        cached = shared / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json" if key else None
        if cached is not None and cached.is_file():
            out.append(json.loads(cached.read_text())["scores"])
            continue
        scores = {}
        for col, path in splits(name, run).items():
            if (col, row.context) not in tasks:
                task = _task(path, run.preset.n_test, row.context)
                tasks[(col, row.context)] = (task, load_problems(task))
            task, problems = tasks[(col, row.context)]
            r = evaluate_model(str(row.model), task, name=row.label, problems=problems)
            scores[col] = r.summary
        if cached is not None:  # one file per teacher: lanes never merge into one file
            shared.mkdir(exist_ok=True)
            text = json.dumps({"key": key, "scores": scores}, default=str)
            atomic_write(cached, lambda tmp, text=text: Path(tmp).write_text(text))
        console.print(f"{run.tag}{row.label}: " + ", ".join(
            f"{c} {100 * s['accuracy']:.1f}%" for c, s in scores.items()))  # fmt: skip
        out.append(scores)
    return out


def shared_teacher(row: Row) -> bool:
    """A teacher shared by the seeds (trained once; not the privileged row, each seed's start)
    whose weights are there."""
    return (row.label.startswith("teacher") and row.label != PRIVILEGED
            and weights_hash(row.model) is not None)  # fmt: skip


def weights_hash(model: Path) -> str | None:
    """sha256 of a model directory's weights, config and tokenizer: not its training metrics
    (their times differ between bit-identical retrainings); None without weights."""
    files = sorted(f for f in Path(model).glob("*") if f.is_file() and (
        f.suffix == ".safetensors" or f.name in WEIGHT_FILES))  # fmt: skip
    if not any(f.suffix == ".safetensors" for f in files):
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _teacher_key(name: str, run: DemoRun, row: Row) -> str:
    """A teacher's scores are its weights' (and context's) on these splits, by this code."""
    test = {c: content_hash(p) for c, p in splits(name, run).items()}
    return json.dumps([weights_hash(row.model), row.context, run.preset.n_test, test,
                       code_version()])  # fmt: skip


def write_seed_summary(name: str, run: DemoRun) -> dict[str, Any]:
    """One seed's part of the study, whole without its models: each row's scores on the test
    splits and its training summary, each run's start on its dev problems and its curves
    (`curve`), the teachers' hashes. Written to <seed dir>/seed_summary.json when the seed's
    stages end, so that a study cut off between seeds, or continued another day with its models
    gone, reports the seeds it finished (`load_seed_summary`)."""
    from distil.demo.study_plot import start_points

    table_rows = rows(name, run)
    scores = evaluate(name, run)
    trained = [
        training_summary(run, _ReportRow(r.label, str(r.model), str(r.metrics))) for r in table_rows
    ]
    teachers = [r for r in table_rows if shared_teacher(r)]
    runs_dir = run.paths["runs"]
    data = {
        "key": seed_summary_key(name, run),
        "machine": machine(),
        "date": date.today().isoformat(),
        "teachers": {r.label: weights_hash(r.model) for r in teachers},
        "rows": [
            {"label": r.label, "scores": s, "trained": t}
            for r, s, t in zip(table_rows, scores, trained, strict=True)
        ],
    }
    if name == "reward":  # the curves.png of a study whose arms share a budget
        data["starts"] = {key: acc for (_, key), acc in start_points([run]).items()}
        data["curves"] = {
            r.key: curve(runs_dir / r.key / "metrics.jsonl") for r in run.manifest.runs
        }
    text = json.dumps(data, indent=1, default=str) + "\n"
    atomic_write(run.seed_dir / SEED_SUMMARY, lambda tmp: Path(tmp).write_text(text))
    return data


def seed_summary_key(name: str, run: DemoRun) -> dict[str, Any]:
    """What a seed's summary must match to be reused: the study, preset, seed, scale and code."""
    return {"study": name, "preset": run.preset_name, "seed": run.seed,
            "distill_scale": run.distill_scale, "code": code_version()}  # fmt: skip


def load_seed_summary(name: str, run: DemoRun) -> dict[str, Any] | None:
    """The seed's summary when <seed dir>/seed_summary.json holds one made by this code and
    these settings (run_study removes it first without --resume); else None."""
    path = run.seed_dir / SEED_SUMMARY
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    want = seed_summary_key(name, run)
    if data.get("key") != want:
        console.print(f"[dim]{path} was made by other code or settings: {run.tag}runs again "
                      f"(it has {data.get('key')}, this run {want})[/dim]")  # fmt: skip
        return None
    labels = [r.label for r in rows(name, run)]
    if [x["label"] for x in data["rows"]] != labels:
        return None
    return data


def provenance(summaries: list[dict[str, Any]]) -> str:
    """Where the seeds' summaries were made when not all on one day and machine, and whether
    they read the same teachers (a study resumed another day retrains its teachers)."""
    made = {(s["date"], s["machine"]) for s in summaries}
    text = ""
    if len(made) > 1:
        text += "; seeds run on " + ", ".join(
            f"seed {s['key']['seed']}: {s['date']}, {s['machine']}" for s in summaries
        )
    if len({json.dumps(s["teachers"], sort_keys=True) for s in summaries}) > 1:
        text += "; the seeds' teachers differ (retrained: their weights' hashes are not equal)"
    elif len(made) > 1:
        text += "; every seed read the same teachers (equal weights' hashes)"
    return text


def curve(metrics: Path) -> dict[str, Any]:
    """A run's metrics.jsonl as the study's curves and its GRPO signal need it: every in-training
    evaluation, the mean reward at up to CURVE_POINTS evenly spaced windows, and over all its
    windows the mean of each reward metric and the skipped (flat) windows."""
    m = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    evals = [(x["cost/student_flops"], x["eval/accuracy"]) for x in m if "eval/accuracy" in x]
    rewarded = [x for x in m if "reward/mean" in x]
    every = max(1, -(-len(rewarded) // CURVE_POINTS))
    points = rewarded[::every] + (
        [rewarded[-1]] if rewarded and (len(rewarded) - 1) % every else []
    )
    keys = sorted({k for x in rewarded for k in x if k.startswith("reward/")})
    return {
        "evals": evals,
        "rewards": [(x["cost/student_flops"], x["reward/mean"]) for x in points],
        "windows": len(m),
        "reward_windows": len(rewarded),
        "skipped_flat": sum(int(x.get("reward/skipped_flat", 0)) for x in m),
        "reward_means": {k: sum(x.get(k, 0.0) for x in rewarded) / len(rewarded) for k in keys},
    }


def _cell(values: list[float]) -> str:
    mean, sd = mean_sd(values)
    each = "" if len(values) == 1 else " (" + " / ".join(f"{100 * v:.1f}" for v in values) + ")"
    return f"{100 * mean:.1f}" + ("" if sd is None else f" ± {100 * sd:.1f}") + f"%{each}"


def accuracies(name: str, run: DemoRun, scores: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One model's accuracy per column, and on the mix of the columns when there are several."""
    cols = list(splits(name, run))
    out = {c: scores[c]["accuracy"] for c in cols}
    if name == "multi-teacher":
        out["mix"] = sum(scores[c]["correct"] for c in cols) / max(
            sum(scores[c]["total"] for c in cols), 1
        )
    return out


def table(name: str, runs: list[DemoRun], summaries: list[dict[str, Any]]):
    """The Markdown table over the seeds (from their summaries) and its rows as dicts."""
    run = runs[0]
    cols = list(accuracies(name, run, summaries[0]["rows"][0]["scores"]))
    head = ["Model", *cols, "Steps", "Student Cost (TFLOP)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out = []
    for i, row in enumerate(rows(name, run)):
        per_seed = [accuracies(name, run, s["rows"][i]["scores"]) for s in summaries]
        trained = [s["rows"][i]["trained"] for s in summaries]
        flops = [t.get("cost/student_flops") for t in trained]
        teacher = row.label.startswith("teacher")
        steps = sorted({str(t.get("step", "")) for t in trained})
        cells = [row.label, *(_cell([a[c] for a in per_seed]) for c in cols), "-".join(steps)]
        known = [f for f in flops if f is not None]
        cells.append("" if teacher or not known else f"{sum(known) / len(known) / 1e12:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
        out.append({"model": row.label, "accuracy": per_seed, "steps": steps,
                    "student_flops": flops})  # fmt: skip
    return "\n".join(lines), out


def comparisons(name: str, runs: list[DemoRun], table_rows: list[dict]) -> list[dict[str, Any]]:
    """The manifest's comparisons on the mix (multi-teacher) or the accuracy, paired by seed,
    with Holm's adjustment over all of them."""
    run = runs[0]
    by_key = {r.key: r for r in run.manifest.runs}
    acc = {x["model"]: x["accuracy"] for x in table_rows}
    out = []
    for a, b in run.manifest.comparisons:
        metric = compared_on(name, by_key[a])
        xs = [s[metric] for s in acc[run_label(by_key[a])]]
        ys = [s[metric] for s in acc[run_label(by_key[b])]]
        d = paired(xs, ys)
        out.append({"distilled": run_label(by_key[a]), "control": run_label(by_key[b]),
                    "on": metric, "mean": d.mean, "sd": d.sd, "n": d.n,
                    "differences": [x - y for x, y in zip(xs, ys, strict=True)],
                    "ci95": None if d.half_width is None else [d.low, d.high], "p": d.p_value,
                    "verdict": d.verdict})  # fmt: skip
    ps = [x["p"] for x in out]
    if out and None not in ps:
        for x, adjusted in zip(out, holm(ps), strict=True):
            x["p_holm"] = adjusted
            ahead = "ahead" if x["mean"] > 0 else "behind"
            x["verdict"] = (f"significant after Holm, {ahead}" if adjusted < 0.05
                            else "not significant after Holm")  # fmt: skip
    return out


def report(name: str, runs: list[DemoRun], reused: tuple[int, ...] = ()) -> dict[str, Any]:
    """Every seed's summary (written when its stages ended, or now), then results.md and
    results.json under --out; prints the tables. `reused`: the seeds taken from an earlier
    run's summaries (--resume), whose stages and commands that run recorded."""
    run = runs[0]
    with run.timed("the seeds' summaries (their models through the checker)") as stage:
        summaries = [load_seed_summary(name, s) or write_seed_summary(name, s) for s in runs]
        stage.note = f"{len(runs)} seeds' summaries read"
    earlier = ""
    if reused:
        earlier = (f"; seed(s) {', '.join(map(str, reused))} from an earlier run's summaries "
                   "(--resume): their stages and commands are that run's")  # fmt: skip
    md, table_rows = table(name, runs, summaries)
    leads = comparisons(name, runs, table_rows)
    if name == "reward":  # the arms' curves against student compute
        from functools import partial

        from distil.demo.study_plot import plot_arms

        curves = plot_arms(runs, summaries, partial(compared_on, name))
        md += f"\n\nCurves (dev accuracy and each arm's mean reward against student compute): {curves}"
    seeds = "" if len(runs) == 1 else f"; {len(runs)} seeds, mean ± sd (each seed's)"
    head = (
        f"`{run.command or f'distil demo --study {name}'}` (study {name}, preset "
        f"{run.preset_name}), {date.today().isoformat()}, {machine()}, {run.threads} threads; "
        f"{run.preset.n_test} test problems per split, greedy decoding, strict checker{seeds}; "
        f"{COST_NOTE}{provenance(summaries)}{earlier}\n"
    )
    what = {"multi-teacher": "the mix", "reward": "the test split of each run's slice"}.get(
        name, "the test problems"
    )
    text = (f"{md}\n\nPaired leads on {what} (same seed; 95% interval and two-sided p: t with "
            f"N-1 dof; p (Holm) over these comparisons):\n\n{leads_table(leads)}")  # fmt: skip
    (run.out / "results.md").write_text(f"{head}\n{text}\n")
    payload = {"study": name, "preset": run.preset_name, "command": run.command,
               "date": date.today().isoformat(), "machine": machine(), "threads": run.threads,
               "seeds": len(runs), "rows": table_rows, "paired_leads": leads,
               "stages": [s.__dict__ for s in run.stages], "commands": run.commands}  # fmt: skip
    (run.out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\n{head}\n{text}\n", flush=True)
    total = sum(s.seconds for s in run.stages)
    lines = ["where the time went:"]
    lines += [f"  {s.seconds / 60:6.2f} min  {s.name}" for s in run.stages]
    lines.append(f"  {total / 60:6.2f} min  all stages")
    lines.append(f"\nresults: {run.out / 'results.md'}, {run.out / 'results.json'}")
    print("\n".join(lines), flush=True)
    return payload
