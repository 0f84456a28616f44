"""curves.png: held-out accuracy against student compute and training loss against steps, for
every distillation and control run of the demo (each accuracy curve starts at its student's
start, measured on the full test split; later points: the runs' eval subset)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distil.demo.run import DemoRun


def plot_curves(run: DemoRun, rows: list[Any], accuracy: dict[str, float]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in rows:
        path = run.out / row.metrics / "metrics.jsonl"
        if not row.curve or not path.exists():
            continue
        m = [json.loads(x) for x in path.read_text().splitlines()]
        ev = [x for x in m if "eval/accuracy" in x]
        xs = [0.0] + [x["cost/student_flops"] / 1e12 for x in ev]
        ys = [100 * accuracy.get(row.start, float("nan"))] + [100 * x["eval/accuracy"] for x in ev]
        ax_acc.plot(xs, ys, marker="o", ms=3, label=row.label)
        ax_loss.plot([x["step"] for x in m], [x["loss"] for x in m], label=row.label)
    ax_acc.set(
        xlabel="student compute (TFLOP: 2 N (3 train + prefill + generated tokens))",
        ylabel="accuracy (%)",
        title="held-out Countdown accuracy (subset)",
    )
    ax_loss.set(
        xlabel="optimizer step",
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
