"""The teacher cache: codec round trip, cache-teacher against the live teacher, resume after a
kill, every corruption/mismatch named before training, and cache == live training losses."""

from __future__ import annotations

import contextlib
import json
import math
import os

import pytest
import torch

from distil.data.collate import collate
from distil.models.load import load_model, load_tokenizer
from distil.teacher import cache as fmt
from distil.teacher.base import sparse_topk
from distil.teacher.cache import CacheError
from distil.teacher.live import LiveTeacher
from distil.teacher.writer import cache_teacher, prepare_rows
from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.types import Sample

K = 8


def synthetic(n=50, v=5000, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log_softmax(torch.randn(n, v, generator=g) * 3, dim=-1)
    ids, vals, rest = sparse_topk(logprobs, k)
    token = logprobs[torch.arange(n), torch.randint(0, v, (n,), generator=g)]
    return ids, vals, rest, token


def as_sets(ids, vals):
    """Per row: {id: value}, so stored (id-sorted) and scored (value-sorted) orders compare."""
    return [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ids, vals, strict=True)]


def test_fp32_codec_is_lossless():
    ids, vals, rest, token = synthetic()
    exact = fmt.decode_tokens(fmt.encode_tokens(ids, vals, rest, token, "fp32"), K, "fp32")
    assert as_sets(exact[0], exact[1]) == as_sets(ids, vals)
    assert torch.equal(exact[2], rest) and torch.equal(exact[3], token)


@pytest.mark.parametrize("values", ["q8", "sqrt"])
def test_lossy_codecs_are_within_half_a_step_and_kl_below_1e_3(values):
    ids, vals, rest, token = synthetic()
    arrays = fmt.encode_tokens(ids, vals, rest, token, values)
    d_ids, d_vals, d_rest, _ = fmt.decode_tokens(arrays, K, values)
    got, want = as_sets(d_ids, d_vals), as_sets(ids, vals)
    assert [set(g) for g in got] == [set(w) for w in want]  # ids are lossless
    # half a step (q8: on log p, sqrt: on sqrt p), plus the fp16 top-1 q8 counts down from and
    # the renormalisation
    if values == "q8":
        err = max(abs(g[i] - w[i]) for g, w in zip(got, want, strict=True) for i in w)
        assert 0 < err <= fmt.LOGPROB_STEP / 2 + 0.05
    else:
        half = fmt.sqrt_step(K) / 2
        err = max(
            abs(math.exp(g[i] / 2) - math.exp(w[i] / 2))
            for g, w in zip(got, want, strict=True)
            for i in w
        )
        assert 0.5 * half < err <= half * 1.25  # renormalising moves sqrt p by ~1% of it
    buckets = torch.cat([d_vals, d_rest[:, None]], -1)
    assert torch.allclose(buckets.logsumexp(-1), torch.zeros(len(ids)), atol=1e-5)  # sums to 1
    exact = torch.cat([vals.gather(-1, ids.argsort(-1)), rest[:, None]], -1)
    kl = (exact.exp() * (exact - buckets)).sum(-1).mean()
    assert 0 < kl < 1e-3


def test_ids_past_16_bits_round_trip():
    ids = torch.tensor([[0, 70000, 131071, 5]])
    vals = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    out = fmt.decode_tokens(fmt.encode_tokens(ids, vals, vals[:, 0], vals[:, 0], "fp32"), 4, "fp32")
    assert out[0].tolist() == [[0, 5, 70000, 131071]] and out[1].tolist() == [[-1, -4, -2, -3]]


@pytest.fixture
def raw(make_train_config):
    return make_train_config(
        teacher={"top_k": K},
        loss={"name": "forward_kl"},
        train={"lambda": 0.0, "max_steps": 3, "per_device_batch_size": 4, "grad_accum_steps": 2},
    )


@pytest.fixture
def cache_dir(tmp_path, raw):
    out = tmp_path / "cache"
    cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)
    return out


