"""teacher.url without a server: vLLM-shaped answers become the live teacher's top-k targets,
the retry policy is bounded, and the config rules name what a server cannot do."""

import math
import sys

import httpx
import pytest
import torch

from distil.config import build_config
from distil.errors import ConfigError
from distil.teacher.base import sparse_topk
from distil.teacher.remote import RemoteTeacher
from distil.teacher.remote_client import RemoteClient, RemoteTeacherError, RetryPolicy
from distil.types import Batch

FAST = RetryPolicy(tries=4, first_wait_s=0.01, max_wait_s=0.02, total_s=5.0, timeout_s=5.0)


def vllm_entries(logprobs_N_V: torch.Tensor, row: list[int], k: int) -> list:
    """What vLLM's server puts in `prompt_logprobs`: None, then the top k plus the prompt's
    own token (with its rank) at each position, keys as JSON strings."""
    out = [None]
    for p in range(1, len(row)):
        lp = logprobs_N_V[p - 1]
        order = lp.argsort(descending=True).tolist()
        entry = {str(t): {"logprob": float(lp[t]), "rank": order.index(t) + 1} for t in order[:k]}
        entry.setdefault(
            str(row[p]), {"logprob": float(lp[row[p]]), "rank": order.index(row[p]) + 1}
        )
        out.append(entry)
    return out


class FakeClient:
    """Answers /completions from fixed per-row log-probs, as a vLLM server would."""

    url = "http://fake/v1"

    def __init__(self, logprobs_by_row: dict[tuple, torch.Tensor], k: int):
        self.rows, self.k, self.bodies = logprobs_by_row, k, []

    def request(self, method, path, body=None, *, hint=""):
        self.bodies.append(body)
        choices = [
            {"index": i, "prompt_logprobs": vllm_entries(self.rows[tuple(r)], r, self.k)}
            for i, r in enumerate(body["prompt"])
        ]
        return {"choices": choices[::-1]}  # order by `index`, not by position


def test_vllm_answers_become_the_live_top_k_targets():
    torch.manual_seed(0)
    V, K, L = 50, 4, 7
    lengths = [7, 5, 3]
    ids = torch.randint(0, V, (3, L))
    attn = torch.zeros(3, L, dtype=torch.long)
    logprobs = torch.log_softmax(torch.randn(3, L - 1, V) * 3, -1)
    rows = {}
    for b, n in enumerate(lengths):
        attn[b, :n] = 1
        rows[tuple(ids[b, :n].tolist())] = logprobs[b, : n - 1]
    client = FakeClient(rows, K)
    teacher = RemoteTeacher(client, model="m", top_k=K, sequences_per_request=2)
    batch = Batch(ids, attn, ids[:, 1:], attn[:, 1:].bool(), samples=[])
    t = teacher.score(batch)
    want_ids, want_lps, want_rest = sparse_topk(logprobs, K)
    for b, n in enumerate(lengths):
        c = n - 1
        got = sorted(zip(t.topk_ids_B_T_K[b, :c].flatten().tolist(), strict=True))
        assert got == sorted(zip(want_ids[b, :c].flatten().tolist(), strict=True))
        torch.testing.assert_close(
            t.topk_logprobs_B_T_K[b, :c].sort(-1).values, want_lps[b, :c].sort(-1).values
        )
        torch.testing.assert_close(t.rest_logprob_B_T[b, :c], want_rest[b, :c])
        realised = logprobs[b, :c].gather(-1, ids[b, 1:n, None])[:, 0]
        torch.testing.assert_close(t.token_logprobs_B_T[b, :c], realised)
    assert t.topk_logprobs_B_T_K.dtype == want_lps.dtype == torch.float32
    assert t.topk_ids_B_T_K.dtype == torch.long and t.topk_ids_B_T_K.shape == (3, L - 1, K)
    assert [len(b["prompt"]) for b in client.bodies] == [2, 1]  # sequences per request
    assert all(b["prompt_logprobs"] == K and b["max_tokens"] == 1 for b in client.bodies)


