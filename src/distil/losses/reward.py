"""A task's reward as a loss: GRPO's group-relative advantage and clipped policy gradient.

Each prompt's `num_generations` on-policy samples form a group; with r_i the reward of sample
i of a group of G (DeepSeekMath's GRPO, Shao et al. 2024; verl's `compute_grpo_outcome_advantage`):

    A_i = r_i - mean_j r_j                          (normalize_std=False: Dr. GRPO's form)
    A_i = (r_i - mean_j r_j) / (std_j r_j + 1e-6)   (normalize_std=True; std with N - 1)

and every completion token t of sample i gets A_i. The per-token loss is PPO's clipped
surrogate with ρ_t = exp(lp_t - lp_t^old), lp_t = log S(x_t) at the sampling temperature:

    loss_t = -min(ρ_t A_i, clip(ρ_t, 1 - ε, 1 + ε) A_i)

With the synchronous loop the sampler is the learner, so lp^old = sg(lp) and ρ_t = 1: value
-A_i, gradient -A_i ∇lp_t, plain REINFORCE with a group baseline (the clip is inactive).
With `generation.async` the window was sampled by the weights of one step earlier, and
lp^old is the sampler's own log-prob of the token (`Batch.sampling_logprobs_B_T`), so ρ_t
corrects for the lag and the clip bounds it. Like every loss the sum is divided by the
window's loss-token count across ranks (`reduce.py`; DAPO's token-level mean, not GRPO's
per-sequence mean), so gradient accumulation and world size change nothing.

`grpo` is the reward alone (no teacher targets); `with_reward(loss, w)` adds w times it to any
on-policy distillation loss, sharing the student's forward.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from distil.losses.aligned import realized_rows, run_positions
from distil.losses.chunked import StudentHidden
from distil.losses.reduce import count_loss_tokens, token_sum_over
from distil.losses.registry import LossFn, register
from distil.types import LossOutput, TeacherTargets

STD_EPS = 1e-6  # verl's epsilon in (r - mean) / (std + eps)


def group_advantages(
    rewards_B: torch.Tensor, group_size: int, *, normalize_std: bool = True
) -> torch.Tensor:
    """GRPO's advantage of each sample: its reward minus its group's mean, divided by the
    group's standard deviation (N - 1) + 1e-6 when `normalize_std`. rewards_B: (B,) floats,
    groups of `group_size` adjacent rows (B divisible by it); a group of equal rewards gets 0."""
    if group_size < 1 or rewards_B.shape[0] % group_size:
        raise ValueError(
            f"{rewards_B.shape[0]} rewards do not split into groups of {group_size} samples"
        )
    r_G_N = rewards_B.double().reshape(-1, group_size)
    centred = r_G_N - r_G_N.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        centred = centred / (r_G_N.std(dim=1, keepdim=True) + STD_EPS)
    # a flat group's mean can round (3 x 0.1), leaving ~1e-17, ~1e-11 once divided by 0 + eps
    flat_G = (r_G_N == r_G_N[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat_G, 0.0, centred).reshape(-1).to(rewards_B.dtype)


def _check(advantages_B, mask_B_T: torch.Tensor, sampling_temperature: float, clip_eps: float):
    if advantages_B is None:
        raise ValueError(
            "the reward loss needs advantages_B (one per row: the group-relative advantage of "
            "an on-policy sample); the loop passes them for on-policy micro-batches when the "
            "run scores rewards (loss.name=grpo or loss.reward_weight > 0)"
        )
    if tuple(advantages_B.shape) != (mask_B_T.shape[0],):
        raise ValueError(
            f"advantages_B has shape {tuple(advantages_B.shape)}; expected ({mask_B_T.shape[0]},), "
            "one per row of mask_B_T"
        )
    if not sampling_temperature > 0:
        raise ValueError(f"sampling_temperature must be > 0, got {sampling_temperature}")
    if not 0 <= clip_eps < 1:
        raise ValueError(f"clip_eps must be in [0, 1), got {clip_eps}")


@register("grpo")
def grpo(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets | None,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    labels_B_T: torch.Tensor | None = None,
    advantages_B: torch.Tensor | None = None,
    sampling_logprobs_B_T: torch.Tensor | None = None,
    importance_ratio: bool = False,
    sampling_temperature: float = 1.0,
    clip_eps: float = 0.2,
    policy_rows: int | None = None,
    chunk_size: int | None = None,
    **unused,
) -> LossOutput:
    """Group-relative policy gradient on a task's reward (GRPO; no teacher targets).

    advantages_B: (B,) per-row advantages (`group_advantages`); labels_B_T: the sampled tokens
    (shifted). `importance_ratio` (generation.async): ρ_t = exp(lp_t - sampling_logprobs_B_T)
    against the lagging sampler, clipped to [1 - clip_eps, 1 + clip_eps]; otherwise ρ_t = 1.
    `policy_rows`: the vocabulary rows the sampler draws from (a model padded past its
    tokenizer: its id rows); log S is normalized over them as the sampler's log-probs are, so
    ρ_t = 1 at no lag. Metrics: loss_sum, advantage_sum (per token), ratio_clipped_sum (tokens
    whose clip binds), student_logprob_sum, student_entropy_sum, tokens_count."""
    _check(advantages_B, mask_B_T, sampling_temperature, clip_eps)
    if labels_B_T is None:
        raise ValueError("the reward loss needs labels_B_T (the sampled tokens, shifted)")
    if importance_ratio and sampling_logprobs_B_T is None:
        raise ValueError(
            "importance_ratio=True needs sampling_logprobs_B_T (the sampler's log-prob of each "
            "sampled token); the batch has none"
        )
    mask_B_T = mask_B_T.bool()
    row_N, pos_N = mask_B_T.nonzero(as_tuple=True)
    tok_N = labels_B_T[row_N, pos_N]
    lp_N, metrics_N, _ = run_positions(
        first_rows(student, policy_rows), row_N, pos_N, realized_rows, mask_B_T,
        extras=(tok_N,), temperature=sampling_temperature, chunk_size=chunk_size,
    )  # fmt: skip
    adv_N = advantages_B.to(device=lp_N.device, dtype=lp_N.dtype)[row_N]
    if importance_ratio:  # the sampler's weights lag the learner's by a step
        old_N = sampling_logprobs_B_T.to(device=lp_N.device, dtype=lp_N.dtype)[row_N, pos_N]
    else:  # the sampler is the learner: ρ = 1, gradient -A ∇lp
        old_N = lp_N.detach()
    ratio_N = torch.exp(lp_N - old_N)
    clipped_N = ratio_N.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    loss_N = -torch.minimum(ratio_N * adv_N, clipped_N * adv_N)
    with torch.no_grad():
        binds_N = (clipped_N * adv_N < ratio_N * adv_N).to(lp_N.dtype)
    metrics = {
        "loss_sum": loss_N.detach().sum(),
        "advantage_sum": adv_N.sum(),
        "ratio_clipped_sum": binds_N.sum(),
        "student_logprob_sum": lp_N.detach().sum(),
        "student_entropy_sum": metrics_N["student_entropy"].sum(),
        "tokens_count": count_loss_tokens(mask_B_T).to(lp_N.dtype),
    }
    return LossOutput(token_sum_over(loss_N, num_tokens), metrics)


def first_rows(student: torch.Tensor | StudentHidden, rows: int | None):
    """The student's logits (or head) cut to the vocabulary's first `rows` rows (None: all)."""
    if rows is None:
        return student
    if isinstance(student, StudentHidden):
        bias = None if student.bias_V is None else student.bias_V[:rows]
        return replace(student, weight_V_H=student.weight_V_H[:rows], bias_V=bias)
    return student[..., :rows]


def with_reward(loss_fn: LossFn, weight: float) -> LossFn:
    """`loss_fn` + weight x `grpo` on the same student output and options (the loop passes
    advantages_B for on-policy micro-batches; a micro-batch without them, an off-policy slice,
    gets `loss_fn` alone). weight 0 returns `loss_fn` itself: bit-identical to no reward.

    The reward term covers `reward_mask_B_T` (every sampled token; default `mask_B_T`, which a
    cross-tokenizer alignment narrows to the aligned tokens) over `reward_num_tokens` (that
    mask's count in the window across ranks; default `num_tokens`), each term a mean over its
    own tokens. Metrics: `loss_fn`'s, with distill_loss_sum and reward_loss_sum the parts,
    loss_sum their total per `num_tokens` token (the reward part rescaled by num_tokens /
    reward_num_tokens, so loss_sum / tokens is the loss), and the reward term's advantage_sum,
    ratio_clipped_sum and reward_tokens_count (its tokens: the reward sums' denominator)."""
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"the reward weight must be a finite number >= 0, got {weight}")
    if weight == 0:
        return loss_fn

    def combined(student, targets, mask_B_T, *, num_tokens, advantages_B=None,
                 reward_mask_B_T=None, reward_num_tokens=None, **opts):  # fmt: skip
        base = loss_fn(student, targets, mask_B_T, num_tokens=num_tokens, **opts)
        if advantages_B is None:
            return base
        mask = mask_B_T if reward_mask_B_T is None else reward_mask_B_T
        n = num_tokens if reward_num_tokens is None else reward_num_tokens
        pg = grpo(student, targets, mask, num_tokens=n, advantages_B=advantages_B, **opts)
        metrics = {**base.metrics, "distill_loss_sum": base.metrics["loss_sum"]}
        metrics["reward_loss_sum"] = pg.metrics["loss_sum"]
        scale = 1.0 if reward_num_tokens is None else num_tokens / reward_num_tokens
        metrics["loss_sum"] = base.metrics["loss_sum"] + weight * scale * pg.metrics["loss_sum"]
        for k in ("advantage_sum", "ratio_clipped_sum"):
            metrics[k] = pg.metrics[k]
        metrics["reward_tokens_count"] = pg.metrics["tokens_count"]
        return LossOutput(base.loss + weight * pg.loss, metrics)

    combined.__doc__ = f"{loss_fn.__doc__ or ''} + {weight:g} x grpo (a task's reward)"
    combined.__name__ = f"{getattr(loss_fn, '__name__', 'loss')}_with_reward"
    return combined
