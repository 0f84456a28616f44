"""seq-KD with several routed teachers (`teachers.column` + `train.seq_kd=true`): each row's
completion is written by its own teacher, after its own privileged prompt, exactly as that
teacher alone writes it for its rows; a mixture's completions are drawn from the mixture of
both teachers (generation/mixture.py), as its generator writes them for the same prompts; a cache
cannot write."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from distil.config import build_config
from distil.errors import ConfigError
from distil.generation.seeded import sampling_seed
from distil.preflight import preflight
from distil.testing import config_with, read_metrics, teacher_alone
from distil.train import loop
from distil.train.setup import build

SOLUTION = "{prompt} (a solution: {solution})"


@pytest.fixture
def raw(tmp_path, countdown_dir, make_train_config, pair_dirs, second_teacher):
    """Rows alternate between teacher a (sees the solution) and b (no context)."""
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "routed.jsonl"
    lines = [json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows)]
    data.write_text("".join(lines))
    raw = make_train_config(
        train={"max_steps": 2, "lambda": 0.0, "seq_kd": True},
        loss={"name": "forward_kl"},
        # two windows a teacher call: sampling seeded per block, whatever the call's size
        generation={"num_generations": 1, "max_new_tokens": 10, "teacher_windows": 2},
    )
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    raw["teachers"] = {
        "models": {
            "a": {"path": str(pair_dirs[0]), "context": SOLUTION},
            "b": {"path": str(second_teacher)},
        },
        "column": "src",
    }
    return raw


def test_each_row_is_written_by_its_own_teacher_as_that_teacher_alone_writes_it(raw):
    c = build(build_config(raw))
    block = [c.buffer.next_window() for _ in range(2)]  # the first block: one call a teacher
    samples = [s for w in block for b in w.micro_batches for s in b.samples]
    assert {s.source for s in samples} == {"seq_kd"}
    refs = {n: build(teacher_alone(raw, n)).buffer for n in "ab"}
    params = replace(refs["a"].params, seed=sampling_seed(0, 0, "teacher-block", 0))
    differs = 0
    for t, name in enumerate("ab"):
        mine = [s for s in samples if s.example_id % 2 == t]
        assert mine, name
        ref = refs[name]  # that teacher alone (its context), writing its rows in this order
        prompts = [ref.teacher.prompt_ids[s.example_id] for s in mine]
        want = ref.teacher.generator.generate(prompts, params).completion_lists()
        assert [s.completion_ids for s in mine] == want
        other = refs["ba"[t]]
        wrong = other.teacher.generator.generate(
            [other.teacher.prompt_ids[s.example_id] for s in mine], params
        ).completion_lists()
        differs += sum(w != g for w, g in zip(wrong, want, strict=True))
    assert differs > 0  # the other teacher would have written something else
    # the student's own prompt ids are untouched: no context tokens in them
    for s in samples:
        assert "(a solution:" not in c.tokenizer.decode(s.prompt_ids)


def test_routed_seq_kd_trains_and_logs_each_teacher(tmp_path, raw):
    raw["train"]["output_dir"] = str(tmp_path / "run")
    assert preflight(build_config(raw))[0] == []  # distil config validate: ok
    loop.train(build_config(raw))
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 2
    assert all(m["policy/seq_kd_share"] == 1.0 for m in metrics)
    assert any("loss/teacher/a" in m and "loss/teacher/b" in m for m in metrics)


def mixture(raw, weights: dict) -> dict:
    """The fixture's teachers mixed (one shared context: a's solution prompt for both)."""
    models = {n: {**m, "context": SOLUTION} for n, m in raw["teachers"]["models"].items()}
    return {**raw, "teachers": {"models": models, "weights": weights}}


def test_a_mixtures_rows_are_drawn_from_the_mixture_of_its_teachers(tmp_path, raw):
    from distil.generation.mixture import mixture_generator

    mixed = mixture(raw, {"a": 1.0, "b": 3.0})
    assert preflight(build_config(mixed))[0] == []  # distil config validate: ok
    c = build(build_config(mixed))
    block = [c.buffer.next_window() for _ in range(2)]  # the first block: one generate call
    samples = [s for w in block for b in w.micro_batches for s in b.samples]
    assert {s.source for s in samples} == {"seq_kd"}
    side = c.buffer.teacher
    prompts = [side.prompt_ids[s.example_id] for s in samples]
    assert all("(a solution:" in c.tokenizer.decode(p) for p in prompts)  # the shared context
    params = replace(c.buffer.params, seed=sampling_seed(0, 0, "teacher-block", 0))
    models = [t.model for t in c.teacher.teachers]
    tok = c.tokenizer
    want = mixture_generator(
        models, [1.0, 3.0], pad_id=tok.pad_token_id, stop_ids=side.generator.stop_ids
    )
    assert [s.completion_ids for s in samples] == want.generate(prompts, params).completion_lists()
    for alone in ({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}):  # neither teacher alone
        ref = build(build_config(mixture(raw, alone))).buffer
        got = ref.teacher.generator.generate(prompts, params).completion_lists()
        assert got != [s.completion_ids for s in samples], alone
    raw = mixed | {"train": {**mixed["train"], "output_dir": str(tmp_path / "run")}}
    loop.train(build_config(raw))
    assert all(m["policy/seq_kd_share"] == 1.0 for m in read_metrics(tmp_path / "run"))


def test_a_cache_cannot_write(raw):
    models = raw["teachers"]["models"]
    cached = {**models, "b": {"cache": "x"}}
    with pytest.raises(ConfigError, match=r"teachers\.models\.b, a cache or a server"):
        config_with(raw, teachers={"models": cached, "column": "src"})
    with pytest.raises(ConfigError, match=r"loss\.name = 'sft' with several teachers"):
        config_with(raw, loss={"name": "sft"})
