"""Groups of student and teacher tokens that spell the same bytes of one completion.

The student's completion bytes come from its ids through the byte table (`VocabBytes`); the
teacher's come from character offsets over the text it was given. When the two byte strings are
equal, a group closes wherever both sides end a token at the same byte (TRL's
`_align_by_byte_offsets`, O(n+m), here done with one `intersect1d`); when the teacher's text is
the student's bytes with an incomplete trailing character dropped, the same walk runs over the
common prefix; otherwise a banded edit-distance alignment (`dp.align_bytes`) maps teacher
boundaries onto student boundaries. Zero-length specials never enter a content group: they are
paired by role at the same byte position (EOS with EOS) as 1:1 groups, or left unalignable.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distil.align.vocab_map import VocabBytes, role_map, vocab_bytes


def completion_text(student_bytes: bytes) -> str:
    """The text a teacher is given for a student completion: its bytes as UTF-8.

    An incomplete trailing character (generation stopped inside a multi-byte character) is
    dropped, so the teacher's bytes are a prefix of the student's; invalid bytes elsewhere
    become U+FFFD (and the alignment falls back to the DP).
    """
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(student_bytes)


def student_byte_spans(ids: Sequence[int] | np.ndarray, vb: VocabBytes) -> tuple[bytes, np.ndarray]:
    """(bytes, ends): the concatenated bytes of `ids` and each token's end offset, int64 (C,).

    Token k covers [ends[k-1], ends[k]) (start 0 for k = 0); specials and ids outside the
    tokenizer (padded embedding rows) have zero length.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    inside = (ids >= 0) & (ids < vb.size)
    lengths = np.where(inside, vb.lengths[np.where(inside, ids, 0)], 0)
    table = vb.token_bytes
    data = b"".join(table[i] for i in ids[inside].tolist())
    return data, np.cumsum(lengths, dtype=np.int64)


def text_byte_ends(
    text: str,
    offsets: Sequence[tuple[int, int]],
    token_bytes: Sequence[bytes] | None = None,
) -> np.ndarray:
    """UTF-8 byte end of each token, int64 (C,), from character `offsets` over `text`.

    Token k then covers [ends[k-1], ends[k]) of `text.encode()`. Ends are non-decreasing:
    whitespace that no token's offsets cover (WordPiece, trimmed offsets) goes to the next
    token. When `token_bytes` (each token's bytes from its `VocabBytes`) is given, a token whose
    bytes appear at the current position, within its offsets, ends after them: this splits
    spans shared by several byte-fallback/byte-level pieces of one character (offsets give all
    of them the whole character) and gives zero length to a SentencePiece '▁' prepended to a
    text that had no leading space (its offsets claim the first character). Otherwise (or
    without `token_bytes`) a token ends at its offset end, but not after the start of the next
    token with a non-empty span, so pieces sharing a span put all bytes on the last of them.
    """
    char_end = _char_to_byte(text)
    data = text.encode("utf-8", "surrogatepass")
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    spans = char_end[np.clip(spans, 0, len(char_end) - 1)]
    starts, stops = spans[:, 0].tolist(), spans[:, 1].tolist()
    # start of the next token with a non-empty span (zero-width (0, 0) specials are skipped)
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


def token_starts(ends: np.ndarray) -> np.ndarray:
    """Start byte of each token from the end bytes: int64 (C,) (0, then the previous ends)."""
    return np.concatenate([[0], np.asarray(ends, dtype=np.int64)])[:-1].astype(np.int64)


def _char_to_byte(text: str) -> np.ndarray:
    # byte offset of every character boundary: (len(text) + 1,)
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    widths = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    return np.concatenate([[0], np.cumsum(widths, dtype=np.int64)])


