"""Privileged context with a remote teacher (teacher.url): the server scores the teacher's prompt
(with context) + the student's completion, and its targets land on the student's positions
exactly as the live teacher's shift puts them (`distil serve-teacher` on 127.0.0.1 stands in)."""

from __future__ import annotations

import pytest
import torch

from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.train.setup import build

HINT = "{prompt} (a solution: {solution})"
FITS = {"max_prompt_tokens": 192}  # within the tiny teacher's served max_model_len (512)


# the session's served teacher (tests/conftest.py), started once for the modules that use it
pytestmark = pytest.mark.xdist_group("served_teacher")


@pytest.fixture
def server(served_teacher):
    return served_teacher[0]


@pytest.fixture
def raw(make_train_config):
    return make_train_config(train={"max_steps": 2, "lambda": 0.5}, data=FITS)


def _first(cfg):
    c = build(cfg)
    torch.manual_seed(0)
    return c, c.buffer.next_window().micro_batches[0]


def test_remote_targets_with_context_equal_the_live_teachers(raw, server):
    live, batch = _first(config_with(raw, teacher={"context": HINT, "top_k": 5}))
    remote, same = _first(config_with(raw, teacher={"context": HINT, "top_k": 5, "url": server}))
    assert torch.equal(batch.context_input_ids_B_L, same.context_input_ids_B_L)
    want, got = live.teacher.score(batch), remote.teacher.score(batch)
    m = batch.mask_B_T.bool()
    assert got.topk_ids_B_T_K.shape == want.topk_ids_B_T_K.shape  # student positions
    assert torch.equal(got.topk_ids_B_T_K[m], want.topk_ids_B_T_K[m])
    for key in ("topk_logprobs_B_T_K", "rest_logprob_B_T", "token_logprobs_B_T"):
        torch.testing.assert_close(
            getattr(got, key)[m], getattr(want, key)[m].float(), rtol=1e-4, atol=1e-5
        )
    # control: the server scoring the student's own prompt gives other targets
    plain, _ = _first(config_with(raw, teacher={"top_k": 5, "url": server}))
    bare = plain.teacher.score(
        type(batch)(**{**batch.__dict__, "context_input_ids_B_L": None, "context_shift_B": None})
    )
    assert not torch.allclose(bare.topk_logprobs_B_T_K[m], got.topk_logprobs_B_T_K[m])


@pytest.mark.slow
def test_training_with_context_through_the_server_equals_the_live_run(raw, server, tmp_path):
    runs = {}
    for name, extra in (("live", {}), ("remote", {"url": server})):
        cfg = config_with(
            raw,
            teacher={"context": HINT, "top_k": 5, **extra},
            train={"output_dir": str(tmp_path / name)},
            logging={"print_example": name == "remote"},
        )
        loop.train(cfg)
        runs[name] = [m["loss"] for m in read_metrics(tmp_path / name)]
    assert len(runs["remote"]) == 2
    torch.testing.assert_close(runs["remote"], runs["live"], rtol=1e-4, atol=1e-6)
