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
    with pytest.raises(ConfigError, match="every divergence is 0"):
        config_with(raw, teacher={"path": None, "context": None, "from_student": "current"})
    with pytest.raises(ConfigError, match=r"teacher\.path, cache, url and teachers\.models"):
        config_with(raw, teacher={"from_student": "initial"})
