"""The task interface: hand-made cases per failure category for every built-in task, the
registry (names, import paths, errors), and Countdown's verdicts unchanged behind the interface."""

from __future__ import annotations

import sys

import pytest

from distil.config import EvalConfig, load_config
from distil.errors import ConfigError, DataError, MissingExtraError
from distil.eval.runner import format_table, score
from distil.tasks import TASKS, Task, Verdict, get_task, make_task
from distil.tasks.countdown import checker
from distil.tasks.math import last_boxed
from distil.tasks.mmlu import extract as mmlu_extract

WHERE = {"path": "rows.jsonl", "line": 7}


def task(name: str, **cfg) -> Task:
    return make_task(EvalConfig(task=name, **cfg))


# ----------------------------------------------------------------------------- gsm8k

GSM_ROW = {"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7 boxes\n#### 1,234"}


@pytest.mark.parametrize(
    ("completion", "outcome", "answer"),
    [
        ("so the total is 1234.\n#### 1234", "correct", "1234"),
        ("#### 1,234", "correct", "1,234"),
        ("#### $1,234.", "correct", "$1,234"),
        ("The answer is \\boxed{1234}.", "correct", "1234"),
        ("First 5, then 10, finally 1234.00", "correct", "1234.00"),  # last number
        ("#### 1234\nbut later 99", "correct", "1234"),  # '####' wins over the last number
        ("#### 12 34", "wrong_value", "34"),
        ("#### 1235", "wrong_value", "1235"),
        ("it is -1234", "wrong_value", "-1234"),
        ("#### 1234.5", "wrong_value", "1234.5"),
        ("I do not know.", "no_number", None),
        ("", "no_number", None),
        ("#### " + "9" * 5000, "wrong_value", "9" * 5000),  # past int-from-str: no crash
    ],
)
def test_gsm8k_categories(completion, outcome, answer):
    t = task("gsm8k")
    v = t.check(completion, t.problem(GSM_ROW, WHERE))
    assert (v.outcome, v.answer) == (outcome, answer)


def test_gsm8k_reference_needs_the_final_marker():
    t = task("gsm8k")
    with pytest.raises(DataError, match=r"^rows.jsonl:7: column 'answer' must end in '####"):
        t.problem({"question": "q", "answer": "just 7"}, WHERE)
    with pytest.raises(DataError, match=r"rows.jsonl:7: column 'question' must be a non-empty"):
        t.problem({"answer": "#### 7"}, WHERE)


# ----------------------------------------------------------------------------- math

MATH_ROW = {"problem": "What is 1/2?", "solution": "Halve it: $\\boxed{\\frac{1}{2}}$."}


@pytest.mark.parametrize(
    ("completion", "outcome"),
    [
        ("\\boxed{\\frac{1}{2}}", "correct"),
        ("so $\\boxed{0.5}$", "correct"),
        ("\\boxed{\\dfrac12}", "correct"),
        ("\\boxed{\\frac{2}{4}}", "correct"),
        ("\\boxed{1/2}", "correct"),
        ("\\boxed{\\frac{1}{2}\\text{ cm}}", "correct"),  # units
        ("\\boxed 0.5", "correct"),
        ("\\fbox{\\frac{1}{2}}", "correct"),
        ("\\boxed{0.4} no wait \\boxed{0.5}", "correct"),  # the last box
        ("\\boxed{0.5} no wait \\boxed{0.4}", "wrong_value"),
        ("\\boxed{0.6}", "wrong_value"),
        ("\\boxed{2}", "wrong_value"),
        ("\\boxed{@@}", "unparsable"),
        ("The answer is 1/2.", "no_boxed_answer"),
        ("\\boxed{}", "no_boxed_answer"),
        ("\\boxed{\\frac{1}{2}", "no_boxed_answer"),  # never closed
        ("", "no_boxed_answer"),
    ],
)
def test_math_categories(completion, outcome):
    t = task("math")
    assert t.check(completion, t.problem(MATH_ROW, WHERE)).outcome == outcome


@pytest.mark.parametrize(
    ("answer", "completion", "outcome"),
    [
        ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}", "correct"),  # a text answer
        ("\\text{Evelyn}", "\\boxed{Evelyn}", "correct"),
        ("\\text{Evelyn}", "\\boxed{\\text{Bob}}", "wrong_value"),
        ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}", "correct"),  # sets
        ("x^{2}+1", "\\boxed{1 + x^2}", "correct"),  # symbolic
        ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{3}}{2}}", "correct"),  # nested braces
        ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{2}}{2}}", "wrong_value"),
        ("90^\\circ", "\\boxed{90}", "correct"),
        ("10\\%", "\\boxed{10}", "correct"),
    ],
)
def test_math_equivalences_with_the_answer_column(answer, completion, outcome):
    t = task("math")
    problem = t.problem({**MATH_ROW, "answer": answer}, WHERE)  # MATH-500's `answer` wins
    assert t.check(completion, problem).outcome == outcome


