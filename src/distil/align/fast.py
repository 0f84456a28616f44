"""A warm micro-batch of plain rows aligned in one compiled call.

Most micro-batches have only *plain* rows: the teacher's text is a prefix of the student's
bytes and no token on either side spells zero bytes, but for specials that end the row (the
EOS of a finished completion), and every table key they need is cached already. For those,
`plain_batch` does in one pass per row what `walk.student_spans`, `walk.align_rows`,
`walk.group_keys`, the key lookups and `outputs.finish` do in separate passes over
intermediate arrays: each student token's byte end from the byte table, checked against the
teacher's bytes as it goes; the two-pointer groups, written as `GroupSpans` fields; each
group's match-table id and each student token's projection entry, their keys read from the
teacher's bytes (equal to the student's inside a plain row) and looked up in the cache as they
come (a projection key's hash extended from the previous one while the teacher token stays
the same); the trailing specials paired by role; then the batch's tables renumbered. Nothing
is written twice and no intermediate array outlives its row, which matters as much as the
work: a batch's arrays that spill out of the core's cache make every pass after them slower.
Anything else (a row that is not plain, a key with no table yet) makes it return `ok = False`
without having changed anything, and the caller runs the general passes, which build the
missing tables in their order; the result is the same either way (tested against the per-row
reference).
"""

from __future__ import annotations

import numba
import numpy as np

from distil.align.keys import hash_more, hash_start, probe
from distil.align.outputs import renumber


@numba.njit(cache=True)
def plain_batch(
    s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start, s_offset, t_offset,
    s_special, t_special, partner, match_index, proj_index, proj_empty, n_match,
):  # fmt: skip  # pragma: no cover - compiled
    """(ok, row, s_first, s_len, t_first, t_len, in_group, match_local, match_used, p_row, p_s,
    p_t, proj_local, proj_used, n_covered, n_bytes, n_exact): `build_alignment`'s arrays and
    counts (the groups as `GroupSpans` fields), or ok False (the rest empty) when a row is not
    plain or a key is not cached. v_data, v_start: the student's byte index; match_index /
    proj_index: the six arrays of each `KeyIndex`; proj_empty: bool per projection table;
    n_match: the match tables."""
    n_rows, n_s = s_off.shape[0] - 1, s_ids.shape[0]
    # groups (row, first and length of each side, match table) and projection entries (row,
    # predicting positions, table): at most one of each per student token
    groups = np.empty((6, n_s), np.int64)
    entries = np.empty((4, n_s), np.int64)
    width = 0
    for b in range(n_rows):
        width = max(width, s_off[b + 1] - s_off[b])
    in_group = np.zeros((n_rows, width), np.bool_)
    se = np.empty(width, np.int64)  # the row's student byte ends
    counts = np.zeros(5, np.int64)  # groups, entries, bytes, bytes in groups, tokens in groups
    for b in range(n_rows):
        w, ns_c, nt_c = _row_ends(
            b, s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start,
            s_special, t_special, se,
        )  # fmt: skip
        if w < 0:
            return _not_plain()
        counts[2] += w
        ok = _row_groups(
            b, ns_c, nt_c, se, s_off, t_ends, t_off, t_bytes, tb_off, s_offset, t_offset,
            match_index, proj_index, proj_empty, groups, entries, in_group, counts,
        )  # fmt: skip
        if not ok:
            return _not_plain()
        _row_specials(
            b, ns_c, nt_c, se, s_ids, s_off, t_ids, t_off, tb_off, s_offset, t_offset, partner,
            groups, entries, in_group, counts,
        )  # fmt: skip
    n_g, n_e = counts[0], counts[1]
    match_local, match_used = renumber(groups[5, :n_g], n_match)
    proj_local, proj_used = renumber(entries[3, :n_e], proj_empty.shape[0])
    return (
        True, groups[0, :n_g], groups[1, :n_g], groups[2, :n_g], groups[3, :n_g],
        groups[4, :n_g], in_group, match_local, match_used, entries[0, :n_e],
        entries[1, :n_e], entries[2, :n_e], proj_local, proj_used, counts[4], counts[2],
        counts[3],
    )  # fmt: skip


@numba.njit(cache=True)
def _not_plain():  # pragma: no cover - compiled
    z, zb = np.zeros(0, np.int64), np.zeros((0, 0), np.bool_)
    return False, z, z, z, z, z, zb, z, z, z, z, z, z, z, 0, 0, 0


