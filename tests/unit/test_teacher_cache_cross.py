"""Cross-tokenizer teacher caches: the teacher's own template and tokens are cached with its
top-k; training from the cache equals training with the live top-k teacher; a cache made for
another tokenizer pair or template is a clear error."""

from __future__ import annotations

import pytest
import torch

from distil.teacher import cache as fmt
from distil.teacher.base import sparse_topk
from distil.teacher.cache import CacheError
from distil.teacher.cached import dense_from_topk
from distil.teacher.live import LiveTeacher
from distil.teacher.select import SCORERS
from distil.teacher.writer import cache_teacher
from distil.testing import build_model_dir, build_peaked_teacher, config_with, read_metrics
from distil.train import loop
from distil.types import TeacherTargets

K = 8


@pytest.fixture(scope="module")
def xtok_teacher(tmp_path_factory, unigram_tokenizer):
    """A tiny teacher of another family (Qwen2 with the unigram tokenizer), peaked outputs."""
    path = build_peaked_teacher(
        tmp_path_factory.mktemp("xteacher"), unigram_tokenizer, hidden_size=64
    )
    return path


@pytest.fixture
def raw(make_train_config, xtok_teacher):
    return make_train_config(
        teacher={"path": str(xtok_teacher)},
        loss={"name": "aligned_kl", "beta": 0.5},
        train={"lambda": 0.0, "max_steps": 3, "per_device_batch_size": 4, "grad_accum_steps": 2},
        generation={"num_generations": 1},
    )


class TopKLive(LiveTeacher):
    """The reference: the live cross teacher's full log-probs cut to top-K + rest, then spread
    back over the vocabulary exactly as the cached scorer does."""

    def score(self, batch):
        full = super().score(batch).logprobs_B_T_V.float()
        ids, vals, rest = sparse_topk(full, K)
        return TeacherTargets(logprobs_B_T_V=dense_from_topk(ids, vals, rest, full.shape[-1]))


def losses(run_dir):
    return [m["loss"] for m in read_metrics(run_dir)]


@pytest.mark.parametrize(
    "loss, values, tol", [("aligned_kl", "fp32", 1e-5), ("gold", "fp32", 1e-5), ("uld", "q8", 2e-3)]
)
def test_training_from_a_cross_cache_equals_the_live_top_k_teacher(
    tmp_path, raw, monkeypatch, loss, values, tol
):
    out = tmp_path / "cache"
    manifest = cache_teacher(
        config_with(raw, teacher={"top_k": K}, loss={"name": loss}),
        out,
        values=values,
        shard_rows=24,
    )
    assert manifest["cross_tokenizer"] and (out / fmt.TEACHER_TOKENIZER).is_dir()
    shard = fmt.read_shard(out, manifest["shards"][0], K, values, manifest["logprob_step"])
    assert shard.teacher_ids_N is not None and len(shard.teacher_ids_N) == shard.offsets[-1]
    # the cache needs no teacher.path: the teacher's tokenizer is read from the cache
    loop.train(
        config_with(
            raw,
            teacher={"path": None, "cache": str(out)},
            loss={"name": loss},
            train={"output_dir": str(tmp_path / "cached")},
        )
    )
    monkeypatch.setitem(SCORERS, "live", f"{__name__}:TopKLive")
    loop.train(config_with(raw, loss={"name": loss}, train={"output_dir": str(tmp_path / "live")}))
    live, cached = losses(tmp_path / "live"), losses(tmp_path / "cached")
    assert len(live) == len(cached) == 3 and all(x > 0 for x in live)
    # the same-tokenizer test's tolerances: fp32 is exact up to the rounding of other padding
    # widths, q8 within its quantisation
    assert cached == pytest.approx(live, rel=tol, abs=tol / 10)
    if values == "q8":
        assert cached != live  # the quantisation is visible, and within its tolerance


