"""hf_static (StaticCacheGenerator) against HFGenerator, and `generation.backend` selection.

The reference for greedy decoding is today's HFGenerator (transformers generate, dynamic
cache); for sampling, a full forward of the sampled sequence with the warpers written out.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distil.config import build_config
from distil.errors import ConfigError
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.select import build_generator, generator_class
from distil.generation.static import StaticCacheGenerator, bucket, takes_cache_position
from distil.testing import tiny_llama, tiny_qwen2

TEXTS = ["nums: 1 2 3 target: 6", "the quick brown fox jumps over the lazy dog", "7 + 8 =", "a"]


@pytest.fixture(params=["llama", "qwen2"])
def model(request, bpe_tokenizer):
    arch = tiny_llama if request.param == "llama" else tiny_qwen2
    return arch(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)


@pytest.fixture
def prompts(bpe_tokenizer):
    return [bpe_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def pair(model, tok, stop_ids=None, **static_kw):
    stops = stop_ids or [tok.eos_token_id]
    hf = HFGenerator(model, pad_id=tok.pad_token_id, stop_ids=stops)
    # small buckets: prompts padded past their longest, filler rows in the batch
    kw = {"batch_buckets": [3, 16], "length_buckets": [4, 16, 64], **static_kw}
    return hf, StaticCacheGenerator(model, pad_id=tok.pad_token_id, stop_ids=stops, **kw)


def assert_same_rollout(a, b, atol=1e-5):
    assert a.prompt_index == b.prompt_index
    assert torch.equal(a.completion_ids_B_C, b.completion_ids_B_C)
    assert torch.equal(a.completion_mask_B_C, b.completion_mask_B_C)
    assert torch.equal(a.stopped_B, b.stopped_B)
    torch.testing.assert_close(a.logprobs_B_C, b.logprobs_B_C, atol=atol, rtol=0)


def test_bucket_rounds_up_and_past_the_largest():
    assert [bucket(s, [8, 16, 64]) for s in (1, 8, 9, 64, 65, 129)] == [8, 8, 16, 64, 128, 192]


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_equals_hf_generate_with_mixed_prompt_lengths(model, bpe_tokenizer, prompts, n):
    hf, static = pair(model, bpe_tokenizer)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, n=n)
    ref, got = hf.generate(prompts, params), static.generate(prompts, params)
    assert len({len(p) for p in prompts}) == len(prompts)  # every row a different length
    assert_same_rollout(ref, got)
    assert ref.logprobs_B_C.lt(0).all()  # real log-probs, not the zero fill


def test_position_ids_count_real_tokens_of_left_padded_rows(bpe_tokenizer, prompts):
    # RoPE only sees position differences within a row, so a constant shift would not change
    # the outputs above: check the positions fed to the model directly, as generate makes them
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, static = pair(model, bpe_tokenizer)
    seen = []
    model.register_forward_pre_hook(
        lambda m, args, kw: seen.append((kw["position_ids"], kw["attention_mask"])),
        with_kwargs=True,
    )
    static.generate(prompts, SamplingParams(3, temperature=0.0))
    (prefill, mask), decode = seen[0], [pos for pos, _ in seen[1:]]
    for row, p in enumerate(prompts):
        real = prefill[row][mask[row, : prefill.shape[1]]]
        assert real.tolist() == list(range(len(p)))
        assert [int(pos[row, 0]) for pos in decode] == [len(p), len(p) + 1]
        assert int(mask[row, : prefill.shape[1]].sum()) == len(p)  # padding masked


def test_several_stop_ids_end_rows_like_hf_generate(model, bpe_tokenizer, prompts):
    free = HFGenerator(model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[0])
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    ref_ids = free.generate(prompts, params).completion_ids_B_C
    # the 3rd token of row 0 and the 2nd of row 2 are stops: rows end at different steps
    stops = [bpe_tokenizer.eos_token_id, int(ref_ids[0, 2]), int(ref_ids[2, 1])]
    hf, static = pair(model, bpe_tokenizer, stop_ids=stops)
    ref, got = hf.generate(prompts, params), static.generate(prompts, params)
    assert_same_rollout(ref, got)
    assert bool(got.stopped_B[0]) and bool(got.stopped_B[2])
    assert len(got.completion_lists()[0]) <= 3 and got.completion_lists()[0][-1] in stops


PROMPT_SETS = st.lists(
    st.lists(st.integers(3, 300), min_size=1, max_size=20), min_size=1, max_size=4
)
FUZZ = settings(
    max_examples=8,
    deadline=timedelta(seconds=1),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FUZZ_LONG = settings(FUZZ, max_examples=int(os.environ.get("DISTIL_HYPOTHESIS_EXAMPLES", "150")))


def check_static_equals_hf(model, tok, prompt_ids, stops, n, new):
    hf, static = pair(model, tok, stop_ids=stops)
    params = SamplingParams(new, temperature=0.0, n=n)
    assert_same_rollout(hf.generate(prompt_ids, params), static.generate(prompt_ids, params))


@FUZZ
@given(
    PROMPT_SETS,
    st.sets(st.integers(0, 300), min_size=1, max_size=8),
    st.integers(1, 2),
    st.integers(1, 6),
)
def test_fuzz_greedy_static_equals_hf(tiny_llama_model, bpe_tokenizer, prompt_ids, stops, n, new):
    check_static_equals_hf(tiny_llama_model, bpe_tokenizer, prompt_ids, sorted(stops), n, new)


@pytest.mark.slow
@FUZZ_LONG
@given(
    PROMPT_SETS,
    st.sets(st.integers(0, 300), min_size=1, max_size=30),
    st.integers(1, 3),
    st.integers(1, 12),
)
def test_fuzz_greedy_static_equals_hf_long(
    tiny_llama_model, bpe_tokenizer, prompt_ids, stops, n, new
):
    check_static_equals_hf(tiny_llama_model, bpe_tokenizer, prompt_ids, sorted(stops), n, new)


def test_decoding_stops_early_when_every_row_stopped(bpe_tokenizer, prompts):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    free = HFGenerator(model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[0])
    ref = free.generate(prompts, SamplingParams(4, temperature=0.0)).completion_ids_B_C
    stops = sorted(set(ref[:, 1].tolist()))  # every row stops at its 2nd token (or before)
    _, static = pair(model, bpe_tokenizer, stop_ids=stops)
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    out = static.generate(prompts, SamplingParams(50, temperature=0.0))
    assert out.stopped_B.all() and out.completion_ids_B_C.shape[1] <= 2
    assert len(forwards) <= 2  # prefill + one decode step, not 50


def test_top_k_1_sampling_equals_greedy(model, bpe_tokenizer, prompts):
    _, static = pair(model, bpe_tokenizer)
    greedy = static.generate(prompts, SamplingParams(8, temperature=0.0, n=2))
    torch.manual_seed(5)
    sampled = static.generate(prompts, SamplingParams(8, temperature=1.3, top_k=1, n=2))
    assert torch.equal(sampled.completion_ids_B_C, greedy.completion_ids_B_C)
    # one candidate left: the sampling distribution is a point mass, log-prob 0
    assert sampled.logprobs_B_C.abs().max() < 1e-6


def warped_logprobs(logits_T_V, temperature, top_k, top_p):
    """log-softmax of the logits after temperature, top-k and top-p (generate's order)."""
    logits = logits_T_V / temperature
    if top_k:
        kth = logits.topk(top_k, -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_p, order = logits.softmax(-1).sort(-1)
        drop_sorted = sorted_p.cumsum(-1) <= 1 - top_p
        drop_sorted[:, -1] = False
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8)]
)
def test_recorded_logprobs_are_those_of_the_sampling_distribution(
    bpe_tokenizer, prompts, temperature, top_k, top_p
):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, static = pair(model, bpe_tokenizer)
    torch.manual_seed(0)
    out = static.generate(prompts, SamplingParams(8, temperature, top_p, top_k, n=2))
    for row, (p_idx, ids) in enumerate(zip(out.prompt_index, out.completion_lists(), strict=True)):
        full = torch.tensor([prompts[p_idx] + ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompts[p_idx]) - 1 : -1]
        logp = warped_logprobs(logits, temperature, top_k, top_p)
        expected = logp.gather(1, torch.tensor(ids)[:, None])[:, 0]
        assert expected.isfinite().all()  # every sampled token was allowed by top-k/top-p
        torch.testing.assert_close(out.logprobs_B_C[row, : len(ids)], expected, atol=1e-4, rtol=0)


