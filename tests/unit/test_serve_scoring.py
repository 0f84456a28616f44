"""serve-teacher's scoring: the head runs on the scored positions only, in chunks of the loss's
auto rule, and the answers equal one log-softmax over each prompt's full logits."""

from __future__ import annotations

import pytest
import torch
from alloc_probe import Created

from distil.serve import scoring
from distil.serve.scoring import PromptScorer
from distil.testing import tiny_llama

V = 1000  # wider than every hidden width of the tiny model


class Tok:
    pad_token_id = 0

    def decode(self, ids):
        return f"<{ids[0]}>"


PROMPTS = [[5, 17, 230, 4, 99, 7, 8], [3, 9], [11, 12, 13, 14], [42]]


@pytest.mark.parametrize("chunk", [None, 3])
def test_chunked_scores_equal_each_prompts_full_log_softmax(monkeypatch, chunk):
    if chunk is not None:
        monkeypatch.setattr(scoring, "auto_chunk_size", lambda v: chunk)
    model = tiny_llama(V, seed=2)
    scorer = PromptScorer(model, Tok(), max_batch=8)
    with Created() as seen:
        entries = scorer.score(PROMPTS, 3)
    rows = [s[0] for op, _, s in seen.seen if op.lstrip("_") == "log_softmax"]
    assert sum(rows) == sum(len(p) - 1 for p in PROMPTS)  # no padding or last position
    assert max(rows) == (chunk or sum(rows))
    longest = max(len(p) for p in PROMPTS)
    assert seen.allocations(len(PROMPTS) * longest * V * 4) == 0  # no (B, L, V) logits
    check_entries(model, PROMPTS, entries, 3)


def check_entries(model, prompts, entries, k: int) -> None:
    """Each prompt's entries: the top-k and the realised token of one log-softmax over the
    model's own logits of the whole prompt, with their 1-based ranks."""
    for prompt, got in zip(prompts, entries, strict=True):
        assert len(got) == len(prompt) and got[0] is None
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
        for p in range(1, len(prompt)):
            vals, ids = lp[p - 1].topk(k)
            for rank, (v, t) in enumerate(zip(vals.tolist(), ids.tolist(), strict=True), 1):
                assert got[p][str(t)]["rank"] == rank
                assert abs(got[p][str(t)]["logprob"] - v) < 1e-5
            realised = got[p][str(prompt[p])]
            assert abs(realised["logprob"] - float(lp[p - 1, prompt[p]])) < 1e-5
            assert realised["rank"] == int((lp[p - 1] > lp[p - 1, prompt[p]]).sum()) + 1


def test_max_logprobs_minus_one_lifts_the_cap_as_vllms():
    import argparse

    from fastapi.testclient import TestClient

    from distil.serve.app import Limits, build_app
    from distil.serve.cli import _logprobs_cap

    assert _logprobs_cap("-1") == -1 and _logprobs_cap("30") == 30
    with pytest.raises(argparse.ArgumentTypeError, match="-1 for no cap"):
        _logprobs_cap("-2")
    scorer = PromptScorer(tiny_llama(V, seed=2), Tok())
    body = {"prompt": [5, 6, 7], "max_tokens": 1, "prompt_logprobs": 50}
    for cap, status in ((20, 400), (-1, 200)):
        app = build_app(scorer, model_name="m", api_key=None, limits=Limits(max_logprobs=cap))
        r = TestClient(app).post("/v1/completions", json=body)
        assert r.status_code == status, r.text
    assert len(r.json()["choices"][0]["prompt_logprobs"][1]) >= 50  # + the prompt token
    card = TestClient(app).get("/v1/models").json()["data"][0]
    assert "max_model_len" not in card  # no limit, no field (vLLM's card always has one)
