"""The demo's results: every model through the Countdown checker, the table (accuracy, the share
of the teacher-student gap each student recovered, optimizer steps, student compute), JSON,
Markdown, a plot, and where the time went."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from distil.demo.run import TEACHER_SUMMARY, DemoRun, last_metrics
from distil.demo.summary import (
    MATCH_NOTE,
    aggregate,
    analysis_note,
    leads_table,
    matches,
    paired_leads,
    ratio_text,
    run_label,
    seeds_table,
    start_label,
)
from distil.progress import console

TEACHER = "teacher (bpe)"
COST_NOTE = (
    "student cost: 2 N (3 T_train + T_prefill + T_gen) FLOPs counted from tokens "
    "(N student parameters; T_train tokens through its training forward+backward, T_prefill "
    "prompt tokens it prefilled, T_gen tokens it sampled; cost/student_flops in metrics.jsonl); "
    "the controls train until they have spent the distillation's (to the first step past it)"
)


@dataclass(frozen=True)
class Row:
    label: str
    model: str  # model dir, relative to the demo's output
    metrics: str  # the training run that made it (its metrics.jsonl), relative
    start: str | None = None  # the row whose accuracy the gap is measured from
    curve: bool = False


def rows(run: DemoRun) -> list[Row]:
    """The table's rows for the run's seed: the teacher, then per student its start and its
    runs, in the order of configs/demo.yaml (paths relative to --out)."""
    p = run.paths

    def rel(path: Path) -> str:
        return str(path.relative_to(run.out))

    teacher = rel(p["teacher"])
    out = [Row(TEACHER, teacher, teacher)]
    for name in run.manifest.students:
        start = start_label(name)
        models, runs = p["models"] / f"student_{name}_start", p["runs"] / f"student_{name}_start"
        out.append(Row(start, rel(models), rel(runs)))
        for r in run.manifest.runs:
            if r.student == name:
                d = p["runs"] / r.key
                out.append(Row(run_label(r), rel(d / "final"), rel(d), start, True))
    return out


def evaluate_all(runs: list[DemoRun]) -> list[list]:
    """Every row of every seed through the checker (the shared teacher once): per seed, the
    results in row order."""
    from distil.config import EvalConfig
    from distil.eval.runner import evaluate_model, load_problems
    from distil.tasks.countdown import Countdown

    run = runs[0]

    task = Countdown(
        EvalConfig(
            data=str(run.paths["data"] / "test.jsonl"),
            n=run.preset.n_test,
            max_new_tokens=32,
            batch_size=128,
            template="countdown_plain",
        )
    )
    problems = load_problems(task)
    done: dict[str, Any] = {}
    out = []
    for seeded in runs:
        results = []
        for row in rows(seeded):
            if row.model not in done:
                model = str(run.out / row.model)
                done[row.model] = evaluate_model(model, task, name=row.label, problems=problems)
                console.print(
                    f"{seeded.tag}{row.label}: {100 * done[row.model].summary['accuracy']:.1f}%"
                )
            results.append(done[row.model])
        out.append(results)
    return out


def training_summary(run: DemoRun, row: Row) -> dict[str, Any]:
    """The last metrics of the run that trained the row's model (the teacher's are kept with
    the cached model)."""
    path = run.out / row.metrics
    if (path / TEACHER_SUMMARY).exists():
        return json.loads((path / TEACHER_SUMMARY).read_text())
    return last_metrics(path)


def table(run: DemoRun, results: list) -> tuple[str, list[dict[str, Any]]]:
    """One seed's Markdown table and the same rows as dicts (with the checker's categories
    and, for a distilled student, its compute to match its continued-SFT control)."""
    acc = {r.name: r.summary["accuracy"] for r in results}
    match = matches(run, acc)
    head = ["Model", "Accuracy", "Gap Recovered", "Steps", "Student Cost (TFLOP)"]
    head.append("Compute to Match")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out = []
    for row, r in zip(rows(run), results, strict=True):
        s = r.summary
        summary = training_summary(run, row)
        start = acc.get(row.start) if row.start else None
        gap = None
        if start is not None and acc[TEACHER] != start:
            gap = (s["accuracy"] - start) / (acc[TEACHER] - start)
        flops = summary.get("cost/student_flops")
        cells = [
            row.label,
            f"{100 * s['accuracy']:.1f}% ({s['correct']}/{s['total']})",
            "" if gap is None else f"{100 * gap:.0f}%",
            str(summary["step"]),
            "" if flops is None else f"{flops / 1e12:.3g}",
            ratio_text(match[row.label]) if row.label in match else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
        out.append(
            {
                "model": row.label,
                "path": row.model,
                **s,
                "gap_recovered": gap,
                "steps": summary["step"],
                "student_flops": flops,
                "teacher_flops": summary.get("cost/teacher_flops"),
                **({"compute_to_match": match[row.label]} if row.label in match else {}),
            }
        )
    return "\n".join(lines), out


def machine() -> str:
    """CPU model, cores, Python and torch versions: results are exact for one machine and
    thread count."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def header(run: DemoRun) -> str:
    scale = "" if run.distill_scale == 1 else f", distillation budgets x{run.distill_scale:g}"
    seeds = (
        ""
        if run.n_seeds == 1
        else f"; {run.n_seeds} seeds (data order, sampling, the starts' init; one teacher), "
        "accuracy as mean ± sd (each seed's)"
    )
    return (
        f"`{run.command or 'distil demo'}` (preset {run.preset_name}{scale}), "
        f"{date.today().isoformat()}, {machine()}, {run.threads} threads; "
        f"{run.preset.n_test} held-out problems, greedy decoding, strict checker{seeds}; "
        f"{COST_NOTE}; {MATCH_NOTE}\n"
    )


