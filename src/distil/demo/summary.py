"""The demo's numbers beyond one model's accuracy: each distilled student's compute to match its
continued-SFT control (from the curves the runs record), the rows over seeds (mean ± sd), and
each distilled student's paired lead over each of its controls with a 95% interval."""

from __future__ import annotations

import json
import math
from typing import Any

from distil.demo.presets import Run
from distil.demo.run import DemoRun
from distil.demo.stats import compute_to_match, holm, match_ratio, mean_sd, paired

MATCH_NOTE = (
    "compute to match: the continued-SFT control's student compute / the distilled student's "
    "compute when its accuracy curve (the runs' held-out eval subset, linear interpolation "
    "between evaluations, from its start at 0) first reaches the control's final accuracy on "
    "that subset; > 1: distillation needed less compute"
)


def start_label(student: str) -> str:
    return f"{student} student: start (SFT on labelled set)"


def run_label(r: Run) -> str:
    return f"{r.student} student: {r.label}"


def distilled_runs(run: DemoRun) -> list[Run]:
    """The distillation runs (a step budget), in table order."""
    return [r for r in run.manifest.runs if r.steps is not None]


def controls_of(run: DemoRun, distilled: Run) -> list[Run]:
    """The runs given `distilled`'s student compute (its equal-cost controls)."""
    return [r for r in run.manifest.runs if r.cost_of == distilled.key]


def curve(run: DemoRun, key: str, start: float | None) -> list[tuple[float, float]]:
    """(student FLOPs, held-out accuracy) of runs/<key>: its start's accuracy at 0 (when
    given), then every in-training evaluation."""
    path = run.paths["runs"] / key / "metrics.jsonl"
    points = [] if start is None else [(0.0, start)]
    if path.exists():
        for line in path.read_text().splitlines():
            m = json.loads(line)
            if "eval/accuracy" in m:
                points.append((m["cost/student_flops"], m["eval/accuracy"]))
    return points


