"""Groups of student and teacher tokens that spell the same bytes of one completion.

The student's completion bytes come from its ids through the byte table (`VocabBytes`); the
teacher's come from character offsets over the text it was given. When the two byte strings are
equal, a group closes wherever both sides end a token at the same byte (TRL's
`_align_by_byte_offsets`, O(n+m)); when the teacher's text is the student's bytes with an
incomplete trailing character dropped, the same walk runs over the common prefix; otherwise a banded edit-distance alignment (`dp.align_bytes`) maps teacher
boundaries onto student boundaries. Zero-length specials never enter a content group: they are
paired by role at the same byte position (EOS with EOS) as 1:1 groups, or left unalignable.
`align_flat` does all of it for a whole micro-batch in compiled passes (`walk`);
`align_completion` is the same on one row.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distil.align.text_ends import text_ends
from distil.align.vocab_map import VocabBytes, role_map, vocab_bytes
from distil.align.walk import FlatRows, align_rows, student_spans


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
    own = list(token_bytes) if token_bytes is not None else [b""] * len(spans)
    own_off = np.zeros(len(spans) + 1, dtype=np.int64)
    own_off[1:] = np.fromiter(map(len, own), dtype=np.int64, count=len(spans))
    np.cumsum(own_off, out=own_off)
    return text_ends(
        np.frombuffer(data, np.uint8),
        np.ascontiguousarray(spans[:, 0]),
        np.ascontiguousarray(spans[:, 1]),
        np.frombuffer(b"".join(own) or b"\0", np.uint8),
        own_off[:-1],
        own_off[1:],
    )


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


@dataclass
class BatchAlignment:
    """The groups of a micro-batch (`align_flat`); token indices are row-local.

    groups int32 (G, 5): row, s_start, s_stop, t_start, t_stop, ordered by row then s_start;
    exact, special bool (G,); covered bool (N_s,): student token inside a group; n_exact int64
    (B,): student bytes inside exact groups; s_ends int64 (N_s,) per-row byte ends, s_bytes
    uint8 and sb_off (B + 1,): the rows' student bytes; dp bool (B,): the DP fallback was used.
    """

    rows: FlatRows
    groups: np.ndarray
    exact: np.ndarray
    special: np.ndarray
    covered: np.ndarray
    n_exact: np.ndarray
    s_ends: np.ndarray
    s_bytes: np.ndarray
    sb_off: np.ndarray
    dp: np.ndarray


def align_flat(rows: FlatRows, s_vb: VocabBytes, t_vb: VocabBytes) -> BatchAlignment:
    """Align every row of a micro-batch in compiled passes (`walk`); see `align_completion`.

    Rows whose teacher bytes are not a prefix of the student's go through the banded DP
    (`dp.align_bytes`), one call per such row; the others cost no Python per row.
    """
    s_index = s_vb.index()
    s_ends, s_bytes, sb_off, prefix = student_spans(
        rows.s_ids, rows.s_off, s_index.data, s_index.start, max(s_vb.max_len, 1), rows.t_bytes,
        rows.tb_off,
    )  # fmt: skip
    dp = ~prefix
    dp_rows = np.flatnonzero(dp).tolist()
    t2s, t2s_off = _dp_maps(rows, s_bytes, sb_off, dp_rows)
    groups, exact, special, covered, n_exact = align_rows(
        rows.s_ids, rows.s_off, s_ends, s_bytes, sb_off, s_vb.is_special,
        rows.t_ids, rows.t_ends, rows.t_off, rows.t_bytes, rows.tb_off, t_vb.is_special,
        partners(s_vb, t_vb), dp, t2s, t2s_off,
    )  # fmt: skip
    return BatchAlignment(
        rows, groups, exact, special, covered, n_exact, s_ends, s_bytes, sb_off, dp
    )


def _dp_maps(rows: FlatRows, s_bytes, sb_off, dp_rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    # t2s of each DP row, concatenated (rows with equal/prefix bytes have none)
    lengths = np.zeros(len(rows.tb_off), dtype=np.int64)
    if not dp_rows:
        return np.zeros(1, np.int64), lengths
    from distil.align.dp import align_bytes  # numba loads only when a row needs it

    maps = []
    for b in dp_rows:
        t_b = rows.t_bytes[rows.tb_off[b] : rows.tb_off[b + 1]].tobytes()
        t2s, _ = align_bytes(t_b, s_bytes[sb_off[b] : sb_off[b + 1]].tobytes())
        maps.append(t2s)
        lengths[b + 1] = len(t2s)
    return np.concatenate(maps), np.cumsum(lengths)


_PARTNERS: dict[tuple[int, int], tuple[VocabBytes, VocabBytes, np.ndarray]] = {}


def partners(s_vb: VocabBytes, t_vb: VocabBytes) -> np.ndarray:
    """int64 (V_t,): the student special with the same role as each teacher special, or -1."""
    key = (id(s_vb), id(t_vb))
    hit = _PARTNERS.get(key)
    if hit is None or hit[0] is not s_vb or hit[1] is not t_vb:
        out = np.full(t_vb.size, -1, dtype=np.int64)
        for t, s in role_map(s_vb, t_vb).items():
            out[t] = s
        hit = _PARTNERS[key] = (s_vb, t_vb, out)
    return hit[2]


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
    Zero-length specials pair 1:1 by role at the same byte position (`special`); a teacher
    special after its last content token stands at the end of the text. This is `align_flat`
    on a batch of one row.
    """
    s_ids = np.asarray(s_ids, dtype=np.int64).reshape(-1)
    t_ids = np.asarray(t_ids, dtype=np.int64).reshape(-1)
    t_ends = np.asarray(t_ends, dtype=np.int64).reshape(-1)
    ba = align_flat(FlatRows.pack([s_ids], [t_ids], [t_ends], [t_bytes]), s_vb, t_vb)
    return RowAlignment(
        groups=ba.groups[:, 1:].astype(np.int64),
        exact=ba.exact,
        special=ba.special,
        unalignable=np.flatnonzero(~ba.covered),
        s_bytes=ba.s_bytes.tobytes(),
        s_ends=ba.s_ends,
        t_bytes=t_bytes,
        t_ends=t_ends,
        n_bytes=len(ba.s_bytes),
        n_bytes_exact=int(ba.n_exact[0]),
        used_dp=bool(ba.dp[0]),
    )
