"""Sparse teacher targets: the teacher's top-k entries plus one rest bucket, on both sides.

The K+1 categories are the teacher's top-k tokens and "everything else". The teacher side is
[topk_logprobs, rest_logprob] as scored (log-softmax over the full vocabulary before top-k);
the student side is its full-vocabulary log-probs gathered at the teacher's ids plus the
log-mass of all other tokens. Any divergence over these K+1 categories is a lower bound of the
full-vocabulary one (data processing) and equals it when k = V. NeMo RL's "(k+1)-dim rest
bucket" KL and TRL's "tail bucket" use the same K+1 categories.
"""

from __future__ import annotations

import math

import torch

from distil.errors import ConfigError
from distil.losses.chunked import Rows, upcast

# Both rest buckets are floored at the same log-mass. A teacher whose top-k mass rounds to 1
# reports rest = log(0) = -inf (or NaN); with the floor on both sides such a bucket adds 0
# instead of an infinite reverse KL. NeMo RL floors at 1e-10 as well; TRL clamps at ~1e-7.
REST_LOGPROB_FLOOR = math.log(1e-10)


def check_sparse_temperature(temperature: float, targets_temperature: float) -> None:
    """Top-k log-probs scored at one temperature cannot be re-tempered to another exactly."""
    if not math.isclose(temperature, targets_temperature, rel_tol=1e-6):
        raise ConfigError(
            f"the teacher's top-k targets were computed at temperature {targets_temperature} but "
            f"the loss uses temperature {temperature}; sparse (top-k + rest) targets cannot be "
            "re-tempered exactly because the mass outside the top-k is unknown. Score the "
            "teacher (or build the cache) at the loss temperature, or use full teacher log-probs"
        )


def safe_logsumexp(x_N_V: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim; an all -inf row gives -inf with a zero (not NaN) gradient."""
    empty = torch.isneginf(x_N_V).all(dim=-1, keepdim=True)
    out = torch.logsumexp(torch.where(empty, 0.0, x_N_V), dim=-1)
    return torch.where(empty.squeeze(-1), float("-inf"), out)


def student_buckets(logprobs_N_V: torch.Tensor, topk_ids_N_K: torch.Tensor) -> torch.Tensor:
    """(N, K+1): the student's full-vocab log-probs at the teacher's top-k ids, then its rest.

    rest = log sum_{v not in top-k} S(v), a logsumexp over the complement. This equals
    log1p(-exp(logsumexp(topk))) but keeps full relative precision when the top-k mass is close
    to 1 (1 - 0.999999 in fp32 loses most digits; the complement's logsumexp loses none).
    """
    ids = topk_ids_N_K.long()
    topk_N_K = logprobs_N_V.gather(-1, ids)
    rest_N = safe_logsumexp(logprobs_N_V.scatter(-1, ids, float("-inf")))
    rest_N = rest_N.clamp_min(REST_LOGPROB_FLOOR)
    return torch.cat([topk_N_K, rest_N.unsqueeze(-1)], dim=-1)


def teacher_buckets(rows: Rows) -> torch.Tensor:
    """(N, K+1): [topk_logprobs, rest_logprob] in fp32, the rest sanitized and floored."""
    topk_N_K = upcast(rows.topk_logprobs_N_K)
    rest_N = rows.rest_logprob_N
    if rest_N is None:  # rest = log(1 - sum_k exp(topk)) = log(-expm1(logsumexp(topk)))
        rest_N = torch.log(-torch.expm1(torch.logsumexp(topk_N_K, dim=-1).clamp_max(0.0)))
    rest_N = torch.nan_to_num(upcast(rest_N), nan=REST_LOGPROB_FLOOR)
    rest_N = rest_N.clamp(REST_LOGPROB_FLOOR, 0.0)
    return torch.cat([topk_N_K, rest_N.unsqueeze(-1)], dim=-1)


@torch.no_grad()
def teacher_label_logprob(rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher log-prob of each label, hit) from sparse targets, both (N,) fp32.

    `token_logprobs_N` when present (hit = 1 where the label is in the top-k). Otherwise the
    top-k entry where the label is in the top-k, and the rest bucket's log-mass where it is
    not: an upper bound on that token's log-prob; `hit` says how often that happened.
    """
    ids = rows.topk_ids_N_K.long()
    labels = rows.labels_N.long().unsqueeze(-1)
    match_N_K = ids == labels
    hit_N = match_N_K.any(dim=-1)
    if rows.token_logprobs_N is not None:
        return upcast(rows.token_logprobs_N), hit_N.float()
    buckets = teacher_buckets(rows)
    topk_value = torch.where(match_N_K, buckets[:, :-1], 0.0).sum(-1)
    return torch.where(hit_N, topk_value, buckets[:, -1]), hit_N.float()
