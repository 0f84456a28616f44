"""Offloaded teachers (`teachers.models.NAME.offload`): a routed run trains exactly as without
offload; a teacher is moved to its device only for a micro-batch with rows for it (a mixture:
each in turn), one at a time, and is back on its host tensors after scoring; config validate
refuses offload where nothing can be offloaded."""

from __future__ import annotations

import json
import re

import pytest
import torch

from distil.config import build_config
from distil.errors import ConfigError
from distil.teacher import offload as off
from distil.teacher.several import _rows
from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.train.setup import build


def routed(make_train_config, data, a: dict, b: dict, *, offload: bool, **routing) -> dict:
    raw = make_train_config(train={"max_steps": 3, "lambda": 0.0})
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    models = {"a": {**a, "offload": offload}, "b": {**b, "offload": offload}}
    routing = routing or {"column": "source", "map": {"small": "a", "big": "b"}}
    raw["teachers"] = {"models": models, **routing}
    return raw


@pytest.fixture
def moves(monkeypatch):
    """Every `place` call as (teacher, 'in' | 'out'). Moving in points each tensor at a fresh
    copy (a stand-in for the device copy on this CPU-only machine), so a teacher whose move
    back is skipped keeps tensors that are not its host tensors. Each move in checks that no
    other offloaded teacher is away from home (one teacher at a time)."""
    events: list[tuple[str, str]] = []
    away: dict[str, off.Offload] = {}
    original = off.place

    def spy(offload, device):
        if device is off.HOME:
            events.append((offload.name, "out"))
            away.pop(offload.name, None)
            return original(offload, device)
        assert not away, f"{offload.name} moved in while {sorted(away)} are on the device"
        events.append((offload.name, "in"))
        away[offload.name] = offload
        for t, h in zip(offload.tensors, offload.host, strict=True):
            t.data = h.clone()

    monkeypatch.setattr(off, "place", spy)
    return events


def at_home(offload: off.Offload) -> bool:
    return all(
        t.data_ptr() == h.data_ptr() and t.device == off.HOME
        for t, h in zip(offload.tensors, offload.host, strict=True)
    )


def test_a_routed_run_with_offload_equals_the_run_without(
    tmp_path, make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher), "top_k": 4}
    runs = {}
    for offload in (False, True):
        raw = routed(make_train_config, routed_data, a, b, offload=offload)
        out = tmp_path / f"offload_{offload}"
        loop.train(config_with(raw, train={"output_dir": str(out)}))
        runs[offload] = read_metrics(out)
    assert len(runs[False]) == len(runs[True]) == 3
    for p, q in zip(runs[False], runs[True], strict=True):
        for key in ("loss", "loss/teacher/a", "loss/teacher/b"):
            assert q[key] == pytest.approx(p[key], rel=1e-6, abs=1e-6), key


def test_only_teachers_with_rows_move_one_at_a_time_and_come_back(
    moves, make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher)}
    plain = build(build_config(routed(make_train_config, routed_data, a, b, offload=False)))
    c = build(build_config(routed(make_train_config, routed_data, a, b, offload=True)))
    offloads = {t.offload.name: t.offload for t in c.teacher.teachers}
    assert sorted(offloads) == ["a", "b"] and all(map(at_home, offloads.values()))
    assert not moves  # building moves nothing to the device
    batches = [b for _ in range(4) for b in c.buffer.next_window().micro_batches]
    both = next(
        b for b in batches if len({c.teacher.route_of[s.example_id] for s in b.samples}) == 2
    )
    routes = [c.teacher.route_of[s.example_id] for s in both.samples]
    only_b = [i for i, r in enumerate(routes) if r == 1]
    cases = [(both, ["a", "b"]), (_rows(both, torch.tensor(only_b), only_b), ["b"])]
    for batch, names in cases:
        moves.clear()
        got = c.teacher.score(batch).logprobs_B_T_V
        assert moves == [(n, d) for n in names for d in ("in", "out")]
        assert all(map(at_home, offloads.values()))
        torch.testing.assert_close(got, plain.teacher.score(batch).logprobs_B_T_V, rtol=0, atol=0)


