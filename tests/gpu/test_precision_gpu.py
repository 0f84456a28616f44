"""train.bf16_weights, fused AdamW and Liger kernels on CUDA (`make test-gpu`).

Skipped automatically without a CUDA device (tests/conftest.py); the Liger test also without
the `liger` extra.
"""

import pytest
import torch

from distil.config import TrainConfig, build_config
from distil.models.load import load_model
from distil.testing import read_metrics, tiny_llama, train_killed_after_checkpoint
from distil.train import loop
from distil.train.optim import MasterAdamW, build_optimizer

pytestmark = pytest.mark.gpu


def test_master_adamw_on_cuda_follows_fp32_fused_adamw(bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer), seed=1).cuda()
    ref = tiny_llama(len(bpe_tokenizer), seed=1).cuda()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True, lr=1e-4), device="cuda")
    ref_opt = build_optimizer(ref, TrainConfig(lr=1e-4), device="cuda")
    assert isinstance(opt, MasterAdamW) and opt.param_groups[0]["fused"] is True
    ordered = [p for g in ref_opt.param_groups for p in g["params"]]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(5):
        for p, q in zip(opt.model_params, ordered, strict=True):
            g = torch.randn(p.shape, device="cuda", generator=gen).bfloat16()
            p.grad, q.grad = g.clone(), g.float()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for m, r, p in zip(opt.masters(), ordered, opt.model_params, strict=True):
        torch.testing.assert_close(m, r, atol=1e-6, rtol=0)
        assert p.dtype == torch.bfloat16 and torch.equal(p, m.bfloat16())


def test_bf16_weights_first_loss_close_to_fp32_and_final_model_in_fp32(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 1, "lambda": 0.0})
    fp32 = loop.train(build_config(raw))["loss"]
    raw["train"].update({"bf16_weights": True, "output_dir": str(tmp_path / "bf16w")})
    got = loop.train(build_config(raw))
    assert got["skipped"] == 0 and got["loss"] == pytest.approx(fp32, rel=0.05)
    final = load_model(str(tmp_path / "bf16w" / "final"))
    assert {p.dtype for p in final.parameters()} == {torch.float32}


def test_bf16_weights_resume_matches_uninterrupted_on_cuda(
    tmp_path, make_train_config, monkeypatch
):
    overrides = {"train": {"max_steps": 4, "save_every": 2, "bf16_weights": True}}
    loop.train(build_config(make_train_config(**overrides)))
    full = read_metrics(tmp_path / "run")
    raw = make_train_config(**overrides)
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    train_killed_after_checkpoint(monkeypatch, build_config(raw), step=2)
    resumed = read_metrics(tmp_path / "killed")
    for a, b in zip(full[2:], resumed[2:], strict=True):  # CUDA kernels: not bit-exact
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6), a["step"]


def test_liger_kernels_give_the_same_loss_and_gradients(bpe_tokenizer):
    pytest.importorskip("liger_kernel")
    from distil.models.liger import apply_liger

    ids = torch.randint(5, len(bpe_tokenizer), (4, 48), generator=torch.Generator().manual_seed(0))
    ids = ids.cuda()

    def loss_and_grads(patch: bool):
        model = tiny_llama(len(bpe_tokenizer), seed=2).cuda().to(torch.bfloat16)
        if patch:
            assert apply_liger(model, "cuda") == ["rope", "rms_norm", "swiglu"]
        logits = model(ids).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads(False)
    loss, grads = loss_and_grads(True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-3)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=5e-2, atol=5e-3, msg=name)
