"""A warm micro-batch of plain rows aligned in one compiled call.

Most micro-batches have only *plain* rows: the teacher's text is a prefix of the student's
bytes and no token on either side spells zero bytes, but for specials that end the row (the
EOS of a finished completion), and every table key they need is cached already. For those,
`plain_batch` does in one pass per row what `walk.student_spans`, `walk.align_rows`,
`group_keys.group_keys`, the key lookups and `outputs.finish` do in separate passes over
intermediate arrays, reading the ids where the collator's padded arrays hold them: each
student token's byte end from the byte table, checked against the teacher's bytes as it goes
(unless the collator found the texts equal already); the two-pointer groups, written as
`GroupSpans` fields; each student token's projection entry and each group's match-table id,
their keys read from the teacher's bytes (equal to the student's inside a plain row) and looked
up as they come; the trailing specials paired by role; then the batch's tables renumbered.

A key is looked up by its hash (`keys.probe`; a projection key's hash extended from the
previous key of the same teacher token), or, inside a group of one teacher token that spells
its own bytes, in a prefix memo: every key there is a prefix of that token, so its table id is
kept at (token, key length) and a token seen before needs no hashing. Nothing is written twice
and no intermediate array outlives its row, which matters as much as the work: a batch's
arrays that spill out of the core's cache make every pass after them slower.

Anything else (a row that is not plain, a key with no table yet) makes it return `ok = False`
(the memos only hold ids of cached tables, so nothing wrong is kept), and the caller runs the
general passes, which build the missing tables in their order; the result is the same either
way (tested against the per-row reference).
"""

from __future__ import annotations

import numba
import numpy as np

from distil.align.keys import HASH_START, hash_key, hash_more, probe, same_bytes
from distil.align.outputs import renumber


