"""The task interface: a task turns a dataset row into a prompt, and a completion into a verdict.

    class MyTask(Task):
        name = "mytask"
        outcomes = ("correct", "no_answer", "wrong_answer")   # "correct" first, then failures
        def problem(self, row, where): ...   # validate a row, keep what is needed -> dict
        def messages(self, problem): ...     # chat messages of the prompt
        def check(self, completion, problem): ...   # -> Verdict(outcome, answer, detail)

Every task's report is the same table: correct, accuracy, one column per failure category,
pass@k with several samples, and per-group accuracy for tasks that define `group` (MMLU's
subjects). A task is found by name in the registry (registry.py) or by import path
("mypkg.tasks:MyTask"); it is built with the `eval` section of the config (`self.cfg`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from distil.data.datasets import read_hub, read_rows
from distil.errors import DataError
from distil.files import file_info
from distil.paths import looks_local

if TYPE_CHECKING:
    from distil.config import EvalConfig

Where = dict[str, Any]  # {"path": ..., "line": ...}: where a row came from, for DataError


@dataclass(frozen=True)
class Verdict:
    """A checker's result: one of the task's outcomes, the extracted answer (None when none was
    found), a short human-readable detail, and the answer's value where the task computes one
    (Countdown: the left side as an exact fraction)."""

    outcome: str
    answer: str | None = None
    detail: str = ""
    value: Any = None

    @property
    def correct(self) -> bool:
        return self.outcome == "correct"


class Task:
    """Base class of every task; subclasses set the class attributes and the three methods."""

    name: ClassVar[str] = ""
    outcomes: ClassVar[tuple[str, ...]] = ("correct", "wrong")
    # table columns (label, outcome) of the failure categories; None: derived from `outcomes`
    columns: ClassVar[tuple[tuple[str, str], ...] | None] = None
    # the hub dataset (id, subset, split) this task was written for, shown in docs and messages
    hub: ClassVar[tuple[str, str | None, str] | None] = None

    def __init__(self, cfg: EvalConfig | None = None) -> None:
        from distil.config import EvalConfig

        self.cfg = cfg if cfg is not None else EvalConfig(task=self.name or "countdown")

    # --- what a task defines -------------------------------------------------------------------

    def problem(self, row: dict[str, Any], where: Where) -> dict[str, Any]:
        """A validated problem from one dataset row (raise DataError(..., **where) when the row
        lacks what the task needs). Keys starting with "_" stay out of the verdict files."""
        raise NotImplementedError

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        """The prompt as chat messages."""
        raise NotImplementedError

    def check(self, completion: str, problem: dict[str, Any]) -> Verdict:
        """Judge one completion; never raises on any str."""
        raise NotImplementedError

    def group(self, problem: dict[str, Any]) -> str | None:
        """A group name for per-group accuracy in the report (None: no groups)."""
        return None

    @property
    def scoring(self) -> str:
        """How answers are found: "generate" (the model writes one, `check` reads it) or
        "loglik" (the choice of highest log-likelihood; tasks that define `choice_prompt`)."""
        return "generate"

    def choice_prompt(self, problem: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
        """Log-likelihood scoring: (the prompt as plain text, [(continuation scored after it,
        the answer text `check` then judges)] per choice)."""
        raise NotImplementedError

    # --- shared machinery ----------------------------------------------------------------------

    @classmethod
    def table_columns(cls) -> list[tuple[str, str]]:
        if cls.columns is not None:
            return list(cls.columns)
        return [(o.replace("_", " ").title(), o) for o in cls.outcomes if o != "correct"]

    def load(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(problems, where they came from): the first `cfg.n` rows of `cfg.data` (a local
        JSONL/parquet file, a saved dataset directory, or a hub id with `cfg.subset` and
        `cfg.split`), each through `problem`."""
        source = self.cfg.data or (self.hub[0] if self.hub else None)
        if not source:
            raise DataError(f"task {self.name!r} needs eval.data (a file or a hub id)")
        subset = (
            self.cfg.subset if self.cfg.data or not self.hub else self.cfg.subset or self.hub[1]
        )
        rows, info = read_task_rows(source, split=self.cfg.split, subset=subset)
        problems = [self.make_problem(row, where, i) for i, (where, row) in enumerate(rows)]
        problems = problems[: self.cfg.n]
        return problems, {**info, "used": len(problems)}

    def make_problem(self, row: Any, where: Where, index: int) -> dict[str, Any]:
        if not isinstance(row, dict):
            raise DataError(f"expected a JSON object, got {type(row).__name__}", **where)
        problem = self.problem(row, where)
        return {"id": row.get("id", row.get("unique_id", index)), **problem}


def read_task_rows(
    source: str, *, split: str, subset: str | None = None
) -> tuple[list[tuple[Where, Any]], dict[str, Any]]:
    """([(where, row)], info): rows of a local file / saved dataset (`split` picks a split of a
    saved DatasetDict) or of a hub dataset loaded through `datasets` (`subset` is its config
    name, e.g. "main" for openai/gsm8k). `info` fingerprints the source for the report."""
    path = Path(os.path.expanduser(source))
    if path.exists() or looks_local(source):
        rows = read_rows(source, split)
        if path.is_file():
            return rows, file_info(path, rows=len(rows))
        return rows, {"path": os.path.abspath(path), "rows": len(rows), "split": split}
    fix = "check the id, eval.subset (the dataset's config name) and eval.split"
    rows = read_hub(source, split, subset, fix=fix)
    return rows, {"hub": source, "subset": subset, "split": split, "rows": len(rows)}


def brief(value: Any) -> str:
    """A value's type and its first 40 characters of JSON, for messages about a row."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        text = "..."
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def field(row: dict[str, Any], key: str, kind: type, where: Where) -> Any:
    """row[key], which must be a non-empty `kind` (str, list, int); DataError otherwise."""
    value = row.get(key)
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if ok and kind in (str, list):
        ok = len(value) > 0
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise DataError(
            f"column '{key}' must be a non-empty {kind.__name__}, got {shown} "
            f"(columns: {', '.join(map(str, row)) or 'none'})",
            **where,
        )
    return value
