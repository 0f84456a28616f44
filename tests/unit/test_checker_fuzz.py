"""Property-based tests of the Countdown checker against an independent exact evaluator.

The reference here is Python's own parser (`ast`) with `fractions.Fraction` arithmetic over the
whitelisted nodes, applied to strings limited to the checker's alphabet (digits, + - * / ( ) and
spaces, no leading zeros), so it shares no code with the checker's shunting-yard evaluator.
Each property runs in the default tier with a small budget and a 1-second deadline per input;
the `slow` twins run the same properties with many more examples (DISTIL_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import ast
import os
import re
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distil.tasks.countdown import OUTCOMES, check, extract_answer, tinyzero_score
from distil.tasks.countdown.tinyzero import _tinyzero_extract

FAST = settings(
    max_examples=150,
    deadline=1000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# the slow tier's budget; DISTIL_FUZZ_EXAMPLES=100000 for a long hunt
SLOW = settings(FAST, max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "1500")))


def twin(strategy_args: dict, prop):
    """(default-tier test, slow-tier test) running `prop` under FAST and SLOW settings."""
    fast = FAST(given(**strategy_args)(prop))
    slow = pytest.mark.slow(SLOW(given(**strategy_args)(prop)))
    return fast, slow


# ----------------------------------------------------------------------------- the reference


def reference_value(text: str) -> Fraction | None:
    """Exact value of `text` by Python's parser + Fractions; None for anything the Countdown
    grammar refuses (other characters, leading zeros, other nodes, division by zero)."""
    if re.search(r"[^0-9+\-*/() ]", text) or re.search(r"(?<![0-9])0[0-9]", text):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                return a / b  # ZeroDivisionError -> None below
        raise ValueError(ast.dump(node))

    try:
        return ev(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def literals(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"[0-9]+", text)]


def expected_outcome(lhs: str, rhs: str | None, nums: list[int], target: int) -> str:
    """The checker's rules in OUTCOMES order, computed with the reference evaluator."""
    value = reference_value(lhs)
    if value is None:
        return "lhs_parse_or_eval_error"
    if sorted(literals(lhs)) != sorted(nums):
        return "invalid_number_usage"
    if rhs is not None and rhs.strip():
        rhs_value = reference_value(rhs)
        if rhs_value is None:
            return "rhs_parse_or_eval_error"
        if rhs_value != value:
            return "equation_not_balanced"
    return "correct" if value == target else "wrong_value"


# ----------------------------------------------------------------------------- strategies

SPACE = st.sampled_from(["", "", " ", "  "])


@st.composite
def expressions(draw, max_leaves: int = 6) -> str:
    """A well-formed expression over small integers with random spacing, optional parentheses,
    unary signs and all four operators (Python precedence decides the value)."""
    n = draw(st.integers(1, max_leaves))
    operands, operators = [], []
    for _ in range(n):
        unary = draw(st.sampled_from(["", "", "", "-", "+", "- "]))
        leaf = str(draw(st.integers(0, 120)))
        if draw(st.integers(0, 4)) == 0:
            leaf = f"({draw(SPACE)}{leaf}{draw(SPACE)})"
        operands.append(unary + leaf)
        operators.append(draw(SPACE) + draw(st.sampled_from("+-*/")) + draw(SPACE))
    if n > 2 and draw(st.booleans()):  # parenthesize a random span of operands
        i = draw(st.integers(0, n - 2))
        j = draw(st.integers(i + 1, n - 1))
        operands[i], operands[j] = "(" + operands[i], operands[j] + ")"
    return "".join(o + op for o, op in zip(operands, [*operators[:-1], ""], strict=True))


SOUP = st.text(alphabet="0123456789+-*/() ", max_size=24)
NOISE = st.sampled_from(
    [
        "",
        "Let me think. ",
        "I will put the final equation inside <answer> tags.\n",
        "<think>try </answer> and (1 + 2)</think>\n",
        "Format: <answer> ... </answer>\n",
    ]
)
TRAILER = st.sampled_from(["", "\nDone.", "\nLet me double check: <answer>1 + ", " </answer>"])


# ----------------------------------------------------------------------------- properties


def _soup_matches_reference(text: str) -> None:
    value = reference_value(text)
    verdict = check(f"<answer>{text}</answer>", literals(text), 0)
    if value is None:
        expected = "missing_answer_tags" if not text.strip() else "lhs_parse_or_eval_error"
        assert verdict.outcome == expected, (text, verdict)
        return
    assert verdict.value == value, (text, verdict)
    if value.denominator == 1:
        assert check(f"<answer>{text}</answer>", literals(text), int(value)).correct
    assert check(f"<answer>{text}</answer>", literals(text), int(value) + 1).outcome == (
        "wrong_value"
    )


test_soup_matches_reference, test_soup_matches_reference_slow = twin(
    {"text": SOUP}, _soup_matches_reference
)


