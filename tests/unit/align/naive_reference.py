"""The per-row alignment and table builds as they were before the compiled batch pass.

A reference for tests/unit/align/test_batch_equivalence.py: one `align_completion` per row with
numpy calls, one Python lookup per group and token for the table ids, and the match/projection
tables built with per-token dict lookups and bisection over a sorted list of byte strings.
Slow and plain on purpose; the library must give exactly the same results.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import torch

from distil.align.tables import AMBIGUOUS
from distil.align.token_align import RowAlignment, student_byte_spans, token_starts
from distil.align.vocab_map import VocabBytes, matched_vocab, role_map
from distil.types import AlignmentGroups

# ---------------------------------------------------------------- byte lookups


def _sorted(vb: VocabBytes) -> tuple[list[bytes], list[int]]:
    pairs = sorted((b, i) for i, b in enumerate(vb.token_bytes) if b and not vb.is_special[i])
    return [b for b, _ in pairs], [i for _, i in pairs]


class Lookup:
    """VocabBytes' former lookups: bisection over (bytes, id) sorted keys."""

    def __init__(self, vb: VocabBytes):
        self.vb = vb
        self.keys, self.ids = _sorted(vb)

    def longest_prefix(self, data: bytes) -> int:
        for n in range(min(self.vb.max_len, len(data)), 0, -1):
            found = self.vb.by_bytes.get(data[:n])
            if found is not None:
                return found
        return -1

    def ids_with_prefix(self, prefix: bytes, *, canonical: bool) -> list[int]:
        keys, ids, out = self.keys, self.ids, []
        for k in range(bisect_left(keys, prefix), len(keys)):
            if not keys[k].startswith(prefix):
                break
            if len(keys[k]) > len(prefix) and (
                not canonical or self.vb.by_bytes[keys[k]] == ids[k]
            ):
                out.append(ids[k])
        return out

    def ids_spelling(self, data: bytes) -> list[int]:
        keys, ids, out = self.keys, self.ids, []
        for k in range(bisect_left(keys, data), len(keys)):
            if keys[k] != data:
                break
            out.append(ids[k])
        return out


def _pair_tensors(pairs):
    pairs.sort()
    ids = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
    return ids[:, 0].contiguous(), ids[:, 1].contiguous()


class RefMatchTables:
    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.lookup = {id(v): Lookup(v) for v in (student_vb, teacher_vb)}
        self.tables = [matched_vocab(student_vb, teacher_vb)]
        self._ids: dict[tuple, int] = {(True, b""): 0, (False, b""): 0}

    def delta_id(self, delta: bytes, *, student_longer: bool) -> int:
        key = (student_longer, delta)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.tables)
            self.tables.append(self._build(delta, student_longer))
        return found

    def empty_id(self) -> int:
        found = self._ids.get(("empty",))
        if found is None:
            found = self._ids[("empty",)] = len(self.tables)
            self.tables.append(_pair_tensors([]))
        return found

    def _build(self, delta: bytes, student_longer: bool):
        longer, other = (
            (self.teacher_vb, self.student_vb)
            if student_longer
            else (self.student_vb, self.teacher_vb)
        )
        pairs = []
        for i in self.lookup[id(longer)].ids_with_prefix(delta, canonical=True):
            j = other.by_bytes.get(longer.token_bytes[i][len(delta) :])
            if j is not None:
                pairs.append((j, i) if student_longer else (i, j))
        return _pair_tensors(pairs)


class RefProjectionTables:
    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.s_look, self.t_look = Lookup(student_vb), Lookup(teacher_vb)
        self.tables: list = []
        self._ids: dict[bytes, int] = {}
        self._empty: list[int] = []
        self.table_id(b"")

    def table_id(self, remainder: bytes) -> int:
        found = self._ids.get(remainder)
        if found is None:
            found = self._ids[remainder] = len(self.tables)
            self.tables.append(self._build(remainder))
            if self.tables[found][0].numel() == 0:
                self._empty.append(found)
        return found

    def empty_ids(self) -> np.ndarray:
        return np.asarray(self._empty, dtype=np.int64)

    def _build(self, remainder: bytes):
        t_vb, s_vb = self.teacher_vb, self.student_vb
        pairs = []
        for t in self.t_look.ids_with_prefix(remainder, canonical=False):
            rest = t_vb.token_bytes[t][len(remainder) :]
            s = self.s_look.longest_prefix(rest)
            if s < 0:
                continue
            if self._ambiguous(remainder, rest):
                s = AMBIGUOUS
            pairs.append((t, s))
        if remainder:
            pairs += [(t, AMBIGUOUS) for t in self.t_look.ids_spelling(remainder)]
        else:
            pairs += list(role_map(s_vb, t_vb).items())
        return _pair_tensors(pairs)

    def _ambiguous(self, remainder: bytes, rest: bytes) -> bool:
        s_vb, t_vb = self.student_vb, self.teacher_vb
        return any(
            remainder + s_vb.token_bytes[u] not in t_vb.by_bytes
            for u in self.s_look.ids_with_prefix(rest, canonical=True)
        )


