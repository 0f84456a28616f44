"""The server's forward: top-k prompt log-probs of token-id prompts, batched, no grad.

Each prompt's entry p (p >= 1) describes the distribution predicting token p: the K most
likely ids with their log-probs and 1-based ranks, plus the prompt's own token p (as vLLM
does, so a client always finds the realised token's log-prob). Entry 0 is None. Log-softmax
is taken in fp32 over the full vocabulary before the top-k, as `LiveTeacher` does: the forward
runs the model's decoder (no head), and the head, then what the model's forward applies after
it (`models.logits`: Gemma 2's soft-cap, Cohere's and Granite's scales; checked once against
the model's own logits when the scorer is built), is applied `losses.chunked.auto_chunk_size(V)`
positions at a time, so the (B, L, V) logits of a request never exist at once.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch

from distil.data.packing import model_forward
from distil.losses.chunked import auto_chunk_size
from distil.models.logits import check_decoder_logits, logits_rule
from distil.models.tokenizers import right_pad

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps its log-probs the same way


class PromptScorer:
    """Scores prompts with `model`, `max_batch` sequences per forward, one forward at a time."""

    def __init__(self, model, tokenizer, *, max_batch: int = 8):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.rule = logits_rule(model)
        check_decoder_logits(model, self.rule, role="served model")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._lock = threading.Lock()  # bounds memory: concurrent requests take turns
        self._decode = lru_cache(maxsize=1 << 16)(lambda i: tokenizer.decode([i]))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def score(self, prompts: list[list[int]], k: int) -> list[list[dict | None]]:
        """`prompt_logprobs` of each prompt: [None, {str(id): {logprob, rank, decoded_token}}, ...]."""
        out: list[list[dict | None]] = []
        for s in range(0, len(prompts), self.max_batch):
            out += self._score_batch(prompts[s : s + self.max_batch], k)
        return out

    @torch.inference_mode()
    def _score_batch(self, prompts: list[list[int]], k: int) -> list[list[dict | None]]:
        """One forward of the decoder (the head not run); head + fp32 log-softmax on the scored
        positions (every prompt position but the last), `auto_chunk_size(V)` of them at a time."""
        ids, attn = right_pad(prompts, self.pad_id)
        with self._lock:
            head = self.model.get_output_embeddings()
            hidden_B_L_H = model_forward(
                self.model, ids.to(self.device), attn.to(self.device), packing=False, hidden=True
            )
            nxt_B_L = ids.to(self.device)
            row_N = torch.cat([torch.full((len(r) - 1,), b) for b, r in enumerate(prompts)])
            pos_N = torch.cat([torch.arange(len(r) - 1) for r in prompts])
            row_N, pos_N = row_N.to(self.device), pos_N.to(self.device)
            step = auto_chunk_size(self.vocab_size)
            parts = []
            for s in range(0, len(row_N), step):
                r, p = row_N[s : s + step], pos_N[s : s + step]
                logits_n_V = self.rule.logits(
                    hidden_B_L_H[r, p], head.weight, getattr(head, "bias", None)
                )
                lp_n_V = torch.log_softmax(logits_n_V.float(), dim=-1)
                parts.append(_top_and_realised(lp_n_V, nxt_B_L[r, p + 1], k))
        vals, top, tok_lp, rank = ([x for part in parts for x in part[i]] for i in range(4))
        results, at = [], 0
        for row in prompts:
            n = len(row) - 1
            sl = slice(at, at + n)
            results.append(self._entries(row, vals[sl], top[sl], tok_lp[sl], rank[sl]))
            at += n
        return results

    def _entries(self, row: list[int], vals, top, tok_lp, rank) -> list[dict | None]:
        entries: list[dict | None] = [None]
        for p, token in enumerate(row[1:]):
            entry = {
                str(t): {"logprob": v, "rank": j + 1, "decoded_token": self._decode(t)}
                for j, (v, t) in enumerate(zip(vals[p], top[p], strict=True))
            }
            if str(token) not in entry:
                entry[str(token)] = {
                    "logprob": tok_lp[p],
                    "rank": rank[p],
                    "decoded_token": self._decode(token),
                }
            entries.append(entry)
        return entries


def _top_and_realised(lp_n_V: torch.Tensor, nxt_n: torch.Tensor, k: int):
    """Lists of (top-k log-probs, top-k ids, realised log-prob, its 1-based rank) per row."""
    tok_lp = lp_n_V.gather(-1, nxt_n[:, None])[:, 0]
    rank = (lp_n_V > tok_lp[:, None]).sum(-1) + 1  # 1-based, as vLLM's
    vals, top = lp_n_V.topk(k, dim=-1) if k else (lp_n_V[:, :0], nxt_n[:, None][:, :0])
    return (
        vals.clamp(min=MIN_LOGPROB).tolist(),
        top.tolist(),
        tok_lp.clamp(min=MIN_LOGPROB).tolist(),
        rank.tolist(),
    )
