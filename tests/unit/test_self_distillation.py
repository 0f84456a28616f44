"""Self-distillation (teacher.from_student): the teacher is the student itself, on its current
weights (no second copy, no gradient through the teacher pass) or a frozen copy of its starting
weights. At step 0 both equal a teacher loaded from the student's own checkpoint."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from distil.errors import ConfigError
from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.train.setup import build

HINT = "{prompt} (a solution: {solution})"


@pytest.fixture
def raw(make_train_config, pair_dirs):
    raw = make_train_config(
        teacher={"context": HINT}, train={"max_steps": 2, "lambda": 0.0, "lr": 1e-2}
    )
    raw["teacher"]["path"] = str(pair_dirs[1])  # the student's own checkpoint: a frozen copy
    return raw


def run(raw, out, **teacher):
    cfg = config_with(raw, teacher=teacher, train={"output_dir": str(out)})
    loop.train(cfg)
    losses = [m["loss"] for m in read_metrics(out)]
    return losses, load_file(out / "final" / "model.safetensors")


def test_the_current_student_as_teacher(raw, tmp_path):
    c = build(config_with(raw, teacher={"path": None, "from_student": "current"}))
    assert c.teacher.model is c.unwrapped  # no second copy
    assert all(p.requires_grad for p in c.unwrapped.parameters())  # still trained
    frozen, w_frozen = run(raw, tmp_path / "frozen")
    current, w_current = run(raw, tmp_path / "current", path=None, from_student="current")
    initial, w_initial = run(raw, tmp_path / "initial", path=None, from_student="initial")
    # step 1: every teacher is the starting student: exactly the run with a frozen copy
    assert current[0] == frozen[0] == initial[0]
    # the initial copy stays the starting weights for the whole run
    assert initial == frozen
    for k in w_frozen:
        torch.testing.assert_close(w_initial[k], w_frozen[k], rtol=0, atol=0)
    # the current one moves with the student after its first update
    assert current[1] != frozen[1]
    assert any(not torch.equal(w_current[k], w_frozen[k]) for k in w_frozen)


def test_no_gradient_reaches_the_student_through_the_teacher_pass(raw):
    c = build(config_with(raw, teacher={"path": None, "from_student": "current"}))
    batch = c.buffer.next_window().micro_batches[0]
    c.unwrapped.train()
    targets = c.teacher.score(batch).logprobs_B_T_V
    assert not targets.requires_grad and c.unwrapped.training  # its mode is restored


def test_mistakes_are_named(raw):
    with pytest.raises(ConfigError, match=r"every divergence \(and gradient\) is 0"):
        config_with(raw, teacher={"path": None, "context": None, "from_student": "current"})
    with pytest.raises(ConfigError, match=r"teacher\.path, cache, url and teachers\.models"):
        config_with(raw, teacher={"from_student": "initial"})


def test_an_ema_teacher_follows_the_student_and_resumes_bit_exactly(raw, tmp_path, monkeypatch):
    from distil.testing import train_killed_after_checkpoint

    ema = {"path": None, "from_student": "ema", "ema_decay": 0.5}
    c = build(config_with(raw, teacher=ema))
    start = {n: p.detach().clone() for n, p in c.unwrapped.named_parameters()}
    with torch.no_grad():
        for p in c.unwrapped.parameters():
            p.add_(1.0)  # stands for an optimizer step
    c.teacher.after_step(c.unwrapped)
    for n, p in c.teacher.model.named_parameters():  # 0.5 * start + 0.5 * (start + 1)
        torch.testing.assert_close(p, start[n] + 0.5, rtol=0, atol=1e-6)
    assert c.teacher.model is not c.unwrapped

    raw = {**raw, "teacher": {**raw["teacher"], **ema}}
    raw["train"] = {**raw["train"], "max_steps": 4, "save_every": 2}
    whole, w_whole = run(raw, tmp_path / "whole")
    cut = config_with(raw, train={"output_dir": str(tmp_path / "cut")})
    train_killed_after_checkpoint(monkeypatch, cut, step=2)
    assert (tmp_path / "cut" / "checkpoints" / "step-00000002" / "ema_teacher.safetensors").exists()
    assert [m["loss"] for m in read_metrics(tmp_path / "cut")] == whole
    w_cut = load_file(tmp_path / "cut" / "final" / "model.safetensors")
    for k in w_whole:
        assert torch.equal(w_cut[k], w_whole[k])


@pytest.mark.parametrize("precision", ["bf16_weights", "bf16"])
def test_the_current_student_as_teacher_in_bf16(raw, tmp_path, precision):
    """train.bf16_weights (bf16 weights) or train.bf16 (autocast over fp32 weights): accelerate
    wraps the student's forward to return fp32 outputs, which once met the bf16 head as the
    teacher's hidden states (gpu-review-2 finding 3). The teacher's targets are those of the
    student's own bf16 weights scored whole (its full logits through the unwrapped forward)."""
    cfg = config_with(raw, teacher={"path": None, "from_student": "current"},
                      train={precision: True, "output_dir": str(tmp_path / precision)})  # fmt: skip
    c = build(cfg)
    batch = c.buffer.next_window().micro_batches[0]
    targets = c.teacher.score(batch).logprobs_B_T_V
    model = c.unwrapped
    ids = batch.context_input_ids_B_L
    attn = batch.context_attention_mask_B_L
    with torch.no_grad():
        # the class's own forward: not accelerate's autocast + fp32-output wrapper
        out = type(model).forward(model, input_ids=ids, attention_mask=attn, use_cache=False)
        logits = out.logits[:, :-1]
    row_N, pos_N = batch.mask_B_T.nonzero(as_tuple=True)  # teacher position: + its context
    want = torch.log_softmax(logits.float(), -1)[row_N, pos_N + batch.context_shift_B[row_N]]
    got = targets[row_N, pos_N].float()
    atol = 2e-2 if precision == "bf16_weights" else 1e-4  # bf16: the head's output rounding
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    loop.train(cfg)
    assert [m["skipped"] for m in read_metrics(tmp_path / precision)] == [0, 0]


@pytest.mark.parametrize("from_student", ["current", "initial"])
def test_a_teacher_that_follows_the_student_scores_under_the_runs_autocast(
    raw, tmp_path, monkeypatch, from_student
):
    """train.bf16: the current student as teacher scores under the run's bf16 autocast (its
    decoder call bypasses accelerate's autocast wrapper, so it once ran fp32 matmuls); a frozen
    copy scores as before, in its own dtype."""
    from distil.teacher.live import LiveTeacher

    seen = []
    score = LiveTeacher.score

    def spy(self, batch):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        return score(self, batch)

    monkeypatch.setattr(LiveTeacher, "score", spy)
    cfg = config_with(raw, teacher={"path": None, "from_student": from_student},
                      train={"bf16": True, "output_dir": str(tmp_path)})  # fmt: skip
    loop.train(cfg)
    assert len(seen) == 4  # 2 steps x 2 micro-batches
    assert set(seen) == ({torch.bfloat16} if from_student == "current" else {False})
