"""The server's forward: top-k prompt log-probs of token-id prompts, batched, no grad.

Each prompt's entry p (p >= 1) describes the distribution predicting token p: the K most
likely ids with their log-probs and 1-based ranks, plus the prompt's own token p (as vLLM
does, so a client always finds the realised token's log-prob). Entry 0 is None. Log-softmax
is taken in fp32 over the full vocabulary before the top-k, as `LiveTeacher` does.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch

from distil.data.crosstok import right_pad
from distil.data.packing import model_forward

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps its log-probs the same way


class PromptScorer:
    """Scores prompts with `model`, `max_batch` sequences per forward, one forward at a time."""

    def __init__(self, model, tokenizer, *, max_batch: int = 8):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
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
        ids, attn = right_pad(prompts, self.pad_id)
        with self._lock:
            logits = model_forward(
                self.model, ids.to(self.device), attn.to(self.device), packing=False
            )[:, :-1]
            results = []
            for r, row in enumerate(prompts):
                n = len(row) - 1
                lp = torch.log_softmax(logits[r, :n].float(), dim=-1)
                results.append(self._entries(lp, row, k))
        return results

    def _entries(self, lp_N_V: torch.Tensor, row: list[int], k: int) -> list[dict | None]:
        nxt = torch.tensor(row[1:], device=lp_N_V.device, dtype=torch.long)
        tok_lp = lp_N_V.gather(-1, nxt[:, None])[:, 0]
        rank = (lp_N_V > tok_lp[:, None]).sum(-1) + 1  # 1-based, as vLLM's
        vals, top = lp_N_V.topk(k, dim=-1) if k else (lp_N_V[:, :0], nxt[:, None][:, :0])
        vals, top = vals.clamp(min=MIN_LOGPROB).tolist(), top.tolist()
        tok_lp, rank = tok_lp.clamp(min=MIN_LOGPROB).tolist(), rank.tolist()
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