def matches(run: DemoRun, accuracy: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per distilled row (by label): the compute at which it first reached its continued-SFT
    control's final accuracy, and the ratio control / distilled compute."""
    out = {}
    for r in distilled_runs(run):
        sft = [c for c in controls_of(run, r) if c.config == "control_sft"]
        if not sft:
            continue
        start = accuracy.get(start_label(r.student))
        control = curve(run, sft[0].key, start)
        if len(control) < 2:
            continue  # the control never evaluated: nothing to match
        control_flops, target = control[-1]
        flops = compute_to_match(curve(run, r.key, start), target)
        ratio = match_ratio(control_flops, flops)
        status = "not reached" if ratio is None else "at start" if math.isinf(ratio) else "reached"
        out[run_label(r)] = {
            "control": run_label(sft[0]),
            "target_accuracy": target,
            "control_flops": control_flops,
            "distilled_flops": flops,
            "ratio": ratio if status == "reached" else None,  # JSON has no infinity
            "status": status,
        }
    return out


def ratio_text(match: dict[str, Any]) -> str:
    """'3.1x', 'not reached' or 'at start' (the start already had the control's accuracy)."""
    return f"{match['ratio']:.2g}x" if match["status"] == "reached" else match["status"]


def _ratio_cell(found: list[dict[str, Any]]) -> str:
    if not found:
        return ""
    each = " / ".join(ratio_text(x) for x in found)
    if len(found) == 1 or any(x["status"] != "reached" for x in found):
        return each
    m, sd = mean_sd([x["ratio"] for x in found])
    return f"{m:.2g} ± {sd:.2g}x ({each})"


# ----------------------------------------------------------------------------- over seeds


def aggregate(per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per model over the seeds: mean and sd of accuracy and gap recovered, the steps
    and compute, the compute-to-match ratios, and the per-seed rows."""
    out = []
    for i, first in enumerate(per_seed[0]):
        seeds = [t[i] for t in per_seed]
        acc, acc_sd = mean_sd([s["accuracy"] for s in seeds])
        gaps = [s["gap_recovered"] for s in seeds if s["gap_recovered"] is not None]
        gap, gap_sd = mean_sd(gaps) if gaps else (None, None)
        flops = [s["student_flops"] for s in seeds if s["student_flops"] is not None]
        out.append(
            {
                "model": first["model"],
                "accuracy": acc,
                "accuracy_sd": acc_sd,
                "gap_recovered": gap,
                "gap_recovered_sd": gap_sd,
                "steps": [s["steps"] for s in seeds],
                "student_flops": sum(flops) / len(flops) if flops else None,
                "compute_to_match": [
                    s["compute_to_match"] for s in seeds if "compute_to_match" in s
                ],
                "per_seed": seeds,
            }
        )
    return out


def _pm(mean: float | None, sd: float | None, scale: float = 100) -> str:
    if mean is None:
        return ""
    return f"{scale * mean:.1f}" + ("" if sd is None else f" ± {scale * sd:.1f}") + "%"


def seeds_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of aggregate() rows (mean ± sd, then each seed's accuracy)."""
    head = ["Model", "Accuracy", "Gap Recovered", "Steps", "Student Cost (TFLOP)"]
    head.append("Compute to Match")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        each = " / ".join(f"{100 * s['accuracy']:.1f}" for s in row["per_seed"])
        steps = sorted(set(row["steps"]))
        cells = [
            row["model"],
            f"{_pm(row['accuracy'], row['accuracy_sd'])} ({each})",
            _pm(row["gap_recovered"], row["gap_recovered_sd"]),
            str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}",
            "" if row["student_flops"] is None else f"{row['student_flops'] / 1e12:.3g}",
            _ratio_cell(row["compute_to_match"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_leads(run: DemoRun, per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each distilled student's accuracy minus each of its controls', paired by seed, with the
    two-sided p of the paired t test and, over every comparison, Holm's adjusted p; the verdict
    is the pre-stated analysis' (configs/demo.yaml `analysis`) when it has one."""
    out = []
    for r in distilled_runs(run):
        mine = _accuracies(per_seed, run_label(r))
        for c in controls_of(run, r):
            theirs = _accuracies(per_seed, run_label(c))
            d = paired(mine, theirs)
            out.append(
                {
                    "distilled": run_label(r),
                    "control": run_label(c),
                    "differences": [a - b for a, b in zip(mine, theirs, strict=True)],
                    "mean": d.mean,
                    "sd": d.sd,
                    "n": d.n,
                    "ci95": None if d.half_width is None else [d.low, d.high],
                    "p": d.p_value,
                    "verdict": d.verdict,
                }
            )
    ps = [x["p"] for x in out]
    if out and None not in ps:
        alpha = run.manifest.analysis.alpha if run.manifest.analysis else 0.05
        for x, adjusted in zip(out, holm(ps), strict=True):
            x["p_holm"] = adjusted
            x["verdict"] = _verdict(x["mean"], adjusted, alpha)
    return out


def _verdict(mean: float, p_holm: float, alpha: float) -> str:
    if p_holm >= alpha:
        return "not significant after Holm"
    return "significant after Holm, ahead" if mean > 0 else "significant after Holm, behind"


def analysis_note(run: DemoRun) -> str:
    """What the leads table tests, and whether this run is the pre-stated analysis."""
    a = run.manifest.analysis
    if a is None:
        return ""
    stated = (
        f"the pre-stated analysis (configs/demo.yaml): {a.seeds} seeds, every distilled "
        f"student against each of its equal-compute controls, paired t, two-sided, "
        f"{a.correction.capitalize()}-adjusted over the {len(distilled_pairs(run))} "
        f"comparisons, a win at adjusted p < {a.alpha:g} with a positive lead"
    )
    if run.n_seeds != a.seeds:
        return f"{stated}; THIS RUN HAS {run.n_seeds} SEED(S): exploratory, not that analysis"
    return stated


def distilled_pairs(run: DemoRun) -> list[tuple[Run, Run]]:
    return [(r, c) for r in distilled_runs(run) for c in controls_of(run, r)]


def _accuracies(per_seed: list[list[dict[str, Any]]], label: str) -> list[float]:
    return [next(x["accuracy"] for x in t if x["model"] == label) for t in per_seed]


def leads_table(leads: list[dict[str, Any]]) -> str:
    """The paired leads as Markdown (accuracy points), each seed's lead, the uncorrected and
    Holm-adjusted p-values."""
    head = ["Distilled", "Control", "Lead per seed", "Lead (points)", "95% CI", "p", "p (Holm)"]
    head.append("Verdict")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for x in leads:
        sd = "" if x["sd"] is None else f" ± {100 * x['sd']:.1f} sd"
        ci = "" if x["ci95"] is None else f"[{100 * x['ci95'][0]:+.1f}, {100 * x['ci95'][1]:+.1f}]"
        each = " / ".join(f"{100 * d:+.1f}" for d in x["differences"])
        cells = [x["distilled"], x["control"], each, f"{100 * x['mean']:+.1f}{sd}", ci]
        cells += [_p(x.get("p")), _p(x.get("p_holm")), x["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _p(p: float | None) -> str:
    return "" if p is None else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