# ---------------------------------------------------------------- one row


def _groups_at(s_ends, t_ends, s_bounds, t_bounds) -> np.ndarray:
    if not len(s_bounds):
        return np.zeros((0, 4), dtype=np.int64)
    s_stop = np.searchsorted(s_ends, s_bounds, side="left") + 1
    t_stop = np.searchsorted(t_ends, t_bounds, side="left") + 1
    s_start = np.concatenate([[0], s_stop[:-1]]).astype(np.int64)
    t_start = np.concatenate([[0], t_stop[:-1]]).astype(np.int64)
    return np.stack([s_start, s_stop, t_start, t_stop], axis=1).reshape(-1, 4)


def align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb) -> RowAlignment:
    s_ids = np.asarray(s_ids, dtype=np.int64).reshape(-1)
    t_ids = np.asarray(t_ids, dtype=np.int64).reshape(-1)
    t_ends = np.asarray(t_ends, dtype=np.int64).reshape(-1)
    s_bytes, s_ends = student_byte_spans(s_ids, s_vb)
    s_zero = _is_special(s_ids, s_vb)
    t_start = token_starts(t_ends)
    t_zero = _is_special(t_ids, t_vb) & (t_ends == t_start)
    s_keep, t_keep = np.flatnonzero(~s_zero), np.flatnonzero(~t_zero)
    t2s = None
    if s_bytes == t_bytes or s_bytes.startswith(t_bytes):
        s_keep = s_keep[s_ends[s_keep] <= len(t_bytes)]
        common = np.intersect1d(s_ends[s_keep], t_ends[t_keep])
        s_bounds = t_bounds = common[common > 0]
    else:
        from distil.align.dp import align_bytes

        t2s, _ = align_bytes(t_bytes, s_bytes)
        t_bounds, s_bounds = _mapped_bounds(t2s, t_ends[t_keep], s_ends[s_keep])
    groups = _groups_at(s_ends[s_keep], t_ends[t_keep], s_bounds, t_bounds)
    groups = _to_original(groups, s_keep, t_keep)
    exact = (
        _exact_flags(groups, s_bytes, s_ends, t_bytes, t_ends)
        if t2s is not None
        else np.ones(len(groups), dtype=bool)
    )
    pairs = _pair_specials(s_ids, s_ends, s_zero, t_ids, t_ends, t_bytes, t_zero, s_vb, t_vb, t2s)
    return _finish(groups, exact, pairs, s_ids, s_bytes, s_ends, t_bytes, t_ends, t2s is not None)


def _is_special(ids, vb):
    inside = (ids >= 0) & (ids < vb.size)
    return inside & vb.is_special[np.where(inside, ids, 0)]


def _mapped_bounds(t2s, te, se):
    te = np.unique(te[te > 0])
    mapped = t2s[te]
    ok = (mapped > 0) & np.isin(mapped, se)
    return te[ok], mapped[ok]


def _to_original(groups, s_keep, t_keep):
    if not len(groups):
        return groups
    s0, s1 = s_keep[groups[:, 0]], s_keep[groups[:, 1] - 1] + 1
    t0, t1 = t_keep[groups[:, 2]], t_keep[groups[:, 3] - 1] + 1
    contiguous = (s1 - s0 == groups[:, 1] - groups[:, 0]) & (t1 - t0 == groups[:, 3] - groups[:, 2])
    return np.stack([s0, s1, t0, t1], axis=1)[contiguous]


def _exact_flags(groups, s_bytes, s_ends, t_bytes, t_ends):
    out = np.ones(len(groups), dtype=bool)
    for g, (s0, s1, t0, t1) in enumerate(groups.tolist()):
        sa = int(s_ends[s0 - 1]) if s0 else 0
        ta = int(t_ends[t0 - 1]) if t0 else 0
        out[g] = s_bytes[sa : s_ends[s1 - 1]] == t_bytes[ta : t_ends[t1 - 1]]
    return out