def test_first_token_frequencies_follow_the_warped_distribution(bpe_tokenizer, prompts):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, static = pair(model, bpe_tokenizer, batch_buckets=[256])
    params = SamplingParams(1, temperature=0.5, top_k=6, n=2048)
    torch.manual_seed(0)
    first = static.generate([prompts[0]], params).completion_ids_B_C[:, 0]
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0]])).logits[0, -1:]
    expected = warped_logprobs(logits, 0.5, 6, 1.0).exp()[0]
    seen = torch.bincount(first, minlength=expected.numel()).float() / first.numel()
    assert seen[expected == 0].sum() == 0  # never outside the top-k
    assert (seen - expected).abs().sum() / 2 < 0.05  # total variation, 2048 draws


@pytest.mark.parametrize("compile_backend", [None, "aot_eager"])
def test_sees_in_place_optimizer_updates(bpe_tokenizer, prompts, compile_backend):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    kw = {"compile": True, "compile_backend": compile_backend} if compile_backend else {}
    _, static = pair(model, bpe_tokenizer, **kw)
    params = SamplingParams(8, temperature=0.0)
    from torch._dynamo.utils import counters

    before = static.generate(prompts, params)
    graphs = counters["stats"]["unique_graphs"]
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    batch = torch.tensor([prompts[1]])
    model(batch, labels=batch).loss.backward()
    opt.step()
    after = static.generate(prompts, params)
    assert counters["stats"]["unique_graphs"] == graphs  # replayed, not recompiled
    _, fresh = pair(model, bpe_tokenizer)
    assert_same_rollout(after, fresh.generate(prompts, params))
    assert not torch.equal(after.completion_ids_B_C, before.completion_ids_B_C)
    assert model.training  # the generator restores the mode it found


