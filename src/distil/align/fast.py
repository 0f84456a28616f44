"""A warm micro-batch of plain rows aligned in one compiled call.

Most micro-batches have only *plain* rows: the teacher's text is a prefix of the student's
bytes and no token on either side spells zero bytes, but for specials that end the row (the
EOS of a finished completion), and every table key they need is cached already. For those,
`plain_batch` does in one pass per row what `walk.student_spans`, `walk.align_rows`,
`walk.group_keys` and the key lookups do in separate passes over intermediate arrays: each
student token's byte end from the byte table, checked against the teacher's bytes as it goes;
the two-pointer groups; each group's match-table key and each student token's projection
key, read from the teacher's bytes (equal to the student's inside a plain row); the trailing
specials paired by role; then the cached table ids (`keys.lookup_keys`), the kept projection
entries and the padded tensors (`outputs.group_tensors`). Anything else (a row that is not
plain, a key with no table yet) makes it return `ok = False` without having changed anything,
and the caller runs the general passes, which build the missing tables in their order; the
result is the same either way (tested against the per-row reference).
"""

from __future__ import annotations

import numba
import numpy as np

from distil.align.keys import lookup_keys
from distil.align.outputs import group_tensors, renumber


@numba.njit(cache=True)
def plain_batch(
    s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start, s_offset, t_offset,
    s_special, t_special, partner, match_index, proj_index, proj_empty, n_match,
):  # fmt: skip  # pragma: no cover - compiled
    """(ok, row, s_pos, s_tok, t_pos, t_tok, in_group, match_local, match_used, p_row, p_s,
    p_t, proj_local, proj_used, n_covered, n_bytes, n_exact): `build_alignment`'s arrays and
    counts, or ok False (the rest empty) when a row is not plain or a key is not cached.
    v_data, v_start: the student's byte index; match_index / proj_index: the six arrays of
    each `KeyIndex`; proj_empty: bool per projection table; n_match: the match tables."""
    n_s = s_ids.shape[0]
    g = np.empty((n_s, 5), np.int32)  # at most one group per student token
    covered = np.zeros(n_s, np.bool_)
    s_ends = np.empty(n_s, np.int64)  # row-local byte ends
    # match key per group (offset into t_bytes, length, flag); per projection entry: row,
    # predicting positions, key, fits, plain
    m_off, m_len, m_flag = np.zeros(n_s, np.int64), np.zeros(n_s, np.int64), np.zeros(n_s, np.bool_)
    e_row, e_s, e_t = np.empty(n_s, np.int64), np.empty(n_s, np.int64), np.empty(n_s, np.int64)
    e_off, e_len = np.empty(n_s, np.int64), np.empty(n_s, np.int64)
    e_fits = np.empty(n_s, np.bool_)
    e_plain = np.empty(n_s, np.bool_)
    n_g = n_e = n_bytes = n_exact = 0
    for b in range(s_off.shape[0] - 1):
        w, ns_c, nt_c = _row_ends(
            b, s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start,
            s_special, t_special, s_ends,
        )  # fmt: skip
        if w < 0:
            return _not_plain()
        n_bytes += w
        n_g, n_e, n_exact = _row_groups(
            b, ns_c, nt_c, s_ids, s_off, s_ends, t_ids, t_ends, t_off, tb_off, s_offset,
            t_offset, partner, g, covered, m_off, m_len, m_flag, e_row, e_s, e_t, e_off, e_len,
            e_fits, e_plain, n_g, n_e, n_exact,
        )  # fmt: skip
    match, m_miss = lookup_keys(
        *match_index, t_bytes, m_off[:n_g], m_len[:n_g], m_flag[:n_g], m_len[:n_g] > 0, 0,
    )  # fmt: skip
    table, p_miss = lookup_keys(
        *proj_index, t_bytes, e_off[:n_e], e_len[:n_e], np.zeros(n_e, np.bool_),
        np.ones(n_e, np.bool_), 0,
    )  # fmt: skip
    if m_miss or p_miss:
        return _not_plain()
    # keep an entry when it is not plain, or its teacher token covers the student token and
    # its table is not empty (`walk.projection_entries`)
    n_kept = 0
    for e in range(n_e):
        if not e_plain[e] or (e_fits[e] and not proj_empty[table[e]]):
            e_row[n_kept], e_s[n_kept], e_t[n_kept] = e_row[e], e_s[e], e_t[e]
            table[n_kept] = table[e]
            n_kept += 1
    match_local, match_used = renumber(match, n_match)
    proj_local, proj_used = renumber(table[:n_kept], proj_empty.shape[0])
    row, s_pos, s_tok, t_pos, t_tok, in_group = group_tensors(
        g[:n_g], s_ids, s_off, s_offset, t_ids, t_off, t_offset, covered
    )
    n_covered = 0
    for k in range(n_s):
        n_covered += covered[k]
    return (
        True, row, s_pos, s_tok, t_pos, t_tok, in_group, match_local, match_used,
        e_row[:n_kept], e_s[:n_kept], e_t[:n_kept], proj_local, proj_used,
        n_covered, n_bytes, n_exact,
    )  # fmt: skip


@numba.njit(cache=True)
def _not_plain():  # pragma: no cover - compiled
    z, z2, zb = np.zeros(0, np.int64), np.zeros((0, 1), np.int64), np.zeros((0, 0), np.bool_)
    return False, z, z2, z2, z2, z2, zb, z, z, z, z, z, z, z, 0, 0, 0


