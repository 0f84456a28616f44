"""What bytes each token adds to a text, and the candidate tables built from those bytes.

Two tokenizers meet on bytes: 'Ġthe' (byte-level BPE), '▁the' (SentencePiece) and 'the' after
a space (WordPiece) all spell b" the". `vocab_bytes` reads a fast tokenizer's decoder from its
`backend_tokenizer` JSON and gives every id the bytes it contributes in the *middle* of a text
(start-of-text effects such as a stripped leading space are ignored). Specials spell b"" and
keep a role ("eos", "bos", "pad", "unk" or their own string) so that they can be paired by role.
`matched_vocab` pairs the ids that spell the same bytes; tables.py builds the id tables the
cross-tokenizer losses gather with from two byte tables.
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

from distil.align.byte_index import ByteIndex
from distil.errors import AlignmentError
from distil.models.tokenizers import id_rows, turn_end_id

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
    turn_end      the chat template's assistant-turn terminator when it is not the EOS
                  (Llama 3's <|eot_id|>): it holds the "eos" role too and is the eos that
                  another side's eos pairs with; None otherwise
    by_bytes      non-empty bytes -> canonical id: the lowest non-special id, except that a
                  byte-fallback '<0xNN>' token loses to a regular piece with the same bytes
                  (the tokenizer never emits the byte token then)
    size          the tokenizer's id rows (`models.tokenizers.id_rows`: largest id + 1)
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
    turn_end: int | None = None
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
    size = id_rows(tok)  # ids in a gap of the vocabulary: b"" (no piece)
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
    end = turn_end_id(tok)
    if end is not None and vb.specials.get(end) not in (None, *_ROLES):
        vb.specials[end], vb.turn_end = "eos", end  # a chat completion ends with it
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
    by_role: dict[str, int] = {} if student_vb.turn_end is None else {"eos": student_vb.turn_end}
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