def test_kept_caches_are_reset_between_calls(bpe_tokenizer, prompts):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    hf, static = pair(model, bpe_tokenizer)
    params = SamplingParams(6, temperature=0.0)
    first = static.generate(prompts[:2], params)
    static.generate(prompts, SamplingParams(9, temperature=0.0, n=2))  # another bucket
    again = static.generate(prompts[:2], params)  # the first bucket's cache, reused
    assert_same_rollout(first, again, atol=0)
    assert_same_rollout(hf.generate(prompts[:2], params), again)


def test_compiled_step_equals_eager(bpe_tokenizer, prompts):
    from torch._dynamo.utils import counters

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, eager = pair(model, bpe_tokenizer)
    _, compiled = pair(model, bpe_tokenizer, compile=True, compile_backend="aot_eager")
    params = SamplingParams(8, temperature=0.0, n=2)
    counters.clear()
    assert_same_rollout(eager.generate(prompts, params), compiled.generate(prompts, params))
    # one graph per step, no data-dependent break (transformers 4.x without cache_position)
    assert dict(counters["graph_break"]) == {}


def test_seeded_calls_are_a_function_of_the_seed_and_leave_the_global_rng(bpe_tokenizer, prompts):
    """SamplingParams.seed (generation.async): the draws come from a private generator, so
    a call's samples depend on (weights, prompts, seed) only, compiled or not."""
    from dataclasses import replace

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, static = pair(model, bpe_tokenizer)
    params = SamplingParams(8, temperature=1.3, top_k=30, n=3, seed=11)
    before = torch.get_rng_state()
    a = static.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), before)  # nothing drawn from the global RNG
    torch.manual_seed(1234)
    assert_same_rollout(a, static.generate(prompts, params), atol=0)
    other = static.generate(prompts, replace(params, seed=12))
    assert not torch.equal(a.completion_ids_B_C, other.completion_ids_B_C)
    rows = a.completion_lists()
    assert len({tuple(r) for r in rows[:3]}) > 1  # the samples of one prompt differ
    _, compiled = pair(model, bpe_tokenizer, compile=True, compile_backend="aot_eager")
    assert_same_rollout(a, compiled.generate(prompts, params))


