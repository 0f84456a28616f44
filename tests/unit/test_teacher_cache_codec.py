"""The cache's format-2 codec: Rice-coded id gaps (exact) and sqrt-quantised probabilities
(KL below 1e-3 nats per token, at most 128 bytes per token at k=64 on a 128k vocabulary)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distil.teacher import cache as fmt
from distil.teacher import cache_codec as codec
from distil.teacher.base import sparse_topk
from distil.teacher.cache import CacheError

V = 131072


def test_rice_codes_of_a_hand_worked_row():
    # ids 3, 4: gaps 3 (the first id) and 4 - 3 - 1 = 0. Position 0: r = 1 (3 bits: "01" + "1"
    # beats r = 0's "0001"); position 1: r = 0 ("1"). Unary stream "011", low bits "1".
    arrays = codec.encode_ids(np.array([[3, 4]]))
    assert arrays["ids_r"].tolist() == [1, 0]
    assert arrays["ids_hi"].tolist() == [0b01100000] and arrays["ids_lo"].tolist() == [0b10000000]
    assert codec.decode_ids(arrays, 1, 2).tolist() == [[3, 4]]


def _id_rows():
    @st.composite
    def rows(draw):
        n, k = draw(st.integers(0, 12)), draw(st.integers(1, 12))
        vocab = draw(st.sampled_from([k, k + 1, 1000, V, 2**31 - 1]))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        ids = [np.sort(rng.choice(vocab, k, replace=False)) for _ in range(n)]
        return np.stack(ids).astype(np.int64) if n else np.zeros((0, k), np.int64)

    return rows()


def _check_round_trip(ids):
    n, k = ids.shape
    assert np.array_equal(codec.decode_ids(codec.encode_ids(ids), n, k), ids)


@settings(max_examples=60, deadline=1000)
@given(_id_rows())
def test_any_sorted_distinct_ids_round_trip(ids):
    _check_round_trip(ids)


@pytest.mark.slow
@settings(max_examples=2000, deadline=1000)
@given(_id_rows())
def test_any_sorted_distinct_ids_round_trip_long_run(ids):
    _check_round_trip(ids)


def test_repeated_or_negative_ids_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        codec.encode_ids(np.array([[2, 2, 5]]))
    with pytest.raises(ValueError, match="distinct"):
        codec.encode_ids(np.array([[-1, 5]]))


def synthetic(kind: str, n: int = 256, k: int = 64, seed: int = 0):
    """Top-k of 128k-vocabulary log-probs, as bench/cache.py: "random" spreads the top-k ids
    over the vocabulary, "zipf" gives small ids the large probabilities."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, V, generator=g) * 2.0
    if kind == "random":
        logits[torch.arange(n), torch.randint(0, V, (n,), generator=g)] += 12.0
    else:
        logits -= torch.log(torch.arange(1, V + 1, dtype=torch.float32))
    logprobs = torch.log_softmax(logits, -1)
    return (*sparse_topk(logprobs, k), logprobs[:, 0])


def kl_buckets(ids, vals, rest, decoded) -> float:
    """KL(exact || decoded) over the K+1 buckets, nats per token (decoded rows: id order)."""
    order = ids.argsort(-1)
    p = torch.cat([vals.gather(-1, order), rest[:, None]], -1).double()
    q = torch.cat([decoded[1], decoded[2][:, None]], -1).double()
    assert torch.allclose(q.logsumexp(-1), torch.zeros(len(q), dtype=q.dtype), atol=1e-5)
    return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.mark.parametrize("kind", ["random", "zipf"])
def test_sqrt_codec_at_k64_on_128k_vocabulary_is_small_and_close(kind):
    ids, vals, rest, token = synthetic(kind)
    arrays = codec.encode_tokens(ids, vals, rest, token, "sqrt")
    decoded = codec.decode_tokens(arrays, 64, "sqrt")
    assert torch.equal(decoded[0], ids.sort(-1).values)  # ids lossless
    assert torch.equal(decoded[3], token.half().float())
    kl = kl_buckets(ids, vals, rest, decoded)
    # uniform rounding of sqrt p costs ~ k d^2 / 6 = the budget (5e-4)
    assert 0.5 * codec.SQRT_KL_BUDGET < kl < 1.5 * codec.SQRT_KL_BUDGET < 1e-3
    per_token = sum(a.nbytes for a in arrays.values()) / len(ids)
    assert per_token <= 128  # the cache's size goal (bench/cache.py: ~124 random, ~83 zipf)
    q8 = codec.encode_tokens(ids, vals, rest, token, "q8")
    assert per_token < sum(a.nbytes for a in q8.values()) / len(ids)


def test_probabilities_below_the_first_level_stay_finite():
    ids = torch.tensor([[0, 1, 2]])
    vals = torch.tensor([[-0.01, -40.0, -80.0]])  # sqrt p of the last two far below d/2
    rest = torch.log(-torch.expm1(vals.logsumexp(-1)))
    _, lps, d_rest, _ = codec.decode_tokens(codec.encode_tokens(ids, vals, rest, rest), 3, "sqrt")
    d = codec.sqrt_step(3)
    assert torch.isfinite(lps).all() and torch.isfinite(d_rest).all()
    # level 0 decodes at sqrt p = d/4 (then renormalised with the top-1's rounding: +-0.05)
    assert lps[0, 1] == lps[0, 2] == pytest.approx(2 * math.log(d / 4), abs=0.05)


def test_the_step_keeps_the_kl_budget_for_each_k():
    for k in (1, 16, 64, 256, 1024):
        d = codec.sqrt_step(k)
        assert d >= 1 / codec.MAX_LEVEL
        if d > 1 / codec.MAX_LEVEL:
            assert k * d**2 / 6 == pytest.approx(codec.SQRT_KL_BUDGET)


def _manifest(tmp_path, **changes):
    m = {
        "format": fmt.FORMAT,
        "k": 8,
        "rows": 1,
        "data_fingerprint": "x",
        "values": "sqrt",
        "sqrt_step": codec.sqrt_step(8),
        "temperature": 1.0,
        "shards": [],
    }
    m.update(changes)
    (tmp_path / fmt.MANIFEST).write_text(json.dumps(m))
    return tmp_path


def test_a_format_1_cache_is_refused_with_a_rebuild_hint(tmp_path):
    with pytest.raises(CacheError, match=r"'distil-teacher-cache-1' \(an older distil's format"):
        fmt.read_manifest(_manifest(tmp_path, format="distil-teacher-cache-1"))


@pytest.mark.parametrize("step", [0, -0.1, "big", True, float("inf")])
def test_a_bad_step_in_the_manifest_is_a_cache_error(tmp_path, step):
    assert fmt.read_manifest(_manifest(tmp_path))["values"] == "sqrt"
    with pytest.raises(CacheError, match="'sqrt_step' should be a positive number"):
        fmt.read_manifest(_manifest(tmp_path, sqrt_step=step))
