"""curves.png of a study whose arms share a budget (`distil demo --study reward`): per slice and
student, each arm's held-out accuracy (its in-training evaluations on the dev split, from its
start's accuracy on the same dev problems at 0: `start_points`) and the mean reward of its
on-policy samples (`reward/mean`, logged every step), both against student compute. One colour
per arm, one line per seed. The test split is read only by the study's table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distil.demo.run import DemoRun
from distil.demo.summary import start_label


def panels(runs: list[DemoRun], column_of) -> dict[tuple[str, str], list]:
    """(column, student) -> the runs of that panel, in manifest order; `column_of(r)` names the
    table column (slice) a run trained on."""
    out: dict[tuple[str, str], list] = {}
    for r in runs[0].manifest.runs:
        out.setdefault((column_of(r), r.student), []).append(r)
    return out


def start_points(runs: list[DemoRun]) -> dict[tuple[int, str], float]:
    """(seed index, run key) -> the accuracy of the run's start (its student's SFT start) on the
    problems the run evaluates during training: its recorded config's eval section (the dev
    split of its slice, eval.n, the run's template), so a curve starts on the split of its
    other points. Each (start, problems) is evaluated once; a run not trained has none."""
    from distil.config import load_config
    from distil.eval.runner import evaluate_model
    from distil.train.evaluation import eval_set as eval_problems

    done: dict[tuple[str, str], float] = {}
    out = {}
    for k, seeded in enumerate(runs):
        for r in seeded.manifest.runs:
            config = seeded.paths["runs"] / r.key / "config.yaml"
            if not config.exists():
                continue
            task, problems = eval_problems(load_config(config))
            start = str(seeded.paths["models"] / f"student_{r.student}_start")
            key = (start, task.cfg.model_dump_json())
            if key not in done:
                result = evaluate_model(start, task, name=start_label(r.student),
                                        problems=problems, progress=False)  # fmt: skip
                done[key] = result.summary["accuracy"]
            out[(k, r.key)] = done[key]
    return out


def plot_arms(runs: list[DemoRun], summaries: list[dict[str, Any]], column_of) -> Path:
    """Write and return out/curves.png from the seeds' summaries (study_report.write_seed_summary:
    each run's `curve` and its start's point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = panels(runs, column_of)
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 7.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arms = list(dict.fromkeys(r.config for r in runs[0].manifest.runs))
    for col, ((column, student), members) in enumerate(groups.items()):
        top, bottom = axes[0][col], axes[1][col]
        for r in members:
            color = colors[arms.index(r.config) % len(colors)]
            for k, summary in enumerate(summaries):
                c = summary["curves"].get(r.key) or {"evals": [], "rewards": []}
                start = summary["starts"].get(r.key)
                points = ([(0.0, start)] if start is not None else []) + list(
                    map(tuple, c["evals"])
                )
                label = r.label if k == 0 else None
                top.plot([x / 1e12 for x, _ in points], [100 * y for _, y in points],
                         marker="o", ms=3, color=color, alpha=0.8, label=label)  # fmt: skip
                rewards = c["rewards"]
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