def test_a_mixture_moves_each_teacher_in_turn(
    moves, make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher)}
    raw = routed(make_train_config, routed_data, a, b, offload=True, weights={"a": 1, "b": 2})
    c = build(build_config(raw))
    batch = c.buffer.next_window().micro_batches[0]
    c.teacher.score(batch)
    assert moves == [("a", "in"), ("a", "out"), ("b", "in"), ("b", "out")]
    assert all(at_home(t.offload) for t in c.teacher.teachers)


def test_a_failing_score_still_moves_the_teacher_back(moves, tiny_llama_model):
    class Boom:
        model = tiny_llama_model

        def score(self, batch):
            raise RuntimeError("boom")

    wrapped = off.Offloaded(Boom(), off.Offload(tiny_llama_model, "cpu", "t"))
    with pytest.raises(RuntimeError, match="boom"):
        wrapped.score(None)
    assert moves == [("t", "in"), ("t", "out")] and at_home(wrapped.offload)
    assert wrapped.model is tiny_llama_model  # other attributes are the scorer's


def test_offload_is_refused_where_nothing_can_be_offloaded(
    make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher)}
    raw = routed(make_train_config, routed_data, a, b, offload=True)
    for extra, key, words in [
        ({"path": None, "cache": "DIR", "top_k": 4}, "a", "on a cache (DIR): it holds no weights"),
        ({"url": "http://h:8000/v1"}, "a", "on a server (http://h:8000/v1)"),
        ({"placement": "shard"}, "b", "with teachers.models.b.placement = 'shard': an offloaded"),
    ]:
        models = json.loads(json.dumps(raw["teachers"]["models"]))
        models[key] |= extra
        with pytest.raises(ConfigError, match=re.escape(f"models.{key}.offload = true {words}")):
            config_with(raw, teachers={"models": models})
    with pytest.raises(ConfigError, match=r"offload = true with train\.seq_kd = true.*Fix:"):
        config_with(raw, train={"seq_kd": True})
    one = make_train_config(teacher={"offload": True})
    with pytest.raises(
        ConfigError, match=r"teacher\.offload = true: .*Fix: teacher\.offload=false"
    ):
        build_config(one)


@pytest.mark.parametrize(
    "routing", [{}, {"weights": {"a": 1.0, "b": 2.0}}], ids=["routed", "mixed"]
)
def test_cache_teacher_offloads_each_teacher_and_writes_the_same_cache(
    moves, tmp_path, make_train_config, pair_dirs, second_teacher, routed_data, routing
):
    from distil.teacher import cache as fmt
    from distil.teacher.cached import CachedTeacher
    from distil.teacher.writer import cache_teacher

    k = None if routing else 4  # a mixture's teachers give full distributions, cut to --top-k
    a, b = {"path": str(pair_dirs[0]), "top_k": k}, {"path": str(second_teacher), "top_k": k}
    caches = {}
    for offload in (False, True):
        moves.clear()
        out = tmp_path / f"cache_{offload}"
        cfg = build_config(routed(make_train_config, routed_data, a, b, offload=offload, **routing))
        cache_teacher(cfg, out, values="fp32", shard_rows=24, batch_size=8, top_k=k or 4)
        caches[offload] = CachedTeacher(out, fmt.read_manifest(out))
        if offload:  # in and out in pairs, one teacher at a time (the fixture checks)
            assert {n for n, _ in moves} == {"a", "b"} and len(moves) % 2 == 0
            assert moves[::2] == [(n, "in") for n, _ in moves[::2]]
            assert moves[1::2] == [(n, "out") for n, _ in moves[::2]]
        else:
            assert moves == []
    rows = len(routed_data.read_text().splitlines())
    for i in range(rows):
        for got, want in zip(caches[True].row(i), caches[False].row(i), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        if not routing:
            assert caches[True].route(i) == caches[False].route(i)
