"""The vLLM generator on a real engine (needs CUDA and the vllm extra; skipped otherwise):
greedy completions and log-probs equal HFGenerator's, sampled log-probs are the warped
distribution's, an optimizer step reaches the engine, LoRA students push merged weights.

One engine per process (vLLM's sleep mode allows one), shared by the tests of this module.
Models are bf16, the engine's default dtype (vLLM runs fp32 too, but only on its slower Triton
and Flex attention backends, so distil asks for it only when generation.vllm.dtype says so),
and values are compared with bf16 tolerances; the weights are drawn with a large init range so
that greedy choices are not near-ties. Building the engine must leave the global RNGs as they
were (vLLM's start-up reseeds them; distil restores them).
"""

from __future__ import annotations

import pytest
import torch

from distil.config import build_config
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.testing import tiny_llama

pytestmark = pytest.mark.gpu
vllm = pytest.importorskip("vllm")

V = 512
PROMPTS = [[3, 9, 12, 40], [7], [22, 23, 24, 25, 26, 27, 28, 29, 30], [101, 7, 7]]
STOPS = [5, 6]


def student():
    model = tiny_llama(V, hidden_size=256, num_heads=4, initializer_range=0.3)
    return model.to("cuda", torch.bfloat16)


RNG_STATES: dict[str, tuple] = {}


def rng_states():
    import random

    import numpy as np

    return (
        random.getstate(),
        np.random.get_state()[1].tolist(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state(),
    )


@pytest.fixture(scope="module")
def engine():
    from distil.generation.vllm import VLLMGenerator

    model = student()
    RNG_STATES["before"] = rng_states()
    cfg = build_config(
        {
            "generation": {
                "backend": "vllm",
                "vllm": {"gpu_memory_utilization": 0.2, "enforce_eager": True},
            },
            "data": {"max_prompt_tokens": 32},
        }
    )
    gen = VLLMGenerator.from_config(cfg, model, pad_id=0, stop_ids=STOPS)
    RNG_STATES["after"] = rng_states()
    return model, gen


def test_building_the_engine_leaves_the_global_rngs(engine):
    before, after = RNG_STATES["before"], RNG_STATES["after"]
    assert before[:2] == after[:2]  # Python, numpy
    assert torch.equal(before[2], after[2]) and torch.equal(before[3], after[3])  # torch


def agreeing_prefix(a, b):
    """Per row, how many leading positions hold the same token."""
    same = (a == b).int().cumprod(dim=1)
    return same.sum(dim=1)


def test_greedy_completions_and_logprobs_match_hf(engine):
    model, gen = engine
    params = SamplingParams(24, temperature=0.0, n=2)
    got = gen.generate(PROMPTS, params)
    want = HFGenerator(model, pad_id=0, stop_ids=STOPS).generate(PROMPTS, params)
    width = min(got.completion_ids_B_C.shape[1], want.completion_ids_B_C.shape[1])
    g_ids, w_ids = got.completion_ids_B_C[:, :width], want.completion_ids_B_C[:, :width]
    prefix = agreeing_prefix(g_ids, w_ids)
    assert (prefix >= min(8, width)).all(), prefix  # bf16 kernels: allow late near-tie flips
    assert prefix.float().mean() >= 0.9 * width
    for row, k in enumerate(prefix.tolist()):
        assert torch.allclose(got.logprobs_B_C[row, :k], want.logprobs_B_C[row, :k], atol=0.05), row


def test_sampled_logprobs_are_the_warped_distributions(engine):
    model, gen = engine
    params = SamplingParams(16, temperature=0.7, top_p=0.9, top_k=40, n=4)
    rollout = gen.generate(PROMPTS[:2], params)
    assert rollout.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1]
    for row, tokens in enumerate(rollout.completion_lists()):
        prompt = PROMPTS[rollout.prompt_index[row]]
        want = warped_logprobs(model, prompt, tokens, params)
        got = rollout.logprobs_B_C[row, : len(tokens)].to(want.device)
        assert torch.allclose(got, want, atol=0.05), (row, got, want)


