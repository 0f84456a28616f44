"""The alignment of a whole micro-batch as compiled loops over flat arrays.

All rows' ids, teacher byte ends and teacher bytes are concatenated with row offsets
(`FlatRows`); `student_spans` gives every student token its byte end and the rows' student
bytes; rows whose teacher bytes are not a prefix of the student's get the banded DP
(`dp.align_bytes`, t2s) in Python; `align_rows` then walks every row once (a row with equal
or prefix bytes and no zero-length token, the common case, by the plain walk alone): the
two-pointer groups over the tokens that are not zero-length specials (or, in a DP row, the
teacher ends whose mapped position is a student end), groups straddling a removed special
dropped, the exact flags, the specials paired by role at the same byte position, and the
covered tokens; group_keys.py turns the groups into table keys (`token_align` and `batch`
have the rules in words).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numba
import numpy as np

from distil.align.keys import same_bytes


@dataclass
class FlatRows:
    """Rows concatenated: X_off int64 (B + 1,) are the row offsets into the flat X."""

    s_ids: np.ndarray
    s_off: np.ndarray
    t_ids: np.ndarray
    t_ends: np.ndarray
    t_off: np.ndarray
    t_bytes: np.ndarray
    tb_off: np.ndarray

    @classmethod
    def pack(
        cls,
        s_ids: Sequence[Sequence[int] | np.ndarray],
        t_ids: Sequence[Sequence[int] | np.ndarray],
        t_ends: Sequence[Sequence[int] | np.ndarray],
        t_bytes: Sequence[bytes],
    ) -> FlatRows:
        n = len(s_ids)
        # the rows' three lengths in one pass, their offsets in one cumsum (rows of off)
        lengths = np.fromiter(
            chain.from_iterable(zip(map(len, s_ids), map(len, t_ids), map(len, t_bytes))),
            np.int64,
            3 * n,
        )
        off = np.zeros((3, n + 1), np.int64)
        np.cumsum(lengths.reshape(n, 3).T, axis=1, out=off[:, 1:])
        n_s, n_t = int(off[0, -1]), int(off[1, -1])
        data = b"".join(t_bytes)
        return cls(
            _flat(s_ids, n_s),
            off[0],
            _flat(t_ids, n_t),
            _flat(t_ends, n_t),
            off[1],
            np.frombuffer(data, dtype=np.uint8),  # read-only even when empty: one signature
            off[2],
        )

    @classmethod
    def from_padded(cls, rows, text: tuple | None = None) -> FlatRows:
        """From a `batch.PaddedRows`: the completions gathered from the padded ids; text: its
        `teacher_text` when already made."""
        s_ids, s_off = gather_rows(rows.s_ids_B_L, rows.s_offset_B, rows.s_len_B)
        t_ids, _ = gather_rows(rows.t_ids_B_L, rows.t_offset_B, rows.t_len_B)
        t_ends, t_off, data, tb_off = text or teacher_text(rows.t_ends, rows.t_bytes, rows.t_len_B)
        return cls(s_ids, s_off, t_ids, t_ends, t_off, data, tb_off)


def teacher_text(t_ends, t_bytes, t_len) -> tuple[np.ndarray, ...]:
    """The rows' teacher byte ends and texts concatenated: (ends, their row offsets, the texts'
    bytes (uint8, read-only), their row offsets)."""
    t_off = np.zeros(len(t_len) + 1, np.int64)
    np.cumsum(t_len, out=t_off[1:])
    tb_off = np.zeros(len(t_bytes) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, t_bytes), np.int64, len(t_bytes)), out=tb_off[1:])
    data = np.frombuffer(b"".join(t_bytes), dtype=np.uint8)
    return _flat(t_ends, int(t_off[-1])), t_off, data, tb_off


@numba.njit(cache=True)
def gather_rows(ids, offset, length):  # pragma: no cover - compiled
    """Row b's ids[b, offset[b]:offset[b] + length[b]] concatenated: (flat int64, row offsets)."""
    n_rows = ids.shape[0]
    off = np.zeros(n_rows + 1, np.int64)
    for b in range(n_rows):
        off[b + 1] = off[b] + length[b]
    out = np.empty(off[n_rows], np.int64)
    for b in range(n_rows):
        for k in range(length[b]):
            out[off[b] + k] = ids[b, offset[b] + k]
    return out, off