def test_an_answer_without_the_prompt_token_or_with_too_few_entries_is_an_error():
    teacher = RemoteTeacher(FakeClient({}, 2), model="m", top_k=2)
    good = {"1": {"logprob": -0.1}, "2": {"logprob": -3.0}}
    teacher._parse([None, good], [5, 1])
    with pytest.raises(RemoteTeacherError, match="prompt's token 7"):
        teacher._parse([None, good], [5, 7])
    with pytest.raises(RemoteTeacherError, match=r"fewer than teacher\.top_k = 2"):
        teacher._parse([None, {"1": {"logprob": -0.1}}], [5, 1])
    with pytest.raises(RemoteTeacherError, match="one entry per prompt token"):
        teacher._parse([None], [5, 1])
    limited = RemoteTeacher(FakeClient({}, 2), model="m", top_k=2, vocab_limit=2)
    with pytest.raises(RemoteTeacherError, match="beyond the student's 2 output rows"):
        limited._parse([None, good], [5, 1])


def _client(handler, policy=FAST):
    return RemoteClient("http://teacher/v1", policy=policy, transport=httpx.MockTransport(handler))


def test_5xx_and_connection_errors_are_retried_then_succeed():
    calls = []

    def handler(request):
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(503, text="loading")
        return httpx.Response(200, json={"ok": 1})

    assert _client(handler).request("GET", "/models") == {"ok": 1}
    assert calls == ["/v1/models"] * 3


class FakeClock:
    """The client's clock: sleeping advances it, nothing else does (no wall-clock in the test)."""

    def __init__(self):
        self.now, self.waits = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.waits.append(seconds)
        self.now += seconds


def test_a_dead_server_ends_in_a_clear_error_after_bounded_tries(monkeypatch):
    import distil.teacher.remote_client as rc

    clock = FakeClock()
    monkeypatch.setattr(rc, "time", clock)
    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ConnectError("connection refused")

    with pytest.raises(RemoteTeacherError, match=r"did not answer GET /models after 4 tries") as e:
        _client(handler).request("GET", "/models")
    assert len(calls) == 4 and clock.waits == [0.01, 0.02, 0.02]  # doubled, capped at max_wait_s
    assert "http://teacher/v1" in str(e.value) and "connection refused" in str(e.value)


def test_total_time_bounds_the_retries(monkeypatch):
    import distil.teacher.remote_client as rc

    clock = FakeClock()
    monkeypatch.setattr(rc, "time", clock)
    policy = RetryPolicy(tries=100, first_wait_s=0.25, max_wait_s=0.25, total_s=1.0)
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(502, text="bad gateway")

    with pytest.raises(RemoteTeacherError, match="HTTP 502: bad gateway"):
        _client(handler, policy).request("GET", "/models")
    # waits of 0.25 s while the next one still ends within total_s = 1 s: four waits, five tries
    assert len(calls) == 5 and clock.waits == [0.25] * 4


@pytest.mark.parametrize(
    ("status", "message"),
    [(401, "teacher.api_key_env"), (400, "max-logprobs"), (404, "teacher.url")],
)
def test_other_4xx_fail_at_once_with_the_body_and_what_to_check(status, message):
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(status, json={"error": {"message": "nope: max allowed: 20"}})

    with pytest.raises(RemoteTeacherError, match=message) as e:
        _client(handler).request("POST", "/completions", {}, hint="check --max-logprobs")
    assert len(calls) == 1 and f"HTTP {status}" in str(e.value) and "max allowed" in str(e.value)


def _cfg(**teacher):
    return {
        "student": {"path": "s"},
        "teacher": {"path": "t", "url": "http://127.0.0.1:8000/v1", **teacher},
        "data": {"train": "d.jsonl"},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"teacher": {"top_k": None}}, "teacher.url needs teacher.top_k"),
        ({"teacher": {"url": "127.0.0.1:8000"}}, "not an http"),
        ({"loss": {"temperature": 2.0}}, "loss.temperature=1"),
        ({"train": {"seq_kd": True, "lambda": 0.0}}, "train.seq_kd=false"),
        ({"teacher": {"cache": "c"}}, "keep one teacher source"),
    ],
)
def test_config_rules_name_what_a_server_cannot_do(change, message):
    raw = _cfg(top_k=4)
    for section, values in change.items():
        raw.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=message):
        build_config(raw)
    build_config(_cfg(top_k=4))  # the same config without the change is valid


