"""Forward KL, reverse KL and generalized JSD(β) between student S and teacher T, per position.

S = softmax(student_logits / temperature). T comes from the targets: full log-probs are
re-tempered exactly, log T = log_softmax(teacher_logprobs * targets_temperature / temperature);
sparse targets become K+1 categories (top-k + rest bucket, `topk.py`) on both sides. No T²
factor (as TRL and NeMo RL). The same three registered names serve dense and sparse targets.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from distil.losses import topk
from distil.losses.chunked import Rows, StudentHidden, check_temperatures, run_rowwise, upcast
from distil.losses.registry import register
from distil.types import LossOutput, TeacherTargets


def kl_rows(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) per row: sum_c P(c) (log P(c) - log Q(c)), with 0·log 0 = 0, over the last dim.

    Entries with P(c) = 0 (log P = -inf, or exp underflow) add exactly 0 and pass a zero (not
    NaN) gradient; P(c) > 0 with Q(c) = 0 is a genuinely infinite KL.
    """
    p = p_logp.exp()
    diff = torch.where(p > 0, p_logp - q_logp, 0.0)  # where first, so 0 * inf never happens
    return (p * diff).sum(-1)


def log_mixture(t_logp: torch.Tensor, s_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """log M with M = β·T + (1-β)·S (probability space), as a NaN-free two-term logsumexp."""
    a = t_logp + math.log(beta)
    b = s_logp + math.log1p(-beta)
    hi = torch.maximum(a, b)
    hi = torch.where(torch.isneginf(hi), 0.0, hi).detach()  # any shift is exact; 0 if both -inf
    total = torch.exp(a - hi) + torch.exp(b - hi)
    nonzero = total > 0
    return torch.where(nonzero, hi + torch.log(torch.where(nonzero, total, 1.0)), float("-inf"))


def log1mexp(x: torch.Tensor, *, floor: float | None = None) -> torch.Tensor:
    """log(1 - e^x) for x <= 0: log1p(-e^x) below -ln 2 and log(-expm1(x)) above, the split
    that keeps full precision on both sides (Mächler 2012).

    floor=None: exact; -inf with a zero gradient at x >= 0 (an empty remainder).
    floor=f: x capped at -1e-12 and the result at f (the rest buckets' floor, so that a
    reverse KL stays finite); zero gradient where either cap applies.
    """
    if floor is None:
        ok = x < 0
        x = torch.where(ok, x, -1.0)  # a harmless stand-in where the answer is -inf
    else:
        x = x.clamp(max=-1e-12)
    out = torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))
    if floor is None:
        return torch.where(ok, out, float("-inf"))
    return out.clamp(min=floor)


