"""The Countdown task: an exhaustive solver (the seeded problem generator is in generate.py, the
prompts in templates.py, the dataset files in files.py).

Rules (Stream-of-Search / TinyZero Countdown): a problem has 3 or 4 numbers in [1, max_number]
and a target in [1, max_target]; an answer uses every number exactly once with + - * / and every
intermediate result must be a positive integer (a - b only if a > b, a / b only if b divides a).
Pure Python plus pyarrow for parquet; no torch.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from distil.errors import DataError

MIN_SIZE, MAX_SIZE = 2, 5  # problem sizes the generator accepts; 3 and 4 are standard Countdown

# --- solver -------------------------------------------------------------------------------------
# A node is a list [cost, cls, weight, value, op, left, right] (lists, not objects: the DP makes
# thousands per problem). `cls` is the precedence class of the top operator, used for printing
# with the fewest parentheses: atom 3 > (* /) 2 > (+ -) 1. `weight` counts the expression trees
# that reach `value` (unordered pairs for + and *), used to weight target sampling.
_ADD, _MUL, _ATOM = 1, 2, 3
# The simplicity order (fewest '/', fewest parentheses, fewest '-', shortest spaced string) is
# lexicographic on four small counters, packed into one int so that comparing costs is one `<`.
# Costs add up from children, and packing is linear, so a node's cost = children's + its own.
_DIV, _PAREN, _SUB = 10**9, 10**6, 10**3
_PAR = _PAREN + 2  # one pair of parentheses: one more pair and two more characters


def _offer(out: dict, value: int, cost: int, cls: int, weight: int, op: str, left, right) -> None:
    node = out.get(value)
    if node is None:
        out[value] = [cost, cls, weight, value, op, left, right]
        return
    node[2] += weight
    # On equal cost prefer * / over + -: as an operand it needs parentheses less often. Remaining ties keep the first found (deterministic DP order).
    if cost < node[0] or (cost == node[0] and cls > node[1]):
        node[0], node[1], node[4], node[5], node[6] = cost, cls, op, left, right


def _combine(da: dict, db: dict, size_a: int, size_b: int, same: bool, out: dict, cap) -> None:
    """Add every `hi op lo` up to `cap` for hi, lo drawn one from each of `da`, `db` into `out`."""
    offer = _offer  # a local: the innermost loop of generating a dataset
    a_first = size_a > size_b
    for a, na in da.items():
        for b, nb in db.items():
            if a >= b:
                hi, nh, lo, nl = a, na, b, nb
            elif same:  # A == B: the same pair is visited once with a >= b
                continue
            else:
                hi, nh, lo, nl = b, nb, a, na
            if hi - lo > cap and hi % lo:  # every result is past cap (a drawn problem's table)
                continue
            # For + and * the operand order is cosmetic (parentheses are symmetric): put the
            # sub-expression over more numbers first, e.g. "(12 + 7) * 3", else the larger value.
            if size_a == size_b:
                left, right = nh, nl
            else:
                left, right = (na, nb) if a_first else (nb, na)
            weight = nh[2] * nl[2]
            base = nh[0] + nl[0] + 3  # " op " adds three characters
            kh, kl = nh[1], nl[1]
            if hi + lo <= cap:
                offer(out, hi + lo, base, _ADD, weight, "+", left, right)
            if hi * lo <= cap:
                mul_paren = (_PAR if kh == _ADD else 0) + (_PAR if kl == _ADD else 0)
                offer(out, hi * lo, base + mul_paren, _MUL, weight, "*", left, right)
            if hi > lo and hi - lo <= cap:  # a - (b + c) and a - (b - c) need parentheses
                sub_cost = base + _SUB + (_PAR if kl == _ADD else 0)
                offer(out, hi - lo, sub_cost, _ADD, weight, "-", nh, nl)
            if hi % lo == 0 and hi // lo <= cap:  # a / (b * c) and a / (b / c) need parentheses
                paren = (_PAR if kh == _ADD else 0) + (_PAR if kl != _ATOM else 0)
                offer(out, hi // lo, base + _DIV + paren, _MUL, weight, "/", nh, nl)


def _values(nums: tuple[int, ...]) -> dict[int, list]:
    """Every value reachable from the sorted multiset `nums` -> its simplest node (cached)."""
    return _values_small(nums) if len(nums) <= 3 else _values_large(nums)


@functools.cache
def _splits(size: int) -> tuple[tuple, ...]:
    """The unordered splits of `size` sorted numbers in DP order, as (take A, take B, size of A,
    size of B): A always holds the first number, B is the non-empty complement, and `take` picks
    a part's numbers out of the whole as a tuple."""
    rest = range(1, size)
    splits = []
    for r in range(size - 1):
        for picked in itertools.combinations(rest, r):
            a_at, b_at = (0, *picked), tuple(i for i in rest if i not in picked)
            splits.append((_taker(a_at), _taker(b_at), len(a_at), len(b_at)))
    return tuple(splits)