@numba.njit(cache=True)
def plain_batch(
    student, teacher, t_ends, t_off, t_bytes, tb_off, t_prefix, v_data, v_start, s_offset,
    t_offset, s_special, t_special, partner, match_index, proj_index, proj_empty, n_match, tv_data,
    tv_start, match_memo, proj_memo,
):  # fmt: skip  # pragma: no cover - compiled
    """(ok, row, s_first, s_len, t_first, t_len, in_group, match_local, match_used, p_row, p_s,
    p_t, proj_local, proj_used, n_covered, n_bytes, n_exact): `build_alignment`'s arrays and
    counts (the groups as `GroupSpans` fields), or ok False (the rest empty) when a row is not
    plain or a key is not cached. student / teacher: (ids (R, L), idrow, start, length) per
    batch row: its completion is ids[idrow[b], start[b]:start[b] + length[b]] (`GroupSpans`);
    t_ends / t_off: the teacher's byte ends, flat over the rows; t_prefix: bool per row, its
    t_bytes known to be a prefix of its student bytes (not compared again); v_data, v_start: the
    student's byte index; match_index / proj_index: the arrays of each `KeyIndex`; proj_empty:
    bool per projection table; n_match: the match tables; tv_data, tv_start: the teacher's byte
    index; match_memo / proj_memo: each `KeyIndex`'s `prefix_memo` over the teacher's byte
    index."""
    s_ids, s_idrow, s_start, s_len = student
    t_ids, t_idrow, t_start, t_len = teacher
    n_rows, n_s = s_len.shape[0], 0
    for b in range(n_rows):
        n_s += s_len[b]
    # groups (row, first and length of each side, match table) and projection entries (row,
    # predicting positions, table): at most one of each per student token
    groups = np.empty((7, n_s), np.int64)  # and each group's prefix-memo base
    entries = np.empty((4, n_s), np.int64)
    width = 0
    for b in range(n_rows):
        width = max(width, s_len[b])
    in_group = np.zeros((n_rows, width), np.bool_)
    se = np.empty(width, np.int64)  # the row's student byte ends
    counts = np.zeros(5, np.int64)  # groups, entries, bytes, bytes in groups, tokens in groups
    for b in range(n_rows):
        s_row = s_ids[s_idrow[b], s_start[b] : s_start[b] + s_len[b]]
        t_row = t_ids[t_idrow[b], t_start[b] : t_start[b] + t_len[b]]
        w, ns_c, nt_c = _row_ends(
            b, s_row, t_row, t_ends, t_off, t_bytes, tb_off, t_prefix[b], v_data, v_start,
            s_special, t_special, se,
        )  # fmt: skip
        if w < 0:
            return _not_plain()
        counts[2] += w
        g0 = counts[0]
        if not _row_groups(
            b, ns_c, nt_c, se, s_start[b], t_row, t_start[b], t_ends, t_off, t_bytes, tb_off,
            s_offset, t_offset, proj_index, proj_empty, tv_data, tv_start, proj_memo, groups,
            entries, in_group, counts,
        ) or not _row_matches(
            b, g0, counts[0], se, groups, s_start[b], t_start[b], t_ends, t_off, t_bytes,
            tb_off, match_index, match_memo,
        ):  # fmt: skip
            return _not_plain()
        _row_specials(
            b, ns_c, nt_c, se, s_row, s_start[b], t_row, t_start[b], tb_off, s_offset, t_offset,
            partner, groups, entries, in_group, counts,
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
    b, s_row, t_row, t_ends, t_off, t_bytes, tb_off, prefix, v_data, v_start, s_special,
    t_special, se,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's student byte ends into se, checking on the way that its bytes start with the
    teacher's (unless `prefix` says they do): (student bytes, content tokens of each side
    before the trailing specials), or (-1, 0, 0) when the row is not plain."""
    ns, tbo, n_tb = s_row.shape[0], tb_off[b], tb_off[b + 1] - tb_off[b]
    size = v_start.shape[0] - 1
    w, ns_c = 0, ns
    for k in range(ns):
        i = s_row[k]
        if i < 0 or i >= size:
            return -1, 0, 0
        if v_start[i + 1] == v_start[i]:  # zero bytes: only a special, only at the end
            if not s_special[i]:
                return -1, 0, 0
            ns_c = min(ns_c, k)
        elif ns_c < ns:
            return -1, 0, 0
        if prefix:
            w += v_start[i + 1] - v_start[i]
        else:
            for a in range(v_start[i], v_start[i + 1]):
                if w < n_tb and v_data[a] != t_bytes[tbo + w]:
                    return -1, 0, 0
                w += 1
        se[k] = w
    if w < n_tb:
        return -1, 0, 0
    tb, nt = t_off[b], t_row.shape[0]
    prev, nt_c = 0, nt
    for j in range(nt):  # teacher ends strictly increasing, but for specials at the end
        end, i = t_ends[tb + j], t_row[j]
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
    b, ns_c, nt_c, se, sb, t_row, t_first, t_ends, t_off, t_bytes, tb_off, s_offset, t_offset,
    proj_index, proj_empty, tv_data, tv_start, proj_memo, groups, entries, in_group, counts,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's groups (the two-pointer walk over the content tokens) and the kept projection
    entries of their student tokens, appended at counts[0] / counts[1]; False when a key has
    no cached table. Per student token: the last teacher token starting at or before it, keyed
    by the bytes the teacher is behind, looked up by hash (`keys.probe`, the hash extended
    from the previous key of the same teacher token) or in the prefix memo: for a group of one
    teacher token and several student tokens whose text spells the token's own bytes (checked:
    a normalizer may have changed them), every key is a prefix of that token, remembered at
    memo index base + the key's end (groups[6]; -1 for any other group). (One function: with a
    helper called per group, numba ran the batch 1.5x slower.)"""
    tb, tbo, n_tb = t_off[b], tb_off[b], tb_off[b + 1] - tb_off[b]
    te = t_ends[tb : t_off[b + 1]]
    p_data, p_slots = proj_index
    n_g, n_e = counts[0], counts[1]
    i = j = s0 = t0 = 0
    while i < ns_c and j < nt_c and se[i] <= n_tb:
        if se[i] != te[j]:
            i, j = (i + 1, j) if se[i] < te[j] else (i, j + 1)
            continue
        s1, t1 = i + 1, j + 1
        groups[0, n_g], groups[1, n_g], groups[2, n_g] = b, sb + s0, s1 - s0
        groups[3, n_g], groups[4, n_g] = t_first + t0, t1 - t0
        counts[3] += se[i] - (se[s0 - 1] if s0 > 0 else 0)
        counts[4] += s1 - s0
        base, tid, x0 = -1, t_row[t0], (te[t0 - 1] if t0 > 0 else 0)
        if t1 - t0 == 1 and s1 - s0 > 1 and 0 <= tid < tv_start.shape[0] - 1:
            a0, n0 = tv_start[tid], tv_start[tid + 1] - tv_start[tid]
            if n0 == te[t0] - x0 and same_bytes(tv_data, a0, t_bytes, tbo + x0, n0):
                base = a0 - x0
        groups[6, n_g] = base
        n_g += 1
        q, h_q, h_at, h = t0, -1, 0, HASH_START
        for k in range(s0, s1):
            in_group[b, k] = True
            s_at = se[k - 1] if k > 0 else 0
            while q + 1 < t1 and te[q] <= s_at:
                q += 1
            x = te[q - 1] if q > 0 else 0
            table = 0
            if s_at > x:
                table = proj_memo[base + s_at] if base >= 0 else -1
                if table < 0:
                    if h_q != q:
                        h_q, h_at, h = q, x, HASH_START
                    h, h_at = hash_more(h, t_bytes, tbo + h_at, s_at - h_at), s_at
                    key = hash_key(h, False)
                    table = probe(p_data, p_slots, key, t_bytes, tbo + x, s_at - x, False)
                    if table < 0:
                        return False
                    if base >= 0:
                        proj_memo[base + s_at] = table
            # kept when the teacher token covers the student token and its table is not empty
            if se[k] <= te[q] and not proj_empty[table]:
                entries[0, n_e], entries[1, n_e] = b, s_offset[b] - 1 + k
                entries[2, n_e], entries[3, n_e] = t_offset[b] - 1 + q, table
                n_e += 1
        i, j, s0, t0 = s1, t1, s1, t1
    counts[0], counts[1] = n_g, n_e
    return True


