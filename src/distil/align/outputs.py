"""The tensors of `AlignmentGroups` shaped from a batch's groups in compiled passes.

`group_spans` gives each group's `GroupSpans` fields (row, first token and length of each
side) and the (B, C_max) in-group mask in one pass over the groups; `renumber` maps the cache's
table ids to the few tables a batch uses. `finish` runs them and `group_keys.projection_entries` as
one compiled call: each call into compiled code costs a few microseconds more when its code and
data were evicted by other work (as in a collator between steps), so the tail of a batch build
is one call, not four. `padded_cpu` expands spans into the padded (G, width) position and id
tensors of both sides on the CPU, writing every output cell once (no fill, then overwrite);
`batch` hands it to each `GroupSpans` it builds.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from distil.align.group_keys import projection_entries


@numba.njit(cache=True)
def group_spans(g, s_off, t_off, covered):  # pragma: no cover - compiled
    """From `walk.align_rows`' groups g (G, 5) (row, s0, s1, t0, t1): the `GroupSpans` fields
    (row, student first (flat over the rows at s_off) and length, teacher first and length,
    each int64 (G,)) and in_group bool (B, C_max): row b's completion token j is inside a
    group (`covered`, flat over the rows at s_off)."""
    n_g, n_rows = g.shape[0], s_off.shape[0] - 1
    row, s_first, s_len = np.empty(n_g, np.int64), np.empty(n_g, np.int64), np.empty(n_g, np.int64)
    t_first, t_len = np.empty(n_g, np.int64), np.empty(n_g, np.int64)
    for q in range(n_g):
        b = g[q, 0]
        row[q], s_first[q], s_len[q] = b, s_off[b] + g[q, 1], g[q, 2] - g[q, 1]
        t_first[q], t_len[q] = t_off[b] + g[q, 3], g[q, 4] - g[q, 3]
    width = 0
    for b in range(n_rows):
        width = max(width, s_off[b + 1] - s_off[b])
    in_group = np.zeros((n_rows, width), np.bool_)
    for b in range(n_rows):
        for k in range(s_off[b], s_off[b + 1]):
            in_group[b, k - s_off[b]] = covered[k]
    return row, s_first, s_len, t_first, t_len, in_group


def padded_cpu(spans, row_G: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`GroupSpans.padded` on the CPU: (student_pos_G_S, student_tok_G_S, teacher_pos_G_T,
    teacher_tok_G_T) in one compiled pass."""
    arrays = [
        x.numpy()
        for x in (row_G, spans.student_first_G, spans.student_len_G, spans.student_ids_R_L,
                  spans.student_idrow_B, spans.student_shift_B, spans.teacher_first_G,
                  spans.teacher_len_G, spans.teacher_ids_R_L, spans.teacher_idrow_B,
                  spans.teacher_shift_B)
    ]  # fmt: skip
    return tuple(map(torch.from_numpy, _padded(*arrays)))


@numba.njit(cache=True)
def _width(length):  # pragma: no cover - compiled
    width = 1
    for q in range(length.shape[0]):
        width = max(width, length[q])
    return width


@numba.njit(cache=True)
def _padded(row, s_first, s_len, s_ids, s_idrow, s_shift, t_first, t_len, t_ids, t_idrow, t_shift):
    # pragma: no cover - compiled
    n_g = row.shape[0]
    s_w, t_w = _width(s_len), _width(t_len)
    # one allocation for the four outputs (contiguous views of it): several large blocks freed
    # together can exceed the allocator's trim threshold and come back as fresh pages, whose
    # faults cost more than writing them (~1 us per 4 KiB page: 0.9 ms at G = 14k, width 11)
    size_s, size_t = n_g * s_w, n_g * t_w  # cells of each side's (G, width) tensors
    block = np.empty(2 * size_s + 2 * size_t, np.int64)
    s_pos = block[:size_s].reshape(n_g, s_w)
    s_tok = block[size_s : 2 * size_s].reshape(n_g, s_w)
    t_pos = block[2 * size_s : 2 * size_s + size_t].reshape(n_g, t_w)
    t_tok = block[2 * size_s + size_t :].reshape(n_g, t_w)
    for q in range(n_g):
        b, a, n_s, c, n_t = row[q], s_first[q], s_len[q], t_first[q], t_len[q]
        sr, tr = s_idrow[b], t_idrow[b]
        for i in range(s_w):  # predicting positions, ids; -1 after the group's tokens
            s_pos[q, i] = a + i + s_shift[b] if i < n_s else -1
            s_tok[q, i] = s_ids[sr, a + i] if i < n_s else -1
        for i in range(t_w):
            t_pos[q, i] = c + i + t_shift[b] if i < n_t else -1
            t_tok[q, i] = t_ids[tr, c + i] if i < n_t else -1
    return s_pos, s_tok, t_pos, t_tok


@numba.njit(cache=True)
def renumber(ids, n_tables):  # pragma: no cover - compiled
    """(local int64 (N,), used int64 (U,)): the cache ids `ids` renumbered over the tables they
    use, in cache order, table 0 always kept as local 0. `ids` is overwritten with `local`."""
    local_of = np.full(n_tables, -1, np.int64)
    local_of[0] = 0
    for i in range(ids.shape[0]):
        local_of[ids[i]] = 0
    n = 0
    for t in range(n_tables):
        if local_of[t] >= 0:
            local_of[t] = n
            n += 1
    used = np.empty(n, np.int64)
    for t in range(n_tables):
        if local_of[t] >= 0:
            used[local_of[t]] = t
    for i in range(ids.shape[0]):
        ids[i] = local_of[ids[i]]
    return ids, used


@numba.njit(cache=True)
def finish(
    g, s_off, t_off, covered, match_G, n_match, e_row, e_s, e_t, e_plain, e_fits, proj_E,
    n_proj, empty_ids, exact,
):  # fmt: skip  # pragma: no cover - compiled
    """`projection_entries`, `renumber` of both table lists and `group_spans` in one call:
    (row, s_first, s_len, t_first, t_len, in_group, match_local, match_used, p_row, p_s, p_t,
    proj_local, proj_used, n_covered, n_inexact): n_covered student tokens in groups, n_inexact
    groups not exact. empty_ids: the empty projection tables' cache ids."""
    empty = np.zeros(n_proj, np.bool_)
    for i in range(empty_ids.shape[0]):
        empty[empty_ids[i]] = True
    p_row, p_s, p_t, p_table = projection_entries(e_row, e_s, e_t, e_plain, e_fits, proj_E, empty)
    match_local, match_used = renumber(match_G, n_match)
    proj_local, proj_used = renumber(p_table, n_proj)
    row, s_first, s_len, t_first, t_len, in_group = group_spans(g, s_off, t_off, covered)
    n_covered = n_inexact = 0
    for k in range(covered.shape[0]):
        n_covered += covered[k]
    for q in range(exact.shape[0]):
        n_inexact += not exact[q]
    return (
        row, s_first, s_len, t_first, t_len, in_group, match_local, match_used,
        p_row, p_s, p_t, proj_local, proj_used, n_covered, n_inexact,
    )  # fmt: skip
