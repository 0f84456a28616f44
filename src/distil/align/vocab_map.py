"""What bytes each token adds to a text, and the candidate tables built from those bytes.

Two tokenizers meet on bytes: 'Ġthe' (byte-level BPE), '▁the' (SentencePiece) and 'the' after
a space (WordPiece) all spell b" the". `vocab_bytes` reads a fast tokenizer's decoder from its
`backend_tokenizer` JSON and gives every id the bytes it contributes in the *middle* of a text
(start-of-text effects such as a stripped leading space are ignored). Specials spell b"" and
keep a role ("eos", "bos", "pad", "unk" or their own string) so that they can be paired by role.
`matched_vocab`, `MatchTables` and `ProjectionTables` turn two byte tables into the id tables
the cross-tokenizer losses gather with (cached per byte context, built once).
"""

from __future__ import annotations

import contextlib
import json
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from distil.align.byte_index import (
    ByteIndex,
    absent_prefix_sum,
    as_query,
    match_pairs,
    projection_pairs,
)
from distil.align.keys import KeyIndex
from distil.errors import AlignmentError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_ROLES = ("eos", "bos", "pad", "unk")  # first wins when one id holds several roles (pad = eos)
# BERT's `cleanup` glues these to the previous word when decoding ("hello ," -> "hello,").
_WORDPIECE_CLEANUP_GLUED = {".", "?", "!", ","}


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (256 entries) used by byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to chr(256 + n) in byte
    order, which is why a space is 'Ġ' (chr(288)) and a newline 'Ċ'.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in gpt2_bytes_to_unicode().items()}


@dataclass(eq=False)
class VocabBytes:
    """The bytes every token id adds to a text, with specials and lookup structures.

    token_bytes   (size,) bytes per id; b"" for specials and ids the tokenizer cannot spell
    specials      special id -> role ("eos" | "bos" | "pad" | "unk" | the token's own string)
    special_text  special id -> the token's string (for pairing markers by name)
    by_bytes      non-empty bytes -> canonical id: the lowest non-special id, except that a
                  byte-fallback '<0xNN>' token loses to a regular piece with the same bytes
                  (the tokenizer never emits the byte token then)
    size          len(tokenizer)
    lengths       int64 (size,) byte length per id; is_special bool (size,)
    convention    how the bytes were derived ("byte_level", "metaspace", "wordpiece", "plain",
                  "decode" for the decode-difference fallback)
    Identity-hashed, so it can key caches. Build with `vocab_bytes(tok)` or `from_token_bytes`.
    """

    token_bytes: list[bytes]
    specials: dict[int, str]
    by_bytes: dict[bytes, int]
    size: int
    special_text: dict[int, str] = field(default_factory=dict)
    convention: str = "plain"
    lengths: np.ndarray = field(init=False, repr=False)
    is_special: np.ndarray = field(init=False, repr=False)
    max_len: int = field(init=False)
    _index: ByteIndex | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.lengths = np.fromiter(map(len, self.token_bytes), np.int64, len(self.token_bytes))
        self.is_special = np.zeros(self.size, dtype=bool)
        self.is_special[list(self.specials)] = True
        self.max_len = int(self.lengths.max(initial=0))

    @classmethod
    def from_token_bytes(
        cls,
        token_bytes: list[bytes],
        specials: dict[int, str] | None = None,
        *,
        byte_fallback: set[int] | frozenset[int] = frozenset(),
        convention: str = "plain",
    ) -> VocabBytes:
        """Build from a hand-made byte table (tests, custom vocabularies).

        `specials` (id -> role) get b"" whatever `token_bytes` says; `byte_fallback` ids lose
        `by_bytes` ties to regular pieces.
        """
        specials = dict(specials or {})
        table = [b"" if i in specials else bytes(b) for i, b in enumerate(token_bytes)]
        by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(table):
            if not b or i in specials:
                continue
            held = by_bytes.get(b)
            if held is None or (held in byte_fallback and i not in byte_fallback):
                by_bytes[b] = i
        return cls(table, specials, by_bytes, len(table), dict(specials), convention)

    def index(self) -> ByteIndex:
        """The non-special byte strings sorted into flat arrays (built once, then cached)."""
        if self._index is None:
            self._index = ByteIndex.build(self.token_bytes, self.is_special, self.by_bytes)
        return self._index


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocab_bytes(tokenizer: Any) -> VocabBytes:
    """The `VocabBytes` of a fast tokenizer, cached per tokenizer object.

    The convention comes from `tokenizer.backend_tokenizer`'s JSON, decoder steps in order:
    ByteLevel -> GPT-2 byte map; ByteFallback '<0xNN>' -> that byte; Metaspace / Replace('▁',' ')
    -> '▁' is b" "; WordPiece -> '##x' is x and any other token b" " + token (BERT `cleanup`
    glues . , ? ! to the previous word); BPEDecoder suffix -> b" "; Fuse or no decoder -> the
    token string's UTF-8. Steps after Fuse only touch the start of a text (Llama-2's Strip) and
    are ignored. For a decoder step not listed, every id falls back to a *decode difference*:
    decode([anchor, id]) minus decode([anchor]); that is slower (one decode per id) and loses
    partial UTF-8 bytes (they decode to U+FFFD). Added tokens: special -> b"" with a role;
    non-special -> their content through the same decoder steps, as the tokenizer's own
    `decode` does (so Gemma's added '▁▁▁' spells three spaces, not three U+2581).
    """
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: no caching
        cached = None
    if cached is not None:
        return cached
    vb = _build(tokenizer)
    with contextlib.suppress(TypeError):  # not weak-referenceable: rebuilt on every call
        _CACHE[tokenizer] = vb
    return vb


