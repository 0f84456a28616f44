"""ULD: sorted-probability L1 between the merged group distributions (Boizard et al. 2024).

Per aligned group g, each side's chain-rule merged vector m(y) = sum_{i<k} log P(x_i) +
log P_{p_k}(y) (`distil.align.project`) over its own vocabulary, then
    loss_g = sum_r |sort_desc(exp m_S)_r - sort_desc(exp m_T)_r|    (shorter side zero-padded)
summed over groups / num_tokens. Sorting makes the distance blind to which token is which, so
it needs no vocabulary map (and learns only the shape of the distribution). TRL merges with
the "observed" rule by default (exact for the realized token only, see `distil.align.project`)
and averages over groups then examples; we use the exact chain rule and the window's token
count.

The two passes over the student shared with `gold`: (A) log S(x_i) at every group position but
the last, summed per group into the prefix; (B) the full row at each group's last position,
where `group_fn` compares the student's and the teacher's merged vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from distil.align.project import last_entries, merge_parts
from distil.losses.aligned import (
    Kept,
    check_inputs,
    finish,
    keep_groups,
    realized_rows,
    run_positions,
)
from distil.losses.chunked import StudentHidden
from distil.losses.divergences import gather_rows
from distil.losses.registry import register
from distil.types import AlignmentGroups, LossOutput, TeacherTargets


class Merged(NamedTuple):
    """A merged group vector m(y) = prefix_n + last_n_V[y]; last_n_V is a normalised row."""

    prefix_n: torch.Tensor
    last_n_V: torch.Tensor

    def log_merged(self) -> torch.Tensor:
        return self.prefix_n[:, None] + self.last_n_V

    def rows(self, sl: slice) -> Merged:
        return Merged(self.prefix_n[sl], self.last_n_V[sl])


# group_fn(student, teacher, group_index_n, kept) -> (loss_n, {metric: detached values_n})
GroupFn = Callable[
    [Merged, Merged, torch.Tensor, Kept], tuple[torch.Tensor, dict[str, torch.Tensor]]
]


def sorted_l1(p_N_A: torch.Tensor, q_N_B: torch.Tensor) -> torch.Tensor:
    """sum_r |sort_desc(p)_r - sort_desc(q)_r| per row, the shorter row zero-padded."""
    a = p_N_A.sort(dim=-1, descending=True).values
    b = q_N_B.sort(dim=-1, descending=True).values
    n = min(a.shape[-1], b.shape[-1])
    # past the shorter length the padded side is 0, so |a - 0| = a (probabilities are >= 0)
    return (a[:, :n] - b[:, :n]).abs().sum(-1) + a[:, n:].sum(-1) + b[:, n:].sum(-1)


def _last_rows(group_fn: GroupFn, teacher_B_T_V, kept: Kept, ratio, s_n_V, g_n, prefix_n, tok_n):
    with torch.no_grad():
        t_pos, t_tok = kept.teacher_pos_G_T[g_n], kept.teacher_tok_G_T[g_n]
        t_prefix, t_last = merge_parts(teacher_B_T_V, kept.row_G[g_n], t_pos, t_tok, ratio=ratio)
        _, t_last_tok = last_entries(t_pos, t_tok)
    student, teacher = Merged(prefix_n, s_n_V), Merged(t_prefix.to(s_n_V.dtype), t_last)
    loss_n, metrics = group_fn(student, teacher, g_n, kept)
    metrics = {
        **metrics,
        "student_logprob": prefix_n.detach() + gather_rows(s_n_V.detach(), tok_n),  # log S(g)
        "teacher_logprob": t_prefix + gather_rows(t_last, t_last_tok.long()),  # log T(g)
    }
    return loss_n, metrics


def merged_group_loss(
    group_fn: GroupFn,
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    alignment: AlignmentGroups,
    *,
    num_tokens,
    temperature: float,
    targets_temperature: float,
    chunk_size: int | None,
    ce_weight: float,
) -> LossOutput:
    """Pass A (prefix log-probs) and pass B (`group_fn` at each group's last position).
    Returns sum_g loss_g / num_tokens and metrics.
    """
    kept = keep_groups(alignment, mask_B_T)
    ratio = targets_temperature / temperature
    common = dict(temperature=temperature, chunk_size=chunk_size, ce_weight=ce_weight)
    # pass A: log S(x_i) for i < k, summed per group: the student's prefix of m_S
    g_A, row_A, pos_A, tok_A = kept.student_entries(drop_last=True)
    lp_A, metrics_A, ce_A = run_positions(
        student, row_A, pos_A, realized_rows, mask_B_T, extras=(tok_A,), labels_N=tok_A, **common
    )
    prefix_G = lp_A.new_zeros(kept.num).index_add(0, g_A, lp_A)
    # pass B: the full row at the last position of each group, against the teacher's merge
    last_pos_G, last_tok_G = last_entries(kept.student_pos_G_S, kept.student_tok_G_S)
    group_G = torch.arange(kept.num, device=last_pos_G.device)
    last_tok = last_tok_G.long()
    fn = partial(_last_rows, group_fn, targets.logprobs_B_T_V, kept, ratio)
    loss_G, metrics_B, ce_B = run_positions(
        student,
        kept.row_G,
        last_pos_G,
        fn,
        mask_B_T,
        extras=(group_G, prefix_G, last_tok),
        labels_N=last_tok,
        **common,
    )
    total = loss_G.sum()
    if ce_weight:
        total = total + ce_weight * (ce_A.sum() + ce_B.sum())
    return finish(total, num_tokens, [metrics_A, metrics_B], mask_B_T, kept)


def _uld_groups(student: Merged, teacher: Merged, g_n: torch.Tensor, kept: Kept):
    return sorted_l1(student.log_merged().exp(), teacher.log_merged().exp()), {}


@register("uld")
def uld(
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
    """ULD: sorted-probability L1 between merged group vectors (cross-tokenizer, no vocab map)."""
    check_inputs("uld", targets, alignment, temperature, targets_temperature)
    return merged_group_loss(
        _uld_groups,
        student,
        targets,
        mask_B_T,
        alignment,
        num_tokens=num_tokens,
        temperature=temperature,
        targets_temperature=targets_temperature,
        chunk_size=chunk_size,
        ce_weight=ce_weight,
    )
