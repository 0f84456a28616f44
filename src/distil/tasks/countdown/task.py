"""Countdown behind the task interface: the strict checker (checker.py), unchanged.

Problems come from a file with `nums` and `target` (top level or under `metadata`), or are
generated (eval.data null: eval.n problems with eval.numbers numbers, seed eval.seed). The prompt
is a Countdown template: eval.template, else the one recorded with the model, else
countdown_chat. eval.number_usage picks exact or subset number usage.
"""

from __future__ import annotations

from typing import Any

from distil.errors import DataError
from distil.files import file_info
from distil.tasks.base import Task, Verdict, Where, brief
from distil.tasks.countdown.checker import OUTCOMES, check
from distil.tasks.countdown.files import read_rows
from distil.tasks.countdown.generate import generate_problems, parse_numbers
from distil.tasks.countdown.templates import DEFAULT_TEMPLATE, get_template

COLUMNS = (
    ("Missing Answer Tags", "missing_answer_tags"),
    ("Eqn Not Balanced", "equation_not_balanced"),
    ("Invalid Number Usage", "invalid_number_usage"),
    ("LHS Parse/Eval Error", "lhs_parse_or_eval_error"),
    ("RHS Parse/Eval Error", "rhs_parse_or_eval_error"),
    ("Wrong Value", "wrong_value"),
)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Countdown(Task):
    name = "countdown"
    outcomes = OUTCOMES
    columns = COLUMNS

    def problem(self, row: dict[str, Any], where: Where) -> dict[str, Any]:
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        nums, target = row.get("nums", meta.get("nums")), row.get("target", meta.get("target"))
        if not (isinstance(nums, list) and nums and all(_is_int(x) for x in nums)):
            raise DataError(f"'nums' must be a list of integers, got {brief(nums)}", **where)
        if not _is_int(target):
            raise DataError(f"'target' must be an integer, got {brief(target)}", **where)
        return {"nums": [int(x) for x in nums], "target": int(target)}

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        template = get_template(self.cfg.template or DEFAULT_TEMPLATE)
        return template.messages(problem["nums"], problem["target"])

    def check(self, completion: str, problem: dict[str, Any]) -> Verdict:
        return check(
            completion, problem["nums"], problem["target"], number_usage=self.cfg.number_usage
        )

    def load(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The first eval.n problems of eval.data (read_rows), or freshly generated ones."""
        cfg = self.cfg
        if cfg.data:
            rows = read_rows(cfg.data)
            problems = [
                {"id": r.get("id", i), "nums": list(r["nums"]), "target": int(r["target"])}
                for i, r in enumerate(rows[: cfg.n])
            ]
            return problems, {**file_info(cfg.data, rows=len(rows)), "used": len(problems)}
        probs = generate_problems(cfg.n, numbers=parse_numbers(cfg.numbers), seed=cfg.seed)
        problems = [
            {"id": i, "nums": list(p.nums), "target": p.target} for i, p in enumerate(probs)
        ]
        return problems, {"generated": {"n": cfg.n, "numbers": cfg.numbers, "seed": cfg.seed}}
