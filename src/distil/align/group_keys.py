"""Table keys of an aligned batch, as compiled passes over the groups of `walk.align_rows`.

`group_keys` gives each group its match-table key and each student token of a plain group its
projection entry (teacher position and remainder key) as (offset, length) slices of the student
bytes; `keys.KeyIndex` looks the keys of cached tables up in one pass and `keys.first_seen`
finds the distinct missing ones, so that Python runs once per new table, not per group or
token; `projection_entries` and `outputs.finish` shape the outputs.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def group_keys(g, exact, special, s_off, s_ends, sb_off, t_ends, t_off, s_offset, t_offset):
    # pragma: no cover - compiled
    """Table keys of a batch's groups (from `align_rows`).

    Per group: kind int8 (0: the whole-vocabulary table, 1: the empty table, 2: the delta
    table of key (flag = student_longer, s_bytes[off:off + len])). Per projection entry,
    ordered by row then student token: (row, student and teacher predicting positions
    (offset - 1 + token index), key offset, key length (0: table 0), fits, plain). A plain
    group (exact, not special) gives one entry per student token; any other group one entry
    at its first positions. The teacher token of an entry is the last one of the group
    starting at or before the student's point (ties go to the later token, which has seen any
    zero-length token before it)."""
    n_g = g.shape[0]
    kind = np.zeros(n_g, np.int8)
    flag = np.zeros(n_g, np.bool_)
    # key slices and the other intermediates int32 (read again by the lookups: half the memory
    # traffic of int64); the entries' row and positions are outputs, int64
    m_off = np.zeros(n_g, np.int32)
    m_len = np.zeros(n_g, np.int32)
    n_e = s_ends.shape[0]  # at most one entry per student token
    e_row = np.empty(n_e, np.int64)
    e_s = np.empty(n_e, np.int64)
    e_t = np.empty(n_e, np.int64)
    e_off = np.empty(n_e, np.int32)
    e_len = np.empty(n_e, np.int32)
    e_fits = np.empty(n_e, np.bool_)
    e_plain = np.empty(n_e, np.bool_)
    e = 0
    for q in range(n_g):
        b, s0, s1, t0, t1 = g[q, 0], g[q, 1], g[q, 2], g[q, 3], g[q, 4]
        sb, tb = s_off[b], t_off[b]  # row bases: token k of row b is sb + k
        t_first = t_ends[tb + t0 - 1] if t0 > 0 else 0
        if not exact[q] or special[q]:
            if not exact[q] and (s1 - s0 > 1 or t1 - t0 > 1):
                kind[q] = 1  # texts differ inside a multi-token group: no candidate map
            j = t0
            while j + 1 < t1 and t_ends[tb + j] <= t_first:  # the start of token j + 1
                j += 1
            e_row[e], e_s[e], e_t[e] = b, s_offset[b] - 1 + s0, t_offset[b] - 1 + j
            e_off[e], e_len[e], e_fits[e], e_plain[e] = 0, 0, True, False
            e += 1
            continue
        s_first = s_ends[sb + s0 - 1] if s0 > 0 else 0
        if s1 - s0 == 1 and t1 - t0 == 1:  # 1:1 (most groups): both start at the group's start
            e_row[e], e_s[e], e_t[e] = b, s_offset[b] - 1 + s0, t_offset[b] - 1 + t0
            e_off[e], e_len[e], e_fits[e], e_plain[e] = 0, 0, True, True
            e += 1
            continue
        # an exact group spells the same bytes on both sides, in a DP row at different
        # offsets: teacher byte x is student byte x + shift inside the group
        shift = s_first - t_first
        a = s_ends[sb + s1 - 2] if s1 > 1 else 0  # start of the last student token
        c = (t_ends[tb + t1 - 2] if t1 > 1 else 0) + shift  # ... of the last teacher one
        if a != c:
            kind[q], flag[q] = 2, a > c
            m_off[q], m_len[q] = sb_off[b] + min(a, c), abs(a - c)
        j = t0
        for k in range(s0, s1):
            s_at = s_ends[sb + k - 1] if k > 0 else 0
            while j + 1 < t1 and t_ends[tb + j] + shift <= s_at:
                j += 1
            x = (t_ends[tb + j - 1] if j > 0 else 0) + shift
            e_row[e], e_s[e], e_t[e] = b, s_offset[b] - 1 + k, t_offset[b] - 1 + j
            e_off[e], e_len[e] = sb_off[b] + x, s_at - x
            # the teacher token's distribution covers the student token only if it ends within
            e_fits[e] = s_ends[sb + k] <= t_ends[tb + j] + shift
            e_plain[e] = True
            e += 1
    return (
        kind, flag, m_off, m_len,
        e_row[:e], e_s[:e], e_t[:e], e_off[:e], e_len[:e], e_fits[:e], e_plain[:e],
    )  # fmt: skip


@numba.njit(cache=True)
def projection_entries(e_row, e_s, e_t, e_plain, e_fits, table, empty):
    # pragma: no cover - compiled
    """The kept projection entries (`group_keys`) as (row, student position, teacher position,
    table), each int64 (N,): a plain entry is kept when its table is not empty and the teacher
    token covers the student token. When all are kept, the inputs are returned as they are."""
    n = 0
    for e in range(e_row.shape[0]):
        n += not e_plain[e] or (e_fits[e] and not empty[table[e]])
    if n == e_row.shape[0]:
        return e_row, e_s, e_t, table
    row = np.empty(n, np.int64)
    s_pos = np.empty(n, np.int64)
    t_pos = np.empty(n, np.int64)
    out_table = np.empty(n, np.int64)
    m = 0
    for e in range(e_row.shape[0]):
        if not e_plain[e] or (e_fits[e] and not empty[table[e]]):
            row[m], s_pos[m], t_pos[m], out_table[m] = e_row[e], e_s[e], e_t[e], table[e]
            m += 1
    return row, s_pos, t_pos, out_table
