"""`distil eval --task gsm8k|math|mmlu|module:Class`: end to end on local files with the public
datasets' column names (JSONL and parquet), with a tiny model and with completions files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distil.cli import main
from distil.config import EvalConfig
from distil.tasks import make_task

GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A pen costs $2. Ten pens?", "answer": "2*10=<<2*10=20>>20\n#### 20"},
    {"question": "Half of 1,000?", "answer": "1000/2=500\n#### 500"},
]
MATH = [  # MATH-500's columns
    {
        "problem": "What is $\\frac{2}{4}$ in lowest terms?",
        "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
        "answer": "\\frac{1}{2}",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
    {
        "problem": "Compute $\\sqrt{16}$.",
        "solution": "It is $\\boxed{4}$.",
        "answer": "4",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/2.json",
    },
]


def _mmlu(q, subject, answer=0):
    return {"question": q, "subject": subject, "choices": ["w", "x", "y", "z"], "answer": answer}


MMLU_TEST = [_mmlu("Q1?", "astronomy", 2), _mmlu("Q2?", "virology", 1), _mmlu("Q3?", "astronomy")]
MMLU_DEV = [_mmlu(f"D{i}?", s, i % 4) for i, s in enumerate(["astronomy", "virology"] * 3)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path):
    return {
        "gsm8k": write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K),
        "math": write_parquet(tmp_path / "math500_test.parquet", MATH),
        "mmlu": write_jsonl(tmp_path / "mmlu_test.jsonl", MMLU_TEST),
        "mmlu_dev": write_jsonl(tmp_path / "mmlu_dev.jsonl", MMLU_DEV),
    }


HEADERS = {
    "gsm8k": "| Model | Correct | Accuracy | No Number | Wrong Value |",
    "math": "| Model | Correct | Accuracy | No Boxed Answer | Unparsable | Wrong Value |",
    "mmlu": "| Model | Correct | Accuracy | No Choice | Wrong Choice |",
}


@pytest.mark.parametrize("name", ["gsm8k", "math", "mmlu"])
def test_eval_a_tiny_model_on_each_task(tmp_path, capsys, files, tiny_model_dir, name):
    argv = ["eval", "--task", name, "--data", files[name], "--model", tiny_model_dir]
    argv += ["--n", 2, "--max-new-tokens", 4, "--no-progress", "--out", tmp_path / "r"]
    argv += [f"eval.fewshot_data={files['mmlu_dev']}"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == HEADERS[name]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["task"] == name and report["outcomes"][0] == "correct"
    model = report["models"][0]
    assert model["total"] == 2 and sum(model[o] for o in report["outcomes"]) == 2
    assert model["data"]["path"] == str(files[name]) and model["data"]["used"] == 2
    verdicts = (tmp_path / "r" / model["verdicts"]).read_text().splitlines()
    first = json.loads(verdicts[0])
    assert len(verdicts) == 2 and first["samples"][0]["outcome"] in report["outcomes"]
    assert "_shots" not in first  # the k-shot examples stay out of the verdict files
    if name == "mmlu":
        assert model["data"]["fewshot"]["k"] == 5
        assert "| Group | " in out and "| astronomy | " in out and "| virology | " in out


GOOD = {
    "gsm8k": ["#### 7", "The total is $20.", "\\boxed{499}"],
    "math": ["so \\boxed{0.5}", "\\boxed{@@}"],
    "mmlu": ["Answer: C", "(B)", "no idea"],
}
EXPECTED = {
    "gsm8k": "| gsm8k_outs | 2/3 | 66.67% | 0 | 1 |",
    "math": "| math_outs | 1/2 | 50.00% | 0 | 1 | 0 |",
    "mmlu": "| mmlu_outs | 2/3 | 66.67% | 1 | 0 |",
}


@pytest.mark.parametrize("name", ["gsm8k", "math", "mmlu"])
def test_eval_completions_files_of_each_task(tmp_path, capsys, name):
    rows = {"gsm8k": GSM8K, "math": MATH, "mmlu": MMLU_TEST}[name]
    outs = [{**r, "completion": c} for r, c in zip(rows, GOOD[name], strict=True)]
    path = write_jsonl(tmp_path / f"{name}_outs.jsonl", outs)
    code, out, err = run(capsys, "eval", "--task", name, "--completions", path, "--out", tmp_path)
    assert code == 0, err
    assert out.splitlines()[0] == HEADERS[name]
    assert out.splitlines()[2] == EXPECTED[name]


def test_a_completions_row_without_the_tasks_columns_names_file_and_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "outs.jsonl", [{**GSM8K[0], "completion": "7"}, {"q": 1}])
    code, out, err = run(capsys, "eval", "--task", "gsm8k", "--completions", path)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"{path}:2: column 'question' must be a non-empty str" in err


def test_mmlu_shots_are_the_first_k_dev_rows_of_the_same_subject(files):
    cfg = EvalConfig(task="mmlu", data=str(files["mmlu"]), fewshot_data=str(files["mmlu_dev"]))
    problems, info = make_task(cfg.model_copy(update={"num_fewshot": 2})).load()
    task = make_task(cfg)
    prompt = task.messages(problems[0])[0]["content"]
    assert prompt == (
        "The following are multiple choice questions (with answers) about astronomy.\n\n"
        "D0?\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
        "D2?\nA. w\nB. x\nC. y\nD. z\nAnswer: C\n\n"
        "Q1?\nA. w\nB. x\nC. y\nD. z\nAnswer:"
    )
    assert [s["question"] for s in problems[1]["_shots"]] == ["D1?", "D3?"]
    assert info["fewshot"]["k"] == 2 and info["fewshot"]["path"] == str(files["mmlu_dev"])
    zero = make_task(cfg.model_copy(update={"num_fewshot": 0}))
    assert zero.messages(zero.load()[0][0])[0]["content"].count("Answer:") == 1


def test_mmlu_local_file_without_shots_says_how_to_fix(tmp_path, capsys, files, tiny_model_dir):
    argv = ["eval", "--task", "mmlu", "--data", files["mmlu"], "--model", tiny_model_dir]
    code, _, err = run(capsys, *argv, "--out", tmp_path / "r")
    assert code == 2 and "eval.fewshot_data" in err and "eval.num_fewshot=0" in err
    assert not (tmp_path / "r").exists()


def test_eval_with_a_task_by_import_path(tmp_path, capsys, monkeypatch, tiny_model_dir):
    (tmp_path / "eval_user_task.py").write_text(
        "from distil.tasks import Task, Verdict\n\n"
        "class Anything(Task):\n"
        "    outcomes = ('correct', 'empty')\n"
        "    def problem(self, row, where):\n"
        "        return {'q': row['q']}\n"
        "    def messages(self, problem):\n"
        "        return [{'role': 'user', 'content': problem['q']}]\n"
        "    def check(self, completion, problem):\n"
        "        return Verdict('correct' if completion else 'empty', completion)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "eval_user_task", raising=False)
    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "qs.jsonl", [{"q": "hello"}, {"q": "world"}])
    argv = ["eval", "--task", "eval_user_task:Anything", "--data", data, "--model", tiny_model_dir]
    code, out, err = run(capsys, *argv, "--n", 2, "--max-new-tokens", 3, "--no-progress")
    assert code == 0, err
    assert out.splitlines()[0] == "| Model | Correct | Accuracy | Empty |"
    report = json.loads(Path("eval-report/report.json").read_text())
    assert report["task"] == "eval_user_task:Anything" and report["outcomes"] == [
        "correct",
        "empty",
    ]
    assert report["models"][0]["total"] == 2


def test_hub_ids_load_through_datasets_with_subset_and_split(monkeypatch):
    """No download: datasets.load_dataset is replaced; the task passes id, subset and split, the
    mmlu shots come from the same id's dev split, and the report records the hub source."""
    import datasets

    calls = []

    def load_dataset(path, name=None, *, split):
        calls.append((path, name, split))
        if path == "my/gsm":
            return GSM8K
        return {"test": MMLU_TEST, "dev": MMLU_DEV}[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    problems, info = make_task(EvalConfig(task="mmlu", n=2)).load()  # eval.data null: cais/mmlu
    assert calls == [("cais/mmlu", "all", "test"), ("cais/mmlu", "all", "dev")]
    assert info == {
        "hub": "cais/mmlu",
        "subset": "all",
        "split": "test",
        "rows": 3,
        "used": 2,
        "fewshot": {"k": 5, "hub": "cais/mmlu"},
    }
    assert [s["question"] for s in problems[0]["_shots"]] == ["D0?", "D2?", "D4?"]
    calls.clear()
    problems, info = make_task(EvalConfig(task="gsm8k", data="my/gsm", subset="x")).load()
    assert calls == [("my/gsm", "x", "test")] and info["hub"] == "my/gsm"
    # a hub source in the report's sources line
    from distil.eval.runner import format_sources, score

    r = score(
        "m", [{**problems[0], "completions": ["#### 7"]}], task=make_task(EvalConfig(task="gsm8k"))
    )
    r.data = info
    assert "problems hub dataset `my/gsm`, subset x, split test" in format_sources([r], {})