def _taker(at: tuple[int, ...]):
    # itemgetter of one index gives the item and of several a tuple; a slice gives a tuple
    return operator.itemgetter(*at) if len(at) > 1 else operator.itemgetter(slice(at[0], at[0] + 1))


def _build(nums: tuple[int, ...], cap: float = math.inf) -> dict[int, list]:
    """Subset DP: values(S) = union over unordered splits S = A + B of op(values(A), values(B)).

    Only the values up to `cap` are kept (the parts keep all of theirs): the same nodes, in the
    same order, as the whole table with the values past `cap` left out. Sub-multisets are looked
    up through the caches, so those shared between problems (pairs and triples of numbers recur
    constantly) are computed once.
    """
    if len(nums) == 1:
        value = nums[0]
        return {value: [len(str(value)), _ATOM, 1, value, None, None, None]} if value <= cap else {}
    out: dict[int, list] = {}
    seen_splits = []  # repeated numbers give the same split more than once
    for take_a, take_b, size_a, size_b in _splits(len(nums)):
        a, b = take_a(nums), take_b(nums)
        split = (a, b) if a <= b else (b, a)
        if split not in seen_splits:
            seen_splits.append(split)
            _combine(_values(a), _values(b), size_a, size_b, a == b, out, cap)
    return out


# Two caches: up to 3 numbers the tables are small (tens of values) and recur across problems;
# a 4-number table holds ~1000 values (~50 kB) and rarely recurs, so only a few are kept.
_values_small = functools.lru_cache(maxsize=1 << 15)(_build)
_values_large = functools.lru_cache(maxsize=256)(_build)
# A drawn problem's targets: the top level alone, capped at max_target (most of a 3-number table
# lies past it); kept for the small ranges where the same numbers are drawn again and again.
_targets = functools.lru_cache(maxsize=1024)(_build)


def _render(node: list, sep: str) -> str:
    """Print a node with the fewest parentheses that keep its value under left-associativity."""
    _, cls, _, value, op, left, right = node
    if op is None:
        return str(value)
    lhs, rhs = _render(left, sep), _render(right, sep)
    if left[1] < cls:
        lhs = f"({lhs})"
    # a + (b - c) == a + b - c and a * (b / c) == a * b / c, but - and / do not re-associate
    if right[1] < cls or (right[1] == cls and op in "-/"):
        rhs = f"({rhs})"
    return f"{lhs}{sep}{op}{sep}{rhs}"


def _check_nums(nums: Iterable[int]) -> tuple[int, ...]:
    nums = tuple(nums)
    if not nums or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in nums):
        raise DataError(
            f"Countdown numbers must be a non-empty list of positive ints, got {nums!r}"
        )
    return tuple(sorted(nums))