def warped_logprobs(model, prompt, tokens, params):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
    logits = TopKLogitsWarper(params.top_k)(ids, logits)
    logits = TopPLogitsWarper(params.top_p)(ids, logits)
    return logits.log_softmax(-1).gather(1, ids[0, len(prompt) :, None])[:, 0]


def test_optimizer_step_reaches_the_engine(engine):
    model, gen = engine
    greedy = SamplingParams(12, temperature=0.0)
    before = gen.generate(PROMPTS, greedy)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = torch.tensor([PROMPTS[2]], device="cuda")
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    version = gen.weights_version
    gen.sync_weights(model)
    assert gen.weights_version == version + 1
    after = gen.generate(PROMPTS, greedy)
    want = HFGenerator(model, pad_id=0, stop_ids=STOPS).generate(PROMPTS, greedy)
    assert not torch.equal(before.completion_ids_B_C, after.completion_ids_B_C)
    width = min(after.completion_ids_B_C.shape[1], want.completion_ids_B_C.shape[1])
    prefix = agreeing_prefix(
        after.completion_ids_B_C[:, :width], want.completion_ids_B_C[:, :width]
    )
    assert prefix.float().mean() >= 0.9 * width


def test_lora_student_samples_with_merged_weights(engine):
    peft = pytest.importorskip("peft")
    _, gen = engine
    config = peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(student(), config)  # same architecture: the same engine serves it
    gen.sync_weights(lora)
    greedy = SamplingParams(12, temperature=0.0)
    got = gen.generate(PROMPTS, greedy)
    want = HFGenerator(lora, pad_id=0, stop_ids=STOPS).generate(PROMPTS, greedy)
    width = min(got.completion_ids_B_C.shape[1], want.completion_ids_B_C.shape[1])
    prefix = agreeing_prefix(got.completion_ids_B_C[:, :width], want.completion_ids_B_C[:, :width])
    assert prefix.float().mean() >= 0.9 * width
    assert not any(getattr(m, "merged", False) for m in lora.modules())


def test_async_windows_with_the_engine_equal_the_sync_windows(engine):
    """generation.async drives the engine from its worker thread, on a side stream, through a
    copy of the generator over the weight snapshot (vllm-conformance A20). With the weights
    held still and per-call seeds, its windows are the synchronous buffer's."""
    from distil.train.async_gen import AsyncWindows
    from distil.train.buffer import GenerationBuffer, PromptSide
    from distil.types import Example

    model, gen = engine

    def buffer():
        b = GenerationBuffer(
            [Example(i, f"prompt {i}", f"answer {i}") for i in range(24)],
            PromptSide([[100 + i, 7, 9 + i % 5] for i in range(24)], gen),
            completion_ids=[[200 + i, STOPS[0]] for i in range(24)],
            params=SamplingParams(16, temperature=1.0, top_k=50, n=2),
            per_device_batch_size=4,
            grad_accum_steps=2,
            lambda_=1.0,
            pad_id=0,
            seed=0,
        )
        b.seeded = True
        return b

    def rows(window):
        ids = [s.completion_ids for b in window.micro_batches for s in b.samples]
        width = max(len(r) for r in ids)
        return torch.tensor([r + [-1] * (width - len(r)) for r in ids])

    steps = 6
    sync = buffer()
    want = [rows(sync.next_window()) for _ in range(steps)]  # before: one engine, one caller
    source = AsyncWindows(buffer(), model, max_steps=steps)
    try:
        got = [rows(source.next_window()) for _ in range(steps)]
    finally:
        source.close()
    for w, g in zip(want, got, strict=True):
        width = min(w.shape[1], g.shape[1])
        prefix = agreeing_prefix(w[:, :width], g[:, :width])
        assert prefix.float().mean() >= 0.9 * width, prefix  # bf16 kernels: rare late flips