def _flat(parts: Sequence[Sequence[int] | np.ndarray], n: int) -> np.ndarray:
    if not parts:
        return np.zeros(0, np.int64)
    if hasattr(parts[0], "__array__"):  # arrays or tensors (the collator's): no Python ints
        return np.concatenate(parts, axis=None).astype(np.int64, copy=False)
    # one pass over all rows (a numpy call per row costs as much as the row's data)
    return np.fromiter(chain.from_iterable(parts), dtype=np.int64, count=n)


@numba.njit(cache=True)
def student_spans(s_ids, s_off, v_data, v_start, max_len, t_bytes, tb_off):  # pragma: no cover
    """(s_ends (N_s,) per-row byte ends, s_bytes flat, sb_off (B + 1,), prefix bool (B,):
    the row's teacher bytes are a prefix of its student bytes). Ids outside the table spell
    nothing. One pass over the ids (each id's table entry is read once)."""
    n_rows = s_off.shape[0] - 1
    size = v_start.shape[0] - 1
    s_ends = np.empty(s_ids.shape[0], np.int64)
    sb_off = np.zeros(n_rows + 1, np.int64)
    s_bytes = np.empty(s_ids.shape[0] * max_len, np.uint8)  # pages are touched only if written
    prefix = np.zeros(n_rows, np.bool_)
    w = 0
    for b in range(n_rows):
        # copy the bytes and compare them with the teacher's in the same pass: `stop` is where
        # the teacher's bytes end, `ok` whether they agreed so far
        stop, ok = sb_off[b] + tb_off[b + 1] - tb_off[b], True
        t_at = tb_off[b] - sb_off[b]
        for k in range(s_off[b], s_off[b + 1]):
            i = s_ids[k]
            if 0 <= i < size:
                for a in range(v_start[i], v_start[i + 1]):
                    s_bytes[w] = v_data[a]
                    if w < stop and v_data[a] != t_bytes[t_at + w]:
                        ok = False
                    w += 1
            s_ends[k] = w - sb_off[b]
        sb_off[b + 1] = w
        prefix[b] = ok and stop <= w
    return s_ends, s_bytes[:w], sb_off, prefix


