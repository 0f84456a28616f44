"""MATH / MATH-500 (HuggingFaceH4/MATH-500, split "test"; also the MATH train sets with the same
columns): competition problems whose reference `solution` ends in a \\boxed{} answer (MATH-500
also has the answer alone in `answer`, used when present).

The prediction is the content of the last \\boxed{...} (or \\fbox{...}) in the completion, braces
matched so \\boxed{\\frac{1}{2}} keeps its inner braces. Prediction and reference are parsed and
compared by math-verify (the `math` extra), which knows that \\frac{1}{2} = 0.5 = \\dfrac12, that
"5 \\text{ cm}" is 5, that {1, 2} = {2, 1}, and compares expressions symbolically.

Outcomes: correct; no_boxed_answer (no non-empty \\boxed{} in the completion); unparsable
(math-verify reads no mathematical value from the boxed text, and the text differs from the
reference's); wrong_value (parsed, not equal). When the reference itself is not mathematics
(e.g. \\text{Evelyn}), the normalized texts are compared.
"""

from __future__ import annotations

import threading
from typing import Any

from distil.errors import DataError, require
from distil.tasks.base import Task, Verdict, Where, field

_PROMPT = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
_BOX_COMMANDS = ("\\boxed", "\\fbox")
# seconds math-verify may spend on one parse or comparison (its default is 5): an answer like
# 9^{9^{9^{9}}} would otherwise hold the evaluation for seconds per sample
TIMEOUT_S = 1


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} / \\fbox{...} (braces matched), or of "\\boxed x"
    (to the next "$" or line end); None when there is none or it is never closed. Linear."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i) and not text.startswith("{", i):  # "\boxed 5"
        rest = text[i + 1 :]
        return rest.split("$")[0].split("\n")[0].strip() or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip() or None
    return None


def _normalized(text: str) -> str:
    for cmd in ("\\text", "\\mathrm", "\\textbf", "\\mbox"):
        text = text.replace(cmd, "")
    return "".join(c for c in text if c not in " {}$\\").lower()


class Math(Task):
    name = "math"
    outcomes = ("correct", "no_boxed_answer", "unparsable", "wrong_value")
    hub = ("HuggingFaceH4/MATH-500", None, "test")

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        self._mv = require("math_verify", "math", "the math task (eval.task=math)")
        self._config = [
            self._mv.LatexExtractionConfig(boxed_match_priority=0),
            self._mv.ExprExtractionConfig(),
        ]
        self._gold: dict[str, list] = {}  # reference answers parsed once

    @staticmethod
    def _timeout() -> int | None:
        """math-verify's limit per parse / comparison (signal.alarm: main thread only)."""
        return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None

    def problem(self, row: dict[str, Any], where: Where) -> dict[str, Any]:
        problem = field(row, "problem", str, where)
        solution = field(row, "solution", str, where)
        answer = row.get("answer")
        if not (isinstance(answer, str) and answer.strip()):
            answer = last_boxed(solution)
        if answer is None:
            raise DataError(
                "the reference has no answer: column 'answer' is missing or empty and "
                f"'solution' holds no \\boxed{{}} (it ends {solution[-60:]!r})",
                **where,
            )
        return {"problem": problem, "solution": solution, "answer": answer}

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": _PROMPT.format(problem=problem["problem"])}]

    def _parse(self, latex: str) -> list:
        """math-verify's parse of one answer: [] or [..., original text] when unreadable."""
        try:
            return self._mv.parse(
                f"${latex}$", extraction_config=self._config, parsing_timeout=self._timeout()
            )
        except Exception:  # math-verify's parsers raise many types on odd input
            return []

    def check(self, completion: str, problem: dict[str, Any]) -> Verdict:
        answer = last_boxed(completion)
        if answer is None:
            return Verdict("no_boxed_answer", None, "no non-empty \\boxed{} in the completion")
        gold_text = problem["answer"]
        if _normalized(answer) == _normalized(gold_text):
            return Verdict("correct", answer, "")
        pred = self._parse(answer)
        if gold_text not in self._gold:
            self._gold[gold_text] = self._parse(gold_text)
        gold = self._gold[gold_text]
        if len(pred) < 2:  # parse returns [value, text] when it read a value
            return Verdict("unparsable", answer, "math-verify reads no value from the answer")
        try:
            same = len(gold) >= 2 and self._mv.verify(gold, pred, timeout_seconds=self._timeout())
        except Exception:  # a comparison math-verify cannot make counts as unequal
            same = False
        if same:
            return Verdict("correct", answer, "")
        return Verdict("wrong_value", answer, f"{_clip(answer)} != {_clip(gold_text)}")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
