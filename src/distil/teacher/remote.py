"""`teacher.url`: a TeacherScorer whose teacher runs behind an OpenAI-compatible server.

Each sequence's teacher-side token ids (prompt + completion; for cross-tokenizer pairs the
teacher's own template and tokens, tokenized here; with `teacher.context/system` the teacher's
privileged prompt, `data/context.py`) go to `POST /v1/completions` as a token-id
prompt with `prompt_logprobs: K` and `max_tokens: 1` (what vLLM's server and `distil
serve-teacher` answer). The answer's `prompt_logprobs[p]` maps token ids to
`{logprob, rank, decoded_token}` for the distribution that predicts token p (entry 0 is null),
always holding the realised token p besides the top K. That becomes the same top-k + rest
`TeacherTargets` as `LiveTeacher(top_k=K)`: shifted position t = p - 1, the K largest entries,
rest = log(1 - sum exp(top-k)) (`base.rest_logprob`), and the realised token's log-prob.

Servers return log-probs at temperature 1 (vLLM's prompt log-probs are the raw model's), so
`loss.temperature` must be 1. Sequences go `SEQUENCES_PER_REQUEST` to a request, `CONCURRENCY`
requests at a time; `remote_client.py` retries. Before the first step `connect` checks the
server: reachable, serving `teacher.path`, a `max_model_len` (when its card says) that holds the
run's longest sequence plus the one token of `max_tokens: 1`, and this tokenizer's vocabulary (a
probe). Every answer must be log-probs: top-k whose logsumexp exceeds 0 (beyond rounding) are
logits (`vllm serve --logprobs-mode raw_logits`) and are refused.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from distil.errors import ConfigError
from distil.ranks import is_first_rank
from distil.teacher.base import rest_logprob
from distil.teacher.remote_client import RemoteClient, RemoteTeacherError, RetryPolicy, excerpt
from distil.types import Batch, TeacherTargets

SEQUENCES_PER_REQUEST = 8
CONCURRENCY = 8
PAD_LOGPROB = -30.0  # targets at padding positions: finite, masked out by every loss
PROBE_TOKENS = 12  # ids spread over the vocabulary sent once at start
LOGSUMEXP_SLACK = 1e-3  # top-k log-probs may sum past 0 by rounding (bf16 servers), not more


class RemoteTeacher:
    """Scores micro-batches through `client` (a `RemoteClient`) as the served `model`."""

    def __init__(
        self,
        client: RemoteClient,
        *,
        model: str,
        top_k: int,
        vocab_limit: int | None = None,
        sequences_per_request: int = SEQUENCES_PER_REQUEST,
        concurrency: int = CONCURRENCY,
    ):
        self.client, self.model, self.top_k = client, model, top_k
        self.temperature = 1.0
        self.vocab_limit = vocab_limit  # ids at or above it cannot index the student's logits
        self.max_model_len: int | None = None  # the server's context, when its card says
        self.sequences_per_request, self.concurrency = sequences_per_request, concurrency

    @classmethod
    def from_config(cls, cfg, tok, student_model):
        """(teacher, teacher tokenizer, CrossTokenizer or None, logits to keep): `remote_setup`."""
        return remote_setup(cfg, tok, student_model)

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        """Top-k + rest targets (B, T, K) in float32, positions as `LiveTeacher`'s: with
        privileged context (same tokens) the server scores the teacher's prompt + the
        completion, and teacher position t + shift is written at student position t."""
        ids, attn = batch.input_ids_B_L, batch.attention_mask_B_L
        shift_B = None  # privileged context, same tokens: teacher position t + shift = student t
        if batch.teacher_input_ids_B_L is not None:
            ids, attn = batch.teacher_input_ids_B_L, batch.teacher_attention_mask_B_L
        elif batch.context_input_ids_B_L is not None:
            ids, attn = batch.context_input_ids_B_L, batch.context_attention_mask_B_L
            shift_B = batch.context_shift_B.tolist()
        rows = [_unpadded(ids[b], attn[b]) for b in range(ids.shape[0])]
        longest = max((len(r) for r in rows), default=0)
        if self.max_model_len is not None and longest + 1 > self.max_model_len:
            raise RemoteTeacherError(
                f"a sequence of {longest} teacher tokens does not fit the teacher server's "
                f"max_model_len = {self.max_model_len} with room for max_tokens 1 (the server "
                "would refuse it). Fix: restart the server with a larger --max-model-len, or "
                "lower data.max_prompt_tokens / data.max_completion_tokens / "
                "generation.max_new_tokens (a cross-tokenizer teacher's tokens can outnumber "
                "the student's; teacher.context/system lengthen the teacher's prompt)"
            )
        n = self.sequences_per_request
        chunks = [rows[i : i + n] for i in range(0, len(rows), n)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks))) as pool:
            scored = [r for chunk in pool.map(self.score_rows, chunks) for r in chunk]
        B, K = ids.shape[0], self.top_k
        T = (ids if shift_B is None else batch.input_ids_B_L).shape[1] - 1  # target positions
        top_ids = torch.arange(K).expand(B, T, K).clone()
        top_lps = torch.full((B, T, K), PAD_LOGPROB)
        token = torch.zeros(B, T)
        for b, (r_ids, r_lps, r_tok) in enumerate(scored):
            s = 0 if shift_B is None else shift_B[b]
            lo, hi = max(s, 0), min(len(r_tok), T + s)  # the teacher positions kept
            if lo < hi:
                at = slice(lo - s, hi - s)
                top_ids[b, at], top_lps[b, at], token[b, at] = (
                    r_ids[lo:hi],
                    r_lps[lo:hi],
                    r_tok[lo:hi],
                )
        targets = TeacherTargets(
            topk_ids_B_T_K=top_ids,
            topk_logprobs_B_T_K=top_lps,
            rest_logprob_B_T=rest_logprob(top_lps),
            token_logprobs_B_T=token,
        )
        return targets.to(batch.input_ids_B_L.device)

    def score_rows(self, rows: list[list[int]]) -> list[tuple[torch.Tensor, ...]]:
        """(top-k ids (n-1, K), top-k log-probs (n-1, K), realised log-probs (n-1,)) per row."""
        body = {
            "model": self.model,
            "prompt": rows,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": self.top_k,
        }
        answer = self.client.request("POST", "/completions", body, hint=self._hint())
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != len(rows):
            raise self._unusable(f"{len(rows)} prompts sent, the answer has no matching choices")
        choices = sorted(choices, key=lambda c: c.get("index", 0))
        return [self._parse(c.get("prompt_logprobs"), row) for c, row in zip(choices, rows)]

    def _parse(self, entries: Any, row: list[int]) -> tuple[torch.Tensor, ...]:
        """One choice's `prompt_logprobs` -> top-k ids, top-k log-probs, realised log-probs."""
        if not isinstance(entries, list) or len(entries) != len(row):
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise self._unusable(
                f"prompt_logprobs should have one entry per prompt token ({len(row)}), got {got}"
            )
        K, n = self.top_k, len(row) - 1
        top_ids, top_lps, realised = [], [], []  # Python lists, one tensor each at the end
        for p in range(1, len(row)):
            entry = entries[p]
            try:
                pairs = sorted(((float(v["logprob"]), int(t)) for t, v in entry.items()))
                realised.append(float(entry[str(row[p])]["logprob"]))
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise self._unusable(
                    f"prompt_logprobs[{p}] = {excerpt(repr(entry), 200)} is not a map from "
                    f"token ids (with the prompt's token {row[p]}) to {{logprob, ...}} ({exc!r})"
                ) from None
            if len(pairs) < K:
                raise self._unusable(
                    f"prompt_logprobs[{p}] holds {len(pairs)} entries, fewer than "
                    f"teacher.top_k = {K}"
                )
            top = pairs[: -K - 1 : -1]  # the K largest, largest first
            top_lps.append([v for v, _ in top])
            top_ids.append([t for _, t in top])
        ids = torch.tensor(top_ids, dtype=torch.long).reshape(n, K)
        lps = torch.tensor(top_lps, dtype=torch.float32).reshape(n, K)
        token = torch.tensor(realised, dtype=torch.float32)
        if self.vocab_limit is not None and n and int(ids.max()) >= self.vocab_limit:
            raise self._unusable(
                f"it returned token id {int(ids.max())}, beyond the student's {self.vocab_limit} "
                "output rows: the served model's vocabulary is not the student's"
            )
        if not (torch.isfinite(lps).all() and torch.isfinite(token).all()):
            raise self._unusable("it returned NaN or infinite log-probs")
        check_logprobs(lps, self.client.url)
        return ids, lps.clamp(min=-1e4), token.clamp(min=-1e4)

    def _hint(self) -> str:
        return (
            f"Check that the server serves teacher.path = {self.model!r} and allows "
            f"teacher.top_k = {self.top_k} prompt log-probs (vllm serve --max-logprobs, distil "
            "serve-teacher --max-logprobs), and that the sequences fit its context length"
        )

    def _unusable(self, what: str) -> RemoteTeacherError:
        return RemoteTeacherError(
            f"the teacher server at {self.client.url} answered POST /completions with something "
            f"distil cannot use: {what}. Check that it is an OpenAI-compatible server that "
            "supports prompt_logprobs on token-id prompts (vLLM, distil serve-teacher)"
        )


