"""generation.async on CUDA with the compiled hf_static generator (inductor, reduce-overhead:
CUDA graphs recorded and replayed in the one sampler thread, on its side stream; on torch < 2.12,
whose cudagraph trees assert in any thread but the first to use them (pytorch#123177), the
sampler's copy compiles without CUDA graphs: `StaticCacheGenerator.worker_copy`).

The synchronous buffer runs first on the main thread, so the main thread is the first to use
CUDA graphs: the order that made torch 2.11 assert in the worker (gpu-review-2 finding 2).

With the weights held still, every window the async source hands out must equal the
synchronous buffer's window of the same index (both seeded per call, so the samples are a
function of weights, prompts and seed): staleness makes no difference, so any difference is
the thread, the stream or the graphs. Skipped without a CUDA device (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from distil.generation.base import SamplingParams
from distil.generation.static import StaticCacheGenerator
from distil.testing import tiny_llama
from distil.train.async_gen import AsyncWindows
from distil.train.buffer import ON, GenerationBuffer, PromptSide
from distil.types import Example

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
V, EOS, PAD = 256, 2, 0
WINDOWS = 12


def make_buffer(model, *, compile_backend="inductor"):
    examples = [Example(i, f"prompt {i}", f"answer {i}") for i in range(40)]
    prompts = [[100 + i, 5 + i % 7, 6] for i in range(40)]
    gen = StaticCacheGenerator(
        model,
        pad_id=PAD,
        stop_ids=[EOS],
        compile=True,
        compile_backend=compile_backend,
        batch_buckets=[8],
        length_buckets=[8],
    )
    buffer = GenerationBuffer(
        examples,
        PromptSide(prompts, gen),
        completion_ids=[[150 + i, EOS] for i in range(40)],
        params=SamplingParams(16, temperature=1.0, top_k=50, n=2),
        per_device_batch_size=4,
        grad_accum_steps=2,
        lambda_=1.0,
        pad_id=PAD,
        seed=0,
    )
    buffer.seeded = True  # as AsyncWindows sets it: one seed per generate call
    return buffer


def samples(window):
    return [
        (s.example_id, tuple(s.completion_ids), tuple(s.sampling_logprobs or ()))
        for b in window.micro_batches
        for s in b.samples
    ]


def test_async_compiled_generator_windows_equal_the_sync_windows():
    from torch._dynamo.utils import counters

    from distil.generation.static import cudagraphs_on_any_thread

    model = tiny_llama(V, seed=3).to(DEVICE)
    sync = make_buffer(model)
    source = AsyncWindows(make_buffer(model), model, max_steps=WINDOWS)
    worker_mode = source.buffer.student.generator.compile_mode
    assert worker_mode == (None if cudagraphs_on_any_thread() else "default")
    counters.clear()
    graphs = None
    try:
        for step in range(WINDOWS):
            want, got = sync.next_window(), source.next_window()
            assert got.policies == want.policies == [ON, ON]
            w, g = samples(want), samples(got)
            assert [s[:2] for s in g] == [s[:2] for s in w], step  # same prompts and tokens
            for (_, _, lp_w), (_, _, lp_g) in zip(w, g, strict=True):
                torch.testing.assert_close(
                    torch.tensor(lp_g), torch.tensor(lp_w), atol=1e-5, rtol=0
                )
            if step == 1:  # both generators warmed up (compiled, graphs recorded)
                graphs = counters["stats"]["unique_graphs"]
        assert len({s[1] for s in samples(want)}) > 1  # sampled, not one repeated row
    finally:
        source.close()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == graphs  # no recompile after warm-up