@numba.njit(cache=True)
def align_rows(
    s_ids, s_off, s_ends, s_bytes, sb_off, s_special,
    t_ids, t_ends, t_off, t_bytes, tb_off, t_special,
    partner, dp, t2s, t2s_off,
):  # fmt: skip  # pragma: no cover - compiled
    """Groups of every row: (g int32 (G, 5): row, s0, s1, t0, t1 per row-local token index,
    ordered by row then s0; exact bool (G,); special bool (G,); covered bool (N_s,);
    n_exact int64 (B,): student bytes inside exact groups)."""
    n_rows = s_off.shape[0] - 1
    out_g = np.empty((s_ids.shape[0], 5), np.int32)  # at most one group per student token
    out_exact, out_special = np.zeros(s_ids.shape[0], np.bool_), np.zeros(s_ids.shape[0], np.bool_)
    covered = np.zeros(s_ids.shape[0], np.bool_)
    n_exact = np.zeros(n_rows, np.int64)
    # scratch for the per-row passes, allocated once for the batch (row slices of it)
    s_zero_all, s_kept_all = np.empty(s_ids.shape[0], np.bool_), np.empty(s_ids.shape[0], np.int64)
    t_zero_all, t_kept_all = np.empty(t_ids.shape[0], np.bool_), np.empty(t_ids.shape[0], np.int64)
    bounds = np.empty((2, s_ids.shape[0]), np.int64)
    cg_all = np.empty((s_ids.shape[0], 4), np.int64)
    c_all = np.empty((2, t_ids.shape[0]), np.int64)
    p_all = np.empty((2, s_ids.shape[0]), np.int64)
    n_g = 0
    for b in range(n_rows):
        sb, ns = s_off[b], s_off[b + 1] - s_off[b]
        tb, nt = t_off[b], t_off[b + 1] - t_off[b]
        n_tb = tb_off[b + 1] - tb_off[b]
        se, te = s_ends[sb : sb + ns], t_ends[tb : tb + nt]
        if not dp[b]:
            n_plain = _plain_walk(se, te, n_tb, b, sb, out_g, out_exact, covered, n_exact, n_g)
            if n_plain >= 0:
                n_g = n_plain
                continue
        row_t2s = t2s[t2s_off[b] : t2s_off[b + 1]]
        s_zero, t_zero = s_zero_all[sb : sb + ns], t_zero_all[tb : tb + nt]
        ks = s_kept_all[sb : sb + _kept_student(
            s_ids[sb : sb + ns], se, s_special, n_tb, dp[b], s_zero, s_kept_all[sb:]
        )]  # fmt: skip
        kt = t_kept_all[tb : tb + _kept_teacher(
            t_ids[tb : tb + nt], te, t_special, t_zero, t_kept_all[tb:]
        )]  # fmt: skip
        bs, bt = bounds[0, sb:], bounds[1, sb:]
        if dp[b]:
            m = _mapped_bounds(se, ks, te, kt, row_t2s, bs, bt)
            bs, bt = bs[:m], bt[:m]
        else:
            m = _common_bounds(se, ks, te, kt, bs)
            bs, bt = bs[:m], bs[:m]
        cg = cg_all[sb : sb + _content_groups(se, ks, te, kt, bs, bt, cg_all[sb:])]
        ps, pt = p_all[0, sb:], p_all[1, sb:]
        m = _special_pairs(
            s_ids[sb : sb + ns], se, s_zero, t_ids[tb : tb + nt], te, t_zero, kt, n_tb,
            partner, dp[b], row_t2s, c_all[0, tb:], c_all[1, tb:], ps, pt,
        )  # fmt: skip
        ps, pt = ps[:m], pt[:m]
        x = y = 0
        while x < cg.shape[0] or y < ps.shape[0]:  # groups and pairs merged by s0
            if x >= cg.shape[0] or (y < ps.shape[0] and ps[y] < cg[x, 0]):
                s0, s1, t0, t1 = ps[y], ps[y] + 1, pt[y], pt[y] + 1
                same = True
                out_special[n_g] = True
                y += 1
            else:
                s0, s1, t0, t1 = cg[x, 0], cg[x, 1], cg[x, 2], cg[x, 3]
                sa, ta = (se[s0 - 1] if s0 > 0 else 0), (te[t0 - 1] if t0 > 0 else 0)
                n = se[s1 - 1] - sa
                # the DP maps boundaries only: the bytes between them may differ
                same = not dp[b] or (
                    n == te[t1 - 1] - ta
                    and same_bytes(s_bytes, sb_off[b] + sa, t_bytes, tb_off[b] + ta, n)
                )
                if same:
                    n_exact[b] += n
                x += 1
            out_g[n_g, 0], out_g[n_g, 1], out_g[n_g, 2] = b, s0, s1
            out_g[n_g, 3], out_g[n_g, 4] = t0, t1
            out_exact[n_g] = same
            for k in range(sb + s0, sb + s1):
                covered[k] = True
            n_g += 1
    return out_g[:n_g], out_exact[:n_g], out_special[:n_g], covered, n_exact


@numba.njit(cache=True, inline="always")
def _plain_walk(se, te, n_tb, b, sb, out_g, out_exact, covered, n_exact, n_g):
    # pragma: no cover - compiled
    # the common row: equal/prefix bytes and no zero-length token on either side (no special
    # to pair or remove): the two-pointer walk alone gives the general passes' groups. Returns
    # the new group count, or -1 (nothing written) when the row has a zero-length token.
    prev = 0
    for k in range(se.shape[0]):
        if se[k] <= prev:
            return -1
        prev = se[k]
    prev = 0
    for j in range(te.shape[0]):
        if te[j] <= prev:
            return -1
        prev = te[j]
    i = j = s0 = t0 = 0
    n = n_g
    while i < se.shape[0] and j < te.shape[0] and se[i] <= n_tb:
        if se[i] == te[j]:  # both sides end a token here: close the group
            out_g[n, 0], out_g[n, 1], out_g[n, 2], out_g[n, 3], out_g[n, 4] = (
                b,
                s0,
                i + 1,
                t0,
                j + 1,
            )
            out_exact[n] = True
            for k in range(sb + s0, sb + i + 1):
                covered[k] = True
            n_exact[b] += se[i] - (se[s0 - 1] if s0 > 0 else 0)
            n += 1
            i, j = i + 1, j + 1
            s0, t0 = i, j
        elif se[i] < te[j]:
            i += 1
        else:
            j += 1
    return n


