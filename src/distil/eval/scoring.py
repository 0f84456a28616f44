"""Scoring for any task: verdicts per completion, the summary (accuracy, one count per outcome,
pass@k, mean@k, per-group accuracy) and its `eval/*` metrics for the training log.

The task is received, never named: the evaluator knows the `Task` interface only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distil.errors import ConfigError
from distil.tasks.base import Task


@dataclass
class EvalResult:
    """One model's (or completions file's) verdicts. `kind` is "model" or "completions", `path`
    the model directory or file evaluated, `data` where the problems came from (file_info)."""

    name: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per problem, with verdicts
    kind: str = "model"
    path: str | None = None
    data: dict[str, Any] | None = None
    task: str = ""
    outcomes: tuple[str, ...] = ()
    columns: list[tuple[str, str]] = field(default_factory=list)  # (label, outcome) of failures


def score(name: str, problems: Sequence[dict[str, Any]], *, task: Task) -> EvalResult:
    """Check every completion of every problem (the task's columns plus `completions`) with
    `task`."""
    rows, outcomes, counts, groups = [], Counter(), [], {}
    for i, prob in enumerate(problems):
        outs = []
        for text in prob["completions"]:
            v = task.check(text, prob)
            if v.outcome not in task.outcomes:
                raise ConfigError(
                    f"task {task.name or type(task).__name__} returned the outcome "
                    f"{v.outcome!r}, not one of its outcomes ({', '.join(task.outcomes)}). Fix: "
                    "add it to the task's `outcomes`"
                )
            outcomes[v.outcome] += 1
            outs.append(
                {"completion": text, "outcome": v.outcome, "answer": v.answer, "detail": v.detail}
            )
        n_ok = sum(o["outcome"] == "correct" for o in outs)
        counts.append((len(outs), n_ok))
        if (g := task.group(prob)) is not None:
            total, ok = groups.get(g, (0, 0))
            groups[g] = (total + len(outs), ok + n_ok)
        shown = {k: v for k, v in prob.items() if k not in ("id", "completions") and k[0] != "_"}
        rows.append({"id": prob.get("id", i), **shown, "correct": n_ok, "samples": outs})
    total = sum(outcomes.values())
    summary: dict[str, Any] = {
        "total": total,
        "accuracy": outcomes["correct"] / total if total else 0.0,
    }
    summary.update({outcome: outcomes[outcome] for outcome in task.outcomes})
    summary["problems"] = len(problems)
    n = min((c[0] for c in counts), default=1)
    summary["pass_at_k"] = {str(k): mean_pass_at_k(counts, k) for k in _pass_ks(n)}
    # mean@k: the mean over problems of each problem's share of correct samples
    summary["mean_at_k"] = sum(c / m for m, c in counts) / len(counts) if counts else 0.0
    if groups:
        summary["groups"] = {
            g: {"total": t, "correct": c, "accuracy": c / t if t else 0.0}
            for g, (t, c) in sorted(groups.items())
        }
    return EvalResult(
        name,
        summary,
        rows,
        task=task.name,
        outcomes=tuple(task.outcomes),
        columns=task.table_columns(),
    )


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary as flat `eval/*` metrics for the training log: accuracy, total, the count of
    every outcome, mean@k, pass@k (`eval/pass@2`) and per-group accuracy (`eval/group/<g>`)."""
    out = {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
    out.update({f"eval/pass@{k}": v for k, v in summary.get("pass_at_k", {}).items()})
    for g, stats in summary.get("groups", {}).items():
        out[f"eval/group/{g}"] = stats["accuracy"]
    return out


def _pass_ks(n: int) -> list[int]:
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n not in ks:
        ks.append(n)
    return ks


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given (n, c) per problem; 0.0 for no problems."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    return sum(values) / len(values) if values else 0.0
