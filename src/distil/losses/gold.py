"""GOLD's hybrid cross-tokenizer loss, done right: matched-candidate JSD + unmatched sorted L1.

Per aligned group g, with chain-rule merged vectors m_S, m_T (`distil.align.project`) and the
pair table (student_ids_P, teacher_ids_P) = match_tables[match_table_G[g]] of candidates that
spell the same bytes on both sides:
  matched    JSD_β over P+1 categories on each side: [exp m(ids_P), rest], rest = 1 - sum of
             the matched (unmatched candidates and other prefixes), so both are distributions
  unmatched  sorted L1 (`uld.sorted_l1`) between exp m over the candidates outside the table
  loss_g = w_m · matched + w_u · unmatched; fixed weights (matched_weight, unmatched_weight),
             or per group w_m = sum_matched T~ / sum_all T~ (detached), w_u = 1 - w_m
summed over groups / num_tokens. With one tokenizer (identity table, 1:1 groups) the unmatched
sets are empty, both rests are 0 and the loss is exactly `jsd`.

Deviations from TRL's `_compute_hybrid_uld_loss`, on purpose: TRL takes the JSD of the
*unnormalised* matched sub-vectors (logs clamped at 1e-8: not a divergence, its forward KL can
be negative) and its adaptive weight is |matched vocab| / V_teacher, a constant set by
vocabulary overlap rather than by where the teacher's probability mass is; it also merges with
the "observed" rule. NeMo RL's gold loss (`_compute_gold`) likewise compares unnormalised
chunk-averaged log-probs.
"""

from __future__ import annotations

from functools import partial

import torch

from distil.align.project import PaddedPairs, pad_pairs
from distil.errors import ConfigError
from distil.losses.aligned import Kept, check_inputs
from distil.losses.chunked import StudentHidden
from distil.losses.divergences import divergence_rows, log1mexp
from distil.losses.registry import register
from distil.losses.topk import REST_LOGPROB_FLOOR, safe_logsumexp
from distil.losses.uld import Merged, merged_group_loss
from distil.types import AlignmentGroups, LossOutput, TeacherTargets


def log_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(e^a + e^b), NaN-free in value and gradient when one or both are -inf."""
    hi = torch.maximum(a, b)
    hi = torch.where(torch.isneginf(hi), 0.0, hi).detach()  # any shift is exact
    total = torch.exp(a - hi) + torch.exp(b - hi)
    nonzero = total > 0
    return torch.where(nonzero, hi + torch.log(torch.where(nonzero, total, 1.0)), float("-inf"))


def matched_buckets(merged: Merged, ids_n_P: torch.Tensor, valid_n_P: torch.Tensor):
    """(buckets_n_C, unmatched_last_n_V): log [exp m(ids), rest] (C = P+1), and the last row's
    log-probs off the table (-inf on it; m off the table is prefix_n + these).

    Each row has its own table (ids_n_P, padded with any id where valid_n_P is False: padded
    buckets are -inf on both sides and add nothing). rest = 1 - sum_matched e^m = (1 - e^prefix) +
    e^prefix · sum_unmatched P_last (the last row sums to 1): both terms keep full precision
    when the matched mass is close to 1, and an empty rest is floored like topk.py's, so it adds
    exactly 0 when empty on both sides. One bool (n, V + 1) marks the table (padded entries
    point at the extra column) and one (n, V) row holds the masked log-probs.
    """
    V = merged.last_n_V.shape[1]
    ids = ids_n_P
    matched_n_P = merged.prefix_n[:, None] + merged.last_n_V.gather(1, ids)
    matched_n_P = torch.where(valid_n_P, matched_n_P, float("-inf"))
    on_table = merged.last_n_V.new_zeros((len(ids), V + 1), dtype=torch.bool)
    on_table.scatter_(1, torch.where(valid_n_P, ids, V), True)
    unmatched_last = merged.last_n_V.masked_fill(on_table[:, :V], float("-inf"))
    del on_table
    rest_n = log_add(log1mexp(merged.prefix_n), merged.prefix_n + safe_logsumexp(unmatched_last))
    rest_n = rest_n.clamp_min(REST_LOGPROB_FLOOR)
    buckets = torch.cat([matched_n_P, rest_n[:, None]], dim=1)
    return buckets, unmatched_last


SORT_ROWS = 16  # rows sorted at a time: their int64 sort indices are all that exists at once


class _SortedL1(torch.autograd.Function):
    """`uld.sorted_l1(p, q)` (the shorter row zero-padded), q without gradient. Rows are sorted
    SORT_ROWS at a time; saved for backward: the sort order as int32 and the signs as int8 (5
    bytes an entry), where autograd's sort, sub and abs keep int64 indices and fp32 rows (16
    bytes an entry and more): d/dp_i = sign(p_(r) - q_(r)) at i's rank r, and 1 past q's width
    (as `sorted_l1`)."""

    @staticmethod
    def forward(ctx, p_N_A: torch.Tensor, q_N_B: torch.Tensor) -> torch.Tensor:
        N, A = p_N_A.shape
        n = min(A, q_N_B.shape[1])
        order = torch.empty((N, A), dtype=torch.int32, device=p_N_A.device)
        sign = torch.ones((N, A), dtype=torch.int8, device=p_N_A.device)
        out = p_N_A.new_empty(N)
        for s in range(0, N, SORT_ROWS):
            rows = slice(s, s + SORT_ROWS)
            p_sorted, idx = p_N_A[rows].sort(dim=-1, descending=True)
            order[rows] = idx
            del idx
            q_sorted = q_N_B[rows].sort(dim=-1, descending=True).values
            tails = p_sorted[:, n:].sum(-1) + q_sorted[:, n:].sum(-1)
            diff = p_sorted[:, :n].sub_(q_sorted[:, :n])
            sign[rows, :n] = diff.sign()
            out[rows] = diff.abs_().sum(-1) + tails
        ctx.save_for_backward(order, sign)
        return out

    @staticmethod
    def backward(ctx, grad_N: torch.Tensor):
        order, sign = ctx.saved_tensors
        grad_sorted = sign.to(grad_N.dtype).mul_(grad_N[:, None])
        grad_p = torch.empty_like(grad_sorted).scatter_(1, order.long(), grad_sorted)
        return grad_p, None


def unmatched_l1(s_prefix_n, s_last_n_V, t_prefix_n, t_last_n_V) -> torch.Tensor:
    """Sorted L1 between e^(prefix + last) of each side over its candidates off the table
    (-inf entries are 0 and sort last), as `uld.sorted_l1`; the teacher's side without grad."""
    p = (s_prefix_n[:, None] + s_last_n_V).exp()
    with torch.no_grad():
        q = (t_prefix_n[:, None] + t_last_n_V).exp_()
    return _SortedL1.apply(p, q)