@numba.njit(cache=True)
def _row_matches(
    b, g0, g1, se, groups, s_first, t_first, t_ends, t_off, t_bytes, tb_off, match_index,
    match_memo,
):  # fmt: skip  # pragma: no cover - compiled
    """The match-table ids (groups[5]) of row b's groups g0:g1, keyed by the bytes between the
    last tokens' starts (a 1:1 group has none: table 0); False when a key has no cached
    table."""
    tb, tbo = t_off[b], tb_off[b]
    m_data, m_slots = match_index
    for g in range(g0, g1):
        s1, t1 = groups[1, g] - s_first + groups[2, g], groups[3, g] - t_first + groups[4, g]
        base = groups[6, g]
        a, c = (se[s1 - 2] if s1 > 1 else 0), (t_ends[tb + t1 - 2] if t1 > 1 else 0)
        groups[5, g] = 0
        if a == c:
            continue
        table = match_memo[base + a] if base >= 0 else -1
        if table < 0:
            lo, n = min(a, c), abs(a - c)
            key = hash_key(hash_more(HASH_START, t_bytes, tbo + lo, n), a > c)
            table = probe(m_data, m_slots, key, t_bytes, tbo + lo, n, a > c)
            if table < 0:
                return False
            if base >= 0:
                match_memo[base + a] = table
        groups[5, g] = table
    return True


@numba.njit(cache=True)
def _row_specials(
    b, ns_c, nt_c, se, s_row, s_first, t_row, t_first, tb_off, s_offset, t_offset, partner,
    groups, entries, in_group, counts,
):  # fmt: skip  # pragma: no cover - compiled
    """Row b's trailing specials, 1:1 in order with a teacher special of the same role when the
    content spelled the teacher's whole text (`walk._special_pairs`): one group (table 0) and
    one entry each, appended at counts[0] / counts[1]."""
    ns, nt = s_row.shape[0], t_row.shape[0]
    w_c, first = (se[ns_c - 1] if ns_c > 0 else 0), nt_c
    n_g, n_e = counts[0], counts[1]
    for k in range(ns_c, ns if w_c == tb_off[b + 1] - tb_off[b] else ns_c):
        for c in range(first, nt):
            if partner[t_row[c]] == s_row[k]:
                groups[0, n_g], groups[1, n_g], groups[2, n_g] = b, s_first + k, 1
                groups[3, n_g], groups[4, n_g], groups[5, n_g] = t_first + c, 1, 0
                entries[0, n_e], entries[1, n_e] = b, s_offset[b] - 1 + k
                entries[2, n_e], entries[3, n_e] = t_offset[b] - 1 + c, 0
                in_group[b, k] = True
                counts[4] += 1
                n_g, n_e, first = n_g + 1, n_e + 1, c + 1
                break
    counts[0], counts[1] = n_g, n_e
