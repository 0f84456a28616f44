"""The demo's results: every model through the Countdown checker, the table (with the share of
the teacher-student gap each student recovered), JSON, Markdown, a plot, and where the time went."""

from __future__ import annotations

import json
import platform
from datetime import date
from pathlib import Path
from typing import Any

from distil.demo import DemoRun
from distil.eval.runner import COLUMNS, EvalResult
from distil.progress import console

# (row label, model dir under models/ or runs/<name>/final, student start it is measured from)
ROWS = [
    ("teacher (bpe)", "models/teacher", None),
    ("char student: start (SFT on labelled set)", "models/student_char_start", None),
    (
        "char student: on-policy distilled, cross-tokenizer",
        "runs/distill_cross_tokenizer/final",
        "char student: start (SFT on labelled set)",
    ),
    (
        "char student: control, sequence-level KD",
        "runs/control_seqkd/final",
        "char student: start (SFT on labelled set)",
    ),
    (
        "char student: control, continued SFT",
        "runs/control_sft/final",
        "char student: start (SFT on labelled set)",
    ),
    ("bpe student: start (SFT on labelled set)", "models/student_bpe_start", None),
    (
        "bpe student: on-policy distilled, same tokenizer",
        "runs/distill_same_tokenizer/final",
        "bpe student: start (SFT on labelled set)",
    ),
]
CHAR_START, BPE_START = ROWS[1][0], ROWS[5][0]
# run -> (legend, the row whose accuracy is the curve's starting point)
CURVES = {
    "distill_cross_tokenizer": ("char: distilled (cross-tokenizer, aligned_kl)", CHAR_START),
    "control_seqkd": ("char: seq-KD control (cross-entropy)", CHAR_START),
    "control_sft": ("char: SFT control (cross-entropy)", CHAR_START),
    "distill_same_tokenizer": ("bpe: distilled (same tokenizer, reverse KL)", BPE_START),
}


def evaluate_all(run: DemoRun) -> list[EvalResult]:
    from distil.config import EvalConfig
    from distil.eval.runner import evaluate_model, load_problems

    cfg = EvalConfig(
        data=str(run.paths["data"] / "test.jsonl"),
        n=run.preset.n_test,
        max_new_tokens=32,
        batch_size=128,
        template="countdown_plain",
    )
    problems = load_problems(cfg)
    results = []
    for label, rel, _ in ROWS:
        results.append(evaluate_model(str(run.out / rel), cfg, name=label, problems=problems))
        console.print(f"{label}: {100 * results[-1].summary['accuracy']:.1f}%")
    return results


def table(results: list[EvalResult]) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table with a Gap Recovered column, and the same rows as dicts."""
    acc = {r.name: r.summary["accuracy"] for r in results}
    teacher = acc[ROWS[0][0]]
    head = ["Model", "Correct", "Accuracy", *(c for c, _ in COLUMNS), "Gap Recovered"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    rows = []
    for (label, rel, start), r in zip(ROWS, results, strict=True):
        s = r.summary
        gap = None
        if start is not None and teacher != acc[start]:
            gap = (s["accuracy"] - acc[start]) / (teacher - acc[start])
        cells = [label, f"{s['correct']}/{s['total']}", f"{100 * s['accuracy']:.1f}%"]
        cells += [str(s[key]) for _, key in COLUMNS]
        cells.append("" if gap is None else f"{100 * gap:.0f}%")
        lines.append("| " + " | ".join(cells) + " |")
        rows.append({"model": label, "path": rel, **s, "gap_recovered": gap})
    return "\n".join(lines), rows


def write_outputs(run: DemoRun, results: list[EvalResult]) -> dict[str, Any]:
    md, rows = table(results)
    machine = f"{platform.machine()}, {run.threads} threads, {platform.python_version()}"
    header = (
        f"distil demo ({run.preset_name}), {date.today().isoformat()}, {machine}; "
        f"{run.preset.n_test} held-out problems, greedy decoding, strict checker\n\n"
    )
    (run.out / "results.md").write_text(header + md + "\n")
    payload = {
        "preset": run.preset_name,
        "date": date.today().isoformat(),
        "machine": machine,
        "rows": rows,
        "stages": [s.__dict__ for s in run.stages],
        "commands": run.commands,
    }
    (run.out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot = plot_curves(run, {r.name: r.summary["accuracy"] for r in results})
    print(f"\n{header}{md}\n", flush=True)  # stdout, unwrapped: the table is the result
    _print_summary(run, plot)
    return payload


def plot_curves(run: DemoRun, start_accuracy: dict[str, float]) -> Path | None:
    """Accuracy and training loss against the training clock for each student run; each
    accuracy curve starts at its student's start (full test set; later points: a subset)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, (label, start) in CURVES.items():
        path = run.paths["runs"] / name / "metrics.jsonl"
        if not path.exists():
            continue
        m = [json.loads(x) for x in path.read_text().splitlines()]
        ev = [x for x in m if "eval/accuracy" in x]
        xs = [0.0] + [x["time/train_clock"] for x in ev]
        ys = [100 * start_accuracy.get(start, float("nan"))]
        ys += [100 * x["eval/accuracy"] for x in ev]
        ax_acc.plot(xs, ys, marker="o", ms=3, label=label)
        ax_loss.plot([x["time/train_clock"] for x in m], [x["loss"] for x in m], label=label)
    ax_acc.set(
        xlabel="training clock (s, evaluation excluded)",
        ylabel="accuracy (%)",
        title="held-out Countdown accuracy (subset)",
    )
    ax_loss.set(
        xlabel="training clock (s)",
        ylabel="training loss",
        yscale="log",
        title="training loss (each run's own objective)",
    )
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = run.out / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _print_summary(run: DemoRun, plot: Path | None) -> None:
    total = sum(s.seconds for s in run.stages)
    lines = ["where the time went (training clocks exclude evaluation):"]
    for s in run.stages:
        lines.append(f"  {s.seconds / 60:6.2f} min  {s.name}" + (f"  ({s.note})" if s.note else ""))
    lines.append(f"  {total / 60:6.2f} min  total")
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
    lines.append(
        f"  distil eval --model {run.paths['runs']}/distill_cross_tokenizer/final "
        f"--data {run.paths['data']}/test.jsonl --n {run.preset.n_test}"
    )
    print("\n".join(lines), flush=True)