LEADS_HEAD = (
    "Paired lead of each distilled student over each of its equal-cost controls (same seed; "
    "accuracy points on the test problems; 95% interval and two-sided p: Student's t with N-1 "
    "dof; p (Holm): adjusted over every comparison of the table)"
)


def write_outputs(runs: list[DemoRun], results: list[list]) -> dict[str, Any]:
    run = runs[0]
    per_seed = []
    for seeded, seed_results in zip(runs, results, strict=True):
        md, table_rows = table(seeded, seed_results)
        per_seed.append(table_rows)
    agg = aggregate(per_seed)
    if len(runs) > 1:
        md = seeds_table(agg)
    leads = paired_leads(run, per_seed)
    head = header(run)
    note = analysis_note(run)
    text = f"{md}\n\n{LEADS_HEAD}" + (f"; {note}" if note else "") + f":\n\n{leads_table(leads)}"
    verdicts = [
        (f"{seeded.tag}{r.name}", r.summary)
        for seeded, seed_results in zip(runs, results, strict=True)
        for r in seed_results
        if seeded.seed == 0 or r.name != TEACHER
    ]
    (run.out / "results.md").write_text(f"{head}\n{text}\n\n{categories(verdicts)}\n")
    payload = {
        "preset": run.preset_name,
        "distill_scale": run.distill_scale,
        "command": run.command,
        "date": date.today().isoformat(),
        "machine": machine(),
        "threads": run.threads,
        "seeds": len(runs),
        "rows": per_seed[0] if len(runs) == 1 else agg,
        "paired_leads": leads,
        "lanes": run.lanes,
        "stages": [s.__dict__ for s in run.stages],
        # seconds since the demo started (its stages' sum with one lane, less with several)
        "wall_seconds": time.perf_counter() - run.t0,
        "commands": run.commands,
    }
    (run.out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    from distil.demo.plot import plot_curves

    plot = plot_curves(runs, [{r.name: r.summary["accuracy"] for r in x} for x in results])
    print(f"\n{head}\n{text}\n", flush=True)  # stdout, unwrapped: the table is the result
    _print_summary(run, plot, payload["wall_seconds"])
    return payload


def categories(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The checker's verdicts per model (why the wrong answers were wrong): (name, summary)."""
    from distil.tasks.countdown import COLUMNS

    head = ["Model", "Correct", *(c for c, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, s in results:
        cells = [name, f"{s['correct']}/{s['total']}", *(str(s[k]) for _, k in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _print_summary(run: DemoRun, plot: Path | None, wall: float) -> None:
    total = sum(s.seconds for s in run.stages)
    lines = ["where the time went:"]
    for s in run.stages:
        lines.append(f"  {s.seconds / 60:6.2f} min  {s.name}" + (f"  ({s.note})" if s.note else ""))
    if run.lanes > 1:
        lines.append(f"  {total / 60:6.2f} min  all stages (the students' in {run.lanes} lanes)")
    lines.append(f"  {wall / 60:6.2f} min  total, on the clock")
    lines.append(
        f"\nresults: {run.out / 'results.md'}, {run.out / 'results.json'}"
        + (f", {plot}" if plot else "")
    )
    lines.append(
        f"models (Hugging Face format): {run.paths['models']}/*, "
        f"{run.paths['runs']}/*/final; metrics: {run.paths['runs']}/*/metrics.jsonl"
    )
    lines.append("\nreproduce any step:")
    lines += [f"  {cmd}" for cmd in run.commands]
    first = run.manifest.runs[0].key
    lines.append(
        f"  distil eval --model {run.paths['runs']}/{first}/final "
        f"--data {run.paths['data']}/test.jsonl --n {run.preset.n_test}"
    )
    print("\n".join(lines), flush=True)