def test_a_loss_a_server_cannot_feed_is_named_before_training():
    # the loss name resolves in the registry, so the pre-flight asks (not the config's rules)
    from distil.preflight import check, command_problems

    raw = _cfg(top_k=4)
    raw["loss"] = {"name": "aligned_kl"}
    cfg = build_config(raw)  # valid values
    with pytest.raises(ConfigError, match=r"loss\.name=sampled_chunk_reverse_kl"):
        check(cfg, "train")
    raw["loss"] = {"name": "sampled_chunk_reverse_kl"}
    ok = command_problems(build_config(raw), "train")
    assert not any("sampled_chunk_reverse_kl" in p for p in ok)


def test_the_rest_bucket_is_the_live_teachers():
    lp = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), -1)
    _, vals, rest = sparse_topk(lp, 2)
    assert math.isclose(float(rest), math.log(1 - float(vals.exp().sum())), rel_tol=1e-5)


def test_a_missing_extra_is_named(monkeypatch, capsys):
    from distil.cli import main
    from distil.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx raises ImportError
    with pytest.raises(MissingExtraError, match=r"distil\[remote\]"):
        RemoteClient("http://127.0.0.1:1/v1")
    monkeypatch.setitem(sys.modules, "fastapi", None)
    assert main(["serve-teacher", "some/model"]) == 2
    err = capsys.readouterr().err
    assert "distil[serve]" in err and "Traceback" not in err


def test_the_key_comes_from_the_named_variable_only(monkeypatch):
    from distil.teacher.remote import api_key

    monkeypatch.delenv("DISTIL_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="export DISTIL_NO_SUCH_KEY="):
        api_key("DISTIL_NO_SUCH_KEY")
    monkeypatch.setenv("DISTIL_NO_SUCH_KEY", "abc")
    assert api_key("DISTIL_NO_SUCH_KEY") == "abc" and api_key(None) is None


def test_validate_accepts_a_cross_tokenizer_url_config_with_top_k(make_train_config):
    from distil.preflight import preflight

    raw = make_train_config(loss={"name": "sampled_chunk_reverse_kl"})
    raw["teacher"].update({"url": "http://127.0.0.1:9/v1", "top_k": 4})
    problems, _ = preflight(build_config(raw))
    assert not any("top_k" in p for p in problems), problems


def test_logits_in_place_of_log_probs_are_refused():
    # vllm serve --logprobs-mode raw_logits: the same field, values of a logit scale
    torch.manual_seed(1)
    V, K, row = 50, 4, [3, 7, 9, 11]
    logits = torch.randn(len(row) - 1, V) * 3 + 5
    teacher = RemoteTeacher(FakeClient({}, K), model="m", top_k=K)
    with pytest.raises(RemoteTeacherError, match="drop --logprobs-mode"):
        teacher._parse(vllm_entries(logits, row, K), row)
    # true log-probs pass, also rounded to bf16 as a bf16 server sends them (k = V: mass 1)
    logprobs = torch.log_softmax(logits, -1).bfloat16().float()
    teacher._parse(vllm_entries(logprobs, row, K), row)
    whole = RemoteTeacher(FakeClient({}, V), model="m", top_k=V)
    whole._parse(vllm_entries(logprobs, row, V), row)


def _context_cfg(**data):
    return build_config({**_cfg(top_k=4), "data": {"train": "d.jsonl", **data}})


def test_the_servers_context_must_hold_the_longest_sequence_plus_one_token():
    from distil.teacher.remote import check_context, longest_sequence

    cfg = _context_cfg(max_prompt_tokens=100)  # lambda 1: on-policy, generation's length
    longest = 100 + cfg.generation.max_new_tokens
    assert longest_sequence(cfg) == longest
    check_context(cfg, longest + 1, "u")
    with pytest.raises(RemoteTeacherError, match=rf"{longest + 1} > {longest}.*--max-model-len"):
        check_context(cfg, longest, "u")
    off = _context_cfg(max_prompt_tokens=100, max_completion_tokens=300)
    off.train.lambda_ = 0.0  # dataset completions and their end token
    assert longest_sequence(off) == 100 + 301
    # a sequence past the server's context stops before the request, naming both lengths
    client = FakeClient({}, 2)
    teacher = RemoteTeacher(client, model="m", top_k=2)
    teacher.max_model_len = 5
    ids, attn = torch.arange(1, 6)[None], torch.ones(1, 5, dtype=torch.long)
    with pytest.raises(RemoteTeacherError, match=r"5 teacher tokens.*max_model_len = 5"):
        teacher.score(Batch(ids, attn, ids[:, 1:], attn[:, 1:].bool(), samples=[]))
    assert client.bodies == []