def test_cached_rows_equal_the_live_teachers_top_k(raw, cache_dir, pair_dirs):
    from distil.teacher.cached import CachedTeacher

    cfg = config_with(raw)
    manifest = fmt.read_manifest(cache_dir)
    assert manifest["complete"] and len(manifest["shards"]) == 3  # 64 rows, 24 per shard
    assert cfg.teacher.dtype == "auto" and manifest["dtype"] == "float32"  # as loaded (CPU)
    tok = load_tokenizer(str(pair_dirs[1]))
    _, prompts, completions = prepare_rows(cfg, tok)
    cached = CachedTeacher(cache_dir, manifest)
    live = LiveTeacher(load_model(str(pair_dirs[0])), top_k=K)
    rows = [0, 23, 24, 63, 40]  # shard edges and a middle row
    batch = collate([Sample(i, prompts[i], completions[i], "off_policy") for i in rows], 0)
    want, got = live.score(batch), cached.score(batch)
    m = batch.mask_B_T
    # fp32 storage is lossless; other padding widths change the forward only by fp32 rounding
    got_sets = as_sets(got.topk_ids_B_T_K[m], got.topk_logprobs_B_T_K[m])
    want_sets = as_sets(want.topk_ids_B_T_K[m], want.topk_logprobs_B_T_K[m])
    assert [set(g) for g in got_sets] == [set(w) for w in want_sets]
    for g, w in zip(got_sets, want_sets, strict=True):
        assert [g[i] for i in w] == pytest.approx(list(w.values()), abs=1e-5)
    assert torch.allclose(got.rest_logprob_B_T[m], want.rest_logprob_B_T[m], atol=1e-5)
    assert torch.allclose(got.token_logprobs_B_T[m], want.token_logprobs_B_T[m], atol=1e-5)
    assert manifest["tokens"] == sum(len(c) for c in completions)


def read_losses(run_dir):
    return [m["loss"] for m in read_metrics(run_dir)]


@pytest.mark.parametrize("values, tol", [("fp32", 1e-6), ("q8", 2e-3), ("sqrt", 2e-3)])
def test_training_from_the_cache_logs_the_live_teachers_losses(tmp_path, raw, values, tol):
    out = tmp_path / f"cache_{values}"
    cache_teacher(config_with(raw), out, values=values, shard_rows=24)
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "live")}))
    loop.train(
        config_with(
            raw, teacher={"cache": str(out)}, train={"output_dir": str(tmp_path / "cached")}
        )
    )
    live, cached = read_losses(tmp_path / "live"), read_losses(tmp_path / "cached")
    assert len(live) == len(cached) == 3
    assert cached == pytest.approx(live, rel=tol, abs=tol)
    if values != "fp32":
        assert cached != live  # the quantisation is visible, and within its tolerance


class Killed(Exception):
    pass


def killed_after_shard(raw, out, shard: int) -> None:
    """cache-teacher into `out`, killed once shard `shard` is written (24 rows a shard)."""

    def die(index):
        if index == shard:
            raise Killed

    with pytest.raises(Killed):
        cache_teacher(
            config_with(raw), out, values="fp32", shard_rows=24, batch_size=8, after_shard=die
        )


def test_a_killed_cache_teacher_resumes_after_the_last_complete_shard(tmp_path, raw, cache_dir):
    out = tmp_path / "killed"
    killed_after_shard(raw, out, 1)
    manifest = fmt.read_manifest(out)
    assert not manifest["complete"] and [e["rows"] for e in manifest["shards"]] == [
        [0, 24],
        [24, 48],
    ]
    with pytest.raises(CacheError, match=r"incomplete .48 of 64 rows.*continues after the last"):
        loop.train(config_with(raw, teacher={"cache": str(out)}))
    scored = []
    monkey = LiveTeacher.score

    def counting(self, batch):
        scored.append(len(batch.samples))
        return monkey(self, batch)

    LiveTeacher.score = counting
    try:
        cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)
    finally:
        LiveTeacher.score = monkey
    assert sum(scored) == 16  # only the last shard's rows were scored again
    full, resumed = fmt.read_manifest(cache_dir), fmt.read_manifest(out)
    assert [e["sha256"] for e in resumed["shards"]] == [e["sha256"] for e in full["shards"]]