def check_logprobs(top_lps_n_K: torch.Tensor, url: str) -> None:
    """Log-probs of one distribution have logsumexp <= 0 over any subset; logits do not.
    `vllm serve --logprobs-mode raw_logits` (or processed_logits) returns logits in the same
    field, which would pass every other check and silently become wrong targets."""
    if not len(top_lps_n_K):
        return
    mass_n = torch.logsumexp(top_lps_n_K.double(), dim=-1)
    if float(mass_n.max()) > LOGSUMEXP_SLACK:
        p = int(mass_n.argmax())
        raise RemoteTeacherError(
            f"the teacher server at {url} returned prompt_logprobs whose top-k probabilities "
            f"sum to {math.exp(min(float(mass_n[p]), 700.0)):.4g} > 1 (logsumexp "
            f"{float(mass_n[p]):.4g} at position {p + 1}): these are logits, not log-probs. "
            "Fix: the server returns logits: drop --logprobs-mode (vllm serve's default "
            "raw_logprobs is what distil needs)"
        )


def _unpadded(ids_L: torch.Tensor, attn_L: torch.Tensor) -> list[int]:
    """A right-padded row's tokens."""
    n = int(attn_L.sum())
    if not bool(attn_L[:n].all()):
        raise ValueError("the remote teacher expects right-padded rows (collate's layout)")
    return ids_L[:n].tolist()


