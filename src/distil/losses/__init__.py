"""Distillation losses: pure functions over tensors, found by name in a registry.

Every loss is `fn(student, targets, mask_B_T, *, num_tokens, labels_B_T=None, temperature=1.0,
targets_temperature=1.0, beta=0.5, chunk_size=None, **unused) -> LossOutput`:

- `student` is the shifted logits (B, T, V) or a `StudentHidden` (hidden states + head) whose
  logits are computed chunk by chunk (`chunk_size` rows, checkpointed); `targets` are full or
  top-k + rest teacher log-probs (`TeacherTargets`); `mask_B_T` marks the loss positions.
- The loss is sum over loss tokens / `num_tokens`, the loss-token count of the whole optimizer
  window across ranks (`reduce.py`), so gradients do not depend on how the window is split.
- Options a loss does not use are ignored, so the loop passes one option dict to any loss.

Metrics are detached, per-token SUMS over this micro-batch's loss tokens (no `.item()`); the loop
adds them over the window and divides by the window's token count once. A name ending in
`_count` is a count and is not divided. Every loss reports:

  loss_sum             sum of the per-token loss (before dividing by num_tokens)
  kl_sum               per-token reverse KL(S‖T): exact for full targets, over the K+1 buckets for
                       top-k targets, the sampled estimate log S(x) - log T(x) for
                       `sampled_reverse_kl`
  student_entropy_sum  entropy of the student's tempered distribution
  student_logprob_sum  log S of the realized next token (only when labels_B_T is given)
  teacher_logprob_sum  log T of the realized next token (labels given): gathered from full
                       targets, or token_logprobs, or the top-k entry; for top-k targets without
                       token log-probs a token outside the top-k counts the rest bucket's
                       log-mass (an upper bound)
  teacher_topk_hit_sum top-k targets with labels: tokens whose label is in the teacher's top-k
  tokens_count         N, the number of loss tokens in this micro-batch

Registered: forward_kl, reverse_kl, jsd (dense or top-k + rest), sampled_reverse_kl, sft
(cross-entropy, no teacher), grpo (a task's reward, group-relative policy gradient, no teacher;
`with_reward` adds it to any on-policy loss), and the cross-tokenizer losses uld, gold,
aligned_kl and sampled_chunk_reverse_kl (they read the batch's AlignmentGroups).
"""

from __future__ import annotations

# each module registers its losses on import
from distil.losses import aligned, chunk_sampled, divergences, gold, reward, sampled, sft, uld  # noqa: F401
from distil.losses.chunked import Rows, RowsFn, StudentHidden, run_rowwise, select_rows
from distil.losses.reduce import count_loss_tokens, token_sum_over
from distil.losses.registry import (
    CROSS_TOKENIZER_LOSSES,
    LOSSES,
    TEACHERLESS_LOSSES,
    LossFn,
    describe,
    get_loss,
    is_cross_tokenizer,
    list_losses,
    needs_teacher,
    register,
    teacher_runs,
)
from distil.losses.reward import group_advantages, with_reward

__all__ = [
    "CROSS_TOKENIZER_LOSSES",
    "LOSSES",
    "TEACHERLESS_LOSSES",
    "LossFn",
    "Rows",
    "RowsFn",
    "StudentHidden",
    "count_loss_tokens",
    "describe",
    "get_loss",
    "group_advantages",
    "is_cross_tokenizer",
    "list_losses",
    "needs_teacher",
    "register",
    "run_rowwise",
    "select_rows",
    "teacher_runs",
    "token_sum_over",
    "with_reward",
]
