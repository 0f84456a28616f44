"""Privileged context (teacher.context / teacher.system): the teacher's prompt carries what the
student never sees, both score exactly the same completion, the loss covers the completion
only, and it works with packing and across tokenizers."""

from __future__ import annotations

import pytest
import torch

from distil.config import build_config
from distil.data.context import context_prompt
from distil.errors import ConfigError, DataError
from distil.preflight import preflight
from distil.testing import build_peaked_teacher, config_with, read_metrics
from distil.train import loop
from distil.train.setup import build
from distil.types import Example

HINT = "{prompt} (a solution: {solution})"


def test_the_context_prompt_fills_the_rows_fields():
    row = {"solution": "1+2", "nums": [1, 2], "_where": "d.jsonl:7"}
    chat = Example(0, [{"role": "user", "content": "make 3"}], "x", row)
    got = context_prompt(chat, HINT, "Be careful.")
    assert got == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "make 3 (a solution: 1+2)"},
    ]
    assert chat.prompt == [{"role": "user", "content": "make 3"}]  # the student's is unchanged
    plain = Example(1, "make 3", "x", row)
    assert context_prompt(plain, HINT, None) == "make 3 (a solution: 1+2)"
    assert context_prompt(plain, None, "Be careful.") == "Be careful.\n\nmake 3"
    with pytest.raises(DataError, match=r"d\.jsonl:7: teacher\.context reads 'hint'"):
        context_prompt(plain, "{prompt} {hint}", None)


@pytest.fixture
def raw(make_train_config):
    return make_train_config(train={"max_steps": 2, "lambda": 0.5})


def first_batch(cfg):
    c = build(cfg)
    torch.manual_seed(0)
    return c, c.buffer.next_window().micro_batches[0]


def test_the_student_sees_nothing_of_it_and_the_teacher_scores_the_same_completion(raw):
    _, plain = first_batch(build_config(raw))
    c, batch = first_batch(config_with(raw, teacher={"context": HINT}))
    # the student's inputs, labels and loss positions are those of a run without context
    assert torch.equal(batch.input_ids_B_L, plain.input_ids_B_L)
    assert torch.equal(batch.mask_B_T, plain.mask_B_T)
    tok = c.tokenizer
    seen = tok.decode(batch.context_input_ids_B_L[0][batch.context_attention_mask_B_L[0].bool()])
    assert "(a solution:" in seen and "(a solution:" not in tok.decode(batch.input_ids_B_L[0])
    # the reference: the teacher's own forward over context prompt + completion
    targets = c.teacher.score(batch).logprobs_B_T_V
    model = c.teacher.model
    for i, s in enumerate(batch.samples):
        shift = int(batch.context_shift_B[i])
        row = batch.context_input_ids_B_L[i][batch.context_attention_mask_B_L[i].bool()]
        assert row[-len(s.completion_ids) :].tolist() == s.completion_ids  # the same tokens
        with torch.no_grad():
            ref = torch.log_softmax(model(row[None]).logits[0, :-1].float(), -1)
        pos = batch.mask_B_T[i].nonzero()[:, 0]
        torch.testing.assert_close(targets[i, pos].float(), ref[pos + shift], rtol=1e-5, atol=1e-5)


def test_packed_equals_padded_with_context(raw):
    cfg = config_with(raw, teacher={"context": HINT})
    c, batch = first_batch(cfg)
    packed = build(config_with(raw, teacher={"context": HINT}, train={"packing": True}))
    a = c.teacher.score(batch).logprobs_B_T_V
    b = packed.teacher.score(batch).logprobs_B_T_V
    m = batch.mask_B_T
    torch.testing.assert_close(a[m], b[m], rtol=1e-5, atol=1e-5)


def test_training_with_context_runs_and_shows_what_the_teacher_sees(raw, tmp_path, capsys):
    cfg = config_with(
        raw, teacher={"context": HINT, "system": "Think."}, logging={"print_example": True}
    )
    loop.train(cfg)
    assert len(read_metrics(tmp_path / "run")) == 2
    assert "the teacher sees" in capsys.readouterr().err


