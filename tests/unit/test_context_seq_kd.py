"""Privileged context with seq-KD (train.seq_kd): the teacher writes each completion after ITS
privileged prompt, the student trains on its own prompt + that completion, and the loss covers
the completion only. With teacher.from_student the student-with-context writes."""

from __future__ import annotations

import pytest
import torch

from distil.data.context import both_prompts, context_prompt
from distil.models.tokenizers import encode_prompts
from distil.testing import build_peaked_teacher, config_with, read_metrics
from distil.train import loop
from distil.train.setup import build

HINT = "{prompt} (a solution: {solution})"
SEQ_KD = {"max_steps": 2, "lambda": 0.0, "seq_kd": True}


@pytest.fixture
def raw(make_train_config):
    return make_train_config(train=SEQ_KD)  # generation.temperature 1: sampled, seeded


def _window_and_reference(cfg, prompts_of):
    """(the first window's batches, the completions the teacher's generator writes from
    `prompts_of(c, example ids)` under the same seed)."""
    c = build(cfg)
    torch.manual_seed(0)
    window = c.buffer.next_window()
    assert set(window.policies) == {"seq_kd"}
    samples = [s for b in window.micro_batches for s in b.samples]
    unique = [s.example_id for s in samples[:: c.buffer.n]]
    torch.manual_seed(0)
    side = c.buffer.teacher
    rollout = side.generator.generate(prompts_of(c, unique), c.buffer.params)
    return c, window, rollout.completion_lists()


def _context_ids(c, ids):
    prompts = [context_prompt(c.examples[i], HINT, None) for i in ids]
    return encode_prompts(c.tokenizer, prompts, name="test")


def _student_ids(c, ids):
    return [c.buffer.student.prompt_ids[i] for i in ids]


def test_the_teacher_writes_after_its_privileged_prompt(raw):
    cfg = config_with(raw, teacher={"context": HINT})
    c, window, want = _window_and_reference(cfg, _context_ids)
    samples = [s for b in window.micro_batches for s in b.samples]
    assert [s.completion_ids for s in samples] == want  # what the teacher wrote after HINT
    _, _, plain = _window_and_reference(cfg, _student_ids)  # control: the test can tell
    assert plain != want
    tok = c.tokenizer
    for b in window.micro_batches:
        for i, s in enumerate(b.samples):
            # the student's input is its own prompt + the completion: no context token
            row = b.input_ids_B_L[i][b.attention_mask_B_L[i].bool()].tolist()
            assert row == s.prompt_ids + s.completion_ids
            assert s.prompt_ids == c.buffer.student.prompt_ids[s.example_id]
            assert "(a solution:" not in tok.decode(row)
            # the loss covers the completion only
            start = len(s.prompt_ids) - 1
            assert b.mask_B_T[i].nonzero()[:, 0].tolist() == list(
                range(start, start + len(s.completion_ids))
            )
            # and the teacher scores that completion after its privileged prompt
            seen = b.context_input_ids_B_L[i][b.context_attention_mask_B_L[i].bool()]
            assert seen[-len(s.completion_ids) :].tolist() == s.completion_ids
            assert "(a solution:" in tok.decode(seen)


def test_seq_kd_with_context_trains_and_prints_both_prompts(raw, tmp_path, capsys):
    cfg = config_with(raw, teacher={"context": HINT}, logging={"print_example": True})
    loop.train(cfg)
    assert len(read_metrics(tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "the student sees" in err and "the teacher sees" in err
    c = build(cfg)
    batch = c.buffer.next_window().micro_batches[0]
    student, teacher = both_prompts(batch, 0, c.tokenizer)
    assert student == c.tokenizer.decode(batch.samples[0].prompt_ids)
    assert "(a solution:" in teacher and "(a solution:" not in student
    assert "solution:" in err  # the teacher's column (rich wraps between words)


def test_sft_on_what_the_teacher_writes_with_context(raw, tmp_path):
    """Context distillation by generation: the teacher writes with the hint, the student is
    trained by cross-entropy on its own prompt + that completion."""
    cfg = config_with(raw, teacher={"context": HINT}, loss={"name": "sft"})
    _, window, want = _window_and_reference(cfg, _context_ids)
    assert [s.completion_ids for b in window.micro_batches for s in b.samples] == want
    loop.train(cfg)
    assert len(read_metrics(tmp_path / "run")) == 2


@pytest.fixture(scope="module")
def peaked_student(tmp_path_factory, bpe_tokenizer):
    """A student whose samples depend on its prompt (a near-uniform random model's do not)."""
    return build_peaked_teacher(tmp_path_factory.mktemp("ps"), bpe_tokenizer, hidden_size=64)


def test_self_distillation_with_seq_kd_the_student_with_context_writes(
    make_train_config, peaked_student, tmp_path
):
    """from_student=initial + seq-KD writes and trains exactly as a run whose teacher is the
    student's own checkpoint (a frozen copy) with the same context; with current the live
    student writes."""
    raw = make_train_config(train=SEQ_KD, student={"path": str(peaked_student)})
    frozen = {"context": HINT, "path": str(peaked_student)}
    initial = {"context": HINT, "path": None, "from_student": "initial"}
    _, w_frozen, want = _window_and_reference(config_with(raw, teacher=frozen), _context_ids)
    _, w_initial, _ = _window_and_reference(config_with(raw, teacher=initial), _context_ids)
    for w in (w_frozen, w_initial):
        assert [s.completion_ids for b in w.micro_batches for s in b.samples] == want
    _, _, plain = _window_and_reference(config_with(raw, teacher=initial), _student_ids)
    assert plain != want  # control: without its context the student writes otherwise
    c = build(config_with(raw, teacher={**initial, "from_student": "current"}))
    assert c.buffer.teacher.generator.model is c.unwrapped  # the student itself writes
    losses = {}
    for name, teacher in (("frozen", frozen), ("initial", initial)):
        loop.train(config_with(raw, teacher=teacher, train={"output_dir": str(tmp_path / name)}))
        losses[name] = [m["loss"] for m in read_metrics(tmp_path / name)]
    assert losses["initial"] == losses["frozen"] and len(losses["frozen"]) == 2