# ---------------------------------------------------------------------------- start-up checks


def connect(
    cfg, teacher_tok, *, vocab_limit: int | None, policy: RetryPolicy | None = None
) -> RemoteTeacher:
    """A `RemoteTeacher` for `cfg.teacher`, after checking the server once: it answers, it
    serves `teacher.path`, and a probe of token ids spread over `teacher_tok`'s vocabulary
    comes back as top-k prompt log-probs whose decoded tokens are this tokenizer's."""
    t = cfg.teacher
    client = RemoteClient(t.url, api_key=api_key(t.api_key_env), policy=policy)
    models = client.request("GET", "/models")
    cards = models.get("data", []) if isinstance(models, dict) else []
    cards = {m.get("id"): m for m in cards if isinstance(m, dict)}
    served = list(cards)
    name = t.path or _only_served(served, client.url)
    if name not in served:
        raise RemoteTeacherError(
            f"the teacher server at {client.url} serves {served}, not teacher.path = "
            f"{t.path!r}. Fix: set teacher.path to the served name (vllm serve's MODEL argument "
            "or --served-model-name) and teacher.tokenizer to that model's tokenizer, or point "
            "teacher.url at the server of this model"
        )
    rows = cards[name].get("vocab_size")  # distil serve-teacher says; vLLM does not
    if isinstance(rows, int) and rows < len(teacher_tok):
        raise RemoteTeacherError(
            f"the model served at {client.url} has {rows} output rows, fewer than the "
            f"{len(teacher_tok)} tokens of teacher.tokenizer = {teacher_tok.name_or_path!r}: "
            "they are not the same vocabulary. Fix: set teacher.tokenizer to the served "
            "model's tokenizer"
        )
    max_model_len = cards[name].get("max_model_len")  # vLLM sends it
    max_model_len = max_model_len if isinstance(max_model_len, int) else None
    if max_model_len is not None:
        check_context(cfg, max_model_len, client.url)
    teacher = RemoteTeacher(client, model=name, top_k=t.top_k, vocab_limit=vocab_limit)
    teacher.max_model_len = max_model_len
    probe(teacher, teacher_tok)
    return teacher


def longest_sequence(cfg) -> int:
    """The most tokens one scored sequence can hold: the prompt limit plus the longest
    completion of the run's sources (dataset completions off-policy, generated ones on-policy
    or with seq-KD)."""
    completion = 0
    if cfg.train.lambda_ < 1.0 and not cfg.train.seq_kd:
        completion = cfg.data.max_completion_tokens + 1  # + its end token
    if cfg.train.lambda_ > 0.0 or cfg.train.seq_kd:
        completion = max(completion, cfg.generation.max_new_tokens)
    return cfg.data.max_prompt_tokens + completion


def check_context(cfg, max_model_len: int, url: str) -> None:
    """vLLM answers a prompt of n tokens with `max_tokens: 1` only when n + 1 <= max_model_len
    (a 400 otherwise): refuse at start a run whose longest sequence does not fit, rather than
    stopping hours in at the first sequence that reaches it."""
    longest = longest_sequence(cfg)
    if longest + 1 > max_model_len:
        raise RemoteTeacherError(
            f"the teacher server at {url} serves a context of max_model_len = {max_model_len} "
            f"tokens, but this run's sequences can hold {longest} (data.max_prompt_tokens = "
            f"{cfg.data.max_prompt_tokens} + the longest completion) and each needs room for "
            f"max_tokens 1: {longest + 1} > {max_model_len}. Fix: restart the server with "
            f"--max-model-len {longest + 1} or more (vllm serve, distil serve-teacher), or lower "
            "data.max_prompt_tokens / data.max_completion_tokens / generation.max_new_tokens. "
            "Cross-tokenizer pairs count teacher tokens: leave some room for a longer teacher "
            "tokenization"
        )