def test_across_tokenizers_the_teacher_renders_the_context_itself(
    make_train_config, tmp_path_factory, unigram_tokenizer
):
    teacher = build_peaked_teacher(tmp_path_factory.mktemp("xt"), unigram_tokenizer, hidden_size=64)
    raw = make_train_config(
        teacher={"path": str(teacher), "context": HINT},
        loss={"name": "aligned_kl", "beta": 0.5},
        train={"max_steps": 1, "lambda": 0.0},
    )
    c, batch = first_batch(build_config(raw))
    t_tok = c.cross.teacher_tok
    seen = t_tok.decode(batch.teacher_input_ids_B_L[0][batch.teacher_attention_mask_B_L[0].bool()])
    assert "a solution:" in seen and "a solution:" not in c.tokenizer.decode(batch.input_ids_B_L[0])
    assert batch.alignment is not None and batch.alignment.num_groups > 0
    loop.train(build_config(raw))


def test_validate_names_a_missing_field_and_allows_a_cache_and_a_server(raw):
    problems, _ = preflight(config_with(raw, teacher={"context": "{prompt} {hint}"}))
    assert any("teacher.context reads 'hint'" in p and "train.jsonl:1" in p for p in problems)
    config_with(raw, teacher={"context": HINT, "cache": "x"}, train={"lambda": 0.0})  # allowed
    config_with(raw, teacher={"context": HINT, "url": "http://x/v1", "top_k": 5})  # allowed


def test_validate_names_what_stays_refused(raw):
    config_with(  # allowed: a routed teacher's own context (test_several_contexts)
        raw,
        teacher={"path": None},
        teachers={"models": {"a": {"path": "x", "context": HINT}}, "column": "c"},
    )
    config_with(  # allowed: a cache written with the context (test_teacher_cache_teachers)
        raw,
        teacher={"path": None, "context": HINT},
        teachers={"models": {"a": {"cache": "x"}}, "column": "c"},
    )
    with pytest.raises(ConfigError, match=r"loss\.name='sft' and train\.seq_kd=false"):
        config_with(raw, teacher={"context": HINT}, loss={"name": "sft"})
    config_with(
        raw, teacher={"context": HINT}, loss={"name": "sft"}, train={"seq_kd": True, "lambda": 0.0}
    )
    config_with(raw, teacher={"context": HINT, "url": "http://127.0.0.1:9/v1", "top_k": 5})


def test_routed_teachers_share_the_context(raw, pair_dirs, tmp_path, countdown_dir):
    """teacher.context with teachers.models: each row is scored by its own teacher after the
    same privileged prompt (the batch's context rows are cut per teacher like its other rows)."""
    import json

    from distil.teacher.several import _rows

    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "routed.jsonl"
    data.write_text(
        "".join(json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows))
    )
    models = {"a": {"path": str(pair_dirs[0])}, "b": {"path": str(pair_dirs[1])}}
    cfg = config_with(
        raw, data={"train": str(data)}, teacher={"path": None, "context": HINT},
        teachers={"models": models, "column": "src"},
    )  # fmt: skip
    c, batch = first_batch(cfg)
    targets = c.teacher.score(batch).logprobs_B_T_V
    bare = {"context_input_ids_B_L": None, "context_attention_mask_B_L": None}
    for i, s in enumerate(batch.samples):
        alone = c.teacher.teachers[s.example_id % 2]  # row i of the file: teacher "ab"[i % 2]
        one = _rows(batch, torch.tensor([i]), [i])
        m = batch.mask_B_T[i]
        torch.testing.assert_close(
            targets[i][m], alone.score(one).logprobs_B_T_V[0][m], rtol=0, atol=0
        )
        plain = alone.score(type(one)(**{**one.__dict__, **bare, "context_shift_B": None}))
        assert not torch.allclose(targets[i][m], plain.logprobs_B_T_V[0][m])  # it saw the hint