def test_cache_position_reaches_every_call_of_a_model_that_takes_it(bpe_tokenizer, prompts):
    """A forward with a `cache_position` argument (transformers 4.x) gets it on the prefill
    (arange(width)) and on every decode step (width + t), as generate passes it; the
    completions are unchanged."""
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    hf, plain = pair(model, bpe_tokenizer)
    params = SamplingParams(5, temperature=0.0, n=2)
    want, ref = plain.generate(prompts, params), hf.generate(prompts, params)
    seen, forward, passes_it = [], model.forward, takes_cache_position(model)

    def forward_with_cache_position(*args, cache_position=None, **kwargs):
        seen.append(cache_position)
        if passes_it:  # transformers 4.x (5.x: the cache counts its own length)
            kwargs["cache_position"] = cache_position
        return forward(*args, **kwargs)

    model.forward = forward_with_cache_position
    _, static = pair(model, bpe_tokenizer)
    got = static.generate(prompts, params)
    assert_same_rollout(want, got, atol=0)
    assert_same_rollout(ref, got)
    width = bucket(max(len(p) for p in prompts), [4, 16, 64])  # pair()'s length buckets
    assert all(isinstance(c, torch.Tensor) for c in seen)  # on every call, as a tensor
    assert seen[0].tolist() == list(range(width))
    assert [c.tolist() for c in seen[1:]] == [[width + t] for t in range(len(seen) - 1)]
    assert len(seen) == want.completion_ids_B_C.shape[1]  # prefill + one per further token


def test_the_cache_goes_under_the_name_the_forward_takes(bpe_tokenizer, prompts):
    """transformers 5.24 renamed past_key_values to cache (the old name warns, and goes in
    5.40): every call passes the name the model's forward declares."""
    import inspect
    import warnings

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    hf, static = pair(model, bpe_tokenizer)
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(set(kw)), with_kwargs=True)
    params = SamplingParams(3, temperature=0.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*deprecated")
        got = static.generate(prompts, params)
    takes = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in takes else "past_key_values"
    assert seen and all(name in kw for kw in seen)
    assert_same_rollout(hf.generate(prompts, params), got)


def test_an_evaluation_keeps_no_kv_cache_and_the_training_cache_stays(bpe_tokenizer, prompts):
    """Calls inside scratch_caches() (an evaluation) drop their caches afterwards; the cache
    from before (the training bucket) stays the same object, reused inside, and results are
    those of HF generate."""
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    hf, static = pair(model, bpe_tokenizer)
    train = SamplingParams(6, temperature=0.0)
    static.generate(prompts[:2], train)  # batch bucket 3, width 16 + 6
    (key,) = static._caches
    training_cache, training_bytes = static._caches[key], static.kept_cache_bytes()
    assert training_bytes > 0
    with static.scratch_caches():
        for n, new in ((3, 9), (1, 30), (2, 4)):  # other buckets than training's
            params = SamplingParams(new, temperature=0.0, n=n)
            assert_same_rollout(hf.generate(prompts, params), static.generate(prompts, params))
        assert static.kept_cache_bytes() > training_bytes  # the eval's caches, while it runs
        assert_same_rollout(hf.generate(prompts[:2], train), static.generate(prompts[:2], train))
    assert list(static._caches) == [key] and static._caches[key] is training_cache
    assert static.kept_cache_bytes() == training_bytes
    again = static.generate(prompts[:2], train)  # the training cache still serves its bucket
    assert static._caches[key] is training_cache
    assert_same_rollout(hf.generate(prompts[:2], train), again)


def test_training_calls_in_three_width_buckets_keep_their_three_caches(bpe_tokenizer):
    """gpu-review-2 finding 11: with two caches kept, three width buckets in rotation evicted
    each other, so every call made a new cache (new static addresses: the CUDA graphs
    re-recorded every step). Now each shape keeps its cache, at the same addresses."""
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    _, static = pair(model, bpe_tokenizer)
    params = SamplingParams(4, temperature=0.0)
    widths = {3: [[5, 6, 7]], 12: [list(range(5, 17))], 40: [list(range(5, 45))]}  # 4, 16, 64
    first = {}
    for _ in range(3):
        for length, rows in widths.items():
            static.generate(rows, params)
            addresses = {k: c.layers[0].keys.data_ptr() for k, c in static._caches.items()}
            for key, ptr in addresses.items():
                assert first.setdefault(key, ptr) == ptr, (length, key)
    assert sorted(first) == [(3, 4 + 4), (3, 16 + 4), (3, 64 + 4)]


@pytest.mark.slow
def test_steady_state_sampled_calls_replay_the_compiled_step(bpe_tokenizer, prompts):
    from torch._dynamo.utils import counters

    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer, seed=3)
    kw = {"compile": True, "compile_backend": "aot_eager", "length_buckets": [64]}
    _, static = pair(model, bpe_tokenizer, **kw)
    params = SamplingParams(6, temperature=0.7, top_p=0.9, top_k=5)
    static.generate(prompts[:2], params)
    graphs = counters["stats"]["unique_graphs"]
    # new warper objects, other prompts and row counts of the same buckets: no recompile
    static.generate(prompts[1:], params)
    static.generate(prompts[:1], SamplingParams(6, temperature=0.7, top_p=0.9, top_k=5))
    assert counters["stats"]["unique_graphs"] == graphs


