"""The TeacherScorer protocol: what the teacher says about every position of a micro-batch.

A live teacher (a forward pass, `live.py`), a cache of its top-k targets (`cached.py`) and a
teacher behind a server (`remote.py`) return the same `TeacherTargets`, so every loss works with
each of them; `select.py` picks one from the config.
"""

from __future__ import annotations

from typing import Protocol

import torch

from distil.types import Batch, TeacherTargets


class TeacherScorer(Protocol):
    temperature: float

    def score(self, batch: Batch) -> TeacherTargets:
        """Targets aligned with the batch's shifted positions (B, T), on the batch's device."""
        ...


def sparse_topk(logprobs_N_V: torch.Tensor, k: int):
    """Top-k of log-probs (already log-softmaxed over the full vocabulary) + the rest bucket.

    rest = log(1 - sum_k exp(topk)), computed as log1p(-exp(logsumexp(topk))) and clamped so a
    bucket with (numerically) no mass is a very negative number rather than -inf or NaN.
    """
    vals, ids = logprobs_N_V.topk(k, dim=-1)
    return ids, vals, rest_logprob(vals)


def rest_logprob(topk_logprobs_N_K: torch.Tensor) -> torch.Tensor:
    """log(1 - sum_k exp(topk)) per row (N,), in the top-k values' dtype (see `sparse_topk`)."""
    covered = torch.logsumexp(topk_logprobs_N_K.float(), dim=-1).clamp(max=-1e-7)
    rest = torch.log1p(-covered.exp()).clamp(min=-1e4)
    return rest.to(topk_logprobs_N_K.dtype)