def jsd_rows(s_logp: torch.Tensor, t_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalized JSD per row: β·KL(T‖M) + (1-β)·KL(S‖M), M = β·T + (1-β)·S.

    At β=0 and β=1 this interpolation is 0, not KL: for small β it is ≈ β·KL(T‖S) (the S term is
    O(β²)). `divergence_rows` special-cases the endpoints to the pure KLs, as TRL does, so the
    endpoints are not the limit of the interpolation.
    """
    log_m = log_mixture(t_logp, s_logp, beta)
    return beta * kl_rows(t_logp, log_m) + (1.0 - beta) * kl_rows(s_logp, log_m)


def divergence_rows(kind: str, s_logp: torch.Tensor, t_logp: torch.Tensor, beta: float):
    """Per-row divergence over the last dim: "forward" KL(T‖S), "reverse" KL(S‖T) or "jsd"."""
    if kind == "forward" or (kind == "jsd" and beta == 0.0):
        return kl_rows(t_logp, s_logp)  # sum_v T (log T - log S)
    if kind == "reverse" or (kind == "jsd" and beta == 1.0):
        return kl_rows(s_logp, t_logp)  # sum_v S (log S - log T)
    return jsd_rows(s_logp, t_logp, beta)


def retemper(logprobs_N_V: torch.Tensor, ratio: float) -> torch.Tensor:
    """Teacher log-probs at temperature τ_t -> at τ: log_softmax(logp · τ_t/τ), exact; fp32."""
    logprobs_N_V = upcast(logprobs_N_V)
    return logprobs_N_V if ratio == 1.0 else torch.log_softmax(logprobs_N_V * ratio, dim=-1)


@torch.no_grad()
def entropy_rows(logp_N_V: torch.Tensor) -> torch.Tensor:
    """Entropy per row: -sum_v P(v) log P(v), 0·log 0 = 0."""
    p = logp_N_V.exp()
    return -torch.where(p > 0, p * logp_N_V, 0.0).sum(-1)


def gather_rows(logp_N_V: torch.Tensor, labels_N: torch.Tensor) -> torch.Tensor:
    """logp_N_V[n, labels_N[n]] for each row: the log-prob of the realized token."""
    return logp_N_V.gather(-1, labels_N.long().unsqueeze(-1)).squeeze(-1)


def _dense_rows(kind: str, beta: float, ratio: float, diagnostics: bool, logits_n_V, rows: Rows):
    s = torch.log_softmax(logits_n_V, dim=-1)
    t = retemper(rows.logprobs_N_V, ratio)
    loss_n = divergence_rows(kind, s, t, beta)
    if not diagnostics:  # a step that logs nothing: about a third of the full-width passes
        return loss_n, {}
    with torch.no_grad():
        sd = s.detach()
        metrics = {
            "kl": loss_n.detach() if kind == "reverse" else kl_rows(sd, t),
            "student_entropy": entropy_rows(sd),
        }
        if rows.labels_N is not None:
            metrics["student_logprob"] = gather_rows(sd, rows.labels_N)
            metrics["teacher_logprob"] = gather_rows(t, rows.labels_N)
    return loss_n, metrics


def _sparse_rows(kind: str, beta: float, diagnostics: bool, logits_n_V, rows: Rows):
    s = torch.log_softmax(logits_n_V, dim=-1)
    s_C = topk.student_buckets(s, rows.topk_ids_N_K)  # C = K + 1 categories
    t_C = topk.teacher_buckets(rows)
    loss_n = divergence_rows(kind, s_C, t_C, beta)
    if not diagnostics:
        return loss_n, {}
    with torch.no_grad():
        sd = s.detach()
        metrics = {
            "kl": loss_n.detach() if kind == "reverse" else kl_rows(s_C.detach(), t_C),
            "student_entropy": entropy_rows(sd),
        }
        if rows.labels_N is not None:
            metrics["student_logprob"] = gather_rows(sd, rows.labels_N)
            teacher_lp, hit = topk.teacher_label_logprob(rows)
            metrics["teacher_logprob"] = teacher_lp
            metrics["teacher_topk_hit"] = hit
    return loss_n, metrics


def divergence_loss(
    kind: str,
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    labels_B_T: torch.Tensor | None = None,
    temperature: float = 1.0,
    targets_temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    diagnostics: bool = True,
    compile_backend: str | None = None,
    **unused,
) -> LossOutput:
    """`forward_kl`, `reverse_kl` and `jsd` (`kind`): per-position divergence, summed / num_tokens.

    student: logits (B, T, V) or `StudentHidden`; targets: full (B, T, V) or top-k (B, T, K) +
    rest (B, T); mask_B_T: bool loss positions; labels_B_T: realized next tokens (metrics only);
    beta: JSD mix (ignored by the KLs); diagnostics=False leaves out the logging-only metrics
    (kl, entropy, log-probs of the labels; the loss and its gradient are the same);
    compile_backend: `run_rowwise`'s; options other losses use are ignored (`**unused`).
    """
    check_temperatures(temperature, targets_temperature)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {beta}")
    if targets.is_sparse:
        topk.check_sparse_temperature(temperature, targets_temperature)
        rows_fn = partial(_sparse_rows, kind, beta, diagnostics)
    elif targets.logprobs_B_T_V is not None:
        rows_fn = partial(_dense_rows, kind, beta, targets_temperature / temperature, diagnostics)
    else:
        raise ValueError(
            f"the {kind} divergence needs the teacher's full log-probs or its top-k + rest; "
            "these targets only carry token log-probs (use loss 'sampled_reverse_kl')"
        )
    return run_rowwise(
        student,
        targets,
        mask_B_T,
        rows_fn,
        num_tokens=num_tokens,
        labels_B_T=labels_B_T,
        temperature=temperature,
        chunk_size=chunk_size,
        ce_weight=ce_weight,
        compile_backend=compile_backend,
    )


@register("forward_kl")
def forward_kl(student, targets, mask_B_T, *, num_tokens, **opts) -> LossOutput:
    """Forward KL(T‖S) = sum_v T(v) (log T(v) - log S(v)): mean-seeking; dense or top-k + rest."""
    return divergence_loss("forward", student, targets, mask_B_T, num_tokens=num_tokens, **opts)


@register("reverse_kl")
def reverse_kl(student, targets, mask_B_T, *, num_tokens, **opts) -> LossOutput:
    """Reverse KL(S‖T) = sum_v S(v) (log S(v) - log T(v)): mode-seeking; dense or top-k + rest."""
    return divergence_loss("reverse", student, targets, mask_B_T, num_tokens=num_tokens, **opts)


@register("jsd")
def jsd(student, targets, mask_B_T, *, num_tokens, **opts) -> LossOutput:
    """Generalized JSD(β) with M = βT + (1-β)S; β=0 forward KL, β=1 reverse KL; dense or top-k."""
    return divergence_loss("jsd", student, targets, mask_B_T, num_tokens=num_tokens, **opts)