# ---------------------------------------------------------------------- backend selection


def test_backend_names_build_their_generators(make_train_config, bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer)
    kw = {
        "pad_id": bpe_tokenizer.pad_token_id,
        "stop_ids": [bpe_tokenizer.eos_token_id],
        "vocab_limit": len(bpe_tokenizer) - 8,
    }
    cfg = build_config(make_train_config())
    assert cfg.generation.backend == "hf"
    gen = build_generator(cfg, model, **kw)
    assert type(gen) is HFGenerator and gen.vocab_limit == len(bpe_tokenizer) - 8
    cfg = build_config(make_train_config(generation={"backend": "hf_static"}))
    gen = build_generator(cfg, model, **kw)
    assert type(gen) is StaticCacheGenerator and gen.compile is False  # auto: off on CPU
    assert gen.vocab_limit == len(bpe_tokenizer) - 8
    cfg = build_config(make_train_config(generation={"backend": "hf_static", "compile": True}))
    gen = build_generator(cfg, model, **kw)
    assert gen.compile is True and gen.max_batch == 256


def test_vllm_backend_is_imported_only_when_chosen(make_train_config, monkeypatch):
    import sys
    import types

    made = {}

    class StandIn:
        @classmethod
        def from_config(cls, cfg, model, *, pad_id, stop_ids, vocab_limit):
            made.update(cfg=cfg, model=model, pad_id=pad_id, stop_ids=stop_ids, limit=vocab_limit)
            return cls()

    monkeypatch.delitem(sys.modules, "distil.generation.vllm", raising=False)
    cfg = build_config(make_train_config())
    build_generator(cfg, object(), pad_id=0, stop_ids=[1], vocab_limit=None)
    assert "distil.generation.vllm" not in sys.modules  # hf needs no vllm module
    module = types.ModuleType("distil.generation.vllm")
    module.VLLMGenerator = StandIn
    monkeypatch.setitem(sys.modules, "distil.generation.vllm", module)
    cfg = build_config(make_train_config())
    cfg.generation.backend = "vllm"  # (a config check may ask for CUDA: not the point here)
    model = object()
    gen = build_generator(cfg, model, pad_id=3, stop_ids=(4, 5), vocab_limit=9)
    assert isinstance(gen, StandIn)
    assert made == {"cfg": cfg, "model": model, "pad_id": 3, "stop_ids": [4, 5], "limit": 9}


def test_unknown_backend_is_a_config_error_naming_the_valid_ones(make_train_config):
    with pytest.raises(ConfigError, match=r"hf_static"):
        build_config(make_train_config(generation={"backend": "sglang"}))
    with pytest.raises(ConfigError, match=r"hf, hf_static, vllm"):
        generator_class("sglang")


def test_the_config_and_the_registry_name_the_same_backends():
    # the config's Literal (what validation accepts) and the registry (what builds) in step
    from typing import get_args

    from distil.config import GenerationConfig
    from distil.generation.select import GENERATORS

    allowed = get_args(GenerationConfig.model_fields["backend"].annotation)
    assert set(allowed) == set(GENERATORS)