def test_a_cross_cache_for_another_template_student_or_loss_is_refused(
    tmp_path, raw, char_tokenizer
):
    from distil.models.load import load_tokenizer

    out = tmp_path / "cache"
    cache_teacher(config_with(raw, teacher={"top_k": K}), out, values="q8", shard_rows=32)
    cached = {"cache": str(out)}
    # the teacher tokenizer comes from the cache (teacher.tokenizer is only noted): a saved
    # tokenizer whose template was changed after the cache was written is refused
    with pytest.raises(CacheError, match="teacher_template_sha256"):
        chat = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
        tok_dir = out / fmt.TEACHER_TOKENIZER
        tok = load_tokenizer(str(tok_dir))
        saved = tok.chat_template
        tok.chat_template = chat
        tok.save_pretrained(tok_dir)
        loop.train(config_with(raw, teacher=cached))
    tok.chat_template = saved
    tok.save_pretrained(tok_dir)
    with pytest.raises(CacheError, match="cross_tokenizer"):  # a same-tokenizer loss
        loop.train(config_with(raw, teacher=cached, loss={"name": "forward_kl"}))
    with pytest.raises(CacheError, match="template: cache 'countdown_plain'"):
        chat_data = {"template": "countdown_chat", "overlong": "truncate"}
        loop.train(config_with(raw, teacher=cached, data=chat_data))
    student = build_model_dir(tmp_path / "char_student", tokenizer=char_tokenizer)
    with pytest.raises(CacheError, match="student_tokenizer_sha256"):
        other = {"path": str(student)}
        loop.train(config_with(raw, teacher=cached, student=other, data={"overlong": "truncate"}))


def test_a_row_whose_teacher_tokens_differ_from_the_cache_is_named(tmp_path, raw):
    from distil.data.crosstok import CrossTokenizer
    from distil.models.load import load_tokenizer
    from distil.teacher.cached import CachedTeacher
    from distil.teacher.writer import prepare_rows
    from distil.types import Sample

    out = tmp_path / "cache"
    cfg = config_with(raw, teacher={"top_k": K})
    manifest = cache_teacher(cfg, out, values="fp32", shard_rows=32)
    tok = load_tokenizer(raw["student"]["path"])
    cross = CrossTokenizer(tok, load_tokenizer(raw["teacher"]["path"]))
    examples, prompts, completions = prepare_rows(cfg, tok)
    rows = [0, 33]
    samples = [
        Sample(i, prompts[i], completions[i], "off_policy", examples[i].prompt) for i in rows
    ]
    batch = cross.collate(samples, tok.pad_token_id)
    cached = CachedTeacher(out, manifest)
    targets = cached.score(batch)
    T_t = batch.teacher_input_ids_B_L.shape[1] - 1
    assert targets.logprobs_B_T_V.shape == (2, T_t, manifest["vocab_size"])
    assert torch.allclose(targets.logprobs_B_T_V.logsumexp(-1), torch.zeros(2, T_t), atol=1e-4)
    last = int(batch.teacher_attention_mask_B_L[1].sum()) - 2  # a completion token of row 33
    batch.teacher_input_ids_B_L[1, last] += 1
    with pytest.raises(CacheError, match="data row 33: the teacher's tokens"):
        cached.score(batch)


def test_sampled_chunk_kl_from_a_cross_cache_equals_the_full_live_teacher(tmp_path, raw):
    # this loss reads only the teacher's log-probs of its realised tokens, which the cache
    # stores exactly (fp32 codec): the run equals the live teacher's with its full distribution
    loss = {"name": "sampled_chunk_reverse_kl"}
    out = tmp_path / "cache"
    cache_teacher(config_with(raw, teacher={"top_k": K}, loss=loss), out, values="fp32")
    cached = {"path": None, "cache": str(out)}
    loop.train(
        config_with(raw, teacher=cached, loss=loss, train={"output_dir": str(tmp_path / "c")})
    )
    loop.train(config_with(raw, loss=loss, train={"output_dir": str(tmp_path / "live")}))
    live, from_cache = losses(tmp_path / "live"), losses(tmp_path / "c")
    assert len(live) == 3 and any(x != 0 for x in live)
    assert from_cache == pytest.approx(live, rel=1e-5, abs=1e-6)


class Killed(Exception):
    pass