def _pair_specials(s_ids, s_ends, s_zero, t_ids, t_ends, t_bytes, t_zero, s_vb, t_vb, t2s):
    roles = role_map(s_vb, t_vb)
    content = np.flatnonzero(~t_zero)
    last_content = int(content[-1]) if len(content) else -1
    t_cands = []
    for j in np.flatnonzero(t_zero).tolist():
        at = len(t_bytes) if j > last_content else int(t_ends[j])
        pos = at if t2s is None else int(t2s[at])
        t_cands.append((j, pos, roles.get(int(t_ids[j]))))
    pairs, start = [], 0
    for k in np.flatnonzero(s_zero).tolist():
        for c in range(start, len(t_cands)):
            j, pos, partner = t_cands[c]
            if pos == s_ends[k] and partner == s_ids[k]:
                pairs.append((k, j))
                start = c + 1
                break
    return pairs


def _finish(groups, exact, pairs, s_ids, s_bytes, s_ends, t_bytes, t_ends, used_dp):
    special = np.zeros(len(groups) + len(pairs), dtype=bool)
    special[len(groups) :] = True
    if pairs:
        extra = np.array([(k, k + 1, j, j + 1) for k, j in pairs], dtype=np.int64)
        groups = np.concatenate([groups.reshape(-1, 4), extra])
        exact = np.concatenate([exact, np.ones(len(pairs), dtype=bool)])
    order = np.argsort(groups[:, 0], kind="stable") if len(groups) else np.zeros(0, np.int64)
    groups, exact, special = groups.reshape(-1, 4)[order], exact[order], special[order]
    n = len(s_ids)
    s0, s1 = groups[:, 0], groups[:, 1]
    covered = np.cumsum(np.bincount(s0, minlength=n + 1) - np.bincount(s1, minlength=n + 1)) > 0
    s_start = token_starts(s_ends)
    n_exact = int((s_ends[s1[exact] - 1] - s_start[s0[exact]]).sum()) if len(groups) else 0
    return RowAlignment(
        groups=groups,
        exact=exact,
        special=special,
        unalignable=np.flatnonzero(~covered[:n]),
        s_bytes=s_bytes,
        s_ends=s_ends,
        t_bytes=t_bytes,
        t_ends=t_ends,
        n_bytes=len(s_bytes),
        n_bytes_exact=n_exact,
        used_dp=used_dp,
    )


# ---------------------------------------------------------------- the batch


def build_alignment(rows, student_vb, teacher_vb, match_tables, proj_tables):
    aligned = [
        align_completion(r.s_ids, student_vb, r.t_ids, r.t_ends, r.t_bytes, teacher_vb)
        for r in rows
    ]
    parts = [
        _row_parts(b, ra, r, match_tables, proj_tables)
        for b, (ra, r) in enumerate(zip(aligned, rows, strict=True))
    ]
    groups_G_7 = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, 7), np.int64)
    proj_N_4 = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 4), np.int64)
    match_ids, match_list = _local_tables(groups_G_7[:, 5], match_tables.tables)
    entry = proj_N_4[:, [0, 2, 3]].copy()
    entry[:, 1] -= np.asarray([rows[b].t_offset - 1 for b in entry[:, 0]], np.int64).reshape(-1)
    prev_tok, prev_table = _boundaries(entry, rows, aligned, teacher_vb, proj_tables)
    group = np.stack([groups_G_7[:, 0], groups_G_7[:, 3], np.zeros(len(groups_G_7), np.int64)], 1)
    g_tok, g_table = _boundaries(group, rows, aligned, teacher_vb, proj_tables)
    n, m = len(proj_N_4), int((prev_table >= 0).sum())
    both, proj_list = _local_tables(
        np.concatenate([proj_N_4[:, 3], prev_table[prev_table >= 0], g_table[g_table >= 0]]),
        proj_tables.tables,
    )
    proj_ids = both[:n]
    prev_local = torch.full((n,), -1, dtype=torch.long)
    prev_local[torch.from_numpy(prev_table >= 0)] = both[n : n + m]
    g_local = torch.full((len(groups_G_7),), -1, dtype=torch.long)
    g_local[torch.from_numpy(g_table >= 0)] = both[n + m :]
    s_pos, s_tok = _padded(groups_G_7, 1, [r.s_ids for r in rows], [r.s_offset for r in rows])
    t_pos, t_tok = _padded(groups_G_7, 3, [r.t_ids for r in rows], [r.t_offset for r in rows])
    result = AlignmentGroups(
        group_row_G=torch.from_numpy(groups_G_7[:, 0].copy()),
        student_pos_G_S=s_pos,
        student_tok_G_S=s_tok,
        teacher_pos_G_T=t_pos,
        teacher_tok_G_T=t_tok,
        match_table_G=match_ids,
        match_tables=match_list,
        proj_row_N=torch.from_numpy(proj_N_4[:, 0].copy()),
        proj_student_pos_N=torch.from_numpy(proj_N_4[:, 1].copy()),
        proj_teacher_pos_N=torch.from_numpy(proj_N_4[:, 2].copy()),
        proj_table_N=proj_ids,
        proj_tables=proj_list,
        exact_G=torch.from_numpy(groups_G_7[:, 6].astype(bool)),
        metrics=_metrics(aligned, len(proj_N_4)),
        proj_prev_tok_N=torch.from_numpy(prev_tok),
        proj_prev_table_N=prev_local,
        group_prev_tok_G=torch.from_numpy(g_tok),
        group_prev_table_G=g_local,
    )
    width = max((len(ra.s_ends) for ra in aligned), default=0)
    in_group = torch.zeros((len(aligned), width), dtype=torch.bool)
    for b, ra in enumerate(aligned):
        in_group[b, : len(ra.s_ends)] = True
        in_group[b, torch.from_numpy(ra.unalignable)] = False
    return result, in_group


