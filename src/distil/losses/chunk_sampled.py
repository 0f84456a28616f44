"""Sampled reverse KL per aligned chunk as an advantage (Tinker's on-policy distillation, cross-tokenizer).

Tokens of two tokenizers do not line up, but aligned groups spell the same bytes, so each
model's log-probability of a group's bytes is the sum of its realized tokens' log-probs:
log S(g) = sum_{i in g} lp_i (student, at the loss temperature) and log T(g) (teacher, from its
token log-probs or gathered from its full log-probs). Then, as `sampled.py` per token:
    A_g = -(log S(g) - log T(g))  (held constant),   loss = -sum_g A_g · exp(log S(g) - sg(log S(g)))
value sum_g (log S(g) - log T(g)) (the sampled reverse-KL estimate) and gradient
-sum_g A_g ∇ log S(g), REINFORCE on the reward -KL per chunk. Only the teacher's log-probs of
its own realized tokens are needed, so a remote teacher stays cheap.

The ratio is taken per group (exp of the group's summed log-prob) rather than per token
(sum_i exp(lp_i - sg(lp_i))): both give the gradient -A_g ∇ log S(g), but the per-group one
makes the loss value the KL estimate itself, as `sampled_reverse_kl`'s is per token.
"""

from __future__ import annotations

import math

import torch

from distil.errors import ConfigError
from distil.losses.aligned import (
    check_inputs,
    finish,
    keep_groups,
    realized_rows,
    run_positions,
    teacher_group_logprob,
)
from distil.losses.chunked import StudentHidden
from distil.losses.registry import register
from distil.types import AlignmentGroups, LossOutput, TeacherTargets


def _check_targets(targets: TeacherTargets, temperature: float, targets_temperature: float):
    same_temperature = math.isclose(temperature, targets_temperature, rel_tol=1e-6)
    if targets.logprobs_B_T_V is not None and not targets.is_sparse:
        return  # full log-probs: gather (and re-temper exactly)
    if targets.token_logprobs_B_T is None:
        raise ConfigError(
            "loss 'sampled_chunk_reverse_kl' needs the teacher's log-prob of each of its realized "
            "tokens (TeacherTargets.token_logprobs_B_T, in teacher positions) or its full "
            "log-probs; these targets have neither (sparse top-k targets are not supported for "
            "cross-tokenizer losses). Use a teacher scorer that returns token log-probs"
        )
    if not same_temperature:
        raise ConfigError(
            f"the teacher's token log-probs were computed at temperature {targets_temperature} "
            f"but the loss uses temperature {temperature}; a single token's log-prob cannot be "
            "re-tempered without the teacher's full distribution. Score the teacher at the loss "
            "temperature"
        )


@register("sampled_chunk_reverse_kl")
def sampled_chunk_reverse_kl(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    alignment: AlignmentGroups | None = None,
    temperature: float = 1.0,
    targets_temperature: float = 1.0,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    **unused,
) -> LossOutput:
    """Sampled reverse KL per aligned chunk as an advantage (cross-tokenizer Tinker on-policy)."""
    check_inputs("sampled_chunk_reverse_kl", targets, alignment, temperature, targets_temperature)
    _check_targets(targets, temperature, targets_temperature)
    kept = keep_groups(alignment, mask_B_T)
    group_N, row_N, pos_N, tok_N = kept.student_entries()
    lp_N, metrics_N, ce_N = run_positions(
        student,
        row_N,
        pos_N,
        realized_rows,
        mask_B_T,
        extras=(tok_N,),
        labels_N=tok_N,
        temperature=temperature,
        chunk_size=chunk_size,
        ce_weight=ce_weight,
    )
    student_G = lp_N.new_zeros(kept.num).index_add(0, group_N, lp_N)  # log S(g)
    ratio = targets_temperature / temperature
    teacher_G = teacher_group_logprob(targets, kept, ratio, chunk_size).to(lp_N.dtype)  # log T(g)
    advantage_G = -(student_G.detach() - teacher_G)
    loss_G = -advantage_G * torch.exp(student_G - student_G.detach())  # value -A_g, grad -A_g ∇
    total = loss_G.sum() + (ce_weight * ce_N.sum() if ce_N is not None else 0.0)
    out = finish(
        total,
        num_tokens,
        [metrics_N],
        mask_B_T,
        kept,
        student_logprob_sum=student_G.detach().sum(),
        teacher_logprob_sum=teacher_G.sum(),
    )
    out.metrics["kl_sum"] = out.metrics["logratio_sum"]  # this loss's own estimate of KL(S‖T)
    return out