def test_a_killed_cross_cache_resumes_with_the_same_shards(tmp_path, raw):
    cfg = config_with(raw, teacher={"top_k": K})
    whole = cache_teacher(cfg, tmp_path / "whole", values="q8", shard_rows=24)

    def kill(index):
        if index == 0:
            raise Killed

    with pytest.raises(Killed):
        cache_teacher(cfg, tmp_path / "cut", values="q8", shard_rows=24, after_shard=kill)
    resumed = cache_teacher(cfg, tmp_path / "cut", values="q8", shard_rows=24)
    assert [e["sha256"] for e in resumed["shards"]] == [e["sha256"] for e in whole["shards"]]


class Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    """(device, dtype) of every new tensor of at least `numel` elements an aten op returns."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.seen = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (  # a new storage of that size (views such as expand are not allocations)
            isinstance(out, torch.Tensor)
            and out.untyped_storage().nbytes() >= self.numel * out.element_size()
        ):
            self.seen.append((str(func.overloadpacket.__name__), out.device.type, out.dtype))
        return out


def _reference_dense(ids, vals, rest, V):
    """The former CPU path: an fp32 (B, T, V) expand-clone, then the top-k scattered in."""
    import math

    spread = rest.float() - math.log(V - ids.shape[-1])
    full = spread[..., None].expand(*rest.shape, V).clone()
    return full.scatter_(-1, ids.long(), vals.float())


def test_cross_cache_rows_are_densified_on_the_students_device_in_the_compute_dtype(tmp_path, raw):
    import dataclasses

    from distil.data.crosstok import CrossTokenizer
    from distil.models.load import load_tokenizer
    from distil.teacher.cached import CachedTeacher
    from distil.teacher.writer import prepare_rows
    from distil.types import Sample

    out = tmp_path / "cache"
    cfg = config_with(raw, teacher={"top_k": K})
    manifest = cache_teacher(cfg, out, values="fp32", shard_rows=32)
    tok = load_tokenizer(raw["student"]["path"])
    cross = CrossTokenizer(tok, load_tokenizer(raw["teacher"]["path"]))
    examples, prompts, completions = prepare_rows(cfg, tok)
    samples = [
        Sample(i, prompts[i], completions[i], "off_policy", examples[i].prompt) for i in (0, 5)
    ]
    batch = cross.collate(samples, tok.pad_token_id)
    B, T, V = *batch.teacher_input_ids_B_L.shape, manifest["vocab_size"]
    fp32 = CachedTeacher(out, manifest).score(batch)
    # the old path's values, from the cache's own top-k
    rows = [CachedTeacher(out, manifest).row(i, teacher_ids=True) for i in (0, 5)]
    ids = torch.arange(K).expand(B, T - 1, K).clone()
    vals, rest = torch.full((B, T - 1, K), -30.0), torch.zeros(B, T - 1)
    lengths = batch.teacher_attention_mask_B_L.sum(-1).tolist()
    for b, (r_ids, r_lps, r_rest, _, r_teacher) in enumerate(rows):
        p = int(lengths[b]) - len(r_teacher)
        span = slice(p - 1, p - 1 + len(r_teacher))
        ids[b, span], vals[b, span], rest[b, span] = r_ids, r_lps, r_rest
    assert torch.equal(fp32.logprobs_B_T_V, _reference_dense(ids, vals, rest, V))
    # a student on another device ("meta" stands in for cuda): the full rows are built there, in
    # the compute dtype; nothing of (B, T, V) size is allocated on the host
    on_meta = dataclasses.replace(batch, input_ids_B_L=batch.input_ids_B_L.to("meta"))
    with Allocations(B * (T - 1) * V) as seen:
        bf16 = CachedTeacher(out, manifest, dense_dtype=torch.bfloat16).score(on_meta)
    assert seen.seen and {(dev, dt) for _, dev, dt in seen.seen} == {("meta", torch.bfloat16)}
    assert bf16.logprobs_B_T_V.device.type == "meta"
    assert bf16.logprobs_B_T_V.dtype == torch.bfloat16
    on_cpu = CachedTeacher(out, manifest, dense_dtype=torch.bfloat16).score(batch)
    torch.testing.assert_close(
        on_cpu.logprobs_B_T_V.float(), fp32.logprobs_B_T_V, rtol=1e-2, atol=1e-2
    )
