"""Teacher-written data for every built-in task: `distil generate --keep correct` judges with the
config's task, the output keeps the source columns, `distil eval --completions` reads it as that
task's problems, and training reads the kept rows."""

from __future__ import annotations

import json

import pytest
import yaml

from distil.cli import main
from distil.config import build_config
from distil.tasks import make_task
from distil.train import loop

ROWS = {
    "gsm8k": [
        {"question": f"What is {i} + {i}?", "answer": f"{i}+{i}\n#### {2 * i}"} for i in range(4)
    ],
    "math": [
        {"problem": f"Find {i} + 1.", "solution": f"It is $\\boxed{{{i + 1}}}$."} for i in range(4)
    ],
    "mmlu": [
        {"question": f"Pick {i}.", "choices": ["0", "1", "2", "3"], "answer": i, "subject": "toy"}
        for i in range(4)
    ],
}
# the columns each task's data keeps as its prompt and completion
FIELDS = {
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
    "mmlu": ("question", "x"),
}


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("task", ["countdown", "gsm8k", "math", "mmlu"])
def test_generate_keep_correct_then_eval_completions_then_train(
    task, tmp_path, make_train_config, countdown_dir, monkeypatch
):
    if task == "math":
        pytest.importorskip("math_verify")
    raw = make_train_config(
        generation={"max_new_tokens": 8, "num_generations": 2, "temperature": 1.0},
        loss={"name": "forward_kl"},
        train={"lambda": 0.0, "max_steps": 1, "per_device_batch_size": 2, "grad_accum_steps": 1},
        eval={"task": task},
    )
    if task == "countdown":
        source = read(countdown_dir / "train.jsonl")[:4]
    else:
        source = ROWS[task]
        prompt_field, completion_field = FIELDS[task]
        raw["data"] = {
            "template": task,
            "prompt_field": prompt_field,
            "completion_field": completion_field,
        }
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in source))
    raw["data"]["train"] = str(data)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))

    # a tiny random model solves nothing: the task's checker accepts even lengths instead
    cls = type(make_task(build_config(raw).eval))
    real = cls.check

    def judged(self, completion, problem):
        verdict = real(self, completion, problem)
        ok = len(completion) % 2 == 0
        return type(verdict)("correct" if ok else "wrong_value", verdict.answer)

    monkeypatch.setattr(cls, "check", judged)
    kept = tmp_path / "kept.jsonl"
    assert (
        main(["generate", str(cfg_file), "--out", str(kept), "--n", "2", "--keep", "correct"]) == 0
    )
    rows = read(kept)
    assert rows and all(len(r["completion"]) % 2 == 0 for r in rows)
    for r in rows:  # every source column is carried, then the rendered prompt and completion
        assert {k: r[k] for k in source[0] if k not in ("prompt", "completion")}.keys() <= r.keys()
    sources = [{k: v for k, v in s.items() if k not in ("prompt", "completion")} for s in source]
    assert all({k: r[k] for k in sources[0]} in sources for r in rows)

    report = tmp_path / "report"
    assert main(["eval", "--task", task, "--completions", str(kept), "--out", str(report)]) == 0
    result = json.loads((report / "report.json").read_text())["models"][0]
    assert result["total"] == len(rows) and result["correct"] == len(rows)  # judged like generate

    train = {"train": str(kept), "template": None, "prompt_field": "prompt"}
    train["completion_field"] = "completion"
    metrics = loop.train(build_config({**raw, "data": train, "eval": {"task": task}}))
    assert metrics["step"] == 1 and metrics["loss"] > 0
