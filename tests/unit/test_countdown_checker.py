"""The strict Countdown checker (every outcome and rule), the TinyZero scorer and pass@k."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hang_guard import finishes

from distil.errors import ConfigError
from distil.eval.scoring import mean_pass_at_k, pass_at_k
from distil.tasks.base import Verdict
from distil.tasks.countdown import (
    OUTCOMES,
    check,
    extract_answer,
    summarize,
    tinyzero_score,
)

NUMS, TARGET = [44, 19, 35], 28  # 44 + 19 - 35 = 28


def outcome(text: str, nums=NUMS, target=TARGET, **kw) -> str:
    return check(text, nums, target, **kw).outcome


def test_outcomes_are_exported_in_checking_order():
    assert OUTCOMES == (
        "correct",
        "missing_answer_tags",
        "lhs_parse_or_eval_error",
        "invalid_number_usage",
        "rhs_parse_or_eval_error",
        "equation_not_balanced",
        "wrong_value",
    )


def test_correct_answer_fields():
    v = check("<think>44 + 19 = 63</think>\n<answer> (44 + 19) - 35 </answer>", NUMS, TARGET)
    assert v == Verdict("correct", "(44 + 19) - 35", detail="", value=Fraction(28))
    assert v.correct


@pytest.mark.parametrize(
    "text", ["no tags at all 44 + 19 - 35", "<answer>   </answer>", "<answer>44+19-35", ""]
)
def test_missing_answer_tags(text):
    v = check(text, NUMS, TARGET)
    assert (v.outcome, v.answer, v.value, v.correct) == ("missing_answer_tags", None, None, False)


def test_last_answer_block_wins():
    assert outcome("<answer>44 + 19 - 35</answer> oops <answer>44 + 19 + 35</answer>") == (
        "wrong_value"
    )
    assert outcome("<answer>1 + 1</answer> then <answer>44 + 19 - 35</answer>") == "correct"
    # an empty last block is not rescued by an earlier good one
    assert outcome("<answer>44 + 19 - 35</answer><answer> </answer>") == "missing_answer_tags"


def test_tags_are_case_insensitive_and_may_span_lines():
    assert outcome("<ANSWER>44 + 19 - 35</Answer>") == "correct"
    assert outcome("<answer>\n  (44 + 19)\n  - 35\n</answer>") == "correct"
    assert extract_answer("<answer>\n(44 +\n 19) - 35\n</answer>") == "(44 + 19) - 35"


def test_unicode_operators_are_normalized():
    assert outcome("<answer>44 + 19 − 35</answer>") == "correct"  # U+2212 minus
    assert outcome("<answer>(3 × 4) ÷ 2</answer>", nums=[3, 4, 2], target=6) == "correct"


def test_lhs_parse_or_eval_errors():
    for text in ["44 + 19 -", "44 19 35", "(44 + 19 - 35", "= 28", "x + 44 + 19 - 35"]:
        assert outcome(f"<answer>{text}</answer>") == "lhs_parse_or_eval_error", text


@pytest.mark.parametrize(
    "expr",
    [
        "44 + 19 ** 1 - 35",  # power
        "44 + 19 // 1 - 35",  # floor division
        "44 + 19 % 100 - 35",  # modulo
        "44.0 + 19 - 35",  # float literal
        "44 + 19 - 35 + 0j",  # complex literal
        "44 + 19 - 35 + True",  # bool literal
        "abs(44) + 19 - 35",  # call
        "44 + 19 - 35 + '0'",  # string
        "44 + 19 - 35 < 100",  # comparison
        "44 + 19 - 35 + None",
    ],
)
def test_rejected_nodes_are_lhs_errors(expr):
    v = check(f"<answer>{expr}</answer>", NUMS, TARGET)
    assert (v.outcome, v.value) == ("lhs_parse_or_eval_error", None)


def test_division_by_zero_is_an_eval_error_on_either_side():
    assert outcome("<answer>3 / (2 - 2)</answer>", nums=[3, 2, 2], target=1) == (
        "lhs_parse_or_eval_error"
    )
    assert outcome("<answer>3 - 2 + 2 = 3 / 0</answer>", nums=[3, 2, 2], target=3) == (
        "rhs_parse_or_eval_error"
    )


def test_exact_fraction_arithmetic_and_nested_parentheses():
    # 1/3 * 3 is exactly 1 in Fractions (a float evaluator would also pass, but 2/3 must not)
    assert outcome("<answer>1 / 3 * 3</answer>", nums=[1, 3, 3], target=1) == "correct"
    assert outcome("<answer>((44 + (19)) - ((35)))</answer>") == "correct"
    v = check("<answer>(5 / (5 * 2))</answer>", [5, 5, 2], 1)
    assert (v.outcome, v.value) == ("wrong_value", Fraction(1, 2))
    assert outcome("<answer>-(-44 - 19) - 35</answer>") == "correct"  # unary minus allowed


def test_number_usage_exact_and_subset():
    # exact: every number once, nothing extra, nothing missing
    assert outcome("<answer>44 + 19 - 35 + 0</answer>") == "invalid_number_usage"
    assert outcome("<answer>63 - 35</answer>") == "invalid_number_usage"
    assert outcome("<answer>44 - 16</answer>") == "invalid_number_usage"
    # subset: unused numbers allowed, but no number more often than given, nothing foreign
    assert outcome("<answer>63 - 35</answer>", number_usage="subset") == "invalid_number_usage"
    assert outcome("<answer>44 - 19 + 3</answer>", target=28, number_usage="subset") == (
        "invalid_number_usage"
    )
    assert outcome("<answer>35 - 19 + 12</answer>", number_usage="subset") == (
        "invalid_number_usage"
    )
    assert outcome("<answer>19 + 19</answer>", number_usage="subset") == "invalid_number_usage"
    assert outcome("<answer>44 - 19 + 3</answer>", nums=[44, 19, 3, 7], target=28) == (
        "invalid_number_usage"
    )
    assert outcome("<answer>44 - 19 + 3</answer>", [44, 19, 3, 7], 28, number_usage="subset") == (
        "correct"
    )


def test_repeated_numbers_count_as_a_multiset():
    assert outcome("<answer>5 / 5 + 2</answer>", nums=[5, 5, 2], target=3) == "correct"
    assert outcome("<answer>5 + 2 - 2</answer>", nums=[5, 5, 2], target=5) == (
        "invalid_number_usage"
    )
    assert outcome("<answer>5 * 2</answer>", [5, 5, 2], 10) == "invalid_number_usage"
    assert outcome("<answer>5 * 2</answer>", [5, 5, 2], 10, number_usage="subset") == "correct"


def test_bad_number_usage_option_lists_choices():
    with pytest.raises(ConfigError, match="exact, subset"):
        check("<answer>1</answer>", [1], 1, number_usage="loose")


def test_equals_sign_handling():
    assert outcome("<answer>44 + 19 - 35 = 28</answer>") == "correct"
    assert outcome("<answer>44+19-35=28</answer>") == "correct"
    assert outcome("<answer>44 + 19 - 35 = 14 * 2</answer>") == "correct"  # RHS literals ignored
    assert outcome("<answer>44 + 19 - 35 = 29</answer>") == "equation_not_balanced"
    # balanced but the shared value is not the target
    assert outcome("<answer>44 + 19 + 35 = 98</answer>") == "wrong_value"
    assert outcome("<answer>44 + 19 - 35 = 28 +</answer>") == "rhs_parse_or_eval_error"
    assert outcome("<answer>44 + 19 - 35 = twenty-eight</answer>") == "rhs_parse_or_eval_error"
    # split on the LAST '=': the left side "44 + 19 - 35 = 28" does not parse
    assert outcome("<answer>44 + 19 - 35 = 28 = 28</answer>") == "lhs_parse_or_eval_error"
    assert outcome("<answer>44 + 19 - 35 == 28</answer>") == "lhs_parse_or_eval_error"


def test_empty_rhs_counts_as_no_rhs():
    assert outcome("<answer>44 + 19 - 35 =</answer>") == "correct"
    assert outcome("<answer>44 + 19 - 34 = </answer>", nums=[44, 19, 34]) == "wrong_value"


def test_rhs_literals_never_count_toward_usage():
    # the RHS uses 44 again and 2: usage still judged on the LHS only
    assert outcome("<answer>44 + 19 - 35 = 44 - 16</answer>") == "correct"
    assert outcome("<answer>44 + 19 = 63</answer>") == "invalid_number_usage"


def test_outcome_order_when_several_rules_fail():
    # misuses numbers AND has an RHS parse error -> number usage is checked first
    assert outcome("<answer>44 + 19 = 28 +</answer>") == "invalid_number_usage"
    # LHS parse error beats bad usage
    assert outcome("<answer>44 ** 2 = 1</answer>") == "lhs_parse_or_eval_error"
    # unbalanced AND wrong target -> not balanced first
    assert outcome("<answer>44 + 19 + 35 = 97</answer>") == "equation_not_balanced"


def test_summarize_counts_every_outcome():
    verdicts = [
        check("<answer>44 + 19 - 35</answer>", NUMS, TARGET),
        check("<answer>44 + 19 - 35</answer>", NUMS, TARGET),
        check("nothing", NUMS, TARGET),
        check("<answer>44 + 19 + 35</answer>", NUMS, TARGET),
    ]
    s = summarize(verdicts)
    assert s["total"] == 4 and s["correct"] == 2 and s["accuracy"] == 0.5
    assert s["missing_answer_tags"] == 1 and s["wrong_value"] == 1
    assert set(OUTCOMES) <= set(s) and s["equation_not_balanced"] == 0
    assert summarize([])["accuracy"] == 0.0


# --- TinyZero scorer ---------------------------------------------------------------------------
P = "User: make 28 from [44, 19, 35]\nAssistant: Let me solve this step by step.\n<think>ok</think>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (P + "<answer>44 + 19 - 35</answer>", 1.0),
        (P + "<answer>(44+19)-35</answer><answer>44 + 19 - 35</answer>", 1.0),  # last match
        (P + "<answer>44 + 19 + 35</answer>", 0.1),  # wrong value
        (P + "<answer>44 + 19</answer>", 0.1),  # digits != nums
        (P + "<answer>44 + 19 - 35 = 28</answer>", 0.1),  # '=': digits 28 extra
        (P + "<answer>44 + 19 - 35 =</answer>", 0.1),  # '=' not whitelisted
        (P + "<answer>44 + 19 - 35 x</answer>", 0.1),  # whitelist
        (P + "<answer>44 + 19 - (35</answer>", 0.1),  # syntax error
        (P + "<answer>44 * 19 / (35 - 35)</answer>", 0.1),  # digits mismatch before eval
        (P + "<answer>\n44 + 19 - 35\n</answer>", 0.0),  # multi-line answer: not on last line
        (P + "<answer>44 + 19 - 35</answer>\nDone.", 0.0),  # answer not on the last line
        ("<answer>44 + 19 - 35</answer>", 0.0),  # no Assistant marker
        ("<|im_start|>assistant\n<answer>44 + 19 - 35</answer>", 1.0),
        (P + "<ANSWER>44 + 19 - 35</ANSWER>", 0.0),  # case-sensitive tags
    ],
)
def test_tinyzero_score_paths(text, expected):
    assert tinyzero_score(text, NUMS, TARGET) == expected


def test_tinyzero_quirks_power_floor_division_and_floats():
    # ** and // pass the whitelist and evaluate like Python
    assert tinyzero_score(P + "<answer>2 ** 3 + 20</answer>", [2, 3, 20], 28) == 1.0
    assert tinyzero_score(P + "<answer>57 // 2 - 0</answer>", [57, 2, 0], 28) == 1.0
    # "1.5" is the numbers 1 and 5, and floats compare with tolerance
    assert tinyzero_score(P + "<answer>1.5 * 2</answer>", [1, 5, 2], 3) == 1.0
    assert tinyzero_score(P + "<answer>1 / 3 * 3</answer>", [1, 3, 3], 1) == 1.0
    assert tinyzero_score(P + "<answer>1 / 0 + 2</answer>", [1, 0, 2], 3) == 0.1
    assert tinyzero_score(P + "<answer>(1)(2)</answer>", [1, 2], 2) == 0.1  # call -> TypeError
    assert (
        tinyzero_score(P + "<answer>1 + 2</answer>", [1, 2], 3, format_score=0.0, score=2.0) == 2.0
    )


def test_tinyzero_huge_power_fails_fast_instead_of_hanging():
    # computing 99 ** 99 ** 99 never ends: the guard fails the test if the score does not return
    assert finishes(tinyzero_score, P + "<answer>99 ** 99 ** 99</answer>", [99, 99, 99], 1) == 0.1


# --- pass@k --------------------------------------------------------------------------------------


def test_pass_at_k_hand_checked():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2) = 0.7
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c/n
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset has a correct sample
    assert pass_at_k(5, 5, 5) == 1.0


def test_pass_at_k_rejects_bad_counts():
    for n, c, k in [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)]:
        with pytest.raises(ConfigError):
            pass_at_k(n, c, k)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(5, 2), (5, 0), (5, 5)], 2) == pytest.approx((0.7 + 0 + 1) / 3)
    assert mean_pass_at_k([], 1) == 0.0


# --- answer-tag rule (and the tag fuzz classes) -------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # a mention of the tag in the reasoning, then the real block
        "I will put the final equation inside <answer> tags.\n<answer>44 + 19 - 35</answer>",
        "Format: <answer> and </answer>. So <answer>44 + 19 - 35</answer>",
        "<think>remember the <ANSWER> tag</think>\n<answer>\n44 + 19 - 35\n</answer>",
        # an unclosed tag after the final block does not erase it (a truncated second answer)
        "<answer>44 + 19 - 35</answer>\nLet me double-check: <answer>44 + 19",
        # a stray closing tag before or after the block is ignored
        "</answer> ok <answer>44 + 19 - 35</answer> </answer>",
        # nested: the innermost (closed, tag-free) block
        "<answer>1 + <answer>44 + 19 - 35</answer> 2</answer>",
    ],
)
def test_last_closed_block_wins_and_unpaired_tags_are_ignored(text):
    v = check(text, NUMS, TARGET)
    assert (v.outcome, v.answer) == ("correct", "44 + 19 - 35")


def test_only_a_mention_or_an_unclosed_tag_is_missing_answer_tags():
    assert outcome("I will answer inside <answer> tags. 44 + 19 - 35") == "missing_answer_tags"
    assert outcome("44 + 19 - 35 </answer>") == "missing_answer_tags"
    assert outcome("</answer>44 + 19 - 35<answer>") == "missing_answer_tags"


@pytest.mark.parametrize(
    "text",
    [
        "<anſwer>44 + 19 - 35</anſwer>",  # U+017F LATIN SMALL LETTER LONG S folds to 's'
        "<answer>44 + 19 - 35</anſwer>",
        "<ANſWER>44 + 19 - 35</ANSWER>",
        "＜answer＞44 + 19 - 35＜/answer＞",  # fullwidth brackets
        "<answer >44 + 19 - 35</answer >",
    ],
)
def test_tags_match_ascii_case_insensitively_only(text):
    assert outcome(text) == "missing_answer_tags"


def _verdicts(text):
    return check(text, NUMS, TARGET).outcome, tinyzero_score(P + text, NUMS, TARGET)


def test_tag_search_is_linear():
    # 800,000 characters of tags: a linear scan takes about a second; the old lazy regex was
    # quadratic (seconds at 80,000 characters, so many minutes here), which the guard catches
    n = 100_000
    assert finishes(_verdicts, "<answer>" * n) == ("missing_answer_tags", 0.0)
    assert finishes(_verdicts, "<answer>" * n + "1</answer>")[0] == "invalid_number_usage"
    assert finishes(_verdicts, "</answer>" * n) == ("missing_answer_tags", 0.0)


def test_lone_surrogates_and_odd_text_get_a_verdict():
    assert outcome("\ud800<answer>44 + 19 - 35</answer>\udfff") == "correct"
    assert outcome("<answer>\ud800</answer>") == "lhs_parse_or_eval_error"
    assert outcome("<answer>44 + 19 - 35 = \udc80</answer>") == "rhs_parse_or_eval_error"
    assert tinyzero_score(P + "\ud800<answer>44 + 19 - 35</answer>", NUMS, TARGET) == 1.0


# --- numbers: plain decimal integers, any size ------------------------------------------------


@pytest.mark.parametrize(
    "spelling", ["4_4", "0x2c", "0o54", "0b101100", "44.0", "4.4e1", "44e0", "044", "٤٤", "４４"]
)
def test_python_literal_spellings_are_not_numbers(spelling):
    assert outcome(f"<answer>{spelling} + 19 - 35</answer>") == "lhs_parse_or_eval_error"
    assert outcome(f"<answer>44 + 19 - 35 = {spelling} - 16</answer>") == (
        "rhs_parse_or_eval_error"
    )


def test_zero_and_comments_and_double_zero():
    assert outcome("<answer>28 + 0</answer>", nums=[28, 0]) == "correct"
    assert outcome("<answer>28 + 00</answer>", nums=[28, 0]) == "lhs_parse_or_eval_error"
    assert outcome("<answer>44 + 19 - 35 # done</answer>") == "lhs_parse_or_eval_error"


def _balanced_product(factors: list[str]) -> str:
    if len(factors) == 1:
        return factors[0]
    half = len(factors) // 2
    return f"({_balanced_product(factors[:half])} * {_balanced_product(factors[half:])})"


def test_values_past_python_int_str_limit_give_verdicts():
    nums = [99] * 2200  # 99 ** 2200 has 4,391 digits
    product = _balanced_product(["99"] * 2200)
    v = check(f"<answer>{product}</answer>", nums, 1)
    assert v.outcome == "wrong_value" and v.value == Fraction(99) ** 2200
    assert v.detail == "<a number of about 4391 digits> != 1"
    v = check(f"<answer>{product} = {product} + 1</answer>", nums, 1)
    assert v.outcome == "equation_not_balanced" and "digits" in v.detail
    v = check(f"<answer>{product} / 7</answer>", [*nums, 7], 1)
    assert v.outcome == "wrong_value" and v.detail.startswith("<a fraction of about")
    assert check(f"<answer>{product}</answer>", nums, 99**2200).outcome == "correct"
    # a huge given number in the usage detail
    v = check("<answer>1 + 2</answer>", [10**5000, 1], 3)
    assert v.outcome == "invalid_number_usage" and "<a number of about 5001 digits>" in v.detail


def test_a_literal_past_the_limit_is_a_parse_error():
    v = check("<answer>" + "9" * 5000 + "</answer>", NUMS, TARGET)
    assert v.outcome == "lhs_parse_or_eval_error" and "5000 digits" in v.detail
    assert outcome("<answer>44 + 19 - 35 = " + "9" * 4301 + "</answer>") == (
        "rhs_parse_or_eval_error"
    )
    assert outcome("<answer>" + "9" * 4300 + "</answer>") == "invalid_number_usage"


def test_tinyzero_score_survives_huge_literals():
    assert tinyzero_score(P + "<answer>" + "9" * 5000 + "</answer>", NUMS, TARGET) == 0.1
    assert tinyzero_score(P + "<answer>" + "9" * 4300 + " * 0</answer>", [10**4300 - 1, 0], 0) == (
        1.0
    )


# --- nesting and length -------------------------------------------------------------------------


def test_deep_nesting_gets_a_verdict_not_a_recursion_error():
    deep = "(" * 5000 + "44 + 19" + ")" * 5000 + " - 35"
    assert outcome(f"<answer>{deep}</answer>") == "correct"
    assert outcome(f"<answer>{'-' * 20_000}44 + 19 - 35</answer>") == "correct"  # even: +
    assert outcome(f"<answer>{'-' * 20_001}44 + 19 - 35</answer>") == "wrong_value"
    assert outcome(f"<answer>{'(' * 5000}44 + 19 - 35</answer>") == "lhs_parse_or_eval_error"
    # a long flat chain is not "nested": it evaluates (and uses numbers it was not given)
    v = check("<answer>" + " + ".join(["1"] * 20_000) + "</answer>", [1] * 20_000, 20_000)
    assert v.outcome == "correct"
    v = check("<answer>" + " * ".join(["99"] * 3000) + "</answer>", NUMS, TARGET)
    assert v.outcome == "invalid_number_usage" and "(3000 numbers)" in v.detail


def test_precedence_and_unary_follow_python():
    for expr, value in [
        ("2 + 3 * 4", 14),
        ("2 * 3 + 4", 10),
        ("8 / 2 / 2", 2),
        ("8 - 2 - 2", 4),
        ("-2 * 3", -6),
        ("2 * -3 + 1", -5),
        ("- (2 + 3) * 4", -20),
        ("+-+2", -2),
        ("2 - -3", 5),
        ("(1 + 2) / (3 - 1)", Fraction(3, 2)),
    ]:
        v = check(f"<answer>{expr}</answer>", [], 0, number_usage="subset")
        assert v.value == value, expr


@pytest.mark.parametrize("terms", [2, 999, 1200, 2500])
def test_tinyzero_scores_long_chains_as_pythons_eval_does(terms):
    # TinyZero evaluates with eval(): a chain Python's parser reads scores on its value; the
    # evaluator here is iterative, so no recursion limit of its own turns it into format_score
    equation = " + ".join(["1"] * terms)
    want = 1.0 if eval(equation) == terms else 0.1  # the reference: Python's own eval
    assert tinyzero_score(f"{P}<answer>{equation}</answer>", [1] * terms, terms) == want == 1.0


def test_tinyzero_takes_what_pythons_parser_takes_and_the_strict_checker_any_depth():
    deep = "(" * 300 + "44 + 19 - 35" + ")" * 300  # past the parser's 200 nested parentheses
    with pytest.raises(SyntaxError):
        compile(deep, "<answer>", "eval")
    assert tinyzero_score(f"{P}<answer>{deep}</answer>", NUMS, TARGET) == 0.1  # as eval fails
    assert check(f"<answer>{deep}</answer>", NUMS, TARGET).correct
    shallow = "(" * 150 + "44 + 19 - 35" + ")" * 150
    assert tinyzero_score(f"{P}<answer>{shallow}</answer>", NUMS, TARGET) == 1.0