@numba.njit(cache=True)
def _row_ends(
    b, s_ids, s_off, t_ids, t_ends, t_off, t_bytes, tb_off, v_data, v_start, s_special,
    t_special, se,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's student byte ends into se, checking on the way that its bytes start with the
    teacher's: (student bytes, content tokens of each side before the trailing specials), or
    (-1, 0, 0) when the row is not plain."""
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
        se[k] = w
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
    b, ns_c, nt_c, se, s_off, t_ends, t_off, t_bytes, tb_off, s_offset, t_offset, match_index,
    proj_index, proj_empty, groups, entries, in_group, counts,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's groups (the two-pointer walk over the content tokens) with their match-table
    ids, and the kept projection entries of their student tokens, appended at counts[0] /
    counts[1]; False when a key has no cached table."""
    sb, tb = s_off[b], t_off[b]
    tbo, n_tb = tb_off[b], tb_off[b + 1] - tb_off[b]
    te = t_ends[tb : tb + t_off[b + 1] - tb]
    n_g, n_e = counts[0], counts[1]
    m_data, m_off, m_len, m_flag, m_value, m_slots = match_index
    p_data, p_off, p_len, p_flag, p_value, p_slots = proj_index
    i = j = s0 = t0 = 0
    while i < ns_c and j < nt_c and se[i] <= n_tb:
        if se[i] != te[j]:
            i, j = (i + 1, j) if se[i] < te[j] else (i, j + 1)
            continue
        s1, t1 = i + 1, j + 1
        groups[0, n_g], groups[1, n_g], groups[2, n_g] = b, sb + s0, s1 - s0
        groups[3, n_g], groups[4, n_g] = tb + t0, t1 - t0
        counts[3] += se[i] - (se[s0 - 1] if s0 > 0 else 0)
        counts[4] += s1 - s0
        in_group[b, s0:s1] = True
        # the last tokens' starts: the bytes between them key the match table (a 1:1 group
        # has a == c, table 0)
        a, c = (se[s1 - 2] if s1 > 1 else 0), (te[t1 - 2] if t1 > 1 else 0)
        groups[5, n_g] = 0
        if a != c:
            lo, n = min(a, c), abs(a - c)
            h = hash_more(hash_start(a > c), t_bytes, tbo + lo, n)
            groups[5, n_g] = probe(
                m_data, m_off, m_len, m_flag, m_value, m_slots, h, t_bytes, tbo + lo, n, a > c
            )
            if groups[5, n_g] < 0:
                return False
        n_g += 1
        # per student token: the last teacher token starting at or before it, keyed by the
        # bytes the teacher is behind (hashed on from the previous key of the same token)
        q, h_q, h_at, h = t0, -1, 0, hash_start(False)
        for k in range(s0, s1):
            s_at = se[k - 1] if k > 0 else 0
            while q + 1 < t1 and te[q] <= s_at:
                q += 1
            x = te[q - 1] if q > 0 else 0
            table = 0
            if s_at > x:
                if h_q != q:
                    h_q, h_at, h = q, x, hash_start(False)
                h, h_at = hash_more(h, t_bytes, tbo + h_at, s_at - h_at), s_at
                table = probe(
                    p_data, p_off, p_len, p_flag, p_value, p_slots, h, t_bytes, tbo + x,
                    s_at - x, False,
                )  # fmt: skip
                if table < 0:
                    return False
            # kept when the teacher token covers the student token and its table is not empty
            if se[k] <= te[q] and not proj_empty[table]:
                entries[0, n_e], entries[1, n_e] = b, s_offset[b] - 1 + k
                entries[2, n_e], entries[3, n_e] = t_offset[b] - 1 + q, table
                n_e += 1
        i, j, s0, t0 = s1, t1, s1, t1
    counts[0], counts[1] = n_g, n_e
    return True


@numba.njit(cache=True)
def _row_specials(
    b, ns_c, nt_c, se, s_ids, s_off, t_ids, t_off, tb_off, s_offset, t_offset, partner, groups,
    entries, in_group, counts,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's trailing specials, 1:1 in order with a teacher special of the same role when the
    content spelled the teacher's whole text (`walk._special_pairs`): one group (table 0) and
    one entry each, appended at counts[0] / counts[1]."""
    sb, ns, tb, nt = s_off[b], s_off[b + 1] - s_off[b], t_off[b], t_off[b + 1] - t_off[b]
    w_c, first = (se[ns_c - 1] if ns_c > 0 else 0), nt_c
    n_g, n_e = counts[0], counts[1]
    for k in range(ns_c, ns if w_c == tb_off[b + 1] - tb_off[b] else ns_c):
        for c in range(first, nt):
            if partner[t_ids[tb + c]] == s_ids[sb + k]:
                groups[0, n_g], groups[1, n_g], groups[2, n_g] = b, sb + k, 1
                groups[3, n_g], groups[4, n_g], groups[5, n_g] = tb + c, 1, 0
                entries[0, n_e], entries[1, n_e] = b, s_offset[b] - 1 + k
                entries[2, n_e], entries[3, n_e] = t_offset[b] - 1 + c, 0
                in_group[b, k] = True
                counts[4] += 1
                n_g, n_e, first = n_g + 1, n_e + 1, c + 1
                break
    counts[0], counts[1] = n_g, n_e