def _only_served(served: list, url: str) -> str:
    """teacher.path left null with a URL: the name of the one model the server serves."""
    if len(served) != 1:
        raise RemoteTeacherError(
            f"teacher.path is null and the teacher server at {url} serves {len(served)} models "
            f"{served}: with teacher.url, teacher.path is the served model's name (vllm serve's "
            "MODEL argument or --served-model-name), not a directory. Fix: set teacher.path to "
            "one of them"
        )
    if is_first_rank():
        print(f"note: teacher.path is null: using {served[0]!r}, the model {url} serves")
    return served[0]


def api_key(env_var: str | None) -> str | None:
    """The API key from the named environment variable (never from the config or argv)."""
    if env_var is None:
        return None
    value = os.environ.get(env_var)
    if not value:
        raise ConfigError(
            f"teacher.api_key_env = {env_var!r} but that environment variable is not set or "
            f"empty. Fix: export {env_var}=<the server's API key> before running, or set "
            "teacher.api_key_env=null for a server without a key"
        )
    return value


def probe(teacher: RemoteTeacher, tok) -> None:
    """Score ids spread over the tokenizer (its last id included: a smaller served vocabulary
    refuses it) and compare the server's decoded tokens with this tokenizer's."""
    from distil.models.tokenizers import id_rows

    size = id_rows(tok)
    ids = sorted({round(i * (size - 1) / (PROBE_TOKENS - 1)) for i in range(PROBE_TOKENS)})
    entries = teacher.client.request(
        "POST",
        "/completions",
        {
            "model": teacher.model,
            "prompt": [ids],
            "max_tokens": 1,
            "prompt_logprobs": teacher.top_k,
        },
        hint=(
            f"A refusal here usually means the served vocabulary is smaller than teacher."
            f"tokenizer's ({size} ids: the probe sends id {size - 1}) or the server allows "
            f"fewer prompt log-probs than teacher.top_k = {teacher.top_k} (vllm serve "
            "--max-logprobs, distil serve-teacher --max-logprobs)"
        ),
    )["choices"][0]["prompt_logprobs"]
    teacher._parse(entries, ids)  # the shape and content checks of every answer
    differ = []
    for p in range(1, len(ids)):
        seen = entries[p][str(ids[p])].get("decoded_token")
        if seen is not None and not _same_token(seen, tok, ids[p]):
            differ.append(f"id {ids[p]}: {seen!r} there, {tok.decode([ids[p]])!r} here")
    if len(differ) > (len(ids) - 1) // 2:
        raise RemoteTeacherError(
            f"the teacher server at {teacher.client.url} decodes token ids differently from "
            f"teacher.tokenizer = {tok.name_or_path!r} ({'; '.join(differ[:3])}): the served "
            "model uses another vocabulary. Fix: set teacher.tokenizer to the served model's "
            "tokenizer, or serve the model whose tokenizer this is"
        )


def _same_token(seen: str, tok, token_id: int) -> bool:
    """Servers decode one id with `decode([id])` or show the vocabulary piece; accept both."""
    mine = {tok.decode([token_id]), str(tok.convert_ids_to_tokens(token_id))}
    return seen in mine or seen.strip() in {m.strip() for m in mine}


def remote_setup(cfg, tok, student_model):
    """(RemoteTeacher, teacher tokenizer, CrossTokenizer or None, student logits to keep) for
    `teacher.url`: only the teacher's tokenizer is loaded here."""
    from distil.losses import is_cross_tokenizer
    from distil.models.load import load_tokenizer, vocab_mismatch

    t = cfg.teacher
    key = "teacher.path" if t.tokenizer == t.path else "teacher.tokenizer"
    teacher_tok = load_tokenizer(t.tokenizer, key=key, trust_remote_code=t.trust_remote_code)
    rows = student_model.get_output_embeddings().weight.shape[0]
    if is_cross_tokenizer(cfg.loss.name):
        from distil.data.crosstok import CrossTokenizer
        from distil.models.tokenizers import id_rows

        cross = CrossTokenizer.for_data(tok, teacher_tok, cfg.data)
        keep = id_rows(tok) if rows > id_rows(tok) else None
        return connect(cfg, teacher_tok, vocab_limit=None), teacher_tok, cross, keep
    if problem := vocab_mismatch(cfg.loss.name, tok, teacher_tok):
        raise ConfigError(problem)
    return connect(cfg, teacher_tok, vocab_limit=rows), teacher_tok, None, None
