"""A completion's reward: a task's checker verdict mapped to a number per outcome category, or
a user's function by import path; both checked, their mistakes named with the data row.

    reward, outcomes = reward_scorer(cfg)   # reward(example, completion text) -> (value, outcome)

Built once per run (train/reward.py scores each window with it) and by `distil config validate`
(preflight), so a bad reward.values name or an unimportable reward.function stops before any
weights load.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from distil.config import DistilConfig
from distil.data.datasets import short, source_row
from distil.errors import ConfigError, DataError
from distil.types import Example

# what a reward gives a completion: its value and its outcome category
Scored = tuple[float, str]


class TaskReward:
    """reward(example, text) -> (value, outcome): the task's checker on the completion, the
    outcome's value from `values` (else `default`). Problems are built once per example."""

    def __init__(self, task, values: dict[str, float], default: float):
        unknown = sorted(set(values) - set(task.outcomes))
        if unknown:
            raise ConfigError(
                f"reward.values names {unknown}, which are not outcomes of task {task.name!r}. "
                f"Fix: use its outcomes: {', '.join(task.outcomes)}"
            )
        self.task, self.values, self.default = task, dict(values), float(default)
        self._problems: dict[int, dict[str, Any]] = {}

    def __call__(self, example: Example, text: str) -> Scored:
        problem = self._problems.get(example.id)
        if problem is None:
            path, _, line = example.meta.get("_where", "").rpartition(":")
            where = {"path": path or None, "line": int(line) if line.isdigit() else None}
            problem = self.task.make_problem(source_row(example), where, example.id)
            self._problems[example.id] = problem
        outcome = self.task.check(text, problem).outcome
        return self.values.get(outcome, self.default), outcome


class FunctionReward:
    """reward(example, text) -> (value, category): a user's `fn(row, completion)` by import
    path, its answer checked (a finite number, or (number, str)); errors name the row."""

    def __init__(self, path: str):
        module, _, attr = path.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError as exc:
            raise ConfigError(
                f"reward.function = {path!r}: cannot import module {module!r} ({exc}). Fix: "
                "install the package or put its directory on PYTHONPATH"
            ) from exc
        except Exception as exc:  # the module's own code failed (a SyntaxError, a raise)
            raise ConfigError(
                f"reward.function = {path!r}: importing module {module!r} failed with "
                f"{type(exc).__name__}: {exc}. Fix: the error in that module (import it in "
                "Python to see the traceback)"
            ) from exc
        if not callable(fn):
            raise ConfigError(
                f"reward.function = {path!r}: module {module!r} has no function {attr!r}"
            )
        self.path, self.fn = path, fn

    def __call__(self, example: Example, text: str) -> Scored:
        row = source_row(example)
        try:
            out = self.fn(row, text)
        except Exception as exc:
            raise self._error(example, text, f"raised {type(exc).__name__}: {exc}") from exc
        value, category = out if isinstance(out, tuple) and len(out) == 2 else (out, "scored")
        if not isinstance(category, str):
            raise self._error(example, text, f"returned the category {short(category)}, not a str")
        # numbers.Real takes numpy float32 / int64 (not numpy bool_); a Python bool is no reward
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not number or not math.isfinite(float(value)):
            raise self._error(example, text, f"returned {short(out)}")
        return float(value), category

    def _error(self, example: Example, text: str, what: str) -> DataError:
        path, _, line = example.meta.get("_where", "").rpartition(":")
        return DataError(
            f"data row {example.id}: reward.function {self.path} {what} for the completion "
            f"{short(text)}. Fix: return a finite number (or (number, category name)) for "
            "every row and completion",
            path=path or None,
            line=int(line) if line.isdigit() else None,
        )


def reward_scorer(cfg: DistilConfig) -> tuple[Callable[[Example, str], Scored], Sequence[str]]:
    """(reward, the outcomes it can give: every one gets a logged share): reward.function, else
    the checker of reward.task (null: eval.task) built with the eval section."""
    r = cfg.reward
    if r.function:
        return FunctionReward(r.function), ()
    from distil.tasks.registry import make_task

    task = make_task(cfg.eval.model_copy(update={"task": r.task or cfg.eval.task}))
    return TaskReward(task, r.values, r.default), task.outcomes
