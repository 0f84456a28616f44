"""teacher.url against `distil serve-teacher` on 127.0.0.1: a few training steps equal the live
top-k teacher's (same tokenizer and across tokenizers), the key is enforced, malformed requests
get a 4xx while the server stays up, and a wrong model or vocabulary stops before training."""

import json
from pathlib import Path

import httpx
import pytest
import torch

from distil.config import build_config
from distil.serve.process import teacher_server
from distil.teacher.remote import connect, probe
from distil.teacher.remote_client import RemoteTeacherError, RetryPolicy
from distil.testing import build_peaked_teacher
from distil.train import loop

KEY_ENV, KEY = "DISTIL_TEST_TEACHER_KEY", "s3cret-key"
FAST = RetryPolicy(tries=2, first_wait_s=0.05, total_s=5.0, timeout_s=60.0)
# the longest sequence (prompt + completion + 1) within the tiny teacher's 512 positions, which
# serve-teacher sends as max_model_len and connect() checks
FITS = {"max_prompt_tokens": 192}


@pytest.fixture(scope="module")
def server(pair_dirs, tmp_path_factory):
    """(url, teacher dir): the pair's teacher served with a key, for the whole module."""
    teacher = pair_dirs[0]
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {KEY_ENV: KEY, "OMP_NUM_THREADS": "1"}
    with teacher_server(teacher, "--api-key-env", KEY_ENV, env=env, log_path=log) as (url, _):
        yield url, teacher


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def _losses(run: Path, key: str = "loss") -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)[key] for x in lines]


def _run(raw: dict, out: Path, **teacher) -> Path:
    raw = json.loads(json.dumps(raw))
    raw["teacher"].update(teacher)
    raw["train"]["output_dir"] = str(out)
    loop.train(build_config(raw))
    return out


@pytest.mark.slow
def test_steps_with_teacher_url_equal_the_live_top_k_teacher(
    tmp_path, make_train_config, server, keyed
):
    url, _ = server
    raw = make_train_config(loss={"name": "jsd", "beta": 0.5}, train={"max_steps": 3}, data=FITS)
    live = _run(raw, tmp_path / "live", top_k=5)
    remote = _run(raw, tmp_path / "remote", top_k=5, url=url, api_key_env=KEY_ENV)
    full = _run(raw, tmp_path / "full", top_k=None)  # control: the comparison can tell
    assert len(_losses(remote)) == 3
    torch.testing.assert_close(_losses(remote), _losses(live), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(_losses(remote, "kl"), _losses(live, "kl"), rtol=1e-4, atol=1e-6)
    assert abs(_losses(full)[0] - _losses(live)[0]) > 1e-3


@pytest.fixture(scope="module")
def xtok_server(tmp_path_factory, unigram_tokenizer):
    """A teacher of another family (Qwen2 + unigram tokenizer, peaked head) and its server."""
    root = tmp_path_factory.mktemp("xteacher")
    path = build_peaked_teacher(root / "model", unigram_tokenizer, hidden_size=96)
    env = {"OMP_NUM_THREADS": "1"}
    with teacher_server(path, env=env, log_path=root / "server.log") as (url, _):
        yield url, path


@pytest.mark.slow
def test_cross_tokenizer_steps_with_teacher_url_equal_the_live_teacher(
    tmp_path, make_train_config, xtok_server
):
    url, teacher = xtok_server
    raw = make_train_config(
        teacher={"path": str(teacher)},
        loss={"name": "sampled_chunk_reverse_kl"},
        train={"max_steps": 3},
        data=FITS,
    )
    live = _run(raw, tmp_path / "live", top_k=None)
    remote = _run(raw, tmp_path / "remote", top_k=4, url=url)
    assert len(_losses(remote)) == 3
    torch.testing.assert_close(_losses(remote), _losses(live), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(_losses(remote, "kl"), _losses(live, "kl"), rtol=1e-4, atol=1e-6)
    assert _losses(remote, "groups")[0] > 0


def _post(url, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/completions", json=body, headers=headers, timeout=30, **kw)


def test_a_missing_or_wrong_key_gets_401_and_health_needs_none(server):
    url, teacher = server
    body = {"model": str(teacher), "prompt": [1, 2, 3], "max_tokens": 1, "prompt_logprobs": 2}
    assert _post(url, body, key=None).status_code == 401
    wrong = _post(url, body, key="guess")
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
    assert httpx.get(url + "/models").status_code == 401
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    assert _post(url, body).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "JSON"),
        ({"prompt": "some text", "max_tokens": 1}, 400, "token-id prompts only"),
        ({"prompt": [1, 2], "max_tokens": 1, "prompt_logprobs": 21}, 400, "max allowed: 20"),
        ({"prompt": [1, 10**6], "max_tokens": 1}, 400, "out of vocabulary"),
        ({"prompt": [1, 2], "max_tokens": 16}, 400, "give 1"),
        ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens must be at least 1, got 0"),
        ({"prompt": [1] * 512, "max_tokens": 1}, 400, "maximum context length is 512"),
        ({"prompt": [[1, 2], []], "max_tokens": 1}, 400, "at least one token"),
        ({"prompt": [1, 2], "model": "other"}, 404, "does not exist"),
        ({"prompt": [[1] * 40000, [2] * 40000], "max_tokens": 1}, 413, "over the limit"),
    ],
)
def test_malformed_requests_get_a_4xx_and_the_server_stays_up(server, body, status, message):
    url, _ = server
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + "/completions", content=content, headers=headers, timeout=30)
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    ok = _post(url, {"prompt": [[1, 2, 3]], "max_tokens": 1, "prompt_logprobs": 3})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["prompt_logprobs"]) == 3