def solve(nums: Sequence[int], target: int) -> str | None:
    """The simplest expression using every number once that equals `target`, or None.

    Simplest = fewest '/', then fewest parentheses, fewest '-', shortest. Each sub-multiset keeps
    one best expression per value, which can in principle miss a simpler whole (a costlier
    sub-expression needing fewer parentheses); on all 3-number problems with numbers up to 9 and
    4-number ones up to 6 it matches a brute-force search. Printed spaced: "44 + 19 - 35".
    """
    node = _values(_check_nums(nums)).get(target)
    return None if node is None else _render(node, " ")


def reachable_targets(nums: Sequence[int]) -> dict[int, str]:
    """Every reachable value (ascending) -> its simplest expression, as `solve` prints it."""
    values = _values(_check_nums(nums))
    return {v: _render(values[v], " ") for v in sorted(values)}


_STEP_TOKEN = re.compile(r"\s*(?:([0-9]+)|(.))")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def solution_steps(expression: str) -> list[str]:
    """The intermediate steps of an expression in evaluation order, e.g. "44 + 19 - 35" ->
    ["44 + 19 = 63", "63 - 35 = 28"]. Raises DataError for anything but + - * / and parentheses
    on decimal integers.

    An iterative shunting-yard parse (Python's precedence, left to right), so an expression of
    any length or nesting gets steps or a DataError, never a RecursionError."""
    p = _Steps(expression)
    want_value = True  # a number or "(" comes next; else an operator or ")"
    for number, char in _STEP_TOKEN.findall(expression.strip()):
        if number:
            if not want_value:
                raise p.bad(f"a number where an operator belongs: {number[:20]}")
            if len(number) > 4300:  # Python's int-from-str limit
                raise p.bad("a number of more than 4,300 digits")
            p.values.append(Fraction(int(number)))
            want_value = False
        elif char == "(" and want_value:
            p.ops.append(char)
        elif char == ")" and not want_value and "(" in p.ops:
            while p.ops[-1] != "(":
                p.reduce()
            p.ops.pop()
        elif char in _PRECEDENCE and not want_value:
            while p.ops and p.ops[-1] != "(" and _PRECEDENCE[p.ops[-1]] >= _PRECEDENCE[char]:
                p.reduce()
            p.ops.append(char)
            want_value = True
        else:
            raise p.bad(f"unexpected {char!r}")
    if want_value or "(" in p.ops:
        raise p.bad("incomplete")
    while p.ops:
        p.reduce()
    return p.steps


class _Steps:
    """The parse state of `solution_steps`: values, pending operators, the steps written."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.steps: list[str] = []
        self.values: list[Fraction] = []
        self.ops: list[str] = []

    def bad(self, why: str) -> DataError:
        text = self.expression
        shown = text if len(text) <= 60 else text[:57] + "..."
        return DataError(f"not a Countdown expression (+ - * / on integers): {shown!r} ({why})")

    def reduce(self) -> None:
        """Apply the last pending operator to the last two values, writing its step."""
        op = self.ops.pop()
        b, a = self.values.pop(), self.values.pop()
        if op == "/" and b == 0:
            raise DataError(f"division by zero in {self.expression[:60]!r}")
        value = _ARITH[op](a, b)
        try:
            self.steps.append(f"{a} {op} {b} = {value}")
        except ValueError as exc:  # past Python's 4,300-digit int-to-str limit
            raise self.bad("a value too long to write") from exc
        self.values.append(value)


def compact(expression: str) -> str:
    """The expression without spaces, for small-model templates: "(12 + 7) * 3" -> "(12+7)*3"."""
    return "".join(expression.split())


# --- generator ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One Countdown problem: the numbers (in presentation order), the target and a solution."""

    nums: tuple[int, ...]
    target: int
    solution: str

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        return problem_key(self.nums, self.target)


def problem_key(nums: Iterable[int], target: int) -> tuple[tuple[int, ...], int]:
    """Identity of a problem for de-duplication and split disjointness: (sorted nums, target)."""
    return tuple(sorted(nums)), int(target)
