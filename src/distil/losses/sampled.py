"""Sampled-token reverse KL as a per-token advantage (Tinker cookbook's on-policy distillation).

Only the teacher's log-prob τ_t of each sampled token is needed, so a remote teacher is cheap.
With lp_t = log S(x_t) (student at the loss temperature), the advantage is the negative
single-sample reverse KL, A_t = -(lp_t - τ_t), held constant, and the per-token loss is
-A_t · exp(lp_t - sg(lp_t)): value -A_t (ratio 1, because training is synchronous on-policy and
the learner is the sampler) and gradient -A_t ∇lp_t, i.e. REINFORCE on the reward -KL
(Tinker's "importance_sampling" loss, without the sampler/learner ratio and with window-token
normalization instead of a plain sum).
"""

from __future__ import annotations

import math
from functools import partial

import torch

from distil.errors import ConfigError
from distil.losses.chunked import Rows, StudentHidden, check_temperatures, run_rowwise, upcast
from distil.losses.divergences import entropy_rows, gather_rows, retemper
from distil.losses.registry import register
from distil.types import LossOutput, TeacherTargets


def _teacher_token_logprobs(rows: Rows, ratio: float) -> torch.Tensor:
    """τ_n: the teacher's token log-probs at the loss temperature (see `_check`)."""
    if rows.token_logprobs_N is not None and ratio == 1.0:
        return upcast(rows.token_logprobs_N)
    return gather_rows(retemper(rows.logprobs_N_V, ratio), rows.labels_N)


def _sampled_rows(ratio: float, diagnostics: bool, logits_n_V: torch.Tensor, rows: Rows):
    s = torch.log_softmax(logits_n_V, dim=-1)
    lp_n = gather_rows(s, rows.labels_N)
    with torch.no_grad():
        tau_n = _teacher_token_logprobs(rows, ratio)
        advantage_n = -(lp_n.detach() - tau_n)  # A_t = -(log S(x_t) - log T(x_t))
    loss_n = -advantage_n * torch.exp(lp_n - lp_n.detach())  # value -A_t, gradient -A_t ∇lp_t
    metrics = {
        "kl": -advantage_n,  # sampled reverse-KL estimate lp_t - τ_t (unbiased on-policy)
        "student_logprob": lp_n.detach(),
        "teacher_logprob": tau_n,
    }
    if diagnostics:  # the one full-width metric: only on steps that log it
        metrics["student_entropy"] = entropy_rows(s.detach())
    return loss_n, metrics


def _check(targets: TeacherTargets, labels_B_T, temperature: float, targets_temperature: float):
    if labels_B_T is None:
        raise ConfigError(
            "loss 'sampled_reverse_kl' needs labels_B_T (the sampled tokens, shifted); the loop "
            "passes them from the batch, a direct caller must pass labels_B_T=..."
        )
    same_temperature = math.isclose(temperature, targets_temperature, rel_tol=1e-6)
    if targets.token_logprobs_B_T is not None and same_temperature:
        return
    if targets.logprobs_B_T_V is not None:  # exact fallback: gather from full log-probs
        return
    if targets.token_logprobs_B_T is None:
        raise ConfigError(
            "loss 'sampled_reverse_kl' needs the teacher's log-prob of each sampled token "
            "(TeacherTargets.token_logprobs_B_T) or its full log-probs; these targets have "
            "neither. Use a teacher scorer that returns token log-probs"
        )
    raise ConfigError(
        f"the teacher's token log-probs were computed at temperature {targets_temperature} but "
        f"the loss uses temperature {temperature}; a single token's log-prob cannot be "
        "re-tempered without the teacher's full distribution. Score the teacher at the loss "
        "temperature"
    )


@register("sampled_reverse_kl")
def sampled_reverse_kl(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    labels_B_T: torch.Tensor | None = None,
    temperature: float = 1.0,
    targets_temperature: float = 1.0,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    diagnostics: bool = True,
    **unused,
) -> LossOutput:
    """Sampled-token reverse KL as a per-token advantage (Tinker on-policy): teacher token lps.
    diagnostics=False leaves out the student's entropy (a full-vocabulary pass)."""
    check_temperatures(temperature, targets_temperature)
    _check(targets, labels_B_T, temperature, targets_temperature)
    return run_rowwise(
        student,
        targets,
        mask_B_T,
        partial(_sampled_rows, targets_temperature / temperature, diagnostics),
        num_tokens=num_tokens,
        labels_B_T=labels_B_T,
        temperature=temperature,
        chunk_size=chunk_size,
        ce_weight=ce_weight,
    )
