"""Merging per-token distributions inside an aligned group, and sparse projection (torch only).

Chain-rule merge. A group is predicted at positions p_1..p_k of one model with realized tokens
x_1..x_k; over the candidates y for its last token the merged log-vector is
    m(y) = sum_{i<k} log P_{p_i}(x_i) + log P_{p_k}(y)
the log joint probability of the group's realized prefix followed by y, exact for EVERY y
(TRL's "bayesian" merge, PR #5905); m(x_k) is the log-probability of the group's whole byte
string. TRL's default "observed" merge instead multiplies the FIRST position's distribution by
the later realized probabilities, P_{p_1}(y) · prod_{i>1} P_{p_i}(x_i), which is exact only for
the realized token (TRL issue #5152); we deliberately do not offer it.

Sparse projection. A table (teacher_ids_K, student_ids_K) says which student token would come
next if the teacher emitted each listed token; the teacher distribution becomes one over
student tokens, renormalised over the table (we condition on the bytes the student already
emitted): pi(s) = sum_{k: student_ids_K[k]=s} P_T(teacher_ids_K[k]) / sum_k P_T(teacher_ids_K[k]).

Positions are *predicting* positions of shifted log-probs (see `distil.types.AlignmentGroups`);
per-group position/token lists are left-packed and padded with -1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _normalized_rows(rows_n_V: torch.Tensor, ratio: float) -> torch.Tensor:
    """Rows in fp32, re-tempered exactly when ratio != 1: log_softmax(logp · ratio)."""
    rows_n_V = _upcast(rows_n_V)
    return rows_n_V if ratio == 1.0 else torch.log_softmax(rows_n_V * ratio, dim=-1)


def group_sizes(pos_G_L: torch.Tensor) -> torch.Tensor:
    """Number of valid (non -1) entries of each group, (G,)."""
    return (pos_G_L >= 0).sum(dim=1)


def last_entries(pos_G_L: torch.Tensor, tok_G_L: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pos_G, tok_G) of each group's last valid entry (groups must not be empty)."""
    last = (group_sizes(pos_G_L) - 1).clamp_min(0)[:, None]
    return pos_G_L.gather(1, last).squeeze(1), tok_G_L.gather(1, last).squeeze(1)


def realized_logprobs(
    logprobs_B_T_V: torch.Tensor,
    row_G: torch.Tensor,
    pos_G_L: torch.Tensor,
    tok_G_L: torch.Tensor,
    *,
    ratio: float = 1.0,
) -> torch.Tensor:
    """(G, L): log P_{pos}(tok) at each group entry, 0 at padding; fp32.

    `ratio` = τ_t/τ re-tempers each touched row exactly first (log_softmax(logp · ratio)); only
    the rows of the groups' positions are read.
    """
    valid_G_L = pos_G_L >= 0
    rows_G_L = row_G[:, None].expand_as(pos_G_L)
    if ratio == 1.0:  # no normalisation needed: gather the entries directly
        lp = logprobs_B_T_V[rows_G_L, pos_G_L.clamp_min(0), tok_G_L.clamp_min(0)]
        return torch.where(valid_G_L, _upcast(lp), 0.0)
    rows_n_V = _normalized_rows(logprobs_B_T_V[rows_G_L[valid_G_L], pos_G_L[valid_G_L]], ratio)
    lp_n = rows_n_V.gather(1, tok_G_L[valid_G_L].long()[:, None]).squeeze(1)
    out = torch.zeros(pos_G_L.shape, dtype=lp_n.dtype, device=lp_n.device)
    return out.masked_scatter(valid_G_L, lp_n)


def group_logprob(
    logprobs_B_T_V: torch.Tensor,
    row_G: torch.Tensor,
    pos_G_L: torch.Tensor,
    tok_G_L: torch.Tensor,
    *,
    ratio: float = 1.0,
) -> torch.Tensor:
    """(G,): sum_i log P_{p_i}(x_i), the log-probability of each group's byte string."""
    return realized_logprobs(logprobs_B_T_V, row_G, pos_G_L, tok_G_L, ratio=ratio).sum(dim=1)


