"""The tensors of `AlignmentGroups` shaped from a batch's groups in compiled passes.

`group_tensors` writes the padded (G, width) position and id tensors of both sides and the
(B, C_max) in-group mask in one pass over the groups; `renumber` maps the cache's table ids to
the few tables a batch uses. Each writes every output cell once (no fill, then overwrite).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _width(start, stop):  # pragma: no cover - compiled
    width = 1
    for q in range(start.shape[0]):
        width = max(width, stop[q] - start[q])
    return width


@numba.njit(cache=True)
def group_tensors(g, s_ids, s_off, s_offset, t_ids, t_off, t_offset, covered):
    # pragma: no cover - compiled
    """From `walk.align_rows`' groups g (G, 5) (row, s0, s1, t0, t1): (row (G,), s_pos, s_tok
    (G, S_w), t_pos, t_tok (G, T_w), in_group bool (B, C_max)). pos are predicting positions
    offset[row] - 1 + token index, padded with -1 (widths >= 1); in_group[b, j]: row b's
    completion token j is inside a group (`covered`, flat over the rows at s_off)."""
    n_g, n_rows = g.shape[0], s_off.shape[0] - 1
    s_pos = np.empty((n_g, _width(g[:, 1], g[:, 2])), np.int64)
    s_tok = np.empty_like(s_pos)
    t_pos = np.empty((n_g, _width(g[:, 3], g[:, 4])), np.int64)
    t_tok = np.empty_like(t_pos)
    row = np.empty(n_g, np.int64)
    for q in range(n_g):
        b = g[q, 0]
        row[q] = b
        s0, n_s, t0, n_t = g[q, 1], g[q, 2] - g[q, 1], g[q, 3], g[q, 4] - g[q, 3]
        for i in range(s_pos.shape[1]):  # predicting positions offset - 1 + index, ids; -1 after
            s_pos[q, i] = s_offset[b] - 1 + s0 + i if i < n_s else -1
            s_tok[q, i] = s_ids[s_off[b] + s0 + i] if i < n_s else -1
        for i in range(t_pos.shape[1]):
            t_pos[q, i] = t_offset[b] - 1 + t0 + i if i < n_t else -1
            t_tok[q, i] = t_ids[t_off[b] + t0 + i] if i < n_t else -1
    width = 0
    for b in range(n_rows):
        width = max(width, s_off[b + 1] - s_off[b])
    in_group = np.zeros((n_rows, width), np.bool_)
    for b in range(n_rows):
        for k in range(s_off[b], s_off[b + 1]):
            in_group[b, k - s_off[b]] = covered[k]
    return row, s_pos, s_tok, t_pos, t_tok, in_group


@numba.njit(cache=True)
def renumber(ids, n_tables):  # pragma: no cover - compiled
    """(local int64 (N,), used int64 (U,)): the cache ids `ids` renumbered over the tables they
    use, in cache order, table 0 always kept as local 0."""
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
    local = np.empty(ids.shape[0], np.int64)
    for i in range(ids.shape[0]):
        local[i] = local_of[ids[i]]
    return local, used
