"""GPU tier (`make test-gpu`): mixed precision, devices, chunked losses and generation on CUDA.

Skipped automatically without a CUDA device (tests/conftest.py).
"""

import pytest
import torch

from distil.config import build_config
from distil.data.collate import collate
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.losses import StudentHidden, get_loss
from distil.teacher.live import LiveTeacher
from distil.testing import tiny_llama
from distil.train import loop
from distil.types import Sample

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_on_cuda(tmp_path, make_train_config, precision):
    cfg = build_config(make_train_config(train={precision: True, "max_steps": 3}))
    metrics = loop.train(cfg)
    assert metrics["skipped"] == 0 and 0 < metrics["loss"] < 1


def test_bf16_first_loss_close_to_fp32(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 1, "lambda": 0.0})
    fp32 = loop.train(build_config(raw))["loss"]
    raw["train"].update({"bf16": True, "output_dir": str(tmp_path / "bf16")})
    bf16 = loop.train(build_config(raw))["loss"]
    assert bf16 == pytest.approx(fp32, rel=0.05)


def test_teacher_on_cpu_student_on_gpu(tmp_path, make_train_config):
    cfg = build_config(make_train_config(teacher={"device": "cpu"}, train={"max_steps": 2}))
    metrics = loop.train(cfg)
    assert metrics["skipped"] == 0


def test_cross_tokenizer_run_on_cuda(tmp_path, make_train_config, tiny_qwen2_dir):
    cfg = build_config(
        make_train_config(
            teacher={"path": str(tiny_qwen2_dir)},
            loss={"name": "aligned_kl"},
            train={"max_steps": 2},
        )
    )
    metrics = loop.train(cfg)
    assert metrics["skipped"] == 0 and metrics["groups"] > 0


def test_chunked_loss_equals_unchunked_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(4, 33, 64, device="cuda", generator=g, requires_grad=True)
    weight = torch.randn(3000, 64, device="cuda", generator=g, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(4, 33, 3000, device="cuda", generator=g), -1)
    from distil.types import TeacherTargets

    targets = TeacherTargets(logprobs_B_T_V=teacher)
    mask = torch.rand(4, 33, device="cuda", generator=g) > 0.3
    n = int(mask.sum())
    full = get_loss("jsd")(StudentHidden(hidden, weight), targets, mask, num_tokens=n)
    gf = torch.autograd.grad(full.loss, (hidden, weight))
    chunked = get_loss("jsd")(
        StudentHidden(hidden, weight), targets, mask, num_tokens=n, chunk_size=17
    )
    gc = torch.autograd.grad(chunked.loss, (hidden, weight))
    torch.testing.assert_close(full.loss, chunked.loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(gf, gc, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_generation_and_teacher_on_cuda(bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer).cuda()
    gen = HFGenerator(
        model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[bpe_tokenizer.eos_token_id]
    )
    prompts = [
        bpe_tokenizer(t, add_special_tokens=False)["input_ids"]
        for t in ("nums: 1 2 3 target: 6", "7 + 8 =", "the quick brown fox")
    ]
    params = SamplingParams(8, temperature=0.0)
    batched = gen.generate(prompts, params).completion_lists()
    assert batched == [gen.generate([p], params).completion_lists()[0] for p in prompts]
    samples = [
        Sample(i, p, c or [bpe_tokenizer.eos_token_id], "on_policy")
        for i, (p, c) in enumerate(zip(prompts, batched, strict=True))
    ]
    batch = collate(samples, bpe_tokenizer.pad_token_id).to("cuda")
    targets = LiveTeacher(model).score(batch)
    assert targets.logprobs_B_T_V.device.type == "cuda"
    assert torch.isfinite(targets.logprobs_B_T_V[batch.mask_B_T]).all()