@numba.njit(cache=True)
def _kept_student(ids, ends, special, n_t_bytes, use_dp, zero, kept):
    # pragma: no cover - compiled
    # zero-length special per token into `zero`, the other tokens' indices into `kept` (their
    # count returned); with equal/prefix bytes the student's tail after the teacher's bytes (a
    # cut character) is in no group
    n = 0
    for k in range(ids.shape[0]):
        # specials spell no bytes: look the (large, cache-cold) flag table up only then
        start = ends[k - 1] if k > 0 else 0
        zero[k] = ends[k] == start and 0 <= ids[k] < special.shape[0] and special[ids[k]]
        if not zero[k] and (use_dp or ends[k] <= n_t_bytes):
            kept[n] = k
            n += 1
    return n


@numba.njit(cache=True)
def _kept_teacher(ids, ends, special, zero, kept):  # pragma: no cover - compiled
    # as `_kept_student`: a teacher special is zero-length only where its span is empty (an
    # unknown character spans its bytes and stays a content token)
    n = 0
    for j in range(ids.shape[0]):
        start = ends[j - 1] if j > 0 else 0
        zero[j] = ends[j] == start and 0 <= ids[j] < special.shape[0] and special[ids[j]]
        if not zero[j]:
            kept[n] = j
            n += 1
    return n


@numba.njit(cache=True)
def _common_bounds(se, ks, te, kt, bs):  # pragma: no cover - compiled
    # equal bytes: every common end > 0 of the kept tokens (a merge of the sorted ends) into
    # bs; their count returned
    i = j = m = last = 0
    while i < ks.shape[0] and j < kt.shape[0]:
        a, c = se[ks[i]], te[kt[j]]
        if a == c:
            if a > last:
                bs[m] = a
                m += 1
                last = a
            i += 1
            j += 1
        elif a < c:
            i += 1
        else:
            j += 1
    return m


@numba.njit(cache=True)
def _mapped_bounds(se, ks, te, kt, t2s, bs, bt):  # pragma: no cover - compiled
    # DP row: the kept teacher ends whose mapped student boundary is a kept student end (into
    # bs, bt; their count returned)
    i = m = last = 0
    for q in range(kt.shape[0]):
        end = te[kt[q]]
        if end <= last:
            continue
        last = end
        mapped = t2s[end]
        if mapped <= 0:
            continue
        while i < ks.shape[0] and se[ks[i]] < mapped:
            i += 1
        if i < ks.shape[0] and se[ks[i]] == mapped:
            bs[m], bt[m] = mapped, end
            m += 1
    return m


@numba.njit(cache=True)
def _content_groups(se, ks, te, kt, bs, bt, out):  # pragma: no cover - compiled
    # from each boundary back to the previous one, over kept tokens: the first kept token on
    # each side reaching the boundary closes the group (a zero-length token joins the next);
    # the groups go into out (n, 4), their count returned
    n = ps = pt = i = j = 0
    for q in range(bs.shape[0]):
        while se[ks[i]] < bs[q]:
            i += 1
        while te[kt[j]] < bt[q]:
            j += 1
        s0, s1, t0, t1 = ks[ps], ks[i] + 1, kt[pt], kt[j] + 1
        # a removed special inside the range: the group is dropped, not merged across it
        if s1 - s0 == i + 1 - ps and t1 - t0 == j + 1 - pt:
            out[n, 0], out[n, 1], out[n, 2], out[n, 3] = s0, s1, t0, t1
            n += 1
        i, j = i + 1, j + 1
        ps, pt = i, j
    return n


@numba.njit(cache=True)
def _special_pairs(
    s_ids, se, s_zero, t_ids, te, t_zero, kt, n_t_bytes, partner, use_dp, t2s, c_j, c_pos, ps, pt
):  # pragma: no cover - compiled
    # zero-length specials: 1:1 with the same role at the same byte position, in order (into
    # ps, pt; their count returned); a teacher special after its last content token stands at
    # the end of the text
    last_content = kt[kt.shape[0] - 1] if kt.shape[0] else -1
    n_c = t_ids.shape[0] - kt.shape[0]
    c = 0
    for j in range(t_ids.shape[0]):
        if t_zero[j]:
            at = n_t_bytes if j > last_content else te[j]
            c_j[c], c_pos[c] = j, (t2s[at] if use_dp else at)  # -1: no exact DP match
            c += 1
    n = first = 0
    for k in range(s_ids.shape[0]):
        if not s_zero[k]:
            continue
        for c in range(first, n_c):
            if c_pos[c] == se[k] and partner[t_ids[c_j[c]]] == s_ids[k]:
                ps[n], pt[n] = k, c_j[c]
                n += 1
                first = c + 1
                break
    return n