def merge_parts(
    logprobs_B_T_V: torch.Tensor,
    row_G: torch.Tensor,
    pos_G_L: torch.Tensor,
    tok_G_L: torch.Tensor,
    *,
    ratio: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix_G, last_G_V) with merged m(y) = prefix_G + last_G_V[y].

    prefix_G = sum_{i<k} log P_{p_i}(x_i) (0 for one-token groups), last_G_V = log P_{p_k}(·).
    Keeping the two apart lets a loss use the exact total mass exp(prefix) of the merged
    vector (the last row is normalised) instead of re-summing it.
    """
    lp_G_L = realized_logprobs(logprobs_B_T_V, row_G, pos_G_L, tok_G_L, ratio=ratio)
    size_G = group_sizes(pos_G_L)
    before_last = torch.arange(pos_G_L.shape[1], device=pos_G_L.device)[None] < size_G[:, None] - 1
    prefix_G = torch.where(before_last, lp_G_L, 0.0).sum(dim=1)
    last_pos_G, _ = last_entries(pos_G_L, tok_G_L)
    last_G_V = _normalized_rows(logprobs_B_T_V[row_G, last_pos_G], ratio)
    return prefix_G, last_G_V


def merge_groups(
    logprobs_B_T_V: torch.Tensor,
    row_G: torch.Tensor,
    pos_G_L: torch.Tensor,
    tok_G_L: torch.Tensor,
    *,
    ratio: float = 1.0,
) -> torch.Tensor:
    """merged_G_V: m(y) = sum_{i<k} log P_{p_i}(x_i) + log P_{p_k}(y), chain rule, every y.

    logprobs_B_T_V: shifted log-probs; row_G: each group's row; pos_G_L / tok_G_L: predicting
    positions and realized ids, left-packed, -1 padded; ratio: exact re-tempering (see above).
    """
    prefix_G, last_G_V = merge_parts(logprobs_B_T_V, row_G, pos_G_L, tok_G_L, ratio=ratio)
    return prefix_G[:, None] + last_G_V


class Projection(NamedTuple):
    """A teacher distribution carried over to student tokens through one table.

    support_ids_U: the distinct student ids of the table (sorted); logprobs_N_U: log pi over
    them, each row sums to 1 minus the ambiguous share (rows with no teacher mass on the table
    are -inf: check `log_mass_N`); log_mass_N: log sum_k P_T(teacher_ids_K[k]), the teacher
    mass the table covers (the conditioning event); log_ambiguous_N: log of the share of that
    mass on entries whose student id is -1 (the next student token is not determined).
    """

    support_ids_U: torch.Tensor
    logprobs_N_U: torch.Tensor
    log_mass_N: torch.Tensor
    log_ambiguous_N: torch.Tensor | None = None  # log share of the mass on AMBIGUOUS entries


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    """log x with log 0 = -inf and a zero (not NaN) gradient there."""
    pos = x > 0
    return torch.where(pos, torch.log(torch.where(pos, x, 1.0)), float("-inf"))


def grouped_logsumexp(x_N_K: torch.Tensor, slot_K: torch.Tensor, num_slots: int) -> torch.Tensor:
    """(N, U): logsumexp of x over the columns k with slot_K[k] == u, for every u.

    Each slot is shifted by its own maximum, so a slot of tiny log-probs (-200) keeps its value
    instead of underflowing against the row's largest entry (which a per-row shift would do,
    turning a finite reverse KL into an infinite one).
    """
    n = x_N_K.shape[0]
    index_N_K = slot_K[None].expand(n, -1)
    shift_N_U = torch.full((n, num_slots), float("-inf"), dtype=x_N_K.dtype, device=x_N_K.device)
    shift_N_U = shift_N_U.scatter_reduce(1, index_N_K, x_N_K.detach(), "amax", include_self=False)
    shift_N_U = torch.where(torch.isneginf(shift_N_U), 0.0, shift_N_U)  # any shift is exact
    terms_N_K = torch.exp(x_N_K - shift_N_U.gather(1, index_N_K))
    total_N_U = torch.zeros_like(shift_N_U).scatter_add(1, index_N_K, terms_N_K)
    return shift_N_U + _safe_log(total_N_U)


def project_teacher(
    teacher_logprobs_N_Vt: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]
) -> Projection:
    """pi over student tokens for N teacher rows that share one (teacher_ids_K, student_ids_K).

    pi(s) = sum_{k: student_ids_K[k]=s} P_T(teacher_ids_K[k]) / sum_k P_T(teacher_ids_K[k]).
    The table is a map: each teacher id appears once (several may lead to one student id).
    """
    teacher_ids_K, student_ids_K = table
    lp_N_K = _upcast(teacher_logprobs_N_Vt).index_select(1, teacher_ids_K.long())
    zeros_K = torch.zeros_like(student_ids_K.long())
    log_mass_N = grouped_logsumexp(lp_N_K, zeros_K, 1).squeeze(1)  # all -inf (or K=0) -> -inf
    norm_N = torch.where(torch.isneginf(log_mass_N), 0.0, log_mass_N)[:, None]
    known = student_ids_K >= 0
    support_U, slot_K = torch.unique(student_ids_K[known].long(), return_inverse=True)
    log_U = grouped_logsumexp(lp_N_K[:, known], slot_K, int(support_U.numel()))
    log_amb = grouped_logsumexp(lp_N_K[:, ~known], zeros_K[~known], 1).squeeze(1)
    return Projection(support_U, log_U - norm_N, log_mass_N, log_amb - norm_N.squeeze(1))


# ----------------------------------------------------------------------------- padded tables
# The tables of one batch are few (tens) and small; padding them to one tensor lets a loss
# handle every row of a chunk in one gather/scatter instead of a Python loop over tables.


class PaddedPairs(NamedTuple):
    """Pair tables (a_P, b_P) stacked and -1 padded: a_T_P, b_T_P (long), valid_T_P (bool)."""

    a_T_P: torch.Tensor
    b_T_P: torch.Tensor
    valid_T_P: torch.Tensor


def pad_pairs(tables: list[tuple[torch.Tensor, torch.Tensor]]) -> PaddedPairs:
    """Stack (a_P, b_P) tables of different lengths; padding is -1 and valid=False."""
    width = max([int(a.numel()) for a, _ in tables] + [1])
    device = tables[0][0].device if tables else None
    a = torch.full((len(tables), width), -1, dtype=torch.long, device=device)
    b = torch.full_like(a, -1)
    for t, (x, y) in enumerate(tables):
        a[t, : x.numel()] = x.long()
        b[t, : y.numel()] = y.long()
    valid = (
        torch.arange(width, device=device)[None]
        < torch.tensor([int(x.numel()) for x, _ in tables], device=device)[:, None]
    )
    return PaddedPairs(a, b, valid)


class PaddedProjection(NamedTuple):
    """Projection tables ready for `project_rows`.

    teacher_T_K: teacher ids (0 where padded); slot_T_K: each pair's student support slot in
    [0, U), U for an AMBIGUOUS pair (student id -1), U + 1 for padding; support_T_U: the
    distinct student ids of each table (0 where padded), support_valid_T_U.
    """

    teacher_T_K: torch.Tensor
    slot_T_K: torch.Tensor
    support_T_U: torch.Tensor
    support_valid_T_U: torch.Tensor


def pad_projection(tables: list[tuple[torch.Tensor, torch.Tensor]]) -> PaddedProjection:
    pairs = pad_pairs(tables)
    supports = [torch.unique(s[s >= 0].long()) for _, s in tables]
    width_u = max([int(u.numel()) for u in supports] + [1])
    slot = torch.full_like(pairs.a_T_P, width_u + 1)
    support = torch.zeros((len(tables), width_u), dtype=torch.long, device=pairs.a_T_P.device)
    support_valid = torch.zeros_like(support, dtype=torch.bool)
    for t, (_, s) in enumerate(tables):
        s = s.long()
        slot[t, : s.numel()] = torch.where(
            s >= 0, torch.searchsorted(supports[t], s.clamp_min(0)), width_u
        )
        support[t, : supports[t].numel()] = supports[t]
        support_valid[t, : supports[t].numel()] = True
    return PaddedProjection(pairs.a_T_P.clamp_min(0), slot, support, support_valid)


def grouped_logsumexp_rows(x_N_K: torch.Tensor, index_N_K: torch.Tensor, num_slots: int):
    """(N, S): logsumexp of each row's x over the columns with index == s (per-row indices),
    each slot shifted by its own maximum (see `grouped_logsumexp`)."""
    n = x_N_K.shape[0]
    shift = torch.full((n, num_slots), float("-inf"), dtype=x_N_K.dtype, device=x_N_K.device)
    shift = shift.scatter_reduce(1, index_N_K, x_N_K.detach(), "amax", include_self=False)
    shift = torch.where(torch.isneginf(shift), 0.0, shift)
    terms = torch.exp(x_N_K - shift.gather(1, index_N_K))
    total = torch.zeros_like(shift).scatter_add(1, index_N_K, terms)
    return shift + _safe_log(total)


class RowProjection(NamedTuple):
    """`project_teacher` for rows with their own tables: log pi over each row's support
    (-inf where padded), the ambiguous share and the table's teacher mass, all per row."""

    support_ids_N_U: torch.Tensor
    support_valid_N_U: torch.Tensor
    logprobs_N_U: torch.Tensor
    log_ambiguous_N: torch.Tensor
    log_mass_N: torch.Tensor


def project_rows(
    teacher_logprobs_N_Vt: torch.Tensor, padded: PaddedProjection, table_N: torch.Tensor
) -> RowProjection:
    """pi_n(s) = sum_{k: student(k) = s} P_T(t_k) / sum_k P_T(t_k) over row n's table."""
    slot = padded.slot_T_K[table_N]
    width_u = padded.support_T_U.shape[1]
    lp = _upcast(teacher_logprobs_N_Vt).gather(1, padded.teacher_T_K[table_N])
    lp = torch.where(slot == width_u + 1, float("-inf"), lp)  # padding carries no mass
    per_slot = grouped_logsumexp_rows(lp, slot, width_u + 2)
    log_mass = grouped_logsumexp_rows(lp, torch.zeros_like(slot), 1).squeeze(1)
    norm = torch.where(torch.isneginf(log_mass), 0.0, log_mass)
    valid = padded.support_valid_T_U[table_N]
    log_u = torch.where(valid, per_slot[:, :width_u] - norm[:, None], float("-inf"))
    return RowProjection(
        padded.support_T_U[table_N], valid, log_u, per_slot[:, width_u] - norm, log_mass
    )
