"""GPU tier: packed forwards equal padded ones under each attention kernel transformers offers
on CUDA (sdpa with a block mask, flex attention, flash-attention varlen when installed), and a
packed bf16 run logs the padded run's losses. Skipped without a CUDA device."""

import importlib.util
import json

import pytest
import torch

from distil.config import build_config
from distil.data.packing import model_forward
from distil.testing import tiny_llama
from distil.train import loop

pytestmark = pytest.mark.gpu

KERNELS = ["sdpa", "flex_attention", "flash_attention_2"]


@pytest.mark.parametrize("attn", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_logits_and_gradients_equal_padded_on_cuda(attn, dtype):
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    if attn == "flash_attention_2" and dtype == torch.float32:
        pytest.skip("flash attention runs in half precision only")
    lengths = [9, 3, 17, 5, 12, 2, 7, 31]
    model = tiny_llama(97, seed=3).to("cuda", dtype)
    ids = torch.randint(3, 97, (len(lengths), max(lengths)), device="cuda")
    attn_mask = (
        torch.arange(max(lengths), device="cuda")[None]
        < torch.tensor(lengths, device="cuda")[:, None]
    ).long()
    real = attn_mask.bool()

    def run(packing, impl):
        model.config._attn_implementation = impl
        model.zero_grad(set_to_none=True)
        out = model_forward(model, ids, attn_mask, packing=packing, pack_length=24)
        out[real].float().logsumexp(-1).sum().backward()
        grads = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
        return out.detach().float(), grads

    pad, pad_g = run(False, "sdpa")
    packed, packed_g = run(True, attn)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert (pad[real] - packed[real]).abs().max() < tol * max(1.0, pad[real].abs().max())
    for a, b in zip(pad_g, packed_g, strict=True):
        assert (a - b).abs().max() <= tol * max(a.abs().max(), 1e-3)


def test_packed_bf16_run_logs_the_padded_losses(tmp_path, make_train_config):
    losses = {}
    for packing in (False, True):
        raw = make_train_config(
            train={"bf16": True, "lambda": 0.0, "packing": packing, "pack_length": 96}
        )
        raw["train"]["output_dir"] = str(tmp_path / f"run{packing}")
        loop.train(build_config(raw))
        lines = (tmp_path / f"run{packing}" / "metrics.jsonl").read_text().splitlines()
        losses[packing] = [json.loads(x)["loss"] for x in lines]
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)
