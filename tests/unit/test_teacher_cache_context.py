"""cache-teacher with privileged context (teacher.context / teacher.system): the cache holds the
teacher's targets scored after the context prompt, in the student's positions, equal to the
live teacher-with-context's top-k; training from it equals the live run; a run whose context
differs from the cache's is stopped, naming both."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distil.preflight import preflight
from distil.teacher import cache as fmt
from distil.teacher.base import sparse_topk
from distil.teacher.cache import CacheError
from distil.teacher.cached import CachedTeacher, dense_from_topk
from distil.teacher.live import LiveTeacher
from distil.teacher.select import SCORERS
from distil.teacher.writer import cache_teacher
from distil.testing import build_peaked_teacher, config_with, read_metrics
from distil.train import loop
from distil.train.setup import build
from distil.types import TeacherTargets

K = 8
HINT = "{prompt} (a solution: {solution})"


@pytest.fixture
def raw(make_train_config):
    return make_train_config(
        teacher={"top_k": K, "context": HINT, "system": "Think."},
        loss={"name": "forward_kl"},
        train={"max_steps": 3, "lambda": 0.0},
    )


@pytest.fixture
def cache_dir(tmp_path, raw):
    out = tmp_path / "cache"
    cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)
    return out


def test_a_context_cache_equals_the_live_teacher_with_context(raw, cache_dir):
    manifest = fmt.read_manifest(cache_dir)
    assert manifest["context"] == HINT and manifest["system"] == "Think."
    c = build(config_with(raw))  # the live teacher with context, top-k
    torch.manual_seed(0)
    batch = c.buffer.next_window().micro_batches[0]
    assert batch.context_input_ids_B_L is not None  # the teacher's inputs hold the context
    want = c.teacher.score(batch)
    cached = CachedTeacher(cache_dir, manifest)
    got = cached.score(batch)
    m = batch.mask_B_T
    for g_ids, g_lps, w_ids, w_lps in zip(
        got.topk_ids_B_T_K[m], got.topk_logprobs_B_T_K[m], want.topk_ids_B_T_K[m],
        want.topk_logprobs_B_T_K[m], strict=True,
    ):  # fmt: skip
        g = dict(zip(g_ids.tolist(), g_lps.tolist(), strict=True))
        w = dict(zip(w_ids.tolist(), w_lps.tolist(), strict=True))
        assert set(g) == set(w)
        assert [g[i] for i in w] == pytest.approx(list(w.values()), abs=1e-5)
    for f in ("rest_logprob_B_T", "token_logprobs_B_T"):
        torch.testing.assert_close(getattr(got, f)[m], getattr(want, f)[m], rtol=0, atol=1e-5)
    # and not the targets of the student's own prompt: the context moved them
    bare = replace(
        batch, context_input_ids_B_L=None, context_attention_mask_B_L=None, context_shift_B=None
    )
    other = c.teacher.score(bare)
    assert not torch.allclose(other.token_logprobs_B_T[m], want.token_logprobs_B_T[m], atol=1e-3)


def test_training_from_a_context_cache_logs_the_live_runs_losses(tmp_path, raw, cache_dir):
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "live")}))
    loop.train(
        config_with(
            raw,
            teacher={"cache": str(cache_dir), "top_k": None},
            train={"output_dir": str(tmp_path / "cached")},
        )
    )
    want = [m["loss"] for m in read_metrics(tmp_path / "live")]
    got = [m["loss"] for m in read_metrics(tmp_path / "cached")]
    assert len(want) == len(got) == 3
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "context, said",
    [
        ("{prompt} (hint: {solution})", "this run's teacher prompt for it differs"),
        (None, "no teacher.context/system"),
    ],
)
def test_a_run_with_another_context_is_stopped_naming_both(tmp_path, raw, cache_dir, context, said):
    run = config_with(
        raw,
        teacher={"cache": str(cache_dir), "context": context, "system": None},
        train={"output_dir": str(tmp_path / "run2")},
    )
    problems, _ = preflight(run)  # distil config validate: both values named
    assert any(
        f"context: cache {HINT!r}, this config {context!r}" in p
        and "system: cache 'Think.', this config None" in p
        for p in problems
    ), problems
    with pytest.raises(CacheError, match=said) as err:  # distil train: at the first row read
        loop.train(run)
    assert f"teacher.context = {HINT!r}, teacher.system = 'Think.'" in str(err.value)


def test_a_plain_cache_refuses_a_run_with_context(tmp_path, raw):
    out = tmp_path / "plain"
    plain = config_with(raw, teacher={"context": None, "system": None})
    cache_teacher(plain, out, values="fp32", shard_rows=64, batch_size=8)
    from safetensors.numpy import load_file

    assert "prompt_sha256" not in load_file(str(out / fmt.shard_name(0)))
    run = config_with(raw, teacher={"cache": str(out), "top_k": None})
    with pytest.raises(
        CacheError, match=r"teacher\.context = None.*gives the teacher a privileged"
    ):
        loop.train(run)


class TopKLive(LiveTeacher):
    """The cross reference (as test_teacher_cache_cross's): the live teacher's full log-probs
    cut to top-K + rest, spread back over the vocabulary as the cached scorer does."""

    def score(self, batch):
        full = super().score(batch).logprobs_B_T_V.float()
        ids, vals, rest = sparse_topk(full, K)
        return TeacherTargets(logprobs_B_T_V=dense_from_topk(ids, vals, rest, full.shape[-1]))


def test_a_cross_context_cache_trains_as_the_live_cross_teacher_with_context(
    tmp_path, make_train_config, tmp_path_factory, unigram_tokenizer, monkeypatch
):
    teacher = build_peaked_teacher(tmp_path_factory.mktemp("xt"), unigram_tokenizer, hidden_size=64)
    raw = make_train_config(
        teacher={"path": str(teacher), "context": HINT},
        loss={"name": "aligned_kl", "beta": 0.5},
        train={"max_steps": 2, "lambda": 0.0},
        generation={"num_generations": 1},
    )
    out = tmp_path / "xcache"
    cache_teacher(config_with(raw, teacher={"top_k": K}), out, values="fp32", shard_rows=32)
    cached = {"path": None, "cache": str(out)}
    loop.train(config_with(raw, teacher=cached, train={"output_dir": str(tmp_path / "cached")}))
    monkeypatch.setitem(SCORERS, "live", f"{__name__}:TopKLive")
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "live")}))
    want = [m["loss"] for m in read_metrics(tmp_path / "live")]
    got = [m["loss"] for m in read_metrics(tmp_path / "cached")]
    assert len(want) == len(got) == 2 and all(x > 0 for x in want)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    with pytest.raises(CacheError, match=r"teacher prompt for it differs"):  # no context
        loop.train(config_with(raw, teacher={**cached, "context": None}))
