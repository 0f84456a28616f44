"""Scoring Countdown answers: the strict checker with failure categories, pass@k, summaries, and a
TinyZero-compatible reward for reproducing RL baselines.

The strict checker follows the rules of the public Countdown checker used to reproduce the HF
GOLD results (research/landscape.md §3.5), with multiset-equality number usage as the default:
the last <answer> block, unicode operators normalized, an optional "= RHS", integer literals,
unary +/- and binary + - * / with Python's precedence, evaluated in exact rational arithmetic.

The rules, precisely (each has a test in tests/unit/test_countdown_checker.py):

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

import ast
import math
import operator
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from distil.errors import ConfigError

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


@dataclass(frozen=True)
class Verdict:
    """The checker's result: one of OUTCOMES, the extracted equation (None when there are no
    answer tags), the LHS value when it evaluated, and a short human-readable detail."""

    outcome: str
    answer: str | None
    value: Fraction | None
    detail: str

    @property
    def correct(self) -> bool:
        return self.outcome == "correct"


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
        return Verdict("missing_answer_tags", None, None, "no non-empty <answer>...</answer> block")
    lhs, eq, rhs = answer.rpartition("=")
    if not eq:
        lhs, rhs = answer, ""
    try:
        (num, den), literals = _evaluate(lhs)
    except _EvalError as exc:
        return Verdict("lhs_parse_or_eval_error", answer, None, f"left side: {exc}")
    value = Fraction(num, den)
    if not _usage_ok(literals, nums, number_usage):
        detail = f"used {_show_list(literals)}, given {_show_list(nums)} ({number_usage})"
        return Verdict("invalid_number_usage", answer, value, detail)
    if rhs.strip():
        try:
            (r_num, r_den), _ = _evaluate(rhs)
        except _EvalError as exc:
            return Verdict("rhs_parse_or_eval_error", answer, value, f"right side: {exc}")
        if r_num * den != num * r_den:
            detail = f"{_show(value)} != {_show(Fraction(r_num, r_den))}"
            return Verdict("equation_not_balanced", answer, value, detail)
    if num != target * den:
        side = "right side " if rhs.strip() else ""
        return Verdict("wrong_value", answer, value, f"{side}{_show(value)} != {_show(target)}")
    return Verdict("correct", answer, value, "")


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


# --- TinyZero-compatible reward (verl/utils/reward_score/countdown.py) --------------------------
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


def _tinyzero_eval(node: ast.AST) -> Any:
    """Python's own arithmetic on the nodes the whitelist lets through (ints, floats, + - * /
    // **, unary +/-); anything else (calls like "(1)(2)", "()", "...") raises like eval would."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _tinyzero_eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _TZ_OPS:
        return _TZ_OPS[type(node.op)](_tinyzero_eval(node.left), _tinyzero_eval(node.right))
    raise TypeError(f"not evaluable: {type(node).__name__}")


def tinyzero_score(
    solution_str: str,
    nums: Sequence[int],
    target: float,
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """TinyZero's Countdown reward (landscape.md §3.3), quirks included.

    `solution_str` is prompt + response: text before the first "Assistant:" (else
    "<|im_start|>assistant") is dropped, and with neither marker the score is 0. Only the last
    line is searched for <answer>...</answer> (none -> 0). Digit runs must equal `nums` as a
    multiset and the answer must match ^[\\d+\\-*/().\\s]+$ and evaluate within 1e-5 of the
    target -> `score`; otherwise `format_score`. So "... = 24" and multi-line answers fail.
    One deviation: TinyZero calls eval(), here a whitelisted AST evaluator with Python's own
    semantics does the same arithmetic but refuses integer powers above 2**(2**20) (TinyZero
    would hang), scoring them format_score. A digit run past Python's 4,300-digit int-from-str
    limit fails TinyZero's number check inside its try/except, so it scores format_score here
    too; the last-line tag search is one linear scan with the regex's exact matches.
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