def test_last_boxed_matches_braces():
    assert last_boxed("a \\boxed{\\frac{\\sqrt{3}}{2}} b") == "\\frac{\\sqrt{3}}{2}"
    assert last_boxed("\\boxed{{x}}") == "{x}"
    assert last_boxed("$\\boxed 7$ then") == "7"
    assert last_boxed("\\boxed{a} \\boxed{b}") == "b"
    assert last_boxed("none") is None and last_boxed("\\boxed{open") is None


def test_math_reference_must_have_an_answer():
    with pytest.raises(DataError, match=r"rows.jsonl:7: the reference has no answer"):
        task("math").problem({"problem": "p", "solution": "no box"}, WHERE)


def test_math_without_math_verify_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'distil\[math\]'"):
        task("math")


# ----------------------------------------------------------------------------- mmlu

MMLU_ROW = {
    "question": "Capital of France?",
    "choices": ["Rome", "Paris", "Oslo", "Bern"],
    "answer": 1,
    "subject": "geography",
}


@pytest.mark.parametrize(
    ("completion", "outcome", "letter"),
    [
        ("Answer: B", "correct", "B"),
        ("The answer is (B).", "correct", "B"),
        ("B. Paris", "correct", "B"),
        (" B", "correct", "B"),
        ("I am fairly sure it is (B)", "correct", "B"),
        ("answer: b", "no_choice", None),  # letters are capitals
        ("Answer: C", "wrong_choice", "C"),
        ("A", "wrong_choice", "A"),
        ("the answer is a city", "no_choice", None),  # the article "a" is no choice
        ("Paris", "no_choice", None),
        ("Answer: E", "no_choice", None),  # not among four choices
        ("", "no_choice", None),
    ],
)
def test_mmlu_categories(completion, outcome, letter):
    t = task("mmlu", num_fewshot=0)
    v = t.check(completion, t.problem(MMLU_ROW, WHERE))
    assert (v.outcome, v.answer) == (outcome, letter)


def test_mmlu_letter_extraction_prefers_an_explicit_answer():
    assert mmlu_extract("(A) is tempting, but Answer: D", 4) == "D"
    assert mmlu_extract("Answer: (C)", 4) == "C"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({**MMLU_ROW, "answer": 4}, "must index 'choices' (0..3), got 4"),
        ({**MMLU_ROW, "choices": ["only"]}, "list of 2 to 10 strings"),
        ({**MMLU_ROW, "answer": "B"}, "column 'answer' must be a non-empty int"),
        ({**MMLU_ROW, "answer": True}, "column 'answer' must be a non-empty int"),
    ],
)
def test_mmlu_bad_rows(row, message):
    with pytest.raises(DataError, match=r"^rows.jsonl:7: ") as info:
        task("mmlu").problem(row, WHERE)
    assert message in str(info.value)


def test_mmlu_per_subject_accuracy_in_the_report():
    t = task("mmlu", num_fewshot=0)
    rows = [MMLU_ROW, {**MMLU_ROW, "subject": "astronomy"}, {**MMLU_ROW, "answer": 0}]
    problems = [
        {**t.make_problem(r, WHERE, i), "completions": [c]}
        for i, (r, c) in enumerate(zip(rows, ["Answer: B", "Answer: B", "?"], strict=True))
    ]
    result = score("m", problems, task=t)
    s = result.summary
    assert (s["correct"], s["no_choice"], s["wrong_choice"]) == (2, 1, 0)
    assert s["groups"] == {
        "astronomy": {"total": 1, "correct": 1, "accuracy": 1.0},
        "geography": {"total": 2, "correct": 1, "accuracy": 0.5},
    }
    table = format_table([result]).splitlines()
    assert table[0] == "| Model | Correct | Accuracy | No Choice | Wrong Choice |"
    assert table[2] == "| m | 2/3 | 66.67% | 1 | 0 |"
    assert table[4:] == [
        "| Group | m |",
        "|---|---|",
        "| astronomy | 100.00% (1/1) |",
        "| geography | 50.00% (1/2) |",
    ]


# ----------------------------------------------------------------------------- countdown

COUNTDOWN_CASES = [
    "<answer>44 + 19 - 35</answer>",
    "<answer>44 + 19 - 35 = 28</answer>",
    "<answer>44 + 19 - 35 = 29</answer>",
    "<answer>44 + 19</answer>",
    "<answer>44 + 19 + 35</answer>",
    "<answer>44 + 19 - 35 = x</answer>",
    "<answer>44 +</answer>",
    "no tags at all",
    "<ANSWER>44+19-35</ANSWER>",
    "<answer>007 + 19</answer>",
]


@pytest.mark.parametrize("number_usage", ["exact", "subset"])
def test_countdown_task_gives_the_checkers_verdicts(number_usage):
    t = task("countdown", number_usage=number_usage)
    problem = t.problem({"nums": [44, 19, 35], "target": 28}, WHERE)
    for text in COUNTDOWN_CASES:
        assert t.check(text, problem) == checker.check(
            text, [44, 19, 35], 28, number_usage=number_usage
        )
    assert {checker.check(t_, [44, 19, 35], 28).outcome for t_ in COUNTDOWN_CASES} == set(
        checker.OUTCOMES
    )  # the cases cover every category


