"""The serve-teacher app under fuzzed requests (in process, a tiny model): every body gets a
2xx or a 4xx with a JSON message, never a 5xx, and each answer takes under a second."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distil.serve.app import Limits, build_app
from distil.serve.scoring import PromptScorer
from distil.testing import tiny_llama

CHECKS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=40, deadline=1000, suppress_health_check=CHECKS, database=None)
LONG = settings(
    max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "500")),
    deadline=1000,
    suppress_health_check=CHECKS,
    database=None,
)
NAME = "tiny"


@pytest.fixture(scope="module")
def client(bpe_tokenizer):
    from fastapi.testclient import TestClient

    torch.manual_seed(0)
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer)
    scorer = PromptScorer(model, bpe_tokenizer, max_batch=4)
    limits = Limits(max_logprobs=5, max_tokens_per_request=256, max_body_bytes=1 << 16)
    app = build_app(scorer, model_name=NAME, api_key="k", limits=limits)
    return TestClient(app, headers={"Authorization": "Bearer k"})


IDS = st.integers(min_value=-3, max_value=600)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(IDS, max_size=20),
    st.lists(st.lists(IDS, max_size=12), max_size=5),
)
BODIES = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just(NAME), VALUES),
        "prompt": VALUES,
        "max_tokens": st.one_of(st.sampled_from([0, 1]), VALUES),
        "prompt_logprobs": st.one_of(st.integers(-2, 8), VALUES),
        "stream": VALUES,
        "echo": VALUES,
    },
)


def _check(client, body) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text)
    answer = r.json()
    if r.status_code >= 400:
        assert answer["error"]["message"] and answer["error"]["code"] == r.status_code
        return
    prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
    k = body.get("prompt_logprobs")
    for prompt, choice in zip(prompts, answer["choices"], strict=True):
        entries = choice["prompt_logprobs"]
        if k is None:
            assert entries is None
            continue
        assert len(entries) == len(prompt) and entries[0] is None
        for p, entry in enumerate(entries[1:], start=1):
            assert str(prompt[p]) in entry and len(entry) in (k, k + 1)


@FAST
@given(body=st.one_of(BODIES, st.binary(max_size=64)))
def test_fuzzed_requests_never_get_a_5xx(client, body):
    _check(client, body)


@pytest.mark.slow
@LONG
@given(body=st.one_of(BODIES, st.binary(max_size=64)))
def test_fuzzed_requests_never_get_a_5xx_long(client, body):
    _check(client, body)


def test_scores_equal_a_direct_log_softmax(client, bpe_tokenizer):
    prompt = [5, 17, 230, 4, 99]
    body = {"model": NAME, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 3}
    entries = client.post("/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    torch.manual_seed(0)
    model = tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
    for p in range(1, len(prompt)):
        vals, ids = lp[p - 1].topk(3)
        entry = entries[p]
        for rank, (v, t) in enumerate(zip(vals.tolist(), ids.tolist(), strict=True), start=1):
            assert entry[str(t)]["rank"] == rank
            assert abs(entry[str(t)]["logprob"] - v) < 1e-5
        realised = entry[str(prompt[p])]
        assert abs(realised["logprob"] - float(lp[p - 1, prompt[p]])) < 1e-5
        assert realised["rank"] == int((lp[p - 1] > lp[p - 1, prompt[p]]).sum()) + 1
