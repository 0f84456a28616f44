"""hf_static on CUDA with the decode step compiled (inductor, reduce-overhead: CUDA graphs):
greedy tokens equal hf's, no graph break, no recompile and no CUDA-graph skip after warm-up,
an evaluation's KV caches released afterwards.

Skipped automatically without a CUDA device (tests/conftest.py).
"""

import pytest
import torch

from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.static import StaticCacheGenerator
from distil.testing import tiny_llama

pytestmark = pytest.mark.gpu

TEXTS = ["nums: 1 2 3 target: 6", "the quick brown fox jumps over the lazy dog", "7 + 8 =", "a"]


def test_compiled_cuda_graph_generator_equals_hf_and_follows_weight_updates(bpe_tokenizer):
    from torch._dynamo.utils import counters

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3).cuda()
    prompts = [bpe_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    kw = {"pad_id": bpe_tokenizer.pad_token_id, "stop_ids": [bpe_tokenizer.eos_token_id]}
    hf = HFGenerator(model, **kw)
    static = StaticCacheGenerator(model, compile=True, **kw)
    params = SamplingParams(16, temperature=0.0, n=2)
    counters.clear()
    got = static.generate(prompts, params)
    ref = hf.generate(prompts, params)
    assert torch.equal(got.completion_ids_B_C, ref.completion_ids_B_C)
    torch.testing.assert_close(got.logprobs_B_C, ref.logprobs_B_C, atol=1e-4, rtol=0)
    # one graph per step: no data-dependent break (a cache_position derived from the cache)
    assert dict(counters["graph_break"]) == {}

    graphs = counters["stats"]["unique_graphs"]
    static.generate(prompts[::-1], params)  # same buckets: replayed, not recompiled
    assert counters["stats"]["unique_graphs"] == graphs
    assert counters["inductor"]["cudagraph_skips"] == 0  # replayed as CUDA graphs

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    batch = torch.tensor([prompts[1]], device="cuda")
    model(batch, labels=batch).loss.backward()
    opt.step()  # in place: the captured graph must read the new values
    after = static.generate(prompts, params)
    fresh = hf.generate(prompts, params)
    assert not torch.equal(after.completion_ids_B_C, got.completion_ids_B_C)
    assert torch.equal(after.completion_ids_B_C, fresh.completion_ids_B_C)
    torch.testing.assert_close(after.logprobs_B_C, fresh.logprobs_B_C, atol=1e-4, rtol=0)


def test_compiled_sampling_records_the_warped_logprobs(bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3).cuda()
    prompts = [bpe_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    static = StaticCacheGenerator(
        model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[bpe_tokenizer.eos_token_id]
    )
    static.compile = True
    torch.manual_seed(0)
    out = static.generate(prompts, SamplingParams(12, temperature=0.7, top_k=20, n=2))
    for row, (p, ids) in enumerate(zip(out.prompt_index, out.completion_lists(), strict=True)):
        full = torch.tensor([prompts[p] + ids], device="cuda")
        with torch.no_grad():
            logits = model(full).logits[0, len(prompts[p]) - 1 : -1].float() / 0.7
        kth = logits.topk(20, -1).values[:, -1:]
        logp = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
        expected = logp.gather(1, torch.tensor(ids, device="cuda")[:, None])[:, 0].cpu()
        torch.testing.assert_close(out.logprobs_B_C[row, : len(ids)], expected, atol=1e-3, rtol=0)


def test_an_evaluation_releases_its_kv_caches(bpe_tokenizer):
    """Calls inside scratch_caches() (the in-training eval) leave the CUDA memory they
    allocated for KV caches free afterwards; the training bucket's cache stays."""
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3).cuda()
    prompts = [bpe_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    static = StaticCacheGenerator(
        model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[bpe_tokenizer.eos_token_id]
    )
    static.generate(prompts[:2], SamplingParams(8, temperature=0.0))  # the training bucket
    torch.cuda.synchronize()
    kept, allocated = static.kept_cache_bytes(), torch.cuda.memory_allocated()
    with static.scratch_caches():
        static.generate(prompts * 16, SamplingParams(256, temperature=0.0))  # eval-sized
        static.generate(prompts * 8, SamplingParams(128, temperature=0.0))
        assert static.kept_cache_bytes() > 4 * kept
    torch.cuda.synchronize()
    assert static.kept_cache_bytes() == kept
    assert torch.cuda.memory_allocated() <= allocated  # the eval's caches are free again


def test_three_evaluations_between_training_calls_skip_no_cuda_graph(bpe_tokenizer):
    """gpu-review-2 finding 11: an evaluation's caches are new each time (new static
    addresses: its graphs re-record), and training's caches must keep theirs. After three
    evaluations no CUDA graph was skipped, nothing recompiled after the first, and the
    training calls (two width buckets in rotation) still equal hf's greedy tokens."""
    from torch._dynamo.utils import counters

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3).cuda()
    prompts = [bpe_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    kw = {"pad_id": bpe_tokenizer.pad_token_id, "stop_ids": [bpe_tokenizer.eos_token_id]}
    static = StaticCacheGenerator(model, compile=True, batch_buckets=[8, 32],
                                  length_buckets=[8, 16, 64], **kw)  # fmt: skip
    hf = HFGenerator(model, **kw)
    train = SamplingParams(12, temperature=0.0)
    long = [list(range(5, 40))]  # width bucket 64: the short prompts use 16
    counters.clear()
    graphs = None
    for evaluation in range(3):
        for rows in (prompts[:2], long):
            got = static.generate(rows, train)
            want = hf.generate(rows, train)
            assert torch.equal(got.completion_ids_B_C, want.completion_ids_B_C)
        kept = {k: c.layers[0].keys.data_ptr() for k, c in static._caches.items()}
        with static.scratch_caches():
            static.generate(prompts * 6, SamplingParams(24, temperature=0.0))  # eval shapes
        assert {k: c.layers[0].keys.data_ptr() for k, c in static._caches.items()} == kept
        if evaluation == 0:
            graphs = counters["stats"]["unique_graphs"]
    torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert counters["stats"]["unique_graphs"] == graphs  # compiled once, replayed after
    assert dict(counters["graph_break"]) == {}