def _teacher_cfg(url, path, tokenizer=None, key_env=KEY_ENV):
    raw = {
        "student": {"path": str(path)},
        "teacher": {"path": str(path), "url": url, "top_k": 4, "api_key_env": key_env},
        "data": {"train": "d.jsonl"},
    }
    if tokenizer is not None:
        raw["teacher"]["tokenizer"] = str(tokenizer)
    return build_config(raw)


def test_connect_checks_model_name_vocabulary_and_key(server, keyed, bpe_tokenizer):
    from distil.testing import train_tokenizer

    url, teacher = server
    good = connect(_teacher_cfg(url, teacher), bpe_tokenizer, vocab_limit=None, policy=FAST)
    assert good.model == str(teacher)
    cfg = _teacher_cfg(url, teacher)
    cfg.teacher.path = "someone/else"
    with pytest.raises(RemoteTeacherError, match=r"not teacher\.path = 'someone/else'"):
        connect(cfg, bpe_tokenizer, vocab_limit=None, policy=FAST)
    other = train_tokenizer("wordpiece")  # same size order, other vocabulary
    with pytest.raises(RemoteTeacherError, match=r"decodes token ids differently|out of vocab"):
        connect(_teacher_cfg(url, teacher), other, vocab_limit=None, policy=FAST)
    bigger = train_tokenizer("bpe", vocab_size=len(bpe_tokenizer) + 200)
    with pytest.raises(RemoteTeacherError, match="fewer than the"):
        connect(_teacher_cfg(url, teacher), bigger, vocab_limit=None, policy=FAST)
    with pytest.raises(RemoteTeacherError, match="out of vocabulary"):  # vLLM has no vocab_size
        probe(good, bigger)
    with pytest.raises(RemoteTeacherError, match=r"teacher\.api_key_env"):
        connect(
            _teacher_cfg(url, teacher, key_env=None), bpe_tokenizer, vocab_limit=None, policy=FAST
        )


def test_connect_refuses_a_run_longer_than_the_servers_context(server, keyed, bpe_tokenizer):
    url, teacher = server
    card = httpx.get(url + "/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert card["data"][0]["max_model_len"] == 512  # the tiny model's max_position_embeddings
    cfg = _teacher_cfg(url, teacher)
    cfg.data.max_prompt_tokens = 512 - cfg.generation.max_new_tokens - 1
    assert connect(cfg, bpe_tokenizer, vocab_limit=None, policy=FAST).max_model_len == 512
    cfg.data.max_prompt_tokens += 1  # the longest sequence leaves no room for max_tokens 1
    with pytest.raises(RemoteTeacherError, match=r"max_model_len = 512.*513 > 512"):
        connect(cfg, bpe_tokenizer, vocab_limit=None, policy=FAST)
