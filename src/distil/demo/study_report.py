"""The tables of `distil demo --study NAME` (studies.py): every model through the Countdown
checker on each held-out split the study names, with the optimizer steps and the student
compute of the run that made it; Markdown and JSON under --out.

- multi-teacher: accuracy on the three-number test split, the four-number one and their mix
  (all problems of both; the slices have equally many), teachers first.
- self-distill: accuracy on the demo's held-out (three-number) problems.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from distil.demo.report import COST_NOTE, machine, training_summary
from distil.demo.report import Row as _ReportRow
from distil.demo.run import DemoRun
from distil.demo.summary import run_label, start_label
from distil.progress import console

# the multi-teacher study's slices: name -> numbers per problem (the teacher of each, the
# `slice` column the student's rows are routed by)
SLICES = {"three": 3, "four": 4}
SLICE_COLUMN = "slice"
MAX_NEW_TOKENS = 40  # a four-number answer in the bpe tokens is under 20


@dataclass(frozen=True)
class Row:
    label: str
    model: Path
    metrics: Path  # the run that made it (its metrics.jsonl), or a teacher's final dir


def rows(name: str, run: DemoRun) -> list[Row]:
    """Teachers (multi-teacher), then the student's start and each run, in manifest order."""
    p = run.paths
    out = []
    if name == "multi-teacher":
        for s, k in SLICES.items():
            out.append(Row(f"teacher ({k}-number slice)", p["models"] / f"teacher_{s}",
                           p["models"] / f"teacher_{s}"))  # fmt: skip
    for student in run.manifest.students:
        out.append(Row(start_label(student), p["models"] / f"student_{student}_start",
                       p["runs"] / f"student_{student}_start"))  # fmt: skip
        for r in run.manifest.runs:
            if r.student == student:
                d = p["runs"] / r.key
                out.append(Row(run_label(r), d / "final", d))
    return out


def splits(name: str, run: DemoRun) -> dict[str, Path]:
    """Column name -> the held-out file it is scored on."""
    data = run.paths["data"]
    if name == "multi-teacher":
        return {f"{k} numbers": data / s / "test.jsonl" for s, k in SLICES.items()}
    return {"Accuracy": data / "test.jsonl"}


def evaluate(name: str, run: DemoRun) -> list[dict[str, dict[str, Any]]]:
    """Per row, per split: the checker's summary (correct, total, accuracy, categories)."""
    from distil.config import EvalConfig
    from distil.eval.runner import evaluate_model, load_problems
    from distil.tasks.countdown import Countdown

    tasks = {}
    for col, path in splits(name, run).items():
        cfg = EvalConfig(data=str(path), n=run.preset.n_test, max_new_tokens=MAX_NEW_TOKENS,
                         batch_size=128, template="countdown_plain")  # fmt: skip
        task = Countdown(cfg)
        tasks[col] = (task, load_problems(task))
    out = []
    for row in rows(name, run):
        scores = {}
        for col, (task, problems) in tasks.items():
            r = evaluate_model(str(row.model), task, name=row.label, problems=problems)
            scores[col] = r.summary
        console.print(f"{row.label}: " + ", ".join(
            f"{c} {100 * s['accuracy']:.1f}%" for c, s in scores.items()))  # fmt: skip
        out.append(scores)
    return out


def _cell(correct: int, total: int) -> str:
    return f"{100 * correct / max(total, 1):.1f}% ({correct}/{total})"


def table(name: str, run: DemoRun, scores: list[dict[str, dict[str, Any]]]):
    """The Markdown table and its rows as dicts."""
    cols = list(splits(name, run))
    mix = len(cols) > 1
    head = ["Model", *cols, *(["mix"] if mix else []), "Steps", "Student Cost (TFLOP)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out = []
    for row, s in zip(rows(name, run), scores, strict=True):
        summary = training_summary(run, _ReportRow(row.label, str(row.model), str(row.metrics)))
        flops = summary.get("cost/student_flops")
        cells = [row.label, *(_cell(s[c]["correct"], s[c]["total"]) for c in cols)]
        correct, total = sum(s[c]["correct"] for c in cols), sum(s[c]["total"] for c in cols)
        if mix:
            cells.append(_cell(correct, total))
        teacher = row.label.startswith("teacher")
        cells += [
            str(summary.get("step", "")),
            "" if flops is None or teacher else f"{flops / 1e12:.3g}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
        out.append({"model": row.label, "path": str(row.model.relative_to(run.out)),
                    "accuracy": {c: s[c]["accuracy"] for c in cols}, "correct": correct,
                    "total": total, "mix_accuracy": correct / max(total, 1),
                    "steps": summary.get("step"), "student_flops": flops})  # fmt: skip
    return "\n".join(lines), out


def report(name: str, run: DemoRun) -> dict[str, Any]:
    """Evaluate every row, write results.md and results.json under --out, print the table."""
    with run.timed("evaluation of every model") as stage:
        scores = evaluate(name, run)
        stage.note = f"{len(scores)} models x {len(splits(name, run))} test splits"
    md, table_rows = table(name, run, scores)
    head = (
        f"`{run.command or f'distil demo --study {name}'}` (study {name}, preset "
        f"{run.preset_name}), {date.today().isoformat()}, {machine()}, {run.threads} threads; "
        f"{run.preset.n_test} held-out problems per split, greedy decoding, strict checker; "
        f"{COST_NOTE}\n"
    )
    (run.out / "results.md").write_text(f"{head}\n{md}\n")
    payload = {
        "study": name,
        "preset": run.preset_name,
        "command": run.command,
        "date": date.today().isoformat(),
        "machine": machine(),
        "threads": run.threads,
        "rows": table_rows,
        "stages": [s.__dict__ for s in run.stages],
        "commands": run.commands,
    }
    (run.out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\n{head}\n{md}\n", flush=True)
    total = sum(s.seconds for s in run.stages)
    lines = ["where the time went:"]
    lines += [f"  {s.seconds / 60:6.2f} min  {s.name}" for s in run.stages]
    lines.append(f"  {total / 60:6.2f} min  total")
    lines.append(f"\nresults: {run.out / 'results.md'}, {run.out / 'results.json'}")
    print("\n".join(lines), flush=True)
    return payload
