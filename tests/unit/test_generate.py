"""`distil generate`: a model writes completions into a dataset that data.train reads."""

from __future__ import annotations

import json

import pytest

from distil.cli import main
from distil.config import build_config
from distil.data.datasets import load_examples
from distil.train import loop


@pytest.fixture
def raw(make_train_config):
    return make_train_config(
        generation={"max_new_tokens": 8, "num_generations": 2, "temperature": 1.0},
        loss={"name": "forward_kl"},
        train={"lambda": 0.0, "max_steps": 2},
    )


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_then_train_off_policy_from_it(tmp_path, raw, countdown_dir):
    import yaml

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "teacher_written.jsonl"
    assert main(["generate", str(cfg_file), "--out", str(out), "--n", "2"]) == 0
    rows = read(out)
    source = read(countdown_dir / "train.jsonl")
    assert len(rows) == 2 * len(source)  # n per prompt, adjacent
    assert [r["nums"] for r in rows[::2]] == [s["nums"] for s in source]
    assert all(r["completion"] for r in rows) and rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["completion"] != rows[1]["completion"]  # two samples of one prompt

    examples = load_examples(str(out))
    assert [e.completion for e in examples] == [r["completion"] for r in rows]
    cfg = build_config(
        {**raw, "data": {"train": str(out), "template": None, "overlong": "truncate"}}
    )
    metrics = loop.train(cfg)
    assert metrics["step"] == 2 and metrics["policy/on_policy_share"] == 0.0
    assert 0 < metrics["loss"] < 100


def test_keep_correct_keeps_exactly_the_checked_completions(tmp_path, raw, monkeypatch):
    from distil.tasks.countdown import task as countdown
    from distil.teacher.generate import generate_completions

    cfg = build_config(raw)
    every = tmp_path / "all.jsonl"
    generate_completions(cfg, every, n=2)
    accepted = countdown.check  # a tiny random model solves nothing: accept even lengths

    def fake(text, nums, target, **kw):
        v = accepted(text, nums, target, **kw)
        return type(v)("correct" if len(text) % 2 == 0 else v.outcome, *list(vars(v).values())[1:])

    monkeypatch.setattr(countdown, "check", fake)
    kept = tmp_path / "kept.jsonl"
    counts = generate_completions(cfg, kept, n=2, keep="correct")
    want = [r for r in read(every) if len(r["completion"]) % 2 == 0]
    assert 0 < len(want) < len(read(every))
    assert read(kept) == want and counts["kept"] == len(want) and counts["completions"] == 128


def test_keep_correct_needs_rows_of_the_task(tmp_path, raw):
    from distil.errors import DataError
    from distil.teacher.generate import generate_completions

    data = tmp_path / "plain.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "completion": "there"}) + "\n")
    cfg = build_config({**raw, "data": {"train": str(data)}})
    with pytest.raises(
        DataError,
        match=r"plain.jsonl:1: --keep correct judges completions with the task 'countdown'",
    ):
        generate_completions(cfg, tmp_path / "o.jsonl", keep="correct")
    assert not (tmp_path / "o.jsonl").exists()


def test_keep_correct_judges_with_the_configs_task(tmp_path, raw, monkeypatch):
    # GSM8K rows, prompts rendered by the task, kept by the task's own checker
    from distil.tasks.gsm8k import GSM8K
    from distil.teacher.generate import generate_completions

    data = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": f"What is {i} + {i}?", "answer": f"{i} + {i}\n#### {2 * i}"} for i in range(3)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = {
        **raw,
        "data": {"train": str(data), "template": "gsm8k", "completion_field": "answer"},
        "eval": {"task": "gsm8k"},
    }
    seen = []
    real = GSM8K.check

    def judged(self, completion, problem):
        seen.append(problem["answer"])
        v = real(self, completion, problem)  # a tiny random model: accept even lengths
        return type(v)("correct" if len(completion) % 2 == 0 else "wrong_value", v.answer)

    monkeypatch.setattr(GSM8K, "check", judged)
    kept = tmp_path / "kept.jsonl"
    counts = generate_completions(build_config(raw), kept, n=2, keep="correct")
    assert counts["completions"] == 6 and len(seen) == 6
    assert sorted(set(seen)) == sorted(r["answer"] for r in rows)  # each row's gold answer
    out = read(kept)
    assert len(out) == counts["kept"] and all(len(r["completion"]) % 2 == 0 for r in out)
    assert all(r["question"].startswith("What is") for r in out)