def _completion_matches_reference(data) -> None:
    lhs = data.draw(expressions())
    value = reference_value(lhs)
    nums = literals(lhs)
    data.draw(st.randoms()).shuffle(nums)
    mode = data.draw(st.sampled_from(["exact", "extra", "missing"]))
    if mode == "extra":
        nums.append(data.draw(st.integers(0, 120)))
    elif mode == "missing":
        nums.pop()
    if value is not None and value.denominator == 1:
        target = int(value) + data.draw(st.sampled_from([0, 0, 0, 1, -3]))
    else:
        target = data.draw(st.integers(1, 200))
    rhs = data.draw(st.sampled_from([None, "target", "expr", "junk", "empty"]))
    rhs_text = {
        None: None,
        "target": str(target),
        "expr": data.draw(expressions(max_leaves=3)),
        "junk": data.draw(SOUP),
        "empty": " ",
    }[rhs]
    answer = lhs if rhs_text is None else f"{lhs} = {rhs_text}"
    if data.draw(st.booleans()):  # unicode operators and line wrapping
        answer = answer.replace("*", "×").replace("/", "÷").replace(" - ", " − ", 1)
        answer = answer.replace(" ", "\n", 1)
    tag = data.draw(st.sampled_from(["answer", "ANSWER", "Answer"]))
    completion = data.draw(NOISE) + f"<{tag}>{answer}</{tag}>" + data.draw(TRAILER)

    verdict = check(completion, nums, target)
    assert verdict.outcome == expected_outcome(lhs, rhs_text, nums, target), (completion, verdict)
    if verdict.outcome not in ("missing_answer_tags", "lhs_parse_or_eval_error"):
        assert verdict.value == value


test_completion_matches_reference, test_completion_matches_reference_slow = twin(
    {"data": st.data()}, _completion_matches_reference
)
test_completion_matches_reference_slow = pytest.mark.budget(
    100, "the checker against its reference on many fuzzed completions"
)(test_completion_matches_reference_slow)


# --- tag search against a reference regex (fine on short inputs; quadratic on long ones) ---------

_REF_BLOCK = re.compile(r"<answer>((?:(?!</?answer>).)*)</answer>", re.I | re.A | re.S)
TAG_TEXT = st.lists(
    st.sampled_from(
        [
            *("<answer>", "</answer>", "<ANSWER>", "</Answer>", "<anſwer>", "<", "/", ">"),
            *("answer", "1", "+", "2", " ", "\n", "x", "=", "3"),
        ]
    ),
    max_size=16,
).map("".join)


def _extract_matches_reference(text: str) -> None:
    blocks = _REF_BLOCK.findall(text)
    expected = " ".join(blocks[-1].split()) or None if blocks else None
    assert extract_answer(text) == expected


test_extract_matches_reference, test_extract_matches_reference_slow = twin(
    {"text": TAG_TEXT}, _extract_matches_reference
)


def _tinyzero_extract_matches_reference(text: str) -> None:
    text = "Assistant:" + text
    matches = re.findall(r"<answer>(.*?)</answer>", text.split("Assistant:", 1)[1].split("\n")[-1])
    assert _tinyzero_extract(text) == (matches[-1].strip() if matches else None)


test_tinyzero_extract_matches_reference, test_tinyzero_extract_matches_reference_slow = twin(
    {"text": TAG_TEXT}, _tinyzero_extract_matches_reference
)


# --- any str gets a verdict (surrogates, huge numbers, deep nesting, tag floods) -----------------

ANY_CHAR = st.characters(exclude_categories=())  # surrogates included
FRAGMENT = st.one_of(
    st.text(ANY_CHAR, max_size=8),
    st.sampled_from(["<answer>", "</answer>", "<ANSWER>", "<anſwer>", "=", "(", ")", "-", "/0"]),
    st.integers(1, 30).map(lambda n: "(" * n * 100),
    st.integers(1, 30).map(lambda n: "9" * n * 200),
    st.integers(1, 30).map(lambda n: "<answer>" * n * 100),
    st.integers(1, 30).map(lambda n: "*".join(["99"] * n * 100)),
)


def _any_text_gets_a_verdict(parts: list[str], nums: list[int], target: int) -> None:
    text = "".join(parts)
    verdict = check(text, nums, target, number_usage="subset")
    assert verdict.outcome in OUTCOMES and isinstance(verdict.detail, str)
    assert tinyzero_score("Assistant: " + text, nums, target) in (0.0, 0.1, 1.0)


test_any_text_gets_a_verdict, test_any_text_gets_a_verdict_slow = twin(
    {
        "parts": st.lists(FRAGMENT, max_size=12),
        "nums": st.lists(st.integers(0, 10**6), max_size=6),
        "target": st.integers(-(10**6), 10**6),
    },
    _any_text_gets_a_verdict,
)
test_any_text_gets_a_verdict_slow = pytest.mark.budget(100, "the checker on many fuzzed texts")(
    test_any_text_gets_a_verdict_slow
)