def _build(tok: Any) -> VocabBytes:
    size = len(tok)
    specials, special_text, added_plain = _specials_and_added(tok)
    pieces = tok.convert_ids_to_tokens(list(range(size)))
    if getattr(tok, "backend_tokenizer", None) is None:  # slow tokenizer: no decoder JSON
        steps, convention = None, "decode"
    else:
        steps, convention = _decoder_steps(
            _component(tok, "decoder"), _component(tok, "pre_tokenizer")
        )
    table: list[bytes] = []
    fallback: set[int] = set()
    for i, piece in enumerate(pieces):
        if i in specials or piece is None:
            table.append(b"")
        else:
            # a non-special added token goes through the decoder like any piece (Gemma's
            # '▁▁▁' is three spaces); `pieces` already spells it with its content
            piece = added_plain.get(i, piece)
            data = _piece_bytes(piece, steps) if steps is not None else None
            if data is None:
                convention = "decode"
                data = _decode_difference(tok, i)
            table.append(data)
            if "ByteFallback" in {s["type"] for s in steps or []} and _BYTE_FALLBACK.match(piece):
                fallback.add(i)
    vb = VocabBytes.from_token_bytes(table, specials, byte_fallback=fallback, convention=convention)
    vb.special_text = special_text
    return vb


def _specials_and_added(tok: Any) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
    """(special id -> role, special id -> string, non-special added id -> content)."""
    text: dict[int, str] = {}
    plain: dict[int, str] = {}
    for i, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
        content = getattr(added, "content", str(added))
        (text if getattr(added, "special", False) else plain)[int(i)] = content
    for i in getattr(tok, "all_special_ids", []) or []:
        text.setdefault(int(i), tok.convert_ids_to_tokens(int(i)))
        plain.pop(int(i), None)
    roles = {i: s for i, s in text.items()}
    for role in reversed(_ROLES):  # reversed: "eos" is written last and wins over "pad"
        i = getattr(tok, f"{role}_token_id", None)
        if i is not None and int(i) in roles:
            roles[int(i)] = role
    return roles, text, plain


def _component(tok: Any, name: str) -> dict | None:
    """The JSON of one backend component (the whole tokenizer JSON can be megabytes)."""
    part = getattr(getattr(tok, "backend_tokenizer", None), name, None)
    return None if part is None else json.loads(part.__getstate__())


