"""GPU tier (`make test-gpu`, `make gpu-check`): mixed precision, devices and teachers on CUDA,
each against a reference run (fp32, all-GPU, or the same seed on the CPU).

Tolerances, stated once: bf16 autocast against fp32: per-step loss within 5% and gradient norm
within 15% (bf16 keeps 8 bits of mantissa; three steps of drift). CUDA against CPU (fp32):
losses within 5e-3 relative (CUDA kernels and TF32, which distil may enable for fp32 matmuls,
round differently). Runs compared across devices are off-policy (lambda 0): the CPU and CUDA
samplers draw from different random streams, so on-policy samples would differ by design.

Skipped automatically without a CUDA device (tests/conftest.py).
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

from distil.config import build_config
from distil.data.collate import collate
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.teacher.live import LiveTeacher
from distil.testing import read_metrics, tiny_llama
from distil.train import loop
from distil.types import Sample

pytestmark = pytest.mark.gpu

CPU_REL = 5e-3


@pytest.fixture
def no_tf32():
    """Exact fp32 matmuls for the duration of a test (restored after; the API distil's
    `enable_tf32` uses, so the two never mix)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


def _run(raw: dict, tmp_path, name: str, **train) -> list[dict]:
    raw = {**raw, "train": {**raw["train"], "output_dir": str(tmp_path / name), **train}}
    loop.train(build_config(raw))
    return read_metrics(tmp_path / name)


def test_bf16_steps_follow_the_fp32_steps(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 3, "lambda": 0.0})
    fp32 = _run(raw, tmp_path, "fp32")
    bf16 = _run(raw, tmp_path, "bf16", bf16=True)
    assert [m["skipped"] for m in bf16] == [0, 0, 0]
    for a, b in zip(fp32, bf16, strict=True):
        assert b["tokens/loss"] == a["tokens/loss"]
        assert b["loss"] == pytest.approx(a["loss"], rel=0.05), a["step"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=0.15), a["step"]


def test_fp16_runs_on_after_an_overflowing_step_and_the_scale_backs_off(
    tmp_path, make_train_config, monkeypatch
):
    """Finding 8: the second micro-step's loss is made infinite (what an fp16 overflow gives);
    that step is skipped, the later steps run and are finite, and GradScaler halved its scale
    (its update ran on the skipped step: without it the next clip raises 'unscale_() has
    already been called')."""
    real_build, real_micro = loop.build, loop.micro_step
    built, calls = {}, [0]

    def build(cfg):
        built["c"] = real_build(cfg)
        return built["c"]

    def micro(*args, **kwargs):
        result = real_micro(*args, **kwargs)
        calls[0] += 1
        if calls[0] == 3:  # the first micro-batch of step 2 (grad_accum_steps 2)
            result.loss = result.loss * float("inf")
        return result

    monkeypatch.setattr(loop, "build", build)
    monkeypatch.setattr(loop, "micro_step", micro)
    raw = make_train_config(train={"max_steps": 6, "lambda": 0.0, "fp16": True})
    steps = _run(raw, tmp_path, "fp16")
    assert [m["skipped"] for m in steps] == [0, 1, 0, 0, 0, 0]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in steps[2:])
    scaler = built["c"].accelerator.scaler
    assert scaler is not None and scaler.get_scale() <= 2.0**15  # 65536 halved at least once


def test_teacher_on_cpu_student_on_gpu_equals_all_gpu(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 2, "lambda": 0.0})
    gpu = _run(raw, tmp_path, "gpu")
    raw["teacher"]["device"] = "cpu"
    split = _run(raw, tmp_path, "split")
    for a, b in zip(gpu, split, strict=True):
        assert b["skipped"] == 0 and b["tokens/loss"] == a["tokens/loss"]
        assert b["loss"] == pytest.approx(a["loss"], rel=CPU_REL), a["step"]


def _cpu_run(raw: dict, tmp_path, name: str) -> list[dict]:
    """The same config trained by `distil train` with no CUDA device visible."""
    raw = {**raw, "train": {**raw["train"], "output_dir": str(tmp_path / name)}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4"}
    proc = subprocess.run(
        [sys.executable, "-m", "distil", "train", str(path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(tmp_path / name)


def test_cross_tokenizer_run_on_cuda_equals_the_cpu_run(
    tmp_path, make_train_config, tiny_qwen2_dir
):
    raw = make_train_config(
        teacher={"path": str(tiny_qwen2_dir)},
        loss={"name": "aligned_kl"},
        train={"max_steps": 2, "lambda": 0.0},
    )
    cpu = _cpu_run(raw, tmp_path, "cpu")
    gpu = _run(raw, tmp_path, "gpu")
    for a, b in zip(cpu, gpu, strict=True):
        assert b["skipped"] == 0 and b["groups"] == a["groups"] > 0
        assert b["loss"] == pytest.approx(a["loss"], rel=CPU_REL), a["step"]


def test_generation_and_teacher_on_cuda(bpe_tokenizer, no_tf32):
    """Batched greedy generation equals per-prompt generation on CUDA, and the teacher's
    log-probs on CUDA equal the same model's on the CPU."""
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
    batch = collate(samples, bpe_tokenizer.pad_token_id)
    got = LiveTeacher(model).score(batch.to("cuda"))
    want = LiveTeacher(tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer)).score(batch)
    m = batch.mask_B_T
    assert got.logprobs_B_T_V.device.type == "cuda"
    torch.testing.assert_close(
        got.logprobs_B_T_V.cpu()[m], want.logprobs_B_T_V[m], atol=1e-4, rtol=1e-4
    )