def _boundaries(points, rows, aligned, t_vb, proj):
    """points: (row, completion index j of the teacher token, table: 0 for a boundary). Per
    point on table 0 after a teacher completion token t (not in a DP row, not special, spelling
    bytes): t and the table for the remainder bytes(t), when it holds more than t."""
    tok = np.full(len(points), -1, np.int64)
    table = np.full(len(points), -1, np.int64)
    before = {}
    for e, (b, j, g) in enumerate(points.tolist()):
        if g != 0 or j < 1 or aligned[b].used_dp:
            continue
        t = int(rows[b].t_ids[j - 1])
        if t < t_vb.size and t not in t_vb.specials and t_vb.token_bytes[t]:
            before[e] = t
    ids = {t: proj.table_id(t_vb.token_bytes[t]) for t in sorted(set(before.values()))}
    for e, t in before.items():
        if len(proj.tables[ids[t]][0]) > 1:
            tok[e], table[e] = t, ids[t]
    return tok, table


def _row_parts(b, ra, row, match, proj):
    g = ra.groups.reshape(-1, 4)
    s_start, t_start = token_starts(ra.s_ends), token_starts(ra.t_ends)
    plain = ra.exact & ~ra.special
    table_G = np.zeros(len(g), dtype=np.int64)
    no_map = ~ra.exact & ((g[:, 1] - g[:, 0] > 1) | (g[:, 3] - g[:, 2] > 1))
    if no_map.any():
        table_G[no_map] = match.empty_id()
    shift = s_start[g[plain, 0]] - t_start[g[plain, 2]]
    table_G[plain] = _match_ids(g[plain], shift, s_start, t_start, ra.s_bytes, match)
    k, gi = _expand(g[plain, 0], g[plain, 1])
    j = _teacher_at(t_start, s_start[k] - shift[gi], g[plain, 2][gi], g[plain, 3][gi])
    tables = _proj_ids(t_start[j] + shift[gi], s_start[k], ra.s_bytes, proj)
    fits = ra.s_ends[k] <= ra.t_ends[j] + shift[gi]
    keep = ~np.isin(tables, proj.empty_ids()) & fits
    other = ~plain
    j_other = _teacher_at(t_start, t_start[g[other, 2]], g[other, 2], g[other, 3])
    s_idx = np.concatenate([k[keep], g[other, 0]])
    t_idx = np.concatenate([j[keep], j_other])
    tables = np.concatenate([tables[keep], np.zeros(int(other.sum()), np.int64)])
    order = np.argsort(s_idx, kind="stable")
    proj_N_4 = np.stack(
        [
            np.full(len(s_idx), b, dtype=np.int64),
            row.s_offset - 1 + s_idx[order],
            row.t_offset - 1 + t_idx[order],
            tables[order],
        ],
        axis=1,
    )
    groups = np.concatenate(
        [np.full((len(g), 1), b, np.int64), g, table_G[:, None], ra.exact[:, None]], axis=1
    )
    return groups.reshape(-1, 7).astype(np.int64), proj_N_4.reshape(-1, 4)


