"""cache-teacher with several teachers: one routed cache whose rows hold their own teacher's
targets (and name), the cache of one named teacher (`--teacher`), the top-k of a mixture, and
training from a routed cache against the live routed teachers."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from distil.config import build_config
from distil.data.collate import collate
from distil.errors import ConfigError
from distil.models.load import load_model, load_tokenizer
from distil.teacher import cache as fmt
from distil.teacher.base import sparse_topk
from distil.teacher.cached import CachedTeacher
from distil.teacher.live import LiveTeacher
from distil.teacher.writer import cache_teacher, prepare_rows
from distil.testing import read_metrics
from distil.train import loop
from distil.types import Sample

K = 8


@pytest.fixture
def routed(tmp_path, countdown_dir, make_train_config, pair_dirs, second_teacher):
    """(config dict, each row's teacher): rows alternate between teacher a ('small') and b."""
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r["source"] = "small" if i % 3 else "big"
    data = tmp_path / "routed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = make_train_config(train={"max_steps": 3, "lambda": 0.0}, loss={"name": "forward_kl"})
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    raw["teachers"] = {
        "models": {
            "a": {"path": str(pair_dirs[0]), "top_k": K},
            "b": {"path": str(second_teacher), "top_k": K},
        },
        "column": "source",
        "map": {"small": "a", "big": "b"},
    }
    return raw, ["a" if r["source"] == "small" else "b" for r in rows]


def write(raw, out, **kw):
    cache_teacher(build_config(raw), out, values="fp32", shard_rows=24, batch_size=8, **kw)
    return CachedTeacher(out, fmt.read_manifest(out))


def same_targets(got, want):
    """Two rows' cached targets: the same top-k ids, values/rest/token to fp32 rounding (other
    batch compositions pad the forwards differently)."""
    for g_ids, g_lps, w_ids, w_lps in zip(got[0], got[1], want[0], want[1], strict=True):
        g = dict(zip(g_ids.tolist(), g_lps.tolist(), strict=True))
        w = dict(zip(w_ids.tolist(), w_lps.tolist(), strict=True))
        assert set(g) == set(w)
        assert [g[i] for i in w] == pytest.approx(list(w.values()), abs=1e-5)
    for g, w in zip(got[2:4], want[2:4], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


def test_a_routed_cache_holds_each_rows_own_teachers_targets(tmp_path, routed):
    raw, names = routed
    cache = write(raw, tmp_path / "routed")
    alone = {n: write(raw, tmp_path / n, teacher=n) for n in "ab"}
    m = cache.manifest
    assert m["routes"]["names"] == ["a", "b"] and m["routes"]["column"] == "source"
    assert m["routes"]["rows"] == {"a": names.count("a"), "b": names.count("b")}
    assert alone["a"].manifest["teacher_name"] == "a" and "routes" not in alone["a"].manifest
    differs = 0
    for i, name in enumerate(names):
        assert cache.route(i) == name
        same_targets(cache.row(i), alone[name].row(i))
        other = alone["b" if name == "a" else "a"].row(i)
        differs += not torch.allclose(cache.row(i)[3], other[3], atol=1e-3)
    assert differs == len(names)  # the other teacher's targets are not what the row holds
    # rows 0-3 with placeholder tokens of their lengths: routes do not depend on the tokens
    batch = collate([Sample(i, [1], [0] * len(cache.row(i)[0]), "off_policy") for i in range(4)], 0)
    cache.score(batch)
    assert cache.last_routes == names[:4]  # RoutedTeacher's contract, per row of the batch
    assert cache.names == ["a", "b"]
    alone["b"].score(batch)
    assert alone["b"].route(0) == "b" and alone["b"].last_routes == alone["b"].names == []


def test_training_from_routed_or_per_teacher_caches_logs_the_live_routed_losses(tmp_path, routed):
    raw, _ = routed
    write(raw, tmp_path / "routed")
    live = copy.deepcopy(raw)
    live["train"]["output_dir"] = str(tmp_path / "live")
    loop.train(build_config(live))
    cached = copy.deepcopy(raw)
    cached["teachers"] = {}
    cached["teacher"] = {"cache": str(tmp_path / "routed")}
    cached["train"]["output_dir"] = str(tmp_path / "cached")
    loop.train(build_config(cached))
    per = copy.deepcopy(raw)  # one cache per teacher (--teacher NAME), routed by the config
    for n in "ab":
        write(raw, tmp_path / n, teacher=n)
        per["teachers"]["models"][n] = {"cache": str(tmp_path / n)}
    per["train"]["output_dir"] = str(tmp_path / "per")
    loop.train(build_config(per))
    keys = ["loss", "loss/teacher/a", "loss/teacher/b", "tokens/teacher/a", "tokens/teacher/b"]
    want = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "live")]
    got = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "cached")]
    per_teacher = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "per")]
    assert len(want) == len(got) == len(per_teacher) == 3
    assert all(None not in w for w in want)  # both teachers in every step's window
    for g, p, w in zip(got, per_teacher, want, strict=True):  # per-teacher losses too
        assert g == pytest.approx(w, rel=1e-5, abs=1e-6)
        assert p == pytest.approx(w, rel=1e-5, abs=1e-6)


