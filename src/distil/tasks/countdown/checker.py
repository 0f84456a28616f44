"""The strict Countdown checker with failure categories, and summaries of its verdicts.

It follows the rules of the public Countdown checker used to reproduce the HF GOLD results,
with multiset-equality number usage as the default:
the last <answer> block, unicode operators normalized, an optional "= RHS", integer literals,
unary +/- and binary + - * / with Python's precedence, evaluated in exact rational arithmetic.

The rules, precisely (each has a test in the checker tests):

- **Answer tags.** The tags are `<answer>` and `</answer>`, matched ASCII case-insensitively
  (`<ANSWER>` counts; `<anſwer>` with U+017F or a Kelvin sign K does not). A block is an opening
  tag followed by a closing tag with no answer tag in between; the answer is the content of the
  last block. Unpaired tags are ignored: a mention in the reasoning ("I will put the equation
  inside <answer> tags."), an unclosed `<answer>` after the final block (a truncated second
  answer does not erase the first), a stray `</answer>`. An empty last block counts as no
  answer (an earlier block does not rescue it). The search is one linear scan.
- **Numbers** are plain decimal integers: ASCII digits, no leading zeros (`0` itself is fine).
  Python spellings are not numbers here: `4_7`, `0x10`, `1e3`, `1.5`, `007`, `True`, a comment,
  non-ASCII digits; each makes its side a parse error (`lhs_parse_or_eval_error`, or
  `rhs_parse_or_eval_error` right of "="). A literal longer than 4,300 digits (Python's
  int-to-str limit) is a parse error as well. `-3` is negation applied to the number 3: it uses
  3, as in the public checker; unary +/- never reach a value a positive target could not reach.
- **Size and depth.** The parser and evaluator are iterative (shunting-yard with explicit
  stacks), so parentheses or unary signs nested thousands deep give a verdict, never a
  RecursionError; time is linear in the answer's length plus the cost of the big-integer
  arithmetic, whose operands never exceed the answer's total digits. Values are kept as
  unreduced numerator/denominator pairs (compared by cross-multiplication, one gcd at the end),
  and a verdict's detail text abbreviates numbers of more than 60 digits, so a value of any
  size never trips Python's int-to-str limit.
- Whitespace runs (including newlines) inside the answer become one space, so a line-wrapped
  equation parses; the equation is split at its last "="; an empty RHS ("1 + 2 =") counts as no
  RHS; literals right of "=" never count toward number usage. Any str is a valid completion
  (lone surrogates included): `check` raises only ConfigError, for a bad `number_usage`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

from distil.errors import ConfigError
from distil.tasks.base import Verdict

OUTCOMES = (
    "correct",
    "missing_answer_tags",
    "lhs_parse_or_eval_error",
    "invalid_number_usage",
    "rhs_parse_or_eval_error",
    "equation_not_balanced",
    "wrong_value",
)
NUMBER_USAGE = ("exact", "subset")
MAX_LITERAL_DIGITS = 4300  # Python's default int-to-str limit; longer literals are parse errors

# ASCII-only case folding: with re.IGNORECASE alone, 's' also matches U+017F and 'k' U+212A
_ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE | re.ASCII)
_TOKEN = re.compile(r"[0-9]+|\S")
_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/", "−": "-"})
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "u+": 3, "u-": 3}
_SHOW_DIGITS = 60  # detail text shows numbers up to this many digits in full


def _verdict(outcome: str, answer: str | None, value: Fraction | None, detail: str) -> Verdict:
    """A task Verdict with the LHS value when it evaluated (None otherwise)."""
    return Verdict(outcome, answer, detail, value)


class _EvalError(Exception):
    pass


_Rational = tuple[int, int]  # (numerator, denominator), unreduced; the denominator is never 0


def _apply(op: str, values: list[_Rational]) -> None:
    """Pop the operand(s) of `op` from `values` and push the result (exact, no gcd)."""
    if op in ("u+", "u-"):
        if op == "u-":
            n, d = values[-1]
            values[-1] = (-n, d)
        return
    (b_n, b_d), (a_n, a_d) = values.pop(), values.pop()
    if op == "+":
        values.append((a_n * b_d + b_n * a_d, a_d * b_d))
    elif op == "-":
        values.append((a_n * b_d - b_n * a_d, a_d * b_d))
    elif op == "*":
        values.append((a_n * b_n, a_d * b_d))
    else:  # a/b divided by c/d is (a d) / (b c)
        if b_n == 0:
            raise _EvalError("division by zero")
        values.append((a_n * b_d, a_d * b_n))


def _evaluate(text: str) -> tuple[_Rational, list[int]]:
    """Exact value of an arithmetic expression (+ - * /, unary +/-, parentheses, plain decimal
    integers) and the integer literals it uses, in order. Iterative shunting-yard: no recursion,
    one pass over the tokens."""
    values: list[_Rational] = []
    ops: list[str] = []  # operators and "(" waiting for their right operand
    literals: list[int] = []
    expect_operand = True
    for token in _TOKEN.findall(text):
        if expect_operand:
            if token[0].isdigit() and token.isascii():
                literals.append(_read_number(token))
                values.append((literals[-1], 1))
                expect_operand = False
            elif token == "(":
                ops.append(token)
            elif token in ("+", "-"):
                ops.append("u" + token)
            else:
                raise _EvalError(f"expected a number or '(' at {_clip(token)!r} in {_clip(text)!r}")
        elif token in ("+", "-", "*", "/"):
            while ops and ops[-1] != "(" and _PRECEDENCE[ops[-1]] >= _PRECEDENCE[token]:
                _apply(ops.pop(), values)
            ops.append(token)
            expect_operand = True
        elif token == ")":
            while ops and ops[-1] != "(":
                _apply(ops.pop(), values)
            if not ops:
                raise _EvalError(f"unbalanced ')' in {_clip(text)!r}")
            ops.pop()
        else:
            raise _EvalError(f"expected an operator at {_clip(token)!r} in {_clip(text)!r}")
    if expect_operand:
        raise _EvalError(f"incomplete expression {_clip(text)!r}")
    while ops:
        if ops[-1] == "(":
            raise _EvalError(f"unbalanced '(' in {_clip(text)!r}")
        _apply(ops.pop(), values)
    return values[0], literals


def _read_number(token: str) -> int:
    if len(token) > 1 and token[0] == "0":
        raise _EvalError(f"number with a leading zero: {_clip(token)}")
    if len(token) > MAX_LITERAL_DIGITS:
        raise _EvalError(f"number literal of {len(token)} digits is too long")
    return int(token)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _show(x: int | Fraction) -> str:
    """str(x), abbreviated past _SHOW_DIGITS digits (str() raises past 4,300 digits)."""
    num, den = (x.numerator, x.denominator) if isinstance(x, Fraction) else (x, 1)
    bits = max(abs(num).bit_length(), den.bit_length())
    if bits <= _SHOW_DIGITS * 3.32:
        return str(x)
    kind = "number" if den == 1 else "fraction"
    return f"<a {kind} of about {int(bits * 0.30103) + 1} digits>"


def _show_list(xs: Iterable[int], limit: int = 20) -> str:
    xs = sorted(xs)
    shown = ", ".join(_show(x) for x in xs[:limit])
    if len(xs) > limit:
        return f"[{shown}, ...] ({len(xs)} numbers)"
    return f"[{shown}]"


def _usage_ok(literals: list[int], nums: Sequence[int], number_usage: str) -> bool:
    used, given = Counter(literals), Counter(nums)
    if number_usage == "exact":
        return used == given
    return all(count <= given[x] for x, count in used.items())


def extract_answer(completion: str) -> str | None:
    """The content of the last closed <answer>...</answer> block (ASCII case-insensitive tags, may
    span lines; unpaired tags ignored, see the module docstring), with unicode operators
    normalized and whitespace collapsed; None when absent or empty. Linear time."""
    open_end, block = None, None
    for tag in _ANSWER_TAG.finditer(completion):
        if not tag.group(1):
            open_end = tag.end()  # the nearest opening tag wins
        elif open_end is not None:
            block, open_end = (open_end, tag.start()), None
    if block is None:
        return None
    answer = " ".join(completion[block[0] : block[1]].translate(_UNICODE_OPS).split())
    return answer or None


def check(
    completion: str, nums: Sequence[int], target: int, *, number_usage: str = "exact"
) -> Verdict:
    """Check one completion against a problem; the first failing rule (in OUTCOMES order) wins.

    number_usage: "exact" (the LHS literals are exactly the multiset `nums`) or "subset" (no
    number used more often than given). Literals on the right of "=" never count.
    """
    if number_usage not in NUMBER_USAGE:
        raise ConfigError(f"number_usage={number_usage!r}; valid: {', '.join(NUMBER_USAGE)}")
    answer = extract_answer(completion)
    if answer is None:
        return _verdict(
            "missing_answer_tags", None, None, "no non-empty <answer>...</answer> block"
        )
    lhs, eq, rhs = answer.rpartition("=")
    if not eq:
        lhs, rhs = answer, ""
    try:
        (num, den), literals = _evaluate(lhs)
    except _EvalError as exc:
        return _verdict("lhs_parse_or_eval_error", answer, None, f"left side: {exc}")
    value = Fraction(num, den)
    if not _usage_ok(literals, nums, number_usage):
        detail = f"used {_show_list(literals)}, given {_show_list(nums)} ({number_usage})"
        return _verdict("invalid_number_usage", answer, value, detail)
    if rhs.strip():
        try:
            (r_num, r_den), _ = _evaluate(rhs)
        except _EvalError as exc:
            return _verdict("rhs_parse_or_eval_error", answer, value, f"right side: {exc}")
        if r_num * den != num * r_den:
            detail = f"{_show(value)} != {_show(Fraction(r_num, r_den))}"
            return _verdict("equation_not_balanced", answer, value, detail)
    if num != target * den:
        side = "right side " if rhs.strip() else ""
        return _verdict("wrong_value", answer, value, f"{side}{_show(value)} != {_show(target)}")
    return _verdict("correct", answer, value, "")


def summarize(verdicts: Iterable[Verdict]) -> dict[str, Any]:
    """{"total", "accuracy", and a count for every outcome (zeros included; "correct" is one)}."""
    counts = Counter(v.outcome for v in verdicts)
    total = sum(counts.values())
    summary: dict[str, Any] = {
        "total": total,
        "accuracy": counts["correct"] / total if total else 0.0,
    }
    summary.update({outcome: counts[outcome] for outcome in OUTCOMES})
    return summary