def _expand(starts, stops):
    sizes = stops - starts
    gi = np.repeat(np.arange(len(sizes)), sizes)
    first = np.cumsum(sizes) - sizes
    return (np.arange(int(sizes.sum())) - first[gi] + starts[gi]).astype(np.int64), gi


def _teacher_at(t_start, byte, t0, t1):
    j = np.searchsorted(t_start, byte, side="right") - 1
    return np.minimum(np.maximum(j, t0), t1 - 1).astype(np.int64)


def _match_ids(g, shift, s_start, t_start, data, match):
    ls = s_start[g[:, 1] - 1].tolist()
    lt = (t_start[g[:, 3] - 1] + shift).tolist()
    out = [
        0
        if a == c
        else match.delta_id(data[c:a], student_longer=True)
        if a > c
        else match.delta_id(data[a:c], student_longer=False)
        for a, c in zip(ls, lt, strict=True)
    ]
    return np.asarray(out, dtype=np.int64)


def _proj_ids(t_from, s_at, data, proj):
    out = [
        0 if x == y else proj.table_id(data[x:y])
        for x, y in zip(t_from.tolist(), s_at.tolist(), strict=True)
    ]
    return np.asarray(out, dtype=np.int64)


def _local_tables(global_ids, tables):
    used = np.unique(np.concatenate([[0], global_ids]).astype(np.int64))
    local = np.searchsorted(used, global_ids).astype(np.int64)
    return torch.from_numpy(local), [tables[i] for i in used.tolist()]


def _padded(groups_G_7, col, ids, offsets):
    rows, start, stop = groups_G_7[:, 0], groups_G_7[:, col], groups_G_7[:, col + 1]
    width = max(int((stop - start).max(initial=0)), 1)
    flat = np.concatenate([np.asarray(x, np.int64).reshape(-1) for x in ids] or [[0]])
    base = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
    idx = start[:, None] + np.arange(width)[None, :]
    valid = idx < stop[:, None]
    offset = np.asarray(offsets, np.int64)[rows] if len(rows) else np.zeros(0, np.int64)
    pos = np.where(valid, offset[:, None] - 1 + idx, -1)
    tok = np.where(valid, flat[np.where(valid, base[rows][:, None] + idx, 0)], -1)
    return torch.from_numpy(pos.astype(np.int64)), torch.from_numpy(tok.astype(np.int64))


def _metrics(aligned, n_proj):
    groups = sum(len(ra.groups) for ra in aligned)
    in_groups = sum(int((ra.groups[:, 1] - ra.groups[:, 0]).sum()) for ra in aligned)
    return {
        "groups": float(groups),
        "student_tokens_in_groups": float(in_groups),
        "unalignable_tokens": float(sum(len(ra.unalignable) for ra in aligned)),
        "bytes": float(sum(ra.n_bytes for ra in aligned)),
        "bytes_exact": float(sum(ra.n_bytes_exact for ra in aligned)),
        "dp_rows": float(sum(ra.used_dp for ra in aligned)),
        "inexact_groups": float(sum(int((~ra.exact).sum()) for ra in aligned)),
        "projection_entries": float(n_proj),
    }


# ---------------------------------------------------------------- teacher byte ends


def text_byte_ends(text, offsets, token_bytes=None) -> np.ndarray:
    char_end = np.concatenate(
        [[0], np.cumsum([len(c.encode("utf-8", "surrogatepass")) for c in text], dtype=np.int64)]
    ).astype(np.int64)
    data = text.encode("utf-8", "surrogatepass")
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    spans = char_end[np.clip(spans, 0, len(char_end) - 1)]
    starts, stops = spans[:, 0].tolist(), spans[:, 1].tolist()
    next_start, upcoming = [0] * len(starts), len(data)
    for k in range(len(starts) - 1, -1, -1):
        next_start[k] = upcoming
        if stops[k] > starts[k]:
            upcoming = starts[k]
    ends = np.empty(len(starts), dtype=np.int64)
    pos = 0
    for k in range(len(starts)):
        own = token_bytes[k] if token_bytes is not None else b""
        if own and starts[k] < pos + len(own) <= stops[k] and data.startswith(own, pos):
            pos += len(own)
        else:
            pos = max(pos, min(stops[k], next_start[k]))
        ends[k] = pos
    return ends
