"""Byte-string keys (slices of one byte array) deduplicated and looked up in compiled code.

The table ids of a micro-batch are keyed by byte strings: the delta of a group's prefixes
(`MatchTables`) or the remainder the teacher is behind (`ProjectionTables`). The keys are
(offset, length) slices of the batch's student bytes; `first_seen` finds the distinct ones in
order of first appearance and `KeyIndex` holds the keys of the tables built so far, both as
open-addressing hash tables (FNV-1a) that compare the bytes, so no collision can mix two keys.
"""

from __future__ import annotations

import numba
import numpy as np

HASH_START = np.uint64(14695981039346656037)  # FNV-1a's offset basis: the hash of no bytes


@numba.njit(cache=True, inline="always")
def hash_more(h, data, a, n):  # pragma: no cover - compiled
    # FNV-1a: the bytes hash h extended by the bytes data[a:a + n] (HASH_START: no bytes yet)
    for i in range(a, a + n):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    return h


@numba.njit(cache=True, inline="always")
def hash_key(h, flag):  # pragma: no cover - compiled
    # a key's hash from its bytes hash (`hash_more`) and its flag, folded in last so that two
    # keys with the same bytes share the work
    return (h ^ np.uint64(2 + flag)) * np.uint64(1099511628211)


@numba.njit(cache=True, inline="always")
def _hash(data, a, n, flag):  # pragma: no cover - compiled
    return hash_key(hash_more(HASH_START, data, a, n), flag)


@numba.njit(cache=True, inline="always")
def same_bytes(data_a, a, data_b, b, n):  # pragma: no cover - compiled
    for d in range(n):  # noqa: SIM110 (numba compiles no generators)
        if data_a[a + d] != data_b[b + d]:
            return False
    return True


@numba.njit(cache=True)
def first_seen(data, off, length, flag, select):  # pragma: no cover - compiled
    """Distinct keys among the selected entries, by an open-addressing hash table that compares
    the bytes: (reps int64 (U,): entry index of each distinct key in order of first appearance,
    key int64 (N,): index into reps per selected entry, -1 elsewhere)."""
    n = off.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, np.int64)  # index into reps
    reps = np.empty(n, np.int64)
    key = np.full(n, -1, np.int64)
    n_u = 0
    for q in range(n):
        if not select[q]:
            continue
        s = np.int64(_hash(data, off[q], length[q], flag[q]) & np.uint64(size - 1))
        while True:
            u = slots[s]
            if u < 0:
                slots[s], reps[n_u], key[q] = n_u, q, n_u
                n_u += 1
                break
            r = reps[u]
            if (
                length[r] == length[q]
                and flag[r] == flag[q]
                and same_bytes(data, off[r], data, off[q], length[q])
            ):
                key[q] = u
                break
            s = (s + 1) & (size - 1)
    return reps[:n_u], key


@numba.njit(cache=True)
def lookup_keys(k_data, slots, data, off, length, flag, select, default):
    # pragma: no cover - compiled
    """Value of each selected non-empty key in a `KeyIndex` (its arrays), -1 where it is
    absent, `default` where it is not selected or empty: (int64 (N,), number absent)."""
    out = np.empty(off.shape[0], np.int64)
    n_miss = 0
    for q in range(off.shape[0]):
        if not select[q] or length[q] == 0:
            out[q] = default
            continue
        h = _hash(data, off[q], length[q], flag[q])
        out[q] = probe(k_data, slots, h, data, off[q], length[q], flag[q])
        n_miss += out[q] < 0
    return out, n_miss


@numba.njit(cache=True, inline="always")
def probe(k_data, slots, h, data, a, n, flag):  # pragma: no cover - compiled
    """Value of the key data[a:a + n] with `flag` in a `KeyIndex` (its arrays), h its hash
    (`hash_more`, then `hash_key`); -1 if absent. A slot holds what a probe reads (the key's
    hash, length and flag, offset into k_data, value), so that a miss costs one slot."""
    size = slots.shape[0]
    if size == 0:
        return -1
    s = np.int64(h & np.uint64(size - 1))
    sig = np.int64(h)
    while slots[s, 1] >= 0:
        if (
            slots[s, 0] == sig
            and slots[s, 1] == 2 * n + flag
            and same_bytes(k_data, slots[s, 2], data, a, n)
        ):
            return slots[s, 3]
        s = (s + 1) & (size - 1)
    return -1


@numba.njit(cache=True)
def key_slots(k_data, k_off, k_len, k_flag, k_value):  # pragma: no cover - compiled
    """The open-addressing slots of distinct keys for `probe`: int64 (size, 4) rows of (hash,
    2 * length + flag, offset, value), length -1 in a free slot."""
    size = 16
    while size < 2 * k_off.shape[0]:
        size *= 2
    slots = np.zeros((size, 4), np.int64)
    slots[:, 1] = -1
    for q in range(k_off.shape[0]):
        h = _hash(k_data, k_off[q], k_len[q], k_flag[q])
        s = np.int64(h & np.uint64(size - 1))
        while slots[s, 1] >= 0:
            s = (s + 1) & (size - 1)
        slots[s, 0], slots[s, 1] = np.int64(h), 2 * k_len[q] + k_flag[q]
        slots[s, 2], slots[s, 3] = k_off[q], k_value[q]
    return slots


class KeyIndex:
    """Byte-string keys with a flag -> value (a table id), looked up for a whole batch at once in
    compiled code, so that a warm batch needs no Python per key."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._flags: list[bool] = []
        self._values: list[int] = []
        self._arrays: tuple | None = None
        self._memo: np.ndarray | None = None

    def add(self, key: bytes, flag: bool, value: int) -> None:
        self._keys.append(key)
        self._flags.append(flag)
        self._values.append(value)
        self._arrays = None

    def lookup(self, data, off, length, flag, select, default: int = -1):
        """(int64 (N,), number absent): the value of each selected non-empty key
        data[off:off + length], -1 if absent, `default` if not selected or empty."""
        return lookup_keys(*self.arrays(), data, off, length, flag, select, default)

    def prefix_memo(self, size: int) -> np.ndarray:
        """int32 (size,), -1 where not known yet: the value of each key that is a prefix of a
        vocabulary token, at the token's offset in its byte index plus the key's length
        (`fast.plain_batch` fills it as it looks keys up; a key's value never changes)."""
        if self._memo is None or len(self._memo) != size:
            self._memo = np.full(size, -1, np.int32)
        return self._memo

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(k_data, slots): the keys' bytes and the slots `probe` reads (`key_slots`), rebuilt
        after an `add`."""
        if self._arrays is None:
            joined = b"".join(self._keys)
            # read-only either way: one numba signature for the compiled lookups
            k_data = np.frombuffer(joined or b"\0", np.uint8)
            k_len = np.array([len(k) for k in self._keys], dtype=np.int64)
            k_off = (np.cumsum(k_len) - k_len).astype(np.int64)
            k_flag = np.array(self._flags, dtype=np.int64)
            values = np.array(self._values, dtype=np.int64)
            slots = key_slots(k_data, k_off, k_len, k_flag, values)
            self._arrays = (k_data, slots if self._keys else np.zeros((0, 4), np.int64))
        return self._arrays