def test_a_cache_started_before_the_dtype_was_resolved_resumes(tmp_path, raw, cache_dir):
    """Manifests once recorded the config's `dtype: auto`; resuming such a cache, cut short,
    matches `auto` with the dtype it resolves to now and finishes the same shards."""
    out = tmp_path / "old"
    killed_after_shard(raw, out, 0)
    manifest = fmt.read_manifest(out)
    assert manifest["dtype"] == "float32"  # resolved (a CPU)
    fmt.write_manifest(out, {**manifest, "dtype": "auto"})  # as the old writer left it
    cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)
    full, resumed = fmt.read_manifest(cache_dir), fmt.read_manifest(out)
    assert resumed["complete"]
    assert [e["sha256"] for e in resumed["shards"]] == [e["sha256"] for e in full["shards"]]
    fmt.write_manifest(out, {**resumed, "dtype": "bfloat16"})  # a real change still refused
    with pytest.raises(CacheError, match="dtype: 'bfloat16' vs 'float32'"):
        cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)


def test_an_old_auto_dtype_matches_per_teacher_too():
    from distil.teacher.writer import _differs

    def teachers(a, b="float32"):
        return {"a": {"dtype": a, "top_k": 4}, "b": {"dtype": b, "top_k": 4}}

    assert not _differs("dtype", "auto", "bfloat16")
    assert _differs("dtype", "float16", "bfloat16")
    assert not _differs("teachers", teachers("auto", "auto"), teachers("bfloat16"))
    assert _differs("teachers", teachers("float16"), teachers("bfloat16"))
    assert _differs("teachers", {"a": teachers("auto")["a"]}, teachers("bfloat16"))
    assert _differs("top_k", "auto", 4)  # only a dtype's `auto` is read as resolved


def damage(kind, cache_dir):
    shard = cache_dir / fmt.shard_name(1)
    manifest = json.loads((cache_dir / fmt.MANIFEST).read_text())
    if kind == "truncated":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif kind == "altered":
        data = bytearray(shard.read_bytes())
        data[-3] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif kind == "missing":
        shard.unlink()
    elif kind == "manifest":
        (cache_dir / fmt.MANIFEST).write_text('{"format": "distil-teacher-cache-1", "sha')
    elif kind == "tokenizer":
        manifest["student_tokenizer_sha256"] = "0" * 64
        (cache_dir / fmt.MANIFEST).write_text(json.dumps(manifest))


CASES = {
    "truncated": (r"shard-00001.safetensors has \d+ bytes, the manifest says \d+", {}),
    "altered": (r"shard-00001.safetensors does not match its sha256", {}),
    "missing": (r"shard-00001.safetensors is missing", {}),
    "manifest": (r"manifest.json is not readable JSON", {}),
    "tokenizer": (r"student_tokenizer_sha256: cache 000000000000\.\.\., this config", {}),
    "k": (r"k: cache 8, this config 4", {"teacher": {"top_k": 4}}),
    "temperature": (r"temperature: cache 1.0, this config 2.0", {"loss": {"temperature": 2.0}}),
    "data": (
        r"data has 64 rows, the cache 64|shard-00000.safetensors \(rows 0-23\) was made from other rows",
        {"data": {"max_prompt_tokens": 20, "overlong": "truncate"}},
    ),
    "template": (
        r"template: cache 'countdown_plain', this config 'countdown_chat'",
        {"data": {"template": "countdown_chat", "overlong": "truncate"}},
    ),
    "not a cache": (r"has no manifest.json: it is not a teacher cache", {}),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_damaged_or_mismatched_cache_stops_before_training(tmp_path, raw, cache_dir, kind):
    pattern, sections = CASES[kind]
    target = cache_dir
    if kind == "not a cache":
        target = tmp_path / "empty"
        target.mkdir()
    else:
        damage(kind, cache_dir)
    teacher = {"cache": str(target), **sections.pop("teacher", {})}
    cfg = config_with(raw, teacher=teacher, **sections)
    with pytest.raises(CacheError, match=pattern):
        loop.train(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_cache_with_on_policy_slices_is_a_config_error(raw, cache_dir):
    from distil.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dataset.s completions only.*train.lambda=0"):
        config_with(raw, teacher={"cache": str(cache_dir)}, train={"lambda": 0.5})


def test_cli_prints_the_token_count_and_bytes_per_token(tmp_path, raw, capsys):
    import yaml

    from distil.cli import main

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "cli_cache"
    assert main(["cache-teacher", str(cfg_file), "--out", str(out), "--shard-rows", "32"]) == 0
    manifest = fmt.read_manifest(out)
    printed = capsys.readouterr().out
    assert f"{manifest['tokens']} tokens in 2 shards" in printed and "bytes per token" in printed
    assert manifest["values"] == "sqrt" and manifest["k"] == K and manifest["complete"]
    # another k into the same directory: refused, naming what differs, nothing rewritten
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    assert main(["cache-teacher", str(cfg_file), "teacher.top_k=4", "--out", str(out)]) == 2
    assert "holds a teacher cache made with other settings (k: 8 vs 4" in capsys.readouterr().err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def test_cache_teacher_needs_top_k(tmp_path, raw):
    from distil.errors import ConfigError

    with pytest.raises(ConfigError, match=r"teacher\.top_k is not set"):
        cache_teacher(config_with(raw, teacher={"top_k": None}), tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_config_validate_reads_the_cache_manifest(tmp_path, raw, cache_dir, capsys):
    import yaml

    from distil.cli import main

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            config_with(raw, teacher={"cache": str(cache_dir)}).model_dump(by_alias=True)
        )
    )
    assert main(["config", "validate", str(cfg_file)]) == 0
    assert main(["config", "validate", str(cfg_file), "teacher.top_k=4"]) == 2
    assert "k: cache 8, this config 4" in capsys.readouterr().err


def _any_json():
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-5, 200) | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
        max_leaves=12,
    )