def _decoder_steps(
    decoder: dict | None, pre_tokenizer: dict | None
) -> tuple[list[dict] | None, str]:
    """Flatten the decoder into per-token steps; None when a step is not understood."""
    flat: list[dict] = []

    def walk(d: dict | None) -> None:
        if d is None:
            return
        if d.get("type") == "Sequence":
            for sub in d.get("decoders", []):
                walk(sub)
        else:
            flat.append(d)

    walk(decoder)
    if not flat and "ByteLevel" in json.dumps(pre_tokenizer):
        flat = [{"type": "ByteLevel"}]  # byte-level vocabulary without a decoder entry
    steps: list[dict] = []
    for step in flat:
        kind = step.get("type")
        if kind == "Fuse":
            break  # later steps see the joined text and only change its start
        if kind not in {"ByteLevel", "ByteFallback", "Metaspace", "Replace", "WordPiece"} | {
            "BPEDecoder"
        }:
            return None, "decode"
        steps.append(step)
    kinds = {s["type"] for s in steps}
    if "ByteLevel" in kinds:
        return steps, "byte_level"
    if "WordPiece" in kinds:
        return steps, "wordpiece"
    if "Metaspace" in kinds or any(s.get("content") == " " for s in steps):
        return steps, "metaspace"
    return steps, "plain"


def _piece_bytes(piece: str, steps: list[dict]) -> bytes | None:
    """Apply decoder steps to one vocabulary piece as it appears mid-text."""
    text = piece
    for step in steps:
        kind = step["type"]
        if kind == "ByteLevel":
            if all(c in _UNICODE_TO_BYTE for c in text):
                return bytes(_UNICODE_TO_BYTE[c] for c in text)
        elif kind == "ByteFallback":
            m = _BYTE_FALLBACK.match(text)
            if m:
                return bytes([int(m.group(1), 16)])
        elif kind == "Metaspace":
            text = text.replace(step.get("replacement", "▁"), " ")
        elif kind == "Replace":
            pattern = step.get("pattern", {})
            if "String" in pattern:
                text = text.replace(pattern["String"], step.get("content", ""))
            elif "Regex" in pattern:
                text = re.sub(pattern["Regex"], step.get("content", ""), text)
        elif kind == "WordPiece":
            prefix = step.get("prefix", "##")
            if text.startswith(prefix):
                text = text[len(prefix) :]
            elif not (step.get("cleanup") and text in _WORDPIECE_CLEANUP_GLUED):
                text = " " + text
        elif kind == "BPEDecoder":
            suffix = step.get("suffix", "</w>")
            if text.endswith(suffix):
                text = text[: -len(suffix)] + " "
    return text.encode("utf-8")


def _decode_difference(tok: Any, i: int) -> bytes:
    anchor = _anchor_id(tok)
    kw = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    base = tok.decode([anchor], **kw)
    both = tok.decode([anchor, i], **kw)
    return (both[len(base) :] if both.startswith(base) else both).encode("utf-8")


def _anchor_id(tok: Any) -> int:
    ids = tok.encode("a", add_special_tokens=False)
    return int(ids[-1]) if ids else 0


def role_map(student_vb: VocabBytes, teacher_vb: VocabBytes) -> dict[int, int]:
    """Teacher special id -> student special id with the same role.

    Roles pair eos<->eos, bos<->bos, pad<->pad, unk<->unk and identical marker strings
    ('<|im_start|>' on both sides). A teacher pad maps to the student eos when the student has
    no pad (Llama-style pad = eos). Failing a role, the token strings are compared.
    """
    by_role: dict[str, int] = {}
    by_text: dict[str, int] = {}
    for i in sorted(student_vb.specials):
        by_role.setdefault(student_vb.specials[i], i)
        by_text.setdefault(student_vb.special_text.get(i, student_vb.specials[i]), i)
    out: dict[int, int] = {}
    for t_id, role in teacher_vb.specials.items():
        s_id = by_role.get(role)
        if s_id is None and role == "pad" and "pad" not in by_role:
            s_id = by_role.get("eos")
        if s_id is None:
            s_id = by_text.get(teacher_vb.special_text.get(t_id, role))
        if s_id is not None:
            out[t_id] = s_id
    return out


