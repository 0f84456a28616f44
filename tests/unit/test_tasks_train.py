"""`eval.task` drives the periodic evaluation of a training run: eval/* metrics for gsm8k and
for a task given by import path, and `distil config validate` reads the task's problems file."""

from __future__ import annotations

import json
import sys

import pytest

from distil.config import build_config
from distil.preflight import preflight
from distil.testing import read_metrics
from distil.train import loop

GSM8K = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}=<<{a}+{b}={a + b}>>\n#### {a + b}"}
    for a, b in [(1, 2), (3, 4), (5, 6)]
]


def _config(make_train_config, tmp_path, **eval_section):
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    return build_config(
        make_train_config(
            train={"max_steps": 2, "eval_every": 1},
            eval={"task": "gsm8k", "data": str(path), "n": 3, "max_new_tokens": 6, **eval_section},
        )
    )


def test_training_with_gsm8k_eval_logs_its_metrics(tmp_path, make_train_config):
    cfg = _config(make_train_config, tmp_path, samples=2, temperature=1.0)
    assert preflight(cfg)[0] == []
    loop.train(cfg)
    evals = [m for m in read_metrics(tmp_path / "run") if "eval/accuracy" in m]
    assert len(evals) == 2
    for m in evals:
        assert m["eval/total"] == 6 and m["eval/problems"] == 3  # 3 problems x 2 samples
        assert m["eval/correct"] + m["eval/no_number"] + m["eval/wrong_value"] == 6
        assert m["eval/accuracy"] == m["eval/correct"] / 6 == pytest.approx(m["eval/mean_at_k"])
        assert {"eval/pass@1", "eval/pass@2"} <= m.keys()
        assert "eval/missing_answer_tags" not in m  # Countdown's categories are not logged


def test_validate_reads_the_tasks_problems_file(tmp_path, make_train_config):
    cfg = _config(make_train_config, tmp_path)
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "q", "answer": "no marker"}\n')
    problems = preflight(cfg)[0]
    assert len(problems) == 1 and "gsm8k_test.jsonl:1: column 'answer' must end in" in problems[0]


def test_training_with_a_task_by_import_path(tmp_path, make_train_config, monkeypatch):
    (tmp_path / "train_user_task.py").write_text(
        "from distil.tasks import Task, Verdict\n\n"
        "class Length(Task):\n"
        "    outcomes = ('correct', 'too_short')\n"
        "    def problem(self, row, where):\n"
        "        return {'question': row['question']}\n"
        "    def messages(self, problem):\n"
        "        return [{'role': 'user', 'content': problem['question']}]\n"
        "    def check(self, completion, problem):\n"
        "        return Verdict('correct' if len(completion) >= 0 else 'too_short')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "train_user_task", raising=False)
    cfg = _config(make_train_config, tmp_path, task="train_user_task:Length")
    loop.train(cfg)
    evals = [m for m in read_metrics(tmp_path / "run") if "eval/accuracy" in m]
    assert [(m["eval/accuracy"], m["eval/too_short"], m["eval/total"]) for m in evals] == [
        (1.0, 0, 3),
        (1.0, 0, 3),
    ]


def test_a_broken_task_path_stops_validate(tmp_path, make_train_config):
    cfg = _config(make_train_config, tmp_path, task="no_such_module_x:Task")
    problems = preflight(cfg)[0]
    assert any("cannot import module 'no_such_module_x'" in p for p in problems)


@pytest.mark.parametrize("name", ["gsm9k", "Math"])
def test_training_rejects_an_unknown_task_name_before_loading(tmp_path, make_train_config, name):
    # the config holds the name; `distil train` asks the pre-flight before any weights load
    from distil.errors import ConfigError
    from distil.train import loop

    cfg = _config(make_train_config, tmp_path, task=name)
    with pytest.raises(ConfigError, match="valid: countdown, gsm8k, math, mmlu"):
        loop.train(cfg)
    assert not (tmp_path / "run").exists()
