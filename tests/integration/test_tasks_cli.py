"""`distil eval --task gsm8k` and `distil train` with eval.task by import path, through the real
CLI in a subprocess (the package as installed, a user module on PYTHONPATH)."""

import json
import os
import sys

import pytest
import yaml

import warm

pytestmark = pytest.mark.slow

GSM8K = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
    for a, b in [(1, 2), (3, 4)]
]
USER_TASK = """
from distil.tasks import Task, Verdict


class Short(Task):
    outcomes = ("correct", "too_long")

    def problem(self, row, where):
        return {"question": row["question"]}

    def messages(self, problem):
        return [{"role": "user", "content": problem["question"]}]

    def check(self, completion, problem):
        return Verdict("correct" if len(completion) <= 10_000 else "too_long")
"""


def distil(*args, cwd, pythonpath=""):
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    path = os.pathsep.join(p for p in (pythonpath, os.path.abspath(src)) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return warm.run(  # forked from a warm interpreter with this PYTHONPATH (tests/warm.py)
        [sys.executable, "-m", "distil", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.budget(100, "evaluation and a training run through the CLI with a user task")
def test_eval_gsm8k_and_train_with_a_user_task(tmp_path, make_train_config, tiny_model_dir):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    res = distil(
        "eval", "--task", "gsm8k", "--data", data, "--model", tiny_model_dir, "--n", 2,
        "--max-new-tokens", 4, "--samples", 2, "--temperature", 1.0, "--no-progress",
        "--out", tmp_path / "rep", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == (
        "| Model | Correct | Accuracy | No Number | Wrong Value | pass@2 |"
    )
    model = json.loads((tmp_path / "rep" / "report.json").read_text())["models"][0]
    assert model["total"] == 4 and model["correct"] + model["no_number"] + model["wrong_value"] == 4

    (tmp_path / "cli_user_task.py").write_text(USER_TASK)
    cfg = make_train_config(
        train={"max_steps": 2, "eval_every": 2},
        eval={"task": "cli_user_task:Short", "data": str(data), "n": 2, "max_new_tokens": 4},
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = distil("config", "validate", "c.yaml", cwd=tmp_path, pythonpath=str(tmp_path))
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
    res = distil("train", "c.yaml", cwd=tmp_path, pythonpath=str(tmp_path))
    assert res.returncode == 0, res.stderr
    metrics = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [(m["eval/accuracy"], m["eval/too_long"], m["eval/total"]) for m in evals] == [
        (1.0, 0, 2)
    ]