def _gold_groups(
    pairs: PaddedPairs, beta, weights, student: Merged, teacher: Merged, g_n, kept: Kept
):
    """Every group of a chunk at once, each with its own candidate table."""
    table_n = kept.match_table_G[g_n]
    valid = pairs.valid_T_P[table_n]
    s_C, s_un = matched_buckets(student, pairs.a_T_P[table_n], valid)
    t_C, t_un = matched_buckets(teacher, pairs.b_T_P[table_n], valid)
    matched_n = divergence_rows("jsd", s_C, t_C, beta)
    unmatched_n = unmatched_l1(student.prefix_n, s_un, teacher.prefix_n, t_un)
    del s_un, t_un
    with torch.no_grad():  # share of the teacher's merged mass on the table (prefix cancels)
        t_last = teacher.last_n_V.gather(1, pairs.b_T_P[table_n])
        t_last = torch.where(valid, t_last, float("-inf"))
        mass_n = safe_logsumexp(t_last).exp().clamp(0.0, 1.0).to(matched_n.dtype)
    w_m, w_u = (mass_n, 1.0 - mass_n) if weights is None else weights
    loss_n = w_m * matched_n + w_u * unmatched_n
    metrics = {
        "matched": matched_n.detach(),
        "unmatched": unmatched_n.detach(),
        "matched_mass": mass_n,
    }
    return loss_n, metrics


def _weights(matched_weight, unmatched_weight) -> tuple[float, float] | None:
    if matched_weight is None and unmatched_weight is None:
        return None  # adaptive: the teacher's matched mass per group
    if (
        matched_weight is None
        or unmatched_weight is None
        or min(matched_weight, unmatched_weight) < 0
    ):
        raise ConfigError(
            f"gold weights matched_weight={matched_weight}, unmatched_weight={unmatched_weight}: "
            "give both (>= 0) for fixed weights, or neither for per-group weights from the "
            "teacher's matched mass"
        )
    return float(matched_weight), float(unmatched_weight)


@register("gold")
def gold(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    alignment: AlignmentGroups | None = None,
    temperature: float = 1.0,
    targets_temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    matched_weight: float | None = None,
    unmatched_weight: float | None = None,
    ce_weight: float = 0.0,
    **unused,
) -> LossOutput:
    """GOLD hybrid: JSD(β) on byte-matched candidates + a rest bucket, sorted L1 on the others.

    Extra metrics: matched_sum, unmatched_sum (unweighted per-group terms), matched_mass_sum
    (the teacher's merged mass on matched candidates, the adaptive w_m).
    """
    check_inputs("gold", targets, alignment, temperature, targets_temperature, beta)
    weights = _weights(matched_weight, unmatched_weight)
    if chunk_size is not None:  # about twice aligned_kl's full-width temporaries per row
        chunk_size = max(1, chunk_size * 2 // 3)  # (matched buckets of ~|V| pairs, the sorts)
    pairs = pad_pairs(alignment.match_tables)  # -1 padded; padded entries are masked anyway
    pairs = pairs._replace(a_T_P=pairs.a_T_P.clamp_min(0), b_T_P=pairs.b_T_P.clamp_min(0))
    return merged_group_loss(
        partial(_gold_groups, pairs, float(beta), weights),
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
