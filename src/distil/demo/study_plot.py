"""curves.png of a study whose arms share a budget (`distil demo --study reward`): per slice and
student, each arm's held-out accuracy (its in-training evaluations on the dev split, from its
start's accuracy on that slice's test split at 0) and the mean reward of its on-policy samples
(`reward/mean`, logged every step), both against student compute. One colour per arm, one
line per seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distil.demo.run import DemoRun
from distil.demo.summary import start_label


def _metrics(run: DemoRun, key: str) -> list[dict[str, Any]]:
    path = run.paths["runs"] / key / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def panels(runs: list[DemoRun], column_of) -> dict[tuple[str, str], list]:
    """(column, student) -> the runs of that panel, in manifest order; `column_of(r)` names the
    table column (slice) a run trained on."""
    out: dict[tuple[str, str], list] = {}
    for r in runs[0].manifest.runs:
        out.setdefault((column_of(r), r.student), []).append(r)
    return out


def plot_arms(runs: list[DemoRun], table_rows: list[dict], column_of) -> Path:
    """Write and return out/curves.png. `table_rows`: the study table's rows (per seed, the
    accuracy per column by model label), for each curve's starting point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = panels(runs, column_of)
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 7.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arms = list(dict.fromkeys(r.config for r in runs[0].manifest.runs))
    acc = {x["model"]: x["accuracy"] for x in table_rows}
    for col, ((column, student), members) in enumerate(groups.items()):
        top, bottom = axes[0][col], axes[1][col]
        for r in members:
            color = colors[arms.index(r.config) % len(colors)]
            for k, seeded in enumerate(runs):
                m = _metrics(seeded, r.key)
                start = acc.get(start_label(student), [{}] * len(runs))[k].get(column)
                evals = [(x["cost/student_flops"], x["eval/accuracy"]) for x in m
                         if "eval/accuracy" in x]  # fmt: skip
                points = ([(0.0, start)] if start is not None else []) + evals
                label = r.label if k == 0 else None
                top.plot([x / 1e12 for x, _ in points], [100 * y for _, y in points],
                         marker="o", ms=3, color=color, alpha=0.8, label=label)  # fmt: skip
                rewards = [(x["cost/student_flops"], x["reward/mean"]) for x in m
                           if "reward/mean" in x]  # fmt: skip
                bottom.plot([x / 1e12 for x, _ in rewards], [y for _, y in rewards],
                            color=color, alpha=0.6, lw=1)  # fmt: skip
        top.set(title=f"{student} student, {column}", ylabel="dev accuracy (%)")
        bottom.set(xlabel="student compute (TFLOP)", ylabel="mean reward of its samples")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=7)
    fig.suptitle("each arm at its panel's distillation arm's student compute", fontsize=10)
    fig.tight_layout()
    out = runs[0].out / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