def _manifest_strategy():
    from hypothesis import strategies as st

    good = {
        "format": fmt.FORMAT,
        "k": 8,
        "rows": 64,
        "data_fingerprint": "x" * 64,
        "values": "sqrt",
        "sqrt_step": 0.05,
        "logprob_step": None,
        "temperature": 1.0,
        "complete": True,
        "shards": [
            {"file": fmt.shard_name(0), "rows": [0, 64], "bytes": 1, "tokens": 1, "sha256": "y"}
        ],
    }
    keys = st.sampled_from([*good, "shards.0.file", "shards.0.rows", "shards.0.bytes"])
    return st.fixed_dictionaries({"key": keys, "value": _any_json()}), good


def _check_any_manifest(tmp_path_factory, edits):
    import copy

    from distil.teacher.cached import CachedTeacher

    _, good = _manifest_strategy()
    m = copy.deepcopy(good)
    for edit in edits:
        where, _, sub = edit["key"].partition(".")
        if sub:  # an edit inside the first shard entry, while there is one
            shards = m.get("shards")
            if isinstance(shards, list) and shards and isinstance(shards[0], dict):
                shards[0][sub.partition(".")[2]] = edit["value"]
        else:
            m[where] = edit["value"]
    d = tmp_path_factory.mktemp("m")
    (d / fmt.MANIFEST).write_text(json.dumps(m))
    # every problem is a CacheError, never a KeyError/TypeError/IndexError
    with contextlib.suppress(CacheError):
        CachedTeacher.open(d, expect={"k": 8}, row_fingerprints=["r"] * 64)


def test_any_manifest_gives_a_cache_error_never_an_exception(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    edit, _ = _manifest_strategy()

    @settings(max_examples=60, deadline=1000, suppress_health_check=list(HealthCheck))
    @given(st.lists(edit, min_size=1, max_size=3))
    def run(edits):
        _check_any_manifest(tmp_path_factory, edits)

    run()


@pytest.mark.budget(100, "hundreds of fuzzed cache manifests")
@pytest.mark.slow
def test_any_manifest_long_run(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    edit, _ = _manifest_strategy()

    @settings(
        max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "800")),
        deadline=1000,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(edit, min_size=1, max_size=3))
    def run(edits):
        _check_any_manifest(tmp_path_factory, edits)

    run()