@numba.njit(cache=True)
def _row_ends(
    b, s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start, s_special,
    t_special, s_ends,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's student byte ends into s_ends, checking on the way that its bytes start with
    the teacher's: (student bytes, content tokens of each side before the trailing specials),
    or (-1, 0, 0) when the row is not plain."""
    sb, ns = s_off[b], s_off[b + 1] - s_off[b]
    tbo, n_tb = tb_off[b], tb_off[b + 1] - tb_off[b]
    size = v_start.shape[0] - 1
    w, ns_c = 0, ns
    for k in range(ns):
        i = s_ids[sb + k]
        if i < 0 or i >= size:
            return -1, 0, 0
        if v_start[i + 1] == v_start[i]:  # zero bytes: only a special, only at the end
            if not s_special[i]:
                return -1, 0, 0
            ns_c = min(ns_c, k)
        elif ns_c < ns:
            return -1, 0, 0
        for a in range(v_start[i], v_start[i + 1]):
            if w < n_tb and v_data[a] != t_bytes[tbo + w]:
                return -1, 0, 0
            w += 1
        s_ends[sb + k] = w
    if w < n_tb:
        return -1, 0, 0
    tb, nt = t_off[b], t_off[b + 1] - t_off[b]
    prev, nt_c = 0, nt
    for j in range(nt):  # teacher ends strictly increasing, but for specials at the end
        end, i = t_ends[tb + j], t_ids[tb + j]
        if end <= prev:
            if end < prev or i < 0 or i >= t_special.shape[0] or not t_special[i]:
                return -1, 0, 0
            nt_c = min(nt_c, j)
        elif nt_c < nt:
            return -1, 0, 0
        prev = end
    return w, ns_c, nt_c


@numba.njit(cache=True)
def _row_groups(
    b, ns_c, nt_c, s_ids, s_off, s_ends, t_ids, t_ends, t_off, tb_off, s_offset, t_offset,
    partner, g, covered, m_off, m_len, m_flag, e_row, e_s, e_t, e_off, e_len, e_fits, e_plain,
    n_g, n_e, n_exact,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's groups (the two-pointer walk over the content tokens, then the trailing
    specials paired by role at the end of the text), each group's match key and one projection
    entry per student token, appended at n_g / n_e: returns (n_g, n_e, n_exact)."""
    sb, ns = s_off[b], s_off[b + 1] - s_off[b]
    tb, nt = t_off[b], t_off[b + 1] - t_off[b]
    tbo, n_tb = tb_off[b], tb_off[b + 1] - tb_off[b]
    se, te = s_ends[sb : sb + ns], t_ends[tb : tb + nt]
    i = j = s0 = t0 = 0
    while i < ns_c and j < nt_c and se[i] <= n_tb:
        if se[i] != te[j]:
            i, j = (i + 1, j) if se[i] < te[j] else (i, j + 1)
            continue
        s1, t1 = i + 1, j + 1
        g[n_g, 0], g[n_g, 1], g[n_g, 2], g[n_g, 3], g[n_g, 4] = b, s0, s1, t0, t1
        n_exact += se[i] - (se[s0 - 1] if s0 > 0 else 0)
        for k in range(sb + s0, sb + s1):
            covered[k] = True
        # the last tokens' starts: the bytes between them key the match table
        a, c = (se[s1 - 2] if s1 > 1 else 0), (te[t1 - 2] if t1 > 1 else 0)
        if a != c:  # (a 1:1 group has a == c)
            m_off[n_g], m_len[n_g], m_flag[n_g] = tbo + min(a, c), abs(a - c), a > c
        n_g += 1
        # per student token: the last teacher token starting at or before it, keyed by the
        # bytes the teacher is behind
        q = t0
        for k in range(s0, s1):
            s_at = se[k - 1] if k > 0 else 0
            while q + 1 < t1 and te[q] <= s_at:
                q += 1
            x = te[q - 1] if q > 0 else 0
            e_row[n_e], e_s[n_e], e_t[n_e] = b, s_offset[b] - 1 + k, t_offset[b] - 1 + q
            e_off[n_e], e_len[n_e] = tbo + x, s_at - x
            e_fits[n_e], e_plain[n_e] = se[k] <= te[q], True
            n_e += 1
        i, j, s0, t0 = s1, t1, s1, t1
    # the trailing specials, 1:1 in order with a teacher special of the same role when the
    # content spelled the teacher's whole text (`walk._special_pairs`); one entry each
    w_c, first = (se[ns_c - 1] if ns_c > 0 else 0), nt_c
    for k in range(ns_c, ns if w_c == n_tb else ns_c):
        for c in range(first, nt):
            if partner[t_ids[tb + c]] == s_ids[sb + k]:
                g[n_g, 0], g[n_g, 1], g[n_g, 2], g[n_g, 3], g[n_g, 4] = b, k, k + 1, c, c + 1
                covered[sb + k] = True
                e_row[n_e], e_s[n_e], e_t[n_e] = b, s_offset[b] - 1 + k, t_offset[b] - 1 + c
                e_off[n_e], e_len[n_e], e_fits[n_e], e_plain[n_e] = 0, 0, True, False
                n_g, n_e, first = n_g + 1, n_e + 1, c + 1
                break
    return n_g, n_e, n_exact