def matched_vocab(
    student_vb: VocabBytes, teacher_vb: VocabBytes
) -> tuple[torch.Tensor, torch.Tensor]:
    """(student_ids_P, teacher_ids_P): tokens spelling the same bytes, plus specials by role.

    One pair per byte string (the canonical ids of `by_bytes` on both sides), sorted by student
    id. Raises `AlignmentError` when no non-special bytes are shared.
    """
    shared = student_vb.by_bytes.keys() & teacher_vb.by_bytes.keys()
    pairs = [(student_vb.by_bytes[b], teacher_vb.by_bytes[b]) for b in shared]
    if not pairs:
        raise AlignmentError(
            f"the student ({student_vb.size} tokens, {student_vb.convention}) and teacher "
            f"({teacher_vb.size} tokens, {teacher_vb.convention}) vocabularies share no token "
            "bytes, so there is no matched vocabulary for the hybrid/aligned losses. Use a "
            "loss that needs no shared tokens: loss.name=uld"
        )
    # specials by role, one-to-one: a teacher with both a pad and an eos facing a student with
    # an eos alone keeps eos<->eos (a student id twice would count its probability twice)
    taken: dict[int, int] = {}
    for t, s in role_map(student_vb, teacher_vb).items():
        same_role = teacher_vb.specials[t] == student_vb.specials[s]
        if s not in taken or same_role:
            taken[s] = t
    pairs += [(s, t) for s, t in taken.items()]
    pairs.sort()
    ids = torch.tensor(pairs, dtype=torch.long)
    return ids[:, 0].contiguous(), ids[:, 1].contiguous()