def test_a_mixture_cache_holds_the_top_k_of_the_mixture(
    tmp_path, routed, pair_dirs, second_teacher
):
    raw, _ = routed
    raw["teachers"] = {
        "models": {"a": {"path": str(pair_dirs[0])}, "b": {"path": str(second_teacher)}},
        "weights": {"a": 3.0, "b": 1.0},
    }
    with pytest.raises(ConfigError, match=r"teachers\.models\.NAME\.top_k is not set.*--top-k"):
        write(raw, tmp_path / "no_k")
    cache = write(raw, tmp_path / "mixed", top_k=K)
    assert cache.manifest["mixture"] == {"weights": {"a": 3.0, "b": 1.0}} and cache.top_k == K
    cfg = build_config(raw)
    tok = load_tokenizer(str(pair_dirs[1]))
    _, prompts, completions = prepare_rows(cfg, tok)
    rows = [0, 5, 30, 63]
    batch = collate([Sample(i, prompts[i], completions[i], "off_policy") for i in rows], 0)
    full = [
        LiveTeacher(load_model(str(p))).score(batch).logprobs_B_T_V
        for p in (pair_dirs[0], second_teacher)
    ]
    m = batch.mask_B_T
    mix = torch.logaddexp(full[0][m] + math.log(0.75), full[1][m] + math.log(0.25))  # by hand
    ids, lps, rest = sparse_topk(mix, K)
    token = mix.gather(-1, batch.labels_B_T[m][:, None])[:, 0]
    got = [torch.cat(x) for x in zip(*(cache.row(i) for i in rows), strict=True)]
    same_targets(got, (ids, lps, rest, token))
    assert cache.last_routes == []  # a mixture has no per-row teacher


def test_cache_teacher_names_a_wrong_teacher_or_mixed_top_k(tmp_path, routed):
    raw, _ = routed
    with pytest.raises(ConfigError, match=r"--teacher 'c': no such teacher .*\(a, b\)"):
        write(raw, tmp_path / "c", teacher="c")
    raw["teachers"]["models"]["b"]["top_k"] = 4
    with pytest.raises(ConfigError, match=r"different top_k \(a: 8, b: 4\)"):
        write(raw, tmp_path / "k")
    with pytest.raises(ConfigError, match=r"--top-k 5 but the config's top_k is 8"):
        write(raw, tmp_path / "k5", teacher="a", top_k=5)


def test_one_named_teacher_keeps_the_shared_privileged_context(routed):
    from distil.teacher.cache_sources import one_teacher_config

    raw, _ = routed
    raw["teacher"] = {"context": "{prompt} (a solution: {solution})", "system": "Think."}
    one = one_teacher_config(build_config(raw), "b")
    assert one.teacher.path == raw["teachers"]["models"]["b"]["path"] and not one.teachers.models
    assert (one.teacher.context, one.teacher.system) == (
        "{prompt} (a solution: {solution})",
        "Think.",
    )


def test_per_teacher_caches_with_the_shared_context_train_as_the_live_teachers_with_it(
    tmp_path, routed
):
    """teachers.models.NAME.cache with teacher.context/system: each cache was written after the
    context prompt (`--teacher NAME`), its per-row prompt hashes match the run's, and training
    logs the live routed teachers-with-context losses; a cache written without the context is
    refused, by config validate and by train."""
    from distil.preflight import preflight
    from distil.teacher.cache import CacheError

    raw, _ = routed
    raw["teacher"] = {"context": "{prompt} (a solution: {solution})", "system": "Think."}
    live = copy.deepcopy(raw)
    live["train"]["output_dir"] = str(tmp_path / "live")
    loop.train(build_config(live))
    per = copy.deepcopy(raw)
    for n in "ab":
        assert write(raw, tmp_path / n, teacher=n).manifest["system"] == "Think."
        per["teachers"]["models"][n] = {"cache": str(tmp_path / n)}
    per["train"]["output_dir"] = str(tmp_path / "per")
    assert preflight(build_config(per))[0] == []
    loop.train(build_config(per))
    keys = ["loss", "loss/teacher/a", "loss/teacher/b", "tokens/teacher/a", "tokens/teacher/b"]
    want = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "live")]
    got = [[m.get(k) for k in keys] for m in read_metrics(tmp_path / "per")]
    assert len(want) == len(got) == 3 and all(None not in w for w in want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-6)
    plain = copy.deepcopy(raw)  # b's cache written without the context
    plain["teacher"] = {}
    write(plain, tmp_path / "b_plain", teacher="b")
    per["teachers"]["models"]["b"] = {"cache": str(tmp_path / "b_plain")}
    per["train"]["output_dir"] = str(tmp_path / "per_plain")
    problems, _ = preflight(build_config(per))
    assert any("context: cache None, this config '{prompt}" in p for p in problems), problems
    with pytest.raises(
        CacheError, match=r"teacher\.context = None.*gives the teacher a privileged"
    ):
        loop.train(build_config(per))