def read_losses(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_greedy_on_policy_run_logs_the_same_losses_with_hf_and_hf_static(
    tmp_path, make_train_config, monkeypatch
):
    from distil.train import loop

    losses, evals, built = {}, {}, []
    real = StaticCacheGenerator.from_config.__func__

    def spy(cls, *args, **kwargs):
        built.append(real(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(StaticCacheGenerator, "from_config", classmethod(spy))
    for backend in ("hf", "hf_static"):
        raw = make_train_config(
            generation={"backend": backend, "temperature": 0.0, "num_generations": 1},
            train={
                "lambda": 1.0,
                "max_steps": 3,
                "eval_every": 3,
                "output_dir": str(tmp_path / backend),
            },
            eval={"max_new_tokens": 20},  # the eval's caches: another shape than training's
        )
        loop.train(build_config(raw))
        losses[backend] = read_losses(tmp_path / backend)
        rows = (tmp_path / backend / "metrics.jsonl").read_text().splitlines()
        evals[backend] = {
            k: v
            for k, v in json.loads(rows[-1]).items()
            if k.startswith("eval/") and k != "eval/seconds"
        }
    assert len(losses["hf"]) == 3
    assert losses["hf_static"] == pytest.approx(losses["hf"], rel=1e-5, abs=1e-7)
    assert evals["hf"] and evals["hf_static"] == evals["hf"]  # the eval sampled with it too
    (gen,) = built  # the student's; the eval ran through it and kept none of its caches
    assert gen._caches and all(length == 64 + 12 for _, length in gen._caches)


def test_cudagraphs_on_any_thread_from_torch_2_12():
    from distil.generation.static import cudagraphs_on_any_thread

    got = {v: cudagraphs_on_any_thread(v) for v in ("2.11.0+cu130", "2.12.0a0+git1", "2.12.0",
                                                    "2.13.0+cpu", "3.0.0")}  # fmt: skip
    assert got == {"2.11.0+cu130": False, "2.12.0a0+git1": False, "2.12.0": True,
                   "2.13.0+cpu": True, "3.0.0": True}  # fmt: skip


@pytest.mark.parametrize("torch_version", ["2.11.0+cu130", "2.13.0"])
def test_the_async_sampler_compiles_without_cuda_graphs_before_torch_2_12(
    monkeypatch, bpe_tokenizer, torch_version
):
    """gpu-review-2 finding 2: on torch 2.11 cudagraph trees assert in a thread other than the
    first to use them, so the worker thread's hf_static copy compiles without CUDA graphs
    (inductor's default mode); the main thread's generator and newer torches keep them."""
    from distil.generation import static
    from distil.train.async_gen import AsyncWindows
    from distil.train.buffer import GenerationBuffer, PromptSide
    from distil.types import Example

    monkeypatch.setattr(static.torch, "__version__", torch_version)
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer)
    gen = StaticCacheGenerator(model, pad_id=0, stop_ids=[2], compile=True)
    writer = StaticCacheGenerator(model, pad_id=0, stop_ids=[2], compile=True)
    examples = [Example(i, f"p {i}", f"a {i}") for i in range(8)]
    prompts = [[5 + i, 6] for i in range(8)]
    buffer = GenerationBuffer(
        examples, PromptSide(prompts, gen), completion_ids=[[7, 2]] * 8,
        params=SamplingParams(4, n=1), per_device_batch_size=2, grad_accum_steps=1,
        lambda_=0.5, pad_id=0, seq_kd=True, teacher=PromptSide(prompts, writer),
    )  # fmt: skip
    source = AsyncWindows(buffer, model, max_steps=2)
    try:
        sampler, written = source.buffer.student.generator, source.buffer.teacher.generator
        old = torch_version.startswith("2.11")
        assert sampler is not gen and written is not writer
        assert sampler.compile_mode == written.compile_mode == ("default" if old else None)
        assert gen.compile_mode is None and writer.compile_mode is None  # the originals keep them
        assert sampler.model is source.snapshot and written.model is model
    finally:
        source.close()
