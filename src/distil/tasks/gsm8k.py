"""GSM8K (openai/gsm8k, subset "main", split "test"): grade-school word problems whose reference
`answer` ends in "#### N".

The prediction is, in order of preference, the number after the last "####", the content of the
last \\boxed{}, or the last number in the completion. Numbers are read with their commas ("1,000"),
a leading "$" and a trailing "." removed and compared exactly as decimals (Fraction), so "18.00"
equals "18" and "0.5" does not equal "1/2" written out in words.

Outcomes: correct, no_number (no number anywhere in the completion), wrong_value.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from distil.errors import DataError
from distil.tasks.base import Task, Verdict, Where, field

# no \s* inside: a run of spaces would make the scan quadratic
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+")
_FINAL = re.compile(r"####\s*([^\n]*)")
_PROMPT = (
    "{question}\n\nSolve the problem step by step, then give the final answer as a number on "
    "the last line in the form '#### <number>'."
)


def to_number(text: str) -> Fraction | None:
    """The value of one number as written: "1,234.50", "$18", "-3.", ".5"; None if unreadable."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", cleaned):
        return None
    try:
        return Fraction(cleaned)
    except ValueError:  # past Python's 4,300-digit int-from-str limit
        return None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].strip() if found else None


def extract(completion: str) -> str | None:
    """The predicted number as written (see the module docstring for the order); None if none."""
    from distil.tasks.math import last_boxed

    finals = _FINAL.findall(completion)
    if finals and (number := last_number(finals[-1])) is not None:
        return number
    boxed = last_boxed(completion)
    if boxed is not None and (number := last_number(boxed)) is not None:
        return number
    return last_number(completion)


def reference(answer: str) -> Fraction | None:
    """The reference value: the number after the last "####" of the dataset's `answer`."""
    finals = _FINAL.findall(answer)
    number = last_number(finals[-1]) if finals else None
    return to_number(number) if number is not None else None


class GSM8K(Task):
    name = "gsm8k"
    outcomes = ("correct", "no_number", "wrong_value")
    hub = ("openai/gsm8k", "main", "test")

    def problem(self, row: dict[str, Any], where: Where) -> dict[str, Any]:
        question = field(row, "question", str, where)
        answer = field(row, "answer", str, where)
        if reference(answer) is None:
            raise DataError(
                f"column 'answer' must end in '#### <number>' (GSM8K's format), got "
                f"{answer[-60:]!r}",
                **where,
            )
        return {"question": question, "answer": answer}

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": _PROMPT.format(question=problem["question"])}]

    def check(self, completion: str, problem: dict[str, Any]) -> Verdict:
        gold = reference(problem["answer"])
        written = extract(completion)
        if written is None:
            return Verdict("no_number", None, "no number in the completion")
        value = to_number(written)
        if value != gold:
            return Verdict("wrong_value", written, f"{written} != {_show(gold)}")
        return Verdict("correct", written, "")


def _show(x: Fraction | None) -> str:
    if x is None:
        return "?"
    return str(x.numerator) if x.denominator == 1 else str(float(x))
