"""Training across tokenizers from a teacher cache reads the teacher's tokenizer from the cache:
a preset's hub id in teacher.path is never contacted (the network is blocked here), only noted."""

from __future__ import annotations

import socket

import pytest

from distil.teacher.writer import cache_teacher
from distil.testing import build_peaked_teacher, config_with, read_metrics
from distil.train import loop


@pytest.fixture(scope="module")
def xtok_teacher(tmp_path_factory, unigram_tokenizer):
    return build_peaked_teacher(
        tmp_path_factory.mktemp("xteacher"), unigram_tokenizer, hidden_size=64
    )


def cross_config(make_train_config, teacher) -> dict:
    """One aligned_kl step, off-policy, from `teacher`'s top-8 (a cache needs top-k)."""
    return make_train_config(
        teacher={"path": str(teacher), "top_k": 8},
        loss={"name": "aligned_kl", "beta": 0.5},
        train={"lambda": 0.0, "max_steps": 1, "per_device_batch_size": 4, "grad_accum_steps": 1},
        generation={"num_generations": 1},
    )


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection is recorded and refused."""
    tried = []

    def refuse(self, address, *args, **kwargs):
        tried.append(address)
        raise OSError(f"network blocked in this test: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return tried


def test_a_cross_cache_with_a_hub_teacher_path_never_contacts_the_hub(
    tmp_path, make_train_config, xtok_teacher, no_network, capsys
):
    raw = cross_config(make_train_config, xtok_teacher)
    out = tmp_path / "cache"
    cache_teacher(config_with(raw, train={"max_steps": 1}), out, shard_rows=64)
    run = tmp_path / "run"
    loop.train(
        config_with(
            raw,
            teacher={"path": "Qwen/Qwen3-0.6B", "cache": str(out), "top_k": None},
            train={"output_dir": str(run)},
        )
    )
    assert no_network == []
    assert len(read_metrics(run)) == 1
    err = capsys.readouterr().err
    assert "teacher.path = 'Qwen/Qwen3-0.6B' is not read" in err
    assert "uses the teacher tokenizer saved in the cache" in err


def test_a_local_teacher_tokenizer_that_differs_from_the_cache_is_noted(
    tmp_path, make_train_config, xtok_teacher, pair_dirs, capsys
):
    raw = cross_config(make_train_config, xtok_teacher)
    out = tmp_path / "cache"
    cache_teacher(config_with(raw), out, shard_rows=64)
    other = pair_dirs[0]  # the bpe teacher: another vocabulary than the cache's
    loop.train(
        config_with(
            raw,
            teacher={"path": str(other), "cache": str(out), "top_k": None},
            train={"output_dir": str(tmp_path / "run")},
        )
    )
    err = capsys.readouterr().err
    assert "is not the tokenizer the cache was written with" in err
