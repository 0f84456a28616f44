"""curves.png: held-out accuracy against student compute and training loss against steps, for
every distillation and control run of the demo (each accuracy curve starts at its student's
start, measured on the full test split; later points: the runs' eval subset). One colour per
run, one line per seed; a star marks where a distilled student first reached its continued-SFT
control's final accuracy (compute to match), labelled with the ratio."""

from __future__ import annotations

import json
from pathlib import Path

from distil.demo.run import DemoRun
from distil.demo.summary import curve, matches, ratio_text, run_label, start_label


def plot_curves(runs: list[DemoRun], accuracy: list[dict[str, float]]) -> Path:
    """`accuracy`: per seed, the final accuracy of every row by label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for seeded, acc in zip(runs, accuracy, strict=True):
        first = seeded.seed == 0
        for i, r in enumerate(seeded.manifest.runs):
            color = colors[i % len(colors)]
            label = run_label(r) if first else None
            path = seeded.paths["runs"] / r.key / "metrics.jsonl"
            if not path.exists():
                continue
            points = curve(seeded, r.key, acc.get(start_label(r.student)))
            xs, ys = [x / 1e12 for x, _ in points], [100 * y for _, y in points]
            ax_acc.plot(xs, ys, marker="o", ms=3, color=color, label=label, alpha=0.8)
            m = [json.loads(x) for x in path.read_text().splitlines()]
            ax_loss.plot(
                [x["step"] for x in m], [x["loss"] for x in m], color=color, label=label, alpha=0.8
            )
        _mark_matches(ax_acc, seeded, acc)
    ax_acc.set(
        xlabel="student compute (TFLOP: 2 N (3 train + prefill + generated tokens))",
        ylabel="accuracy (%)",
        title="held-out Countdown accuracy (subset); * compute to match SFT",
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
    out = runs[0].out / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _mark_matches(ax, run: DemoRun, accuracy: dict[str, float]) -> None:
    for m in matches(run, accuracy).values():
        if m["distilled_flops"] is None:
            continue
        x, y = m["distilled_flops"] / 1e12, 100 * m["target_accuracy"]
        ax.plot([x], [y], marker="*", ms=12, color="black", zorder=5)
        ax.annotate(ratio_text(m), (x, y), textcoords="offset points", xytext=(4, 6))