def encode_with_byte_ends(
    tokenizer: Any, text: str, vb: VocabBytes | None = None
) -> tuple[list[int], np.ndarray, bytes]:
    """Tokenize `text` (no specials added) -> (ids, byte ends, text bytes) for `align_completion`."""
    vb = vb or vocab_bytes(tokenizer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    table = [vb.token_bytes[i] if 0 <= i < vb.size else b"" for i in ids]
    return ids, text_byte_ends(text, enc["offset_mapping"], table), text.encode("utf-8")


def two_pointer_groups(s_ends: np.ndarray, t_ends: np.ndarray) -> np.ndarray:
    """Groups of tokens that end at the same byte on both sides: int64 (G, 4).

    Rows are (s_start, s_stop, t_start, t_stop), half-open token ranges. A group closes at every
    positive byte offset where both sides end a token (the two-pointer walk of TRL/NeMo, as one
    `intersect1d` over the sorted ends). A zero-length token joins the group that follows it,
    so no group is one-sided; tokens after the last common end are in no group.
    """
    s_ends, t_ends = np.asarray(s_ends, np.int64), np.asarray(t_ends, np.int64)
    common = np.intersect1d(s_ends, t_ends)
    return _groups_at(s_ends, t_ends, common[common > 0], common[common > 0])


def _groups_at(s_ends, t_ends, s_bounds, t_bounds) -> np.ndarray:
    # close a group at the first token on each side reaching each paired boundary
    if not len(s_bounds):
        return np.zeros((0, 4), dtype=np.int64)
    s_stop = np.searchsorted(s_ends, s_bounds, side="left") + 1
    t_stop = np.searchsorted(t_ends, t_bounds, side="left") + 1
    s_start = np.concatenate([[0], s_stop[:-1]]).astype(np.int64)
    t_start = np.concatenate([[0], t_stop[:-1]]).astype(np.int64)
    return np.stack([s_start, s_stop, t_start, t_stop], axis=1).reshape(-1, 4)


@dataclass
class RowAlignment:
    """The groups of one completion (indices are completion-token indices, 0-based).

    groups        int64 (G, 4): s_start, s_stop, t_start, t_stop (half-open), ordered by s_start
    exact         bool (G,): the group's bytes are equal on both sides
    special       bool (G,): a 1:1 pair of zero-length specials matched by role (EOS <-> EOS)
    unalignable   int64 (U,): student tokens in no group (cut tail, unpaired specials, ...)
    s_bytes, s_ends   the student's completion bytes and token byte ends (C_s,)
    t_bytes, t_ends   the teacher's text bytes and token byte ends (C_t,)
    n_bytes       student completion bytes; n_bytes_exact: of them, inside exact groups
    used_dp       the byte strings differed and the edit-distance alignment was used
    """

    groups: np.ndarray
    exact: np.ndarray
    special: np.ndarray
    unalignable: np.ndarray
    s_bytes: bytes
    s_ends: np.ndarray
    t_bytes: bytes
    t_ends: np.ndarray
    n_bytes: int
    n_bytes_exact: int
    used_dp: bool

    def in_groups(self) -> np.ndarray:
        """Student completion indices inside some group, sorted: int64."""
        return np.setdiff1d(np.arange(len(self.s_ends)), self.unalignable)


def align_completion(
    s_ids: Sequence[int] | np.ndarray,
    s_vb: VocabBytes,
    t_ids: Sequence[int] | np.ndarray,
    t_ends: Sequence[int] | np.ndarray,
    t_bytes: bytes,
    t_vb: VocabBytes,
) -> RowAlignment:
    """Align a student completion (ids) with the teacher's tokens of the text it was given.

    `t_ends` are the teacher tokens' byte ends over `t_bytes` (`text_byte_ends`). Equal bytes:
    two-pointer groups. Teacher bytes a strict prefix of the student's: two-pointer over the
    common part, the student tail unalignable. Otherwise the DP fallback; its groups close where
    a teacher end maps exactly onto a student end and are flagged exact only when their bytes
    agree. A group whose token range would contain a zero-length special is dropped (its
    student tokens become unalignable) rather than merged across a token the other side lacks.
    """
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
        s_keep = s_keep[s_ends[s_keep] <= len(t_bytes)]  # the cut tail is in no group
        common = np.intersect1d(s_ends[s_keep], t_ends[t_keep])
        s_bounds = t_bounds = common[common > 0]
    else:
        from distil.align.dp import align_bytes  # numba loads only when a row needs it

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


def _is_special(ids: np.ndarray, vb: VocabBytes) -> np.ndarray:
    inside = (ids >= 0) & (ids < vb.size)
    return inside & vb.is_special[np.where(inside, ids, 0)]


def _mapped_bounds(
    t2s: np.ndarray, te: np.ndarray, se: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    # teacher ends whose mapped student boundary is also a student end (strictly increasing)
    te = np.unique(te[te > 0])
    mapped = t2s[te]
    ok = (mapped > 0) & np.isin(mapped, se)
    return te[ok], mapped[ok]


def _to_original(groups: np.ndarray, s_keep: np.ndarray, t_keep: np.ndarray) -> np.ndarray:
    # ranges over kept tokens -> original indices; drop groups that straddle a removed special
    if not len(groups):
        return groups
    s0, s1 = s_keep[groups[:, 0]], s_keep[groups[:, 1] - 1] + 1
    t0, t1 = t_keep[groups[:, 2]], t_keep[groups[:, 3] - 1] + 1
    contiguous = (s1 - s0 == groups[:, 1] - groups[:, 0]) & (t1 - t0 == groups[:, 3] - groups[:, 2])
    return np.stack([s0, s1, t0, t1], axis=1)[contiguous]


def _exact_flags(groups, s_bytes, s_ends, t_bytes, t_ends) -> np.ndarray:
    out = np.ones(len(groups), dtype=bool)
    for g, (s0, s1, t0, t1) in enumerate(groups.tolist()):
        sa = int(s_ends[s0 - 1]) if s0 else 0
        ta = int(t_ends[t0 - 1]) if t0 else 0
        out[g] = s_bytes[sa : s_ends[s1 - 1]] == t_bytes[ta : t_ends[t1 - 1]]
    return out


def _pair_specials(s_ids, s_ends, s_zero, t_ids, t_ends, t_bytes, t_zero, s_vb, t_vb, t2s):
    """1:1 (s, t) pairs of zero-length specials with the same role at the same byte position."""
    roles = _role_map_cached(s_vb, t_vb)
    content = np.flatnonzero(~t_zero)
    last_content = int(content[-1]) if len(content) else -1
    t_cands = []
    for j in np.flatnonzero(t_zero).tolist():
        # a special after the teacher's last content token stands at the end of the text:
        # bytes after that token are ones the teacher's tokenizer dropped (a final '\n' under
        # WordPiece), so the student's tokens for them are unalignable and its EOS still pairs
        at = len(t_bytes) if j > last_content else int(t_ends[j])
        pos = at if t2s is None else int(t2s[at])  # -1: no exact match
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


_ROLE_MAPS: dict[tuple[int, int], tuple[VocabBytes, VocabBytes, dict[int, int]]] = {}


def _role_map_cached(s_vb: VocabBytes, t_vb: VocabBytes) -> dict[int, int]:
    key = (id(s_vb), id(t_vb))
    hit = _ROLE_MAPS.get(key)
    if hit is None or hit[0] is not s_vb or hit[1] is not t_vb:
        hit = _ROLE_MAPS[key] = (s_vb, t_vb, role_map(s_vb, t_vb))
    return hit[2]


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
