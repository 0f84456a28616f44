"""TinyZero's Countdown reward (verl's `reward_score/countdown.py`), quirks included, for
reproducing RL baselines: the score the published TinyZero runs trained and reported with.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Sequence
from typing import Any

_TZ_TAG = re.compile(r"<(/?)answer>")  # case-sensitive, like TinyZero
_TZ_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_TZ_MAX_POW_BITS = 1 << 20  # larger powers would take TinyZero's eval minutes or hours


def _tinyzero_extract(text: str) -> str | None:
    if "Assistant:" in text:
        text = text.split("Assistant:", 1)[1]
    elif "<|im_start|>assistant" in text:
        text = text.split("<|im_start|>assistant", 1)[1]
    else:
        return None
    # TinyZero: re.findall(r"<answer>(.*?)</answer>", last_line)[-1]. The same non-overlapping,
    # lazy matches, found in one scan of the tags (the regex is quadratic on many open tags).
    line, content_start, last = text.split("\n")[-1], None, None
    for tag in _TZ_TAG.finditer(line):
        if not tag.group(1):
            if content_start is None:  # inside a match, another <answer> is content
                content_start = tag.end()
        elif content_start is not None:
            last, content_start = line[content_start : tag.start()], None
    return last.strip() if last is not None else None


def _tinyzero_numbers(equation: str) -> list[int] | None:
    r"""TinyZero's `[int(n) for n in re.findall(r"\d+", equation)]`; None where that raises (a
    run past Python's 4,300-digit limit), which TinyZero's try/except scores as a mismatch."""
    try:
        return [int(d) for d in re.findall(r"\d+", equation)]
    except ValueError:
        return None


def _tinyzero_pow(base: Any, exp: Any) -> Any:
    exact = type(base) is int and type(exp) is int and exp > 0 and abs(base) > 1
    if exact and exp * abs(base).bit_length() > _TZ_MAX_POW_BITS:
        raise OverflowError("power too large")  # eval would grind; count it as failed
    return base**exp


_TZ_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: _tinyzero_pow,
}


def _tinyzero_eval(root: ast.AST) -> Any:
    """Python's own arithmetic on the nodes the whitelist lets through (ints, floats, + - * /
    // **, unary +/-); anything else (calls like "(1)(2)", "()", "...") raises like eval would.

    Iterative (an explicit stack, operands left to right as Python evaluates them), so a chain
    of any length that Python's parser builds evaluates as eval would: no recursion limit."""
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    values: list[Any] = []
    while stack:
        node, ready = stack.pop()
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            values.append(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            if ready:
                values.append(-values.pop() if isinstance(node.op, ast.USub) else +values.pop())
            else:
                stack += [(node, True), (node.operand, False)]
        elif isinstance(node, ast.BinOp) and type(node.op) in _TZ_OPS:
            if ready:
                right = values.pop()
                values.append(_TZ_OPS[type(node.op)](values.pop(), right))
            else:
                stack += [(node, True), (node.right, False), (node.left, False)]
        else:
            raise TypeError(f"not evaluable: {type(node).__name__}")
    return values[0]


def tinyzero_score(
    solution_str: str,
    nums: Sequence[int],
    target: float,
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """TinyZero's Countdown reward, quirks included.

    `solution_str` is prompt + response: text before the first "Assistant:" (else
    "<|im_start|>assistant") is dropped, and with neither marker the score is 0. Only the last
    line is searched for <answer>...</answer> (none -> 0). Digit runs must equal `nums` as a
    multiset and the answer must match ^[\\d+\\-*/().\\s]+$ and evaluate within 1e-5 of the
    target -> `score`; otherwise `format_score`. So "... = 24" and multi-line answers fail.
    One deviation: TinyZero calls eval(), here a whitelisted AST evaluator with Python's own
    semantics does the same arithmetic but refuses integer powers above 2**(2**20) (TinyZero
    would hang), scoring them format_score. A digit run past Python's 4,300-digit int-from-str
    limit fails TinyZero's number check inside its try/except, so it scores format_score here
    too; the last-line tag search is one linear scan with the regex's exact matches. The answers
    it can score are those Python's parser reads, as for TinyZero's eval(): at most 200 nested
    parentheses, and chains as long as the parser's own recursion allows (thousands of terms);
    the strict checker (checker.py) has no depth limit.
    """
    equation = _tinyzero_extract(solution_str)
    if equation is None:
        return 0.0
    numbers = _tinyzero_numbers(equation)
    if numbers is None or sorted(numbers) != sorted(nums):
        return format_score
    if not _TZ_ALLOWED.match(equation):
        return format_score
    try:
        result = _tinyzero_eval(ast.parse(equation, mode="eval").body)
        return score if abs(result - target) < 1e-5 else format_score
    except Exception:  # TinyZero scores every evaluation failure as format_score
        return format_score
