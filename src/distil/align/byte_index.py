"""A vocabulary's byte strings sorted into flat arrays, and the compiled prefix queries on them.

The match and projection tables (`tables.MatchTables`, `ProjectionTables`) ask, for every
candidate token of one side, which tokens of the other side start with some bytes, spell them
exactly, or are their longest prefix. Over a 262k-token vocabulary that is millions of byte
comparisons per table; here every non-special id with bytes sits in one array sorted by
(bytes, id), so the tokens starting with a prefix are a contiguous range found by narrowing one
byte at a time (two binary searches per byte), and the table builds run as numba loops over
that array. The results are the same lists the per-token Python lookups gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np


@dataclass(eq=False)
class ByteIndex:
    """data uint8: every id's bytes concatenated; start int32 (size + 1,): id i spells
    data[start[i]:start[i + 1]] (int32: half the cache lines per looked-up id of int64; 1 MiB
    for a 262k vocabulary); order int64 (K,): the non-special ids with bytes, sorted by
    (bytes, id); canon int64 (K,): the canonical id (`VocabBytes.by_bytes`) of each key."""

    data: np.ndarray
    start: np.ndarray
    order: np.ndarray
    canon: np.ndarray

    @classmethod
    def build(
        cls, token_bytes: list[bytes], is_special: np.ndarray, by_bytes: dict[bytes, int]
    ) -> ByteIndex:
        lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
        start = np.zeros(len(token_bytes) + 1, dtype=np.int32)  # < 2**31 bytes in any vocab
        start[1:] = np.cumsum(lengths)
        data = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)
        keep = [i for i in np.flatnonzero((lengths > 0) & ~is_special[: len(lengths)]).tolist()]
        keep.sort(key=token_bytes.__getitem__)  # stable: equal bytes stay in id order
        order = np.asarray(keep, dtype=np.int64)
        canon = np.fromiter(
            (by_bytes[token_bytes[i]] for i in keep), dtype=np.int64, count=len(keep)
        )
        return cls(data, start, order, canon)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.data, self.start, self.order, self.canon


# ------------------------------------------------------------------ compiled queries
# An index is passed as its four arrays (data, start, order, canon); a query as a slice
# q[qa:qb] of a uint8 array. Keys in a range that share their first d bytes are sorted by
# their byte at depth d, with a key that has ended (length d) first (-1).


@numba.njit(cache=True, inline="always")
def _key_byte(data, start, order, p, d):  # pragma: no cover - compiled
    i = order[p]
    a = start[i] + d
    return np.int64(data[a]) if a < start[i + 1] else np.int64(-1)


@numba.njit(cache=True, inline="always")
def _key_len(start, order, p):  # pragma: no cover - compiled
    i = order[p]
    return start[i + 1] - start[i]


@numba.njit(cache=True)
def _narrow(data, start, order, lo, hi, d, c):  # pragma: no cover - compiled
    # keys of [lo, hi) whose byte at depth d is c
    a, b = lo, hi
    while a < b:
        m = (a + b) >> 1
        if _key_byte(data, start, order, m, d) < c:
            a = m + 1
        else:
            b = m
    first, b = a, hi
    while a < b:
        m = (a + b) >> 1
        if _key_byte(data, start, order, m, d) <= c:
            a = m + 1
        else:
            b = m
    return first, a


@numba.njit(cache=True)
def prefix_range(data, start, order, q, qa, qb, lo, hi, depth):  # pragma: no cover - compiled
    """Keys of [lo, hi) (which share `depth` bytes) that continue with q[qa:qb]."""
    for d in range(qb - qa):
        if lo >= hi:
            break
        lo, hi = _narrow(data, start, order, lo, hi, depth + d, np.int64(q[qa + d]))
    return lo, hi


@numba.njit(cache=True)
def skip_exact(start, order, lo, hi, n):  # pragma: no cover - compiled
    """First key of [lo, hi) longer than n (keys of length n come first in a prefix range)."""
    while lo < hi and _key_len(start, order, lo) == n:
        lo += 1
    return lo


@numba.njit(cache=True)
def find_exact(data, start, order, canon, q, qa, qb):  # pragma: no cover - compiled
    """Canonical id of the key equal to q[qa:qb], or -1."""
    lo, hi = prefix_range(data, start, order, q, qa, qb, 0, order.shape[0], 0)
    if lo < hi and _key_len(start, order, lo) == qb - qa:
        return canon[lo]
    return -1


@numba.njit(cache=True)
def longest_prefix(data, start, order, canon, q, qa, qb):  # pragma: no cover - compiled
    """Canonical id of the longest key that is a prefix of q[qa:qb], or -1."""
    lo, hi, best = 0, order.shape[0], -1
    for d in range(qb - qa):
        lo, hi = _narrow(data, start, order, lo, hi, d, np.int64(q[qa + d]))
        if lo >= hi:
            break
        if _key_len(start, order, lo) == d + 1:
            best = canon[lo]
    return best


@numba.njit(cache=True)
def match_pairs(L_data, L_start, L_order, L_canon, O_data, O_start, O_order, O_canon, delta):
    # pragma: no cover - compiled
    """(longer_ids, other_ids): canonical keys of L strictly longer than `delta` that start with
    it, and the canonical id of O spelling the rest, where O has one."""
    n = delta.shape[0]
    lo, hi = prefix_range(L_data, L_start, L_order, delta, 0, n, 0, L_order.shape[0], 0)
    lo = skip_exact(L_start, L_order, lo, hi, n)
    out_l = np.empty(hi - lo, np.int64)
    out_o = np.empty(hi - lo, np.int64)
    m = 0
    for p in range(lo, hi):
        i = L_order[p]
        if L_canon[p] != i:
            continue
        j = find_exact(O_data, O_start, O_order, O_canon, L_data, L_start[i] + n, L_start[i + 1])
        if j >= 0:
            out_l[m], out_o[m] = i, j
            m += 1
    return out_l[:m], out_o[:m]


@numba.njit(cache=True)
def absent_prefix_sum(S_data, S_start, S_order, S_canon, T_data, T_start, T_order):
    # pragma: no cover - compiled
    """int64 (K_s + 1,): running count of canonical student keys that no teacher key spells
    (a merge of the two sorted arrays)."""
    ks, kt = S_order.shape[0], T_order.shape[0]
    out = np.zeros(ks + 1, np.int64)
    j = 0
    for p in range(ks):
        i = S_order[p]
        a0, a1 = S_start[i], S_start[i + 1]
        found = False
        while j < kt:
            t = T_order[j]
            b0, b1 = T_start[t], T_start[t + 1]
            cmp = 0
            n = min(a1 - a0, b1 - b0)
            for d in range(n):
                x, y = S_data[a0 + d], T_data[b0 + d]
                if x != y:
                    cmp = -1 if x < y else 1
                    break
            if cmp == 0:
                cmp = -1 if a1 - a0 < b1 - b0 else (1 if a1 - a0 > b1 - b0 else 0)
            if cmp > 0:
                j += 1
                continue
            found = cmp == 0
            break
        out[p + 1] = out[p] + (1 if S_canon[p] == i and not found else 0)
    return out


@numba.njit(cache=True)
def projection_pairs(
    T_data, T_start, T_order, S_data, S_start, S_order, S_canon, remainder, absent_cum
):  # pragma: no cover - compiled
    """(teacher_ids, student_ids) of `ProjectionTables` for `remainder` (without the role pairs
    of the empty remainder), unsorted; -1 = AMBIGUOUS. `absent_cum`: `absent_prefix_sum`, used
    for the empty remainder (there remainder + bytes(u) is a teacher key iff u's bytes are)."""
    r = remainder.shape[0]
    lo, hi = prefix_range(T_data, T_start, T_order, remainder, 0, r, 0, T_order.shape[0], 0)
    longer = skip_exact(T_start, T_order, lo, hi, r)
    out_t = np.empty(hi - lo, np.int64)
    out_s = np.empty(hi - lo, np.int64)
    m = 0
    ks = S_order.shape[0]
    for p in range(longer, hi):
        t = T_order[p]
        a, b = T_start[t] + r, T_start[t + 1]
        s = longest_prefix(S_data, S_start, S_order, S_canon, T_data, a, b)
        if s < 0:
            continue
        # student tokens strictly longer than rest that start with it: could one of them
        # cover more than t while the teacher has no token for remainder + its bytes?
        u_lo, u_hi = prefix_range(S_data, S_start, S_order, T_data, a, b, 0, ks, 0)
        u_lo = skip_exact(S_start, S_order, u_lo, u_hi, b - a)
        ambiguous = False
        if r == 0:
            ambiguous = absent_cum[u_hi] - absent_cum[u_lo] > 0
        else:
            for q in range(u_lo, u_hi):
                u = S_order[q]
                if S_canon[q] != u:
                    continue
                v_lo, v_hi = prefix_range(
                    T_data, T_start, T_order, S_data, S_start[u], S_start[u + 1], lo, hi, r
                )
                full = r + S_start[u + 1] - S_start[u]
                if v_lo >= v_hi or _key_len(T_start, T_order, v_lo) != full:
                    ambiguous = True
                    break
        out_t[m], out_s[m] = t, (-1 if ambiguous else s)
        m += 1
    # a teacher token spelling exactly the remainder: AMBIGUOUS (see ProjectionTables)
    if r > 0:
        for p in range(lo, longer):
            out_t[m], out_s[m] = T_order[p], -1
            m += 1
    return out_t[:m], out_s[:m]


def as_query(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, np.uint8)
