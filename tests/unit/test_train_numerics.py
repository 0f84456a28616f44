"""The loop's numerics around the optimizer step: the fp16 GradScaler after a skipped step
(gpu-readiness finding 8) and alignment counts on the rank's device (finding 17)."""

import types

import pytest
import torch

from distil.train import loop


def _fp16_components(init_scale: float):
    """A real Accelerator and AcceleratedOptimizer with torch's CPU GradScaler: the fp16 path
    accelerate takes on CUDA (scaled backward, unscale_ in clip_grad_norm_, scaler.step and
    update in optimizer.step), on CPU."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    acc = Accelerator(mixed_precision="fp16", cpu=True)
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    acc.native_amp = True
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(max_grad_norm=1.0))
    c = types.SimpleNamespace(accelerator=acc, model=model, optimizer=opt)
    return c, cfg


def _backward(c, scale_of_loss: float) -> dict:
    loss = c.model(torch.full((1, 4), 0.01)).sum() * scale_of_loss
    c.accelerator.backward(loss)
    return {"loss_sum": loss.detach()}


def test_fp16_skipped_step_updates_the_scaler_and_the_next_steps_run():
    c, cfg = _fp16_components(init_scale=2.0**16)
    scaler = c.accelerator.scaler
    sums = _backward(c, 1e36)  # scaled by 65536: the gradients overflow to inf
    before = [p.detach().clone() for p in c.model.parameters()]
    grad_norm, finite = loop._update(c, cfg, sums)
    assert not finite and not torch.isfinite(grad_norm)
    assert scaler.get_scale() == 2.0**15  # backed off
    assert all(torch.equal(a, b) for a, b in zip(before, c.model.parameters(), strict=True))
    for _ in range(3):  # before the fix the next clip raised: unscale_() already called
        sums = _backward(c, 1.0)
        grad_norm, finite = loop._update(c, cfg, sums)
        assert finite and torch.isfinite(grad_norm)
    assert not all(torch.equal(a, b) for a, b in zip(before, c.model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15


def test_a_non_finite_metric_skips_the_step_in_one_check():
    c, cfg = _fp16_components(init_scale=1.0)
    sums = _backward(c, 1.0)
    sums["kl_sum"] = torch.tensor(float("nan"))
    _, finite = loop._update(c, cfg, sums)
    assert not finite


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_alignment_counts_are_created_on_the_ranks_device(device):
    sums = {}
    loop.add_align_metrics(sums, {"groups": 3, "bytes": 10.0}, torch.device(device))
    loop.add_align_metrics(sums, {"groups": 2, "bytes": 1.0}, torch.device(device))
    assert {v.device.type for v in sums.values()} == {device}
    if device == "cpu":
        assert sums["align/groups"].item() == 5 and sums["align/bytes"].item() == 11


def test_loss_compile_auto_is_on_for_cuda_only(make_train_config):
    from distil.config import build_config
    from distil.train.setup import _compile_backend

    auto = build_config(make_train_config())
    assert _compile_backend(auto, torch.device("cuda")) == "inductor"
    assert _compile_backend(auto, torch.device("cpu")) is None
    on = build_config(make_train_config(loss={"compile": True}))
    assert _compile_backend(on, torch.device("cpu")) == "inductor"
    off = build_config(make_train_config(loss={"compile": False}))
    assert _compile_backend(off, torch.device("cuda")) is None