def test_countdown_template_is_used_for_prompts():
    problem = {"nums": [1, 2], "target": 3}
    plain = task("countdown", template="countdown_plain").messages(problem)
    assert plain == [{"role": "user", "content": "nums: 1 2 target: 3"}]
    assert "<answer>" in task("countdown").messages(problem)[-1]["content"]  # countdown_chat


# ----------------------------------------------------------------------------- registry


def test_registry_lists_the_built_in_tasks():
    assert set(TASKS) == {"countdown", "gsm8k", "math", "mmlu"}
    assert all(get_task(name).name == name for name in TASKS)


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="valid: countdown, gsm8k, math, mmlu") as info:
        get_task("gsm9k")
    assert "mypkg.tasks:MyTask" in str(info.value)
    # the config holds the name; whether it resolves is the pre-flight's question (every
    # command that uses the task asks it before any weights load)
    from distil.preflight import check

    cfg = load_config(None, ["eval.task=gsm9k"])
    for command in ("train", "eval", "generate", "cache-teacher"):
        with pytest.raises(ConfigError, match=r"eval.task = 'gsm9k' is not a registered task"):
            check(cfg, command)


USER_TASK = """
from distil.tasks import Task, Verdict


class Yes(Task):
    name = "yes"
    outcomes = ("correct", "said_no")

    def problem(self, row, where):
        return {"q": row["q"]}

    def messages(self, problem):
        return [{"role": "user", "content": problem["q"]}]

    def check(self, completion, problem):
        if "yes" in completion:
            return Verdict("correct", "yes")
        return Verdict("said_no", None, "no yes")


class NotATask:
    pass


class Rogue(Yes):
    def check(self, completion, problem):
        return Verdict("surprise")
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_tasks_mod.py").write_text(USER_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_tasks_mod"
    sys.modules.pop("my_tasks_mod", None)


def test_a_task_by_import_path(user_module):
    t = task(f"{user_module}:Yes")
    problems = [{"q": "ok?", "completions": ["yes", "nope", "yes!"]}]
    result = score("u", problems, task=t)
    assert (result.summary["correct"], result.summary["said_no"]) == (2, 1)
    assert format_table([result]).splitlines()[0].endswith("| Said No | pass@2 | pass@3 |")


def test_bad_import_paths(user_module):
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        get_task("no_such_mod:Yes")
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        get_task(f"{user_module}:Nope")
    with pytest.raises(ConfigError, match="is not a task class"):
        get_task(f"{user_module}:NotATask")
    with pytest.raises(ConfigError, match="returned the outcome 'surprise'"):
        score("u", [{"q": "?", "completions": ["x"]}], task=task(f"{user_module}:Rogue"))


def test_verdict_correct_property():
    assert Verdict("correct").correct and not Verdict("wrong").correct


@pytest.mark.parametrize("name", ["math_onpolicy", "gsm8k_onpolicy", "mmlu_onpolicy"])
def test_task_presets_validate_without_downloads(name):
    from pathlib import Path

    from distil.preflight import preflight

    cfg = load_config(Path(__file__).parents[2] / "configs" / f"{name}.yaml")
    problems, notes = preflight(cfg)
    assert problems == []
    assert any("eval.data" in n and "hub id" in n for n in notes)  # named, not fetched
    assert cfg.eval.task == name.split("_")[0] and cfg.train.eval_every > 0


def test_the_example_task_in_docs_works(tmp_path, monkeypatch):
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text()
    code = text.split("## Writing a task", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "docs_yesno.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "docs_yesno", raising=False)
    t = task("docs_yesno:YesNo")
    row = {"question": "is it", "passage": "It is.", "answer": True}
    problem = t.make_problem(row, WHERE, 0)
    assert "Answer yes or no" in t.messages(problem)[0]["content"]
    outs = [t.check(c, problem).outcome for c in ["Yes.", "no", "maybe"]]
    assert outs == ["correct", "wrong_answer", "no_answer"]
    with pytest.raises(DataError, match=r"rows\.jsonl:7: column 'question' must be text"):
        t.problem({"passage": "p"}, WHERE)


def test_a_task_as_data_template_renders_training_prompts(tmp_path):
    import json

    from distil.tasks.prompts import examples_from

    rows = [
        {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"},
        {"question": "x", "answer": "y"},
    ]
    path = tmp_path / "gsm8k_train.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    (ex,) = examples_from(str(path), template="gsm8k", completion_field="answer")
    t = task("gsm8k")
    assert ex.prompt == t.messages(t.problem(rows[0], WHERE))
    assert ex.prompt[0]["content"].startswith("What is 2+2?\n\nSolve the problem step by step")
    assert ex.completion == "2+2=4\n#### 4"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"gsm8k_train\.jsonl:2: column 'answer' must end in"):
        examples_from(str(path), template="gsm8k", completion_field="answer")
    with pytest.raises(ConfigError, match="'gsm9k' is neither a Countdown template"):
        examples_from(str(path), template="gsm9k")