def _pair_tensors(first: np.ndarray, second: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    # pairs sorted by (first, second), as two int64 tensors
    order = np.lexsort((second, first))
    return (
        torch.from_numpy(np.ascontiguousarray(first[order], dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(second[order], dtype=np.int64)),
    )


_NONE = np.zeros(0, dtype=np.int64)


class MatchTables:
    """Candidate pairs for the GOLD hybrid loss, cached per byte context.

    A group spells bytes G; its last student token is predicted after the group prefix ps, its
    last teacher token after pt (one is a prefix of the other). A student candidate y spells
    ps + bytes(y), a teacher candidate y' spells pt + bytes(y'); they are the same candidate iff
    those strings are equal. Only delta (the longer prefix minus the shorter) matters:
      |ps| >= |pt|: bytes(y') == delta + bytes(y)     (delta = ps[len(pt):])
      |ps| <  |pt|: bytes(y)  == delta + bytes(y')    (delta = pt[len(ps):])
    `tables[i]` = (student_ids_P, teacher_ids_P), sorted by student id. Table 0 is delta = b""
    (`matched_vocab`); tables for other deltas may be empty (the loss then uses only its rest
    bucket). `empty_id()` is an always-empty table for groups with no candidate map.
    """

    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] = [
            matched_vocab(student_vb, teacher_vb)
        ]
        self._ids: dict[tuple, int] = {(True, b""): 0, (False, b""): 0}
        self.keys = KeyIndex()  # (delta, student_longer) -> table id, for batch lookups

    def table_id(self, ps: bytes, pt: bytes) -> int:
        """Table of the group prefixes `ps` (student) and `pt` (teacher)."""
        if len(ps) >= len(pt):
            return self.delta_id(ps[len(pt) :], student_longer=True)
        return self.delta_id(pt[len(ps) :], student_longer=False)

    def delta_id(self, delta: bytes, *, student_longer: bool) -> int:
        """Table for `delta`, the bytes by which the longer of ps/pt exceeds the shorter."""
        key = (student_longer, delta)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.tables)
            self.tables.append(self._build(delta, student_longer))
            self.keys.add(delta, student_longer, found)
        return found

    def empty_id(self) -> int:
        """An empty table (no candidate of one side spells a candidate of the other)."""
        found = self._ids.get(("empty",))
        if found is None:
            found = self._ids[("empty",)] = len(self.tables)
            self.tables.append(_pair_tensors(_NONE, _NONE))
        return found

    def _build(self, delta: bytes, student_longer: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # enumerate the side whose candidates must start with delta; look the rest up
        longer, other = (
            (self.teacher_vb, self.student_vb)
            if student_longer
            else (self.student_vb, self.teacher_vb)
        )
        ids_l, ids_o = match_pairs(
            *longer.index().arrays(), *other.index().arrays(), as_query(delta)
        )
        return _pair_tensors(ids_o, ids_l) if student_longer else _pair_tensors(ids_l, ids_o)


AMBIGUOUS = -1  # student id of a teacher token whose next student token cannot be told


class ProjectionTables:
    """Sparse teacher -> student next-token maps for the aligned-chunk KL, cached per remainder.

    The teacher predicts at a point `remainder` bytes *behind* the student. A teacher token t
    that starts with `remainder` and is strictly longer would put the student at the start of
    bytes(t)[len(remainder):]; the student token that comes next is the longest student token
    that is a prefix of those bytes (t is dropped when none is), unless a longer student token
    that the teacher has no token for starts with those bytes: then the student might cover
    more than t with one token, and t maps to AMBIGUOUS (-1; its mass is the teacher's
    "anything else" bucket, e.g. the teacher's '<' when the student has '<answer>' and the
    teacher has not; see `_build`). For remainder b"" teacher specials map to student
    specials by role. `tables[i]` = (teacher_ids_K, student_ids_K),
    sorted by teacher id; table 0 is remainder b"". Tables for other remainders may be empty
    (callers skip those positions; see `is_empty`).
    """

    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ids: dict[bytes, int] = {}
        self._empty: list[int] = []
        self._absent: np.ndarray | None = None  # see byte_index.absent_prefix_sum
        self.keys = KeyIndex()  # remainder -> table id, for batch lookups
        self.table_id(b"")

    def table_id(self, remainder: bytes) -> int:
        """Index into `tables` for the teacher being `remainder` bytes behind the student."""
        found = self._ids.get(remainder)
        if found is None:
            found = self._ids[remainder] = len(self.tables)
            self.tables.append(self._build(remainder))
            self.keys.add(remainder, False, found)
            if self.is_empty(found):
                self._empty.append(found)
        return found

    def is_empty(self, table_id: int) -> bool:
        return self.tables[table_id][0].numel() == 0

    def empty_ids(self) -> np.ndarray:
        """Ids of the empty tables so far, int64."""
        return np.asarray(self._empty, dtype=np.int64)

    def _build(self, remainder: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher token t starting with `remainder`, strictly longer: the longest student token
        u0 that is a prefix of rest = bytes(t)[len(remainder):] (t dropped when none is), or
        AMBIGUOUS when a longer student token u starting with rest exists and the teacher has no
        token for remainder + bytes(u) (having emitted the shorter token, the teacher did not
        mean u: with one tokenizer on both sides nothing is ambiguous; the teacher's '<' is, for
        a student with a single '<answer>' token the teacher lacks). A teacher token spelling
        exactly the remainder ends where the student stands: what comes next would be predicted
        at a later teacher position, which this text does not reach (it continued with a longer
        token); its mass is "anything else" (AMBIGUOUS), not dropped: dropping it would tell the
        student that the token never ends here. For remainder b"" teacher specials map to
        student specials by role."""
        t_vb, s_vb = self.teacher_vb, self.student_vb
        t_data, t_start, t_order, _ = t_vb.index().arrays()
        if self._absent is None:
            self._absent = absent_prefix_sum(*s_vb.index().arrays(), t_data, t_start, t_order)
        t_ids, s_ids = projection_pairs(
            t_data, t_start, t_order, *s_vb.index().arrays(), as_query(remainder), self._absent
        )
        if not remainder:
            roles = np.array(list(role_map(s_vb, t_vb).items()), dtype=np.int64).reshape(-1, 2)
            t_ids = np.concatenate([t_ids, roles[:, 0]])
            s_ids = np.concatenate([s_ids, roles[:, 1]])
        return _pair_tensors(t_ids, s_ids)
