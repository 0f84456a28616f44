"""Countdown data: solver (exhaustive, simplest, minimal parentheses), generator, templates, files."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re
from collections import Counter

import pytest
from hang_guard import finishes
from hypothesis import given, settings
from hypothesis import strategies as st

from distil.errors import ConfigError, DataError
from distil.tasks.countdown import (
    TEMPLATES,
    Problem,
    check,
    compact,
    count_problems,
    generate_dataset,
    generate_problems,
    generate_splits,
    get_template,
    parse_numbers,
    problem_key,
    reachable_targets,
    read_rows,
    solution_steps,
    solve,
    split_set,
    to_rows,
    write_rows,
)
from distil.tasks.countdown import solver as cd

# --- solver ------------------------------------------------------------------------------------


def brute_values(nums: list[int]) -> set[int]:
    """Reference: combine any two numbers with any legal op, recurse (Stream-of-Search style)."""
    if len(nums) == 1:
        return {nums[0]}
    out: set[int] = set()
    for i in range(len(nums)):
        for j in range(i + 1, len(nums)):
            a, b = max(nums[i], nums[j]), min(nums[i], nums[j])
            rest = [x for k, x in enumerate(nums) if k not in (i, j)]
            results = [a + b, a * b] + ([a - b] if a > b else []) + ([a // b] if a % b == 0 else [])
            for r in results:
                out |= brute_values([*rest, r])
    return out


def test_solver_is_exhaustive_against_brute_force():
    rng = random.Random(7)
    cases = [[5, 5, 2], [1, 1, 1, 1], [2, 2, 2, 2], [99, 98, 1, 1]]
    cases += [[rng.randint(1, 30) for _ in range(rng.choice((2, 3, 4)))] for _ in range(40)]
    for nums in cases:
        reached = reachable_targets(nums)
        assert set(reached) == brute_values(nums), nums
        for value, expr in list(reached.items())[:50]:
            assert check(f"<answer>{expr}</answer>", nums, value).correct, (nums, value, expr)


def test_solve_small_cases():
    assert solve([1, 2, 3], 100) is None
    assert solve([12, 7, 3], 57) == "(12 + 7) * 3"
    assert solve([5, 5, 2], 1) == "2 - 5 / 5"  # 1 needs a '/', the fewest parentheses wins
    assert solve([7], 7) == "7"
    assert reachable_targets([4, 6]) == {2: "6 - 4", 10: "6 + 4", 24: "6 * 4"}  # 6/4 not int
    assert reachable_targets([2, 4]) == {2: "4 - 2", 6: "4 + 2", 8: "4 * 2"}  # '-' beats '/'
    assert reachable_targets([3, 3]) == {1: "3 / 3", 6: "3 + 3", 9: "3 * 3"}  # no 0
    with pytest.raises(DataError):
        solve([3, 0], 3)
    with pytest.raises(DataError):
        solve([], 3)


def brute_simplest(nums: tuple[int, ...]) -> dict[int, tuple]:
    """Reference: every expression tree, printed, scored by ('/', '(', '-', length)."""

    def trees(items):
        if len(items) == 1:
            yield items[0]
            return
        for i, j in itertools.permutations(range(len(items)), 2):
            a, b = items[i], items[j]
            rest = [x for k, x in enumerate(items) if k not in (i, j)]
            ops = ["+", "*"] if i < j else []
            ops += (["-"] if a[3] > b[3] else []) + (["/"] if a[3] % b[3] == 0 else [])
            for op in ops:
                yield from trees([*rest, node(op, a, b)])

    best: dict[int, tuple] = {}
    for tree in trees([leaf(x) for x in nums]):
        s = cd._render(tree, " ")
        key = (s.count("/"), s.count("("), s.count("-"), len(s))
        best[tree[3]] = min(best.get(tree[3], key), key)
    return best


def test_solver_picks_the_simplest_expression():
    assert solve([2, 4, 4], 8) == "(4 - 2) * 4"  # no '/' beats no parentheses (4 * 4 / 2)
    assert solve([2, 2, 2], 8) == "2 * 2 * 2"  # not (2 + 2) * 2
    assert solve([2, 2, 5], 1) == "5 - 2 * 2"  # one '-' beats two (5 - 2 - 2)
    cases = list(itertools.combinations_with_replacement(range(1, 8), 3))
    cases += list(itertools.combinations_with_replacement(range(1, 5), 4))
    for nums in cases:
        best = brute_simplest(nums)
        for value, s in reachable_targets(nums).items():
            assert (s.count("/"), s.count("("), s.count("-"), len(s)) == best[value], (nums, s)


def node(op: str, left, right):
    value = {"+": left[3] + right[3], "-": left[3] - right[3], "*": left[3] * right[3]}.get(op)
    value = value if value is not None else left[3] // right[3]
    return [0, 1 if op in "+-" else 2, 1, value, op, left, right]


def leaf(n: int):
    return [len(str(n)), 3, 1, n, None, None, None]


@pytest.mark.parametrize(
    ("tree", "spaced"),
    [
        (node("-", leaf(9), node("-", leaf(5), leaf(2))), "9 - (5 - 2)"),
        (node("-", leaf(9), node("+", leaf(5), leaf(2))), "9 - (5 + 2)"),
        (node("/", leaf(24), node("*", leaf(3), leaf(2))), "24 / (3 * 2)"),
        (node("/", leaf(24), node("/", leaf(6), leaf(2))), "24 / (6 / 2)"),
        (node("+", leaf(9), node("-", leaf(5), leaf(2))), "9 + 5 - 2"),
        (node("-", node("-", leaf(9), leaf(5)), leaf(2)), "9 - 5 - 2"),
        (node("*", node("+", leaf(12), leaf(7)), leaf(3)), "(12 + 7) * 3"),
        (node("*", leaf(3), node("+", leaf(12), leaf(7))), "3 * (12 + 7)"),
        (node("*", leaf(4), node("/", leaf(6), leaf(3))), "4 * 6 / 3"),
        (node("/", node("/", leaf(24), leaf(6)), leaf(2)), "24 / 6 / 2"),
        (node("-", leaf(9), node("*", leaf(2), leaf(3))), "9 - 2 * 3"),
        (node("/", node("+", leaf(9), leaf(3)), node("-", leaf(5), leaf(2))), "(9 + 3) / (5 - 2)"),
    ],
)
def test_minimal_parentheses_printing(tree, spaced):
    assert cd._render(tree, " ") == spaced
    assert cd._render(tree, "") == compact(spaced)
    # the printed string evaluates to the tree's value (left-associative re-parse is safe)
    nums = [int(t) for t in spaced.replace("(", " ").replace(")", " ").split() if t.isdigit()]
    assert check(f"<answer>{spaced}</answer>", nums, tree[3]).correct


def test_solution_steps():
    assert solution_steps("(44 + 19) - 35") == ["44 + 19 = 63", "63 - 35 = 28"]
    assert solution_steps("24 / (6 / 2)") == ["6 / 2 = 3", "24 / 3 = 8"]
    assert solution_steps("7") == []
    for bad in ["2 ** 3", "1 +", "x - 1", "1 / 0", "-3 + 4", "(1 + 2", "1 + 2)", "()", "1 2"]:
        with pytest.raises(DataError):
            solution_steps(bad)


def ast_steps(expression: str) -> list[str] | None:
    """Reference: the steps of Python's own parse (a recursive walk), None where Python does not
    read the expression as + - * / on integers."""
    import ast
    from fractions import Fraction

    symbols = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
    steps = []

    def walk(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if not (isinstance(node, ast.BinOp) and type(node.op) in symbols):
            raise ValueError
        a, b = walk(node.left), walk(node.right)
        op = symbols[type(node.op)]
        value = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
        steps.append(f"{a} {op} {b} = {value}")
        return value

    try:
        walk(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None
    return steps


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", max_size=40))
def test_solution_steps_follow_pythons_parse(text):
    # any text: the same steps as Python's own reading of it, or a DataError where Python reads
    # no plain arithmetic on integers (never another exception)
    if re.search(r"(^|[^0-9])0[0-9]", text):  # Python refuses 007, distil reads 7: either is fine
        with contextlib.suppress(DataError):
            solution_steps(text)
        return
    want = ast_steps(text)
    if want is None:
        with pytest.raises(DataError):
            solution_steps(text)
    else:
        assert solution_steps(text) == want


@pytest.mark.parametrize(
    ("solution", "why"),
    [
        ("\u0000", "unexpected"),
        ("1 ** 2", "unexpected '*'"),
        ("-" * 3000 + "1", "unexpected '-'"),
        ("9" * 5000, "more than 4,300 digits"),
        ("(" * 3000 + "1" + ")" * 2999, "incomplete"),
    ],
)
def test_a_bad_solution_column_names_the_file_and_line(tmp_path, solution, why):
    from distil.tasks.prompts import examples_from

    path = tmp_path / "rows.jsonl"
    good = {"nums": [1, 2], "target": 3, "solution": "1 + 2"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "solution": solution}) + "\n")
    with pytest.raises(DataError, match=rf"rows\.jsonl:2: column 'solution': .*{re.escape(why)}"):
        examples_from(str(path), template="countdown_chat")


def test_solution_steps_of_long_chains_and_deep_parentheses():
    # thousands of terms or parentheses: steps, not a RecursionError (Python's parser stops at
    # a few thousand terms and at 200 nested parentheses)
    chain = "+".join(["1"] * 5000)
    steps = solution_steps(chain)
    assert len(steps) == 4999 and steps[-1] == "4999 + 1 = 5000"
    assert solution_steps("(" * 3000 + "1 + 2" + ")" * 3000) == ["1 + 2 = 3"]


# --- generator ----------------------------------------------------------------------------------


def test_generator_is_deterministic_and_seeded():
    a = generate_problems(200, numbers=(3, 4), seed=3)
    assert a == generate_problems(200, numbers=(3, 4), seed=3)
    assert a != generate_problems(200, numbers=(3, 4), seed=4)
    assert all(isinstance(p, Problem) for p in a)


def test_generated_problems_follow_the_rules():
    problems = generate_problems(500, numbers=(3, 4), max_number=50, max_target=80, seed=1)
    assert len({p.key for p in problems}) == 500
    sizes = Counter(len(p.nums) for p in problems)
    assert set(sizes) == {3, 4} and min(sizes.values()) > 150  # a real mix
    for p in problems:
        assert all(1 <= x <= 50 for x in p.nums) and 1 <= p.target <= 80
        assert p.key == problem_key(p.nums, p.target) == (tuple(sorted(p.nums)), p.target)
        assert check(f"<answer>{p.solution}</answer>", p.nums, p.target).correct
    # numbers are presented in drawn order, not sorted
    assert any(list(p.nums) != sorted(p.nums) for p in problems)
    # targets are spread out, not stuck on a few small values
    assert len({p.target for p in problems}) > 60


def test_single_sizes():
    assert {len(p.nums) for p in generate_problems(50, numbers=(3,))} == {3}
    assert {len(p.nums) for p in generate_problems(50, numbers=(4,))} == {4}
    assert all(p.target <= 99 for p in generate_problems(50, numbers=(4,)))  # default = max_number


def test_exclude_and_splits_are_disjoint():
    train, test = generate_splits(300, 100, numbers=(3, 4), max_number=20, seed=5)
    assert len(train) == 300 and len(test) == 100
    assert not {p.key for p in train} & {p.key for p in test}
    # the test split does not depend on how much training data is asked for
    _, test_again = generate_splits(50, 100, numbers=(3, 4), max_number=20, seed=5)
    assert test_again == test
    excluded = frozenset(p.key for p in train[:100])
    fresh = generate_problems(200, numbers=(3, 4), max_number=20, seed=5, exclude=excluded)
    assert not {p.key for p in fresh} & excluded


def test_a_dev_split_is_held_out_like_the_test_split_and_leaves_it_unchanged(tmp_path):
    splits = split_set(300, 100, 80, numbers=(3, 4), max_number=20, seed=5)
    keys = {name: {p.key for p in problems} for name, problems in splits.items()}
    assert [len(splits[n]) for n in ("train", "dev", "test")] == [300, 80, 100]
    assert not keys["train"] & keys["dev"] and not keys["train"] & keys["test"]
    assert not keys["dev"] & keys["test"]
    _, test = generate_splits(300, 100, numbers=(3, 4), max_number=20, seed=5)
    assert splits["test"] == test  # adding a dev split keeps the test set
    out = generate_dataset(tmp_path, n=40, test_n=10, dev_n=8, template="countdown_plain")
    assert out["counts"] == {"train": 40, "dev": 8, "test": 10}
    assert len(read_rows(tmp_path / "dev.jsonl")) == 8


def test_count_problems_hand_checked():
    # sizes 2, numbers in {1, 2}, targets <= 2: (1,1) -> {1, 2}; (1,2) -> {1, 2}; (2,2) -> {1}
    assert count_problems((2,), 2, 2) == 5
    keys = {p.key for p in generate_problems(5, numbers=(2,), max_number=2, seed=0)}
    assert keys == {((1, 1), 1), ((1, 1), 2), ((1, 2), 1), ((1, 2), 2), ((2, 2), 1)}


def test_impossible_requests_raise_config_error():
    with pytest.raises(ConfigError, match="only 5 exist"):
        generate_problems(6, numbers=(2,), max_number=2)
    with pytest.raises(ConfigError, match="exist"):
        generate_problems(100_000, numbers=(3,), max_number=5)
    with pytest.raises(ConfigError, match="exist"):
        generate_splits(4, 2, numbers=(2,), max_number=2)
    # enough in total but all excluded: the bounded draw loop gives up with a clear message
    all_keys = frozenset(p.key for p in generate_problems(5, numbers=(2,), max_number=2))
    with pytest.raises(ConfigError, match="found only 0 of 1"):
        finishes(generate_problems, 1, numbers=(2,), max_number=2, exclude=all_keys)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"numbers": (6,)},
        {"numbers": ()},
        {"numbers": (1,)},
        {"max_number": 0},
        {"max_target": 0},
        {"n": -1},
    ],
)
def test_bad_generator_settings(kwargs):
    args = {"n": 3, **kwargs}
    with pytest.raises(ConfigError):
        generate_problems(args.pop("n"), **args)


def test_parse_numbers():
    assert parse_numbers("3") == (3,)
    assert parse_numbers("4") == (4,)
    assert parse_numbers("3-4") == (3, 4)
    assert parse_numbers(" 2-5 ") == (2, 3, 4, 5)
    assert parse_numbers(4) == (4,)
    assert parse_numbers((3, 4)) == (3, 4)
    for bad in ["", "x", "4-3", "1", "3-9", "3,4", "-3", "3-"]:
        with pytest.raises(ConfigError, match="3-4"):
            parse_numbers(bad)


def test_three_thousand_problems_resolve_and_check():
    """3k problems (3-4 numbers): the stored solution is the solver's answer and passes the
    strict checker, spaced and compact. Caches are cleared so the solver really runs again."""
    problems = generate_problems(3_000, numbers=parse_numbers("3-4"), seed=11)
    assert len({p.key for p in problems}) == 3_000
    cd._values_small.cache_clear()
    cd._values_large.cache_clear()
    for p in problems:
        assert solve(p.nums, p.target) == p.solution
        assert check(f"<answer>{p.solution}</answer>", p.nums, p.target).correct, p
        assert check(f"<answer>{compact(p.solution)}</answer>", p.nums, p.target).correct, p


# --- templates ---------------------------------------------------------------------------------

EXAMPLE = Problem((44, 19, 35), 28, "44 + 19 - 35")


def test_chat_template():
    tmpl = get_template("countdown_chat")
    system, user = tmpl.messages(EXAMPLE.nums, EXAMPLE.target)
    assert system == {
        "role": "system",
        "content": "You are a helpful assistant. You first think about the reasoning process "
        "in the mind and then provide the user with the answer.",
    }
    assert user["role"] == "user"
    for part in ["[44, 19, 35]", "28", "<think> </think>", "<answer> </answer>", "(1 + 2) / 3"]:
        assert part in user["content"]
    completion = tmpl.completion(EXAMPLE)
    assert completion == "<think>44 + 19 = 63, 63 - 35 = 28</think>\n<answer>44 + 19 - 35</answer>"
    assert check(completion, EXAMPLE.nums, EXAMPLE.target).correct


def test_plain_template():
    tmpl = get_template("countdown_plain")
    problem = Problem((12, 7, 3), 57, "(12 + 7) * 3")
    assert tmpl.messages(problem.nums, 57) == [
        {"role": "user", "content": "nums: 12 7 3 target: 57"}
    ]
    assert tmpl.completion(problem) == "<answer>(12+7)*3</answer>"
    assert check(tmpl.completion(problem), problem.nums, 57).correct


def test_unknown_template_lists_valid_names():
    assert set(TEMPLATES) == {"countdown_chat", "countdown_plain"}
    with pytest.raises(ConfigError, match="countdown_chat, countdown_plain"):
        get_template("countdown")


# --- files ---------------------------------------------------------------------------------------


def test_rows_round_trip_jsonl_and_parquet(tmp_path):
    problems = generate_problems(20, numbers=(3, 4), seed=2)
    rows = to_rows(problems, "countdown_chat")
    assert set(rows[0]) == {"nums", "target", "prompt", "solution", "completion"}
    assert rows[0]["nums"] == list(problems[0].nums) and rows[0]["solution"] == problems[0].solution
    paths = write_rows(rows, tmp_path / "out", "train")
    assert [p.name for p in paths] == ["train.jsonl", "train.parquet"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.jsonl", "train.parquet"]
    for path in paths:
        assert read_rows(path) == rows
    for row in rows:
        assert check(row["completion"], row["nums"], row["target"]).correct


def test_read_rows_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nums": [1, 2], "target": 3}\n{not json}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        read_rows(bad)
    bad.write_text('{"nums": [1, 2], "target": 3}\n\n{"nums": "1 2", "target": 3}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: a Countdown row needs"):
        read_rows(bad)
    with pytest.raises(DataError, match=r"jsonl or \.parquet"):
        read_rows(tmp_path / "missing.jsonl")
    other = tmp_path / "rows.csv"
    other.write_text("nums,target\n")
    with pytest.raises(DataError, match=r"jsonl or \.parquet"):
        read_rows(other)


def test_generate_dataset_writes_splits_and_meta(tmp_path):
    out = tmp_path / "cd"
    summary = generate_dataset(
        out, n=60, test_n=20, numbers="3-4", seed=9, template="countdown_plain"
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["counts"] == {"train": 60, "test": 20} and meta["numbers"] == [3, 4]
    assert meta["template"] == "countdown_plain" and meta["max_target"] == 99
    assert summary["counts"] == meta["counts"] and len(summary["files"]) == 5
    train, test = read_rows(out / "train.parquet"), read_rows(out / "test.jsonl")
    assert len(train) == 60 and len(test) == 20
    assert not {problem_key(r["nums"], r["target"]) for r in train} & {
        problem_key(r["nums"], r["target"]) for r in test
    }
    assert train[0]["prompt"][0]["content"].startswith("nums: ")
    assert (
        generate_dataset(
            tmp_path / "again", n=60, test_n=20, numbers="3-4", seed=9, template="countdown_plain"
        )["counts"]
        == meta["counts"]
    )
    assert read_rows(tmp_path / "again" / "train.jsonl") == read_rows(out / "train.jsonl")


def test_generate_dataset_rejects_bad_options_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="countdown_chat"):
        generate_dataset(tmp_path / "x", n=5, template="nope")
    with pytest.raises(ConfigError, match="3-4"):
        generate_dataset(tmp_path / "x", n=5, numbers="three")
    with pytest.raises(ConfigError, match="n_test"):
        generate_dataset(tmp_path / "x", n=5, test_n=-1)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        (b'{"nums": [1, 2], "target": 3}\n{"nums": [1, 2], "target": "\xe9"}\n', "2: not UTF-8"),
        (b'{"nums": [true, 2], "target": 3}\n', "1: a Countdown row needs"),
        (b'{"nums": [1, 2], "target": true}\n', "1: a Countdown row needs"),
        (b'{"nums": [1, 2], "target": 3, "x": "\\udc80"}\n', "1: text holds a lone surrogate"),
        (b'{"nums": [1, 2], "target": ' + b"1" * 4301 + b"}\n", "1: a JSON number is too long"),
        (b"[" * 4000 + b"]" * 4000 + b"\n", "1: JSON nested too deeply"),
    ],
)
def test_read_rows_bad_bytes_and_values_name_the_line(tmp_path, content, phrase):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(f"bad.jsonl:{phrase}")):
        read_rows(bad)


def test_read_rows_text_named_parquet_and_long_names(tmp_path):
    fake = tmp_path / "fake.parquet"
    fake.write_text("nums,target\n1,2\n")
    with pytest.raises(DataError, match="cannot read parquet"):
        read_rows(fake)
    with pytest.raises(DataError, match="File name too long"):
        read_rows(tmp_path / ("x" * 300 + ".jsonl"))
