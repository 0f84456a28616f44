"""Property-based tests of the gsm8k, math and mmlu checkers: any text gets one of the task's
outcomes (never an exception), and generated answers written in equivalent ways get the right
verdict. Default tier: small budgets, a deadline per input; the slow twins run many more."""

from __future__ import annotations

import os
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distil.config import EvalConfig
from distil.tasks import make_task

FAST = settings(
    max_examples=60, deadline=1000, database=None, suppress_health_check=[HealthCheck.too_slow]
)
SLOW = settings(FAST, max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "2000")))
# math-verify may spend up to 1 s (TIMEOUT_S) on the parse and again on the comparison
MATH_FAST = settings(FAST, max_examples=25, deadline=3000)
MATH_SLOW = settings(MATH_FAST, max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "500")))
WHERE = {"path": "f", "line": 1}
TASKS = {
    "gsm8k": {"question": "q", "answer": "#### 1,234"},
    "mmlu": {"question": "q", "choices": ["a", "b", "c", "d"], "answer": 2},
    "math": {"problem": "p", "solution": "\\boxed{\\frac{3}{4}}"},
}
_task = {name: make_task(EvalConfig(task=name, num_fewshot=0)) for name in TASKS}
_problem = {name: _task[name].problem(row, WHERE) for name, row in TASKS.items()}

latexish = st.lists(
    st.sampled_from([*"0123456789{}()^_\\$.,-+*/ =#abxABCD", "\\boxed{", "\\frac"]),
    max_size=60,
).map("".join)


def _any_text(name):
    def prop(text):
        v = _task[name].check(text, _problem[name])
        assert v.outcome in _task[name].outcomes

    return prop


def twin(strategy, prop, fast=FAST, slow=SLOW):
    return fast(given(strategy)(prop)), pytest.mark.slow(slow(given(strategy)(prop)))


test_gsm8k_any_text, test_gsm8k_any_text_slow = twin(st.text() | latexish, _any_text("gsm8k"))
test_mmlu_any_text, test_mmlu_any_text_slow = twin(st.text() | latexish, _any_text("mmlu"))
test_math_any_text, test_math_any_text_slow = twin(
    latexish | st.text(max_size=40), _any_text("math"), MATH_FAST, MATH_SLOW
)

words = st.text(alphabet=st.sampled_from(list("abcdefghij .,:\n")), max_size=30)


def _gsm8k_numbers(n, style, before):
    """n written with commas / "$" / a trailing "." / decimals after "####" is read as n."""
    task = make_task(EvalConfig(task="gsm8k"))
    problem = task.problem({"question": "q", "answer": f"#### {n}"}, WHERE)
    written = {
        "plain": str(n),
        "commas": f"{n:,}",
        "dollar": f"${n:,}",
        "dot": f"{n}.",
        "decimals": f"{n}.00",
    }[style]
    assert task.check(f"{before}\n#### {written}", problem).outcome == "correct"
    assert task.check(f"{before}\n#### {n + 1}", problem).outcome == "wrong_value"


test_gsm8k_numbers, test_gsm8k_numbers_slow = (
    FAST(
        given(
            st.integers(0, 10**12),
            st.sampled_from(["plain", "commas", "dollar", "dot", "decimals"]),
            words,
        )(_gsm8k_numbers)
    ),
    pytest.mark.slow(
        SLOW(
            given(
                st.integers(0, 10**12),
                st.sampled_from(["plain", "commas", "dollar", "dot", "decimals"]),
                words,
            )(_gsm8k_numbers)
        )
    ),
)


def _mmlu_letters(gold, chosen, before):
    """'Answer: X' after letter-free text is read as X: correct exactly when X is the gold."""
    task = make_task(EvalConfig(task="mmlu", num_fewshot=0))
    row = {"question": "q", "choices": ["w", "x", "y", "z"], "answer": gold}
    v = task.check(f"{before.lower()}\nAnswer: {'ABCD'[chosen]}", task.problem(row, WHERE))
    assert v.answer == "ABCD"[chosen]
    assert v.correct == (gold == chosen)


def _mmlu_letters_of(args):
    _mmlu_letters(*args)


test_mmlu_letters, test_mmlu_letters_slow = twin(
    st.tuples(st.integers(0, 3), st.integers(0, 3), words), _mmlu_letters_of
)


def _math_fractions(num, den, k):
    """\\frac{k a}{k b} and a/b as a decimal (when it terminates) equal the reduced fraction."""
    task = _task["math"]
    gold = Fraction(num, den)
    problem = task.problem(
        {
            "problem": "p",
            "solution": f"\\boxed{{\\frac{{{gold.numerator}}}{{{gold.denominator}}}}}",
        },
        WHERE,
    )
    scaled = f"\\boxed{{\\frac{{{k * gold.numerator}}}{{{k * gold.denominator}}}}}"
    assert task.check(scaled, problem).outcome == "correct"
    off = gold + Fraction(1, 7)
    assert task.check(f"\\boxed{{{off.numerator}/{off.denominator}}}", problem).outcome == (
        "wrong_value"
    )


def _math_fractions_of(args):
    _math_fractions(*args)


test_math_fractions, test_math_fractions_slow = twin(
    st.tuples(st.integers(1, 999), st.integers(1, 999), st.integers(1, 9)),
    _math_fractions_of,
    MATH_FAST,
    MATH_SLOW,
)
