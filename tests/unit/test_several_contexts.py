"""Each routed teacher's own privileged context (`teachers.models.NAME.context/system`): a row's
teacher prompt is its own teacher's template, the targets equal a run of that teacher alone
with that context, a teacher without context scores the student's prompt, per-teacher caches
written with their contexts train as the live teachers, and `config validate` names a field
missing from the data for any teacher and a mixture of teachers with different contexts."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from distil.config import build_config
from distil.errors import ConfigError
from distil.preflight import preflight
from distil.teacher.writer import cache_teacher
from distil.testing import config_with, read_metrics, teacher_alone
from distil.train import loop
from distil.train.setup import build

SOLUTION = "{prompt} (a solution: {solution})"


@pytest.fixture
def raw(tmp_path, countdown_dir, make_train_config, pair_dirs, second_teacher):
    """Rows alternate between teacher a (sees the solution) and b (no context of its own)."""
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "routed.jsonl"
    data.write_text(
        "".join(json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows))
    )
    raw = make_train_config(train={"max_steps": 3, "lambda": 0.0}, loss={"name": "forward_kl"})
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    raw["teachers"] = {
        "models": {
            "a": {"path": str(pair_dirs[0]), "top_k": 8, "context": SOLUTION},
            "b": {"path": str(second_teacher), "top_k": 8},
        },
        "column": "src",
    }
    return raw


def teacher_prompt(batch, i: int) -> list[int]:
    n = len(batch.samples[i].prompt_ids) + int(batch.context_shift_B[i])
    return batch.context_input_ids_B_L[i, :n].tolist()


def test_each_routed_row_is_scored_after_its_own_teachers_template(raw):
    c = build(build_config(raw))
    refs = {n: build(teacher_alone(raw, n)) for n in "ab"}
    batches = [b for _ in range(4) for b in c.buffer.next_window().micro_batches]
    batch = next(b for b in batches if len({s.example_id % 2 for s in b.samples}) == 2)
    routes = ["ab"[s.example_id % 2] for s in batch.samples]  # both teachers in one batch
    targets = c.teacher.score(batch)
    assert c.teacher.last_routes == routes
    for i, (s, name) in enumerate(zip(batch.samples, routes, strict=True)):
        ref = refs[name]  # that teacher alone with that context: its collate and its scorer
        one = ref.buffer.collate_fn([s], 0)
        seen = c.tokenizer.decode(teacher_prompt(batch, i))
        if name == "a":
            assert one.context_input_ids_B_L is not None and "(a solution:" in seen
            assert teacher_prompt(batch, i) == teacher_prompt(one, 0)
        else:  # b has no context: its teacher prompt is the student's
            assert one.context_input_ids_B_L is None and "(a solution:" not in seen
            assert teacher_prompt(batch, i) == list(s.prompt_ids)
        want = ref.teacher.score(one)
        m, m1 = batch.mask_B_T[i], one.mask_B_T[0]
        for f in ("topk_logprobs_B_T_K", "rest_logprob_B_T", "token_logprobs_B_T"):
            got, ref_value = getattr(targets, f)[i][m], getattr(want, f)[0][m1]
            torch.testing.assert_close(got, ref_value, rtol=0, atol=1e-5)
        torch.testing.assert_close(targets.topk_ids_B_T_K[i][m], want.topk_ids_B_T_K[0][m1])


def test_per_teacher_caches_with_their_contexts_train_as_the_live_teachers(tmp_path, raw):
    live = copy.deepcopy(raw)
    live["train"]["output_dir"] = str(tmp_path / "live")
    loop.train(build_config(live))
    per = copy.deepcopy(raw)
    for n in "ab":  # --teacher NAME writes that teacher's cache after its own context prompt
        cache_teacher(build_config(raw), tmp_path / n, values="fp32", shard_rows=24, teacher=n)
        per["teachers"]["models"][n] = {
            **{k: v for k, v in raw["teachers"]["models"][n].items() if k == "context"},
            "cache": str(tmp_path / n),
        }
    per["train"]["output_dir"] = str(tmp_path / "per")
    assert preflight(build_config(per))[0] == []
    loop.train(build_config(per))
    keys = ["loss", "loss/teacher/a", "loss/teacher/b"]
    want = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "live")]
    got = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "per")]
    assert len(want) == len(got) == 3 and all(None not in w for w in want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-6)
    with pytest.raises(ConfigError, match=r"own privileged contexts.*--teacher NAME"):
        cache_teacher(build_config(raw), tmp_path / "routed", values="fp32")


def test_validate_names_a_field_missing_for_any_teacher_and_a_mixed_context(raw):
    raw["teachers"]["models"]["b"]["context"] = "{prompt} (hint: {hint})"
    problems, _ = preflight(build_config(raw))
    said = [p for p in problems if "reads 'hint'" in p]
    assert len(said) == 1  # b's first row: its file and line
    assert "routed.jsonl:2: teachers.models.b.context reads 'hint'" in said[0]
    assert not any("teachers.models.a.context" in p for p in problems)
    mix = {"models": {n: {**m, "top_k": None} for n, m in raw["teachers"]["models"].items()}}
    with pytest.raises(ConfigError, match=r"different privileged contexts \(a: context '\{prompt"):
        config_with(raw, teachers={**mix, "column": None, "weights": {"a": 1.0, "b": 1.0}})
    same = {n: {**m, "context": SOLUTION} for n, m in mix["models"].items()}
    config_with(raw, teachers={"models": same, "column": None, "weights": {"a": 1.0, "b": 1.0}})


def test_across_tokenizers_each_teacher_renders_its_own_context_prompt(
    raw, tmp_path_factory, unigram_tokenizer
):
    """Routed cross-tokenizer teachers: each teacher's rows are collated with its own template
    after its own teacher prompt, and the printed example shows each row's teacher's prompt."""
    from distil.data.context import both_prompts
    from distil.testing import build_peaked_teacher

    other = build_peaked_teacher(tmp_path_factory.mktemp("xt"), unigram_tokenizer, hidden_size=64)
    raw["teachers"]["models"]["a"] = {"path": str(other), "context": SOLUTION}
    raw["teachers"]["models"]["b"].pop("top_k")
    raw["loss"] = {"name": "aligned_kl", "beta": 0.5}
    c = build(build_config(raw))
    batches = [b for _ in range(4) for b in c.buffer.next_window().micro_batches]
    batch = next(b for b in batches if len({s.example_id % 2 for s in b.samples}) == 2)
    for name, part in batch.parts.items():
        assert all(s.example_id % 2 == "ab".index(name) for s in part.samples)
        for row in range(len(part.samples)):
            ids = part.teacher_input_ids_B_L[row][part.teacher_attention_mask_B_L[row].bool()]
            seen = (unigram_tokenizer if name == "a" else c.tokenizer).decode(ids)
            assert ("(a solution:" in seen) == (name == "a"), (name, seen)
    for i, s in enumerate(batch.samples):
        student, teacher = both_prompts(batch, i, c.tokenizer, c.cross)
        assert "(a solution:" not in student
        assert ("(a solution:" in teacher) == (s.example_id % 2 == 0)