def test_cached_targets_give_the_live_teachers_gradients(raw, cache_dir, pair_dirs):
    """The same micro-batch the cache was written from (rows 0-7, one batch of 8): the fp32
    cache's targets give the student the live teacher's loss and gradients to fp32 rounding."""
    from distil.losses import get_loss
    from distil.teacher.cached import CachedTeacher
    from distil.train.step import micro_step

    cfg = config_with(raw)
    tok = load_tokenizer(str(pair_dirs[1]))
    _, prompts, completions = prepare_rows(cfg, tok)
    batch = collate([Sample(i, prompts[i], completions[i], "off_policy") for i in range(8)], 0)
    student = load_model(str(pair_dirs[1])).train()
    scorers = {
        "live": LiveTeacher(load_model(str(pair_dirs[0])), top_k=K),
        "cached": CachedTeacher(cache_dir, fmt.read_manifest(cache_dir)),
    }
    grads, losses = {}, {}
    for name, scorer in scorers.items():
        student.zero_grad(set_to_none=True)
        out = micro_step(
            student,
            student,
            batch,
            scorer.score(batch),
            get_loss("forward_kl"),
            num_tokens=batch.num_loss_tokens,
            loss_opts={"temperature": 1.0, "targets_temperature": 1.0},
        )
        out.loss.backward()
        losses[name] = out.loss.item()
        grads[name] = torch.cat([p.grad.flatten() for p in student.parameters()])
    assert losses["cached"] == pytest.approx(losses["live"], rel=1e-6)
    assert torch.allclose(grads["cached"], grads["live"], rtol=1e-5, atol=1e-8)
    assert grads["live"].abs().sum() > 0


def test_a_packed_cache_stores_the_padded_caches_values(tmp_path, raw, cache_dir, monkeypatch):
    from distil.data import packing

    plans = []
    real = packing.plan_packing
    monkeypatch.setattr(packing, "plan_packing", lambda *a: plans.append(a) or real(*a))
    packed = tmp_path / "packed"
    cfg = config_with(raw, train={"packing": True})
    cache_teacher(cfg, packed, values="fp32", shard_rows=24, batch_size=8)
    assert len(plans) == 8  # 64 rows, 8 per batch: every teacher forward ran packed
    want, got = fmt.read_manifest(cache_dir), fmt.read_manifest(packed)
    assert got["tokens"] == want["tokens"]
    for a, b in zip(want["shards"], got["shards"], strict=True):
        x = fmt.read_shard(cache_dir, a, K, "fp32", None)
        y = fmt.read_shard(packed, b, K, "fp32", None)
        assert (x.rows == y.rows).all() and (x.offsets == y.offsets).all()
        assert torch.equal(x.ids_N_K, y.ids_N_K)  # both sorted by id
        for u, v in (
            (x.logprobs_N_K, y.logprobs_N_K),
            (x.rest_N, y.rest_N),
            (x.token_N, y.token_N),
        ):
            assert torch.allclose(u, v, atol=1e-5)


def test_shuffled_rows_decode_each_shard_once(tmp_path, raw, pair_dirs, monkeypatch):
    """64 rows in 32 shards, 3 epochs of shuffled batches of 8: every shard is decoded once
    (a cache of 16 decoded shards decoded them again as rows came back to them)."""
    import random

    from distil.teacher.cached import CachedTeacher

    cfg = config_with(raw)
    out = tmp_path / "small_shards"
    cache_teacher(cfg, out, shard_rows=2, batch_size=8)
    teacher = CachedTeacher(out, fmt.read_manifest(out))
    decoded, read_shard = [], fmt.read_shard
    monkeypatch.setattr(
        fmt, "read_shard", lambda *a: decoded.append(a[1]["file"]) or read_shard(*a)
    )
    _, prompts, completions = prepare_rows(cfg, load_tokenizer(str(pair_dirs[1])))
    order = list(range(64))
    for epoch in range(3):
        random.Random(epoch).shuffle(order)
        for b in range(0, 64, 8):
            rows = order[b : b + 8]
            teacher.score(
                collate([Sample(i, prompts[i], completions[i], "off_policy") for i in rows], 0)
            )
    assert sorted(decoded) == [fmt.shard_name(i) for i in range(32)]


def test_a_shard_cache_over_its_budget_evicts_and_warns_once(capsys):
    from distil.teacher.cached import ShardCache

    ids, vals, rest, token = synthetic(n=10)
    shard = fmt.Shard(None, None, ids.int(), vals, rest, token)  # 10 * (8 * 8 + 8) = 720 bytes
    loads = []
    cache = ShardCache(lambda i: loads.append(i) or shard, budget=1500)  # two shards fit
    for i in (0, 1, 0, 2, 0, 1, 1):
        assert cache(i) is shard
    assert loads == [0, 1, 2, 1]  # 0 stays (used last before 2 came), 1 is evicted by 2
    err = capsys.readouterr().err
    assert err.count("warning: teacher cache shard 1 decoded again") == 1
    assert "do not all fit the 0.0 GiB kept in memory" in err
