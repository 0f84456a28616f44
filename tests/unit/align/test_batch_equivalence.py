"""The compiled batch alignment and the array-built tables equal the per-row reference.

`naive_reference` keeps the per-row code that `build_alignment`, `align_completion` and the
match/projection table builds replaced (one `align_completion` per row with numpy calls, one
Python lookup per group and token, tables from per-token dict lookups and bisection). On random
batches of every tokenizer family pair, with cut characters, texts that differ (the DP rows),
specials inside and around the completion and ids outside the tokenizer, every output is equal:
groups, flags, unalignable tokens, the AlignmentGroups tensors, the tables and the order in
which the caches create them. On random tiny vocabularies (many shared prefixes, duplicate
byte strings, byte-fallback ids) the tables for every key are equal too, and so are the
teacher byte ends computed from offsets (`text_byte_ends`).
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distil.align.batch import RowInputs, build_alignment
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import (
    align_completion,
    completion_text,
    encode_with_byte_ends,
    student_byte_spans,
    text_byte_ends,
)
from distil.align.vocab_map import VocabBytes, vocab_bytes

from . import naive_reference as ref

FAMILIES = ("bpe", "unigram", "wordpiece", "char")
PIECES = [
    *"abcxyzABC0123456789.,;:!?()-+*/'\"<>",
    " ", "  ", "\n", "\t", " the", "12", "<answer>", "é", "ü", "ß", "中", "文",
    "🙂", "👍🏽", "\u0301", "\u00a0", "▁", "Ġ", "##",
]  # fmt: skip
TEXT = st.lists(
    st.one_of(st.sampled_from(PIECES), st.characters(codec="utf-8", exclude_categories=["Cs"])),
    max_size=25,
).map("".join)
# text, cut tokens, teacher reads the original text (DP), student special at (-1: none),
# student EOS at the end, teacher EOS at the end, teacher BOS first, an id outside the table
ROW = st.tuples(
    TEXT,
    st.integers(0, 3),
    st.booleans(),
    st.integers(-1, 12),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
PAIR = st.tuples(st.sampled_from(FAMILIES), st.sampled_from(FAMILIES))
FAST = settings(
    max_examples=25,
    deadline=timedelta(seconds=1),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LONG = settings(FAST, max_examples=int(os.environ.get("DISTIL_HYPOTHESIS_EXAMPLES", "400")))


@pytest.fixture(scope="module")
def toks(bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer, char_tokenizer):
    found = (bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer, char_tokenizer)
    out = {f: (tok, vocab_bytes(tok)) for f, tok in zip(FAMILIES, found, strict=True)}
    # compile (or load) every numba pass (DP, keys, table builds) before the timed examples
    check_batch(out, HAND_SPECS, ("bpe", "unigram"), HAND_OFFSETS)
    return out


HAND_SPECS = [
    ("Hello World the cat", 1, True, -1, True, True, False, False),
    ("the café", 1, False, 2, True, True, True, True),
    (" a 🙂 b", 2, False, -1, False, False, True, False),
    ("", 0, False, 0, True, True, False, False),
]
HAND_OFFSETS = [(1, 2), (3, 1), (2, 2), (1, 1)]


def _role_id(vb: VocabBytes, role: str) -> int:
    return next((i for i, r in sorted(vb.specials.items()) if r == role), min(vb.specials))


def make_row(s, t, spec, s_offset: int, t_offset: int) -> RowInputs:
    (s_tok, s_vb), (t_tok, t_vb) = s, t
    text, cut, dp, special_at, s_eos, t_eos, t_bos, outside = spec
    s_ids = s_tok.encode(text, add_special_tokens=False)
    s_ids = s_ids[: max(len(s_ids) - cut, 0)]
    if special_at >= 0:
        s_ids.insert(min(special_at, len(s_ids)), _role_id(s_vb, "eos"))
    if outside and s_ids:
        s_ids.insert(len(s_ids) // 2, s_vb.size + 3)  # a padded embedding row: no bytes
    if s_eos:
        s_ids.append(_role_id(s_vb, "eos"))
    s_bytes, _ = student_byte_spans(s_ids, s_vb)
    t_ids, t_ends, t_bytes = encode_with_byte_ends(
        t_tok, text if dp else completion_text(s_bytes), t_vb
    )
    t_ids, t_ends = list(t_ids), [int(e) for e in t_ends]
    if t_bos:
        t_ids, t_ends = [_role_id(t_vb, "bos"), *t_ids], [0, *t_ends]
    if t_eos:
        t_ids.append(_role_id(t_vb, "eos"))
        t_ends.append(t_ends[-1] if t_ends else 0)
    return RowInputs(s_ids, s_offset, t_ids, t_offset, np.asarray(t_ends, np.int64), t_bytes)


def assert_same_tables(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (a0, a1), (b0, b1) in zip(got, want, strict=True):
        assert a0.dtype == b0.dtype == a1.dtype == b1.dtype == torch.long
        assert a0.tolist() == b0.tolist() and a1.tolist() == b1.tolist()


def assert_same_groups(got, want) -> None:
    for f in dataclasses.fields(got):
        if f.name == "spans":  # a compact form of the padded tensors, compared expanded
            continue
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert torch.equal(a, b), f.name
        elif f.name in ("match_tables", "proj_tables"):
            assert_same_tables(a, b)
        else:
            assert a == b, f.name


def assert_same_row(got, want) -> None:
    for f in dataclasses.fields(got):
        if f.name == "spans":  # a compact form of the padded tensors, compared expanded
            continue
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, f.name


def check_batch(toks, specs, pair, offsets) -> None:
    s, t = toks[pair[0]], toks[pair[1]]
    s_vb, t_vb = s[1], t[1]
    rows = [make_row(s, t, spec, *off) for spec, off in zip(specs, offsets, strict=False)]
    for r in rows:
        assert_same_row(
            align_completion(r.s_ids, s_vb, r.t_ids, r.t_ends, r.t_bytes, t_vb),
            ref.align_completion(r.s_ids, s_vb, r.t_ids, r.t_ends, r.t_bytes, t_vb),
        )
    mt, pt = MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    ref_mt, ref_pt = ref.RefMatchTables(s_vb, t_vb), ref.RefProjectionTables(s_vb, t_vb)
    # the second call finds some tables cached, the third all of them: plain rows then take
    # the one-call path (`fast.plain_batch`), the others the general passes
    for half in (rows[: len(rows) // 2], rows, rows):
        ag, in_group = build_alignment(half, s_vb, t_vb, mt, pt)
        ref_ag, ref_in = ref.build_alignment(half, s_vb, t_vb, ref_mt, ref_pt)
        assert_same_groups(ag, ref_ag)
        assert torch.equal(in_group, ref_in)
        # the caches hold the same tables, created in the same order
        assert_same_tables(mt.tables, ref_mt.tables)
        assert_same_tables(pt.tables, ref_pt.tables)
        assert pt.empty_ids().tolist() == ref_pt.empty_ids().tolist()


OFFSETS = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=4, max_size=4)


@FAST
@given(specs=st.lists(ROW, min_size=1, max_size=4), pair=PAIR, offsets=OFFSETS)
def test_batch_equals_the_per_row_reference(toks, specs, pair, offsets):
    check_batch(toks, specs, pair, offsets)


@pytest.mark.slow
@LONG
@given(specs=st.lists(ROW, min_size=1, max_size=6), pair=PAIR, offsets=OFFSETS)
def test_batch_equals_the_per_row_reference_long(toks, specs, pair, offsets):
    check_batch(toks, specs, pair, offsets)


def test_hand_rows_equal_the_reference(bpe_tokenizer, unigram_tokenizer):
    """Rows chosen to hit every branch at once: a DP row (the teacher reads the original
    text), a cut character, specials paired and unpaired, an id outside the table."""
    toks = {
        "bpe": (bpe_tokenizer, vocab_bytes(bpe_tokenizer)),
        "unigram": (unigram_tokenizer, vocab_bytes(unigram_tokenizer)),
    }
    check_batch(toks, HAND_SPECS, ("bpe", "unigram"), HAND_OFFSETS)
    check_batch(toks, HAND_SPECS, ("unigram", "bpe"), HAND_OFFSETS)
    s_vb, t_vb = toks["bpe"][1], toks["unigram"][1]
    rows = [make_row(toks["bpe"], toks["unigram"], spec, 1, 1) for spec in HAND_SPECS]
    ag, _ = build_alignment(rows, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb))
    assert ag.metrics["dp_rows"] == 1 and ag.match_table_G.max() > 0 and ag.proj_table_N.max() > 0


# ---------------------------------------------------------------- tables on tiny vocabularies

PIECE = st.text(alphabet="ab <", min_size=1, max_size=4).map(str.encode)
KEY = st.text(alphabet="ab <", max_size=3).map(str.encode)


def tiny_vocab(pieces: list[bytes], fallback: list[bool]) -> VocabBytes:
    # id 0 an EOS, id 1 a BOS; repeated pieces are duplicates (byte-fallback ones lose ties)
    table = [b"", b"", b"a", *pieces]
    marked = {i + 3 for i, f in enumerate(fallback[: len(pieces)]) if f}
    return VocabBytes.from_token_bytes(table, {0: "eos", 1: "bos"}, byte_fallback=marked)


def check_tables(s_pieces, s_fb, t_pieces, t_fb, keys) -> None:
    s_vb, t_vb = tiny_vocab(s_pieces, s_fb), tiny_vocab(t_pieces, t_fb)
    mt, ref_mt = MatchTables(s_vb, t_vb), ref.RefMatchTables(s_vb, t_vb)
    pt, ref_pt = ProjectionTables(s_vb, t_vb), ref.RefProjectionTables(s_vb, t_vb)
    for key in keys:
        for longer in (True, False):
            assert mt.delta_id(key, student_longer=longer) == ref_mt.delta_id(
                key, student_longer=longer
            )
        assert pt.table_id(key) == ref_pt.table_id(key)
    assert_same_tables(mt.tables, ref_mt.tables)
    assert_same_tables(pt.tables, ref_pt.tables)
    assert pt.empty_ids().tolist() == ref_pt.empty_ids().tolist()


@pytest.fixture(scope="module")
def compiled():
    # compile (or load) the table builds before the timed examples
    check_tables([b"ab", b"a ", b"b"], [], [b"ab", b"b", b"a"], [True], [b"a", b"", b" "])


VOCAB = st.lists(PIECE, max_size=30)
FLAGS = st.lists(st.booleans(), max_size=30)


@FAST
@given(s=VOCAB, s_fb=FLAGS, t=VOCAB, t_fb=FLAGS, keys=st.lists(KEY, max_size=6))
def test_tables_equal_the_reference(compiled, s, s_fb, t, t_fb, keys):
    check_tables(s, s_fb, t, t_fb, keys)


@pytest.mark.slow
@LONG
@given(s=VOCAB, s_fb=FLAGS, t=VOCAB, t_fb=FLAGS, keys=st.lists(KEY, max_size=10))
def test_tables_equal_the_reference_long(compiled, s, s_fb, t, t_fb, keys):
    check_tables(s, s_fb, t, t_fb, keys)


# ---------------------------------------------------------------- tables on real vocabularies

REAL = Path(
    os.environ.get(
        "DISTIL_REAL_TOKENIZERS", Path(__file__).resolve().parents[4] / "shared" / "tokenizers"
    )
)


@pytest.mark.slow
@pytest.mark.skipif(
    not all((REAL / n / "tokenizer.json").exists() for n in ("gemma3", "qwen3")),
    reason=f"real tokenizer files not found under {REAL} (set DISTIL_REAL_TOKENIZERS)",
)
@pytest.mark.parametrize(("student", "teacher"), [("gemma3", "qwen3"), ("qwen3", "gemma3")])
def test_real_vocabulary_tables_equal_the_reference(student, teacher):
    """Gemma 3 (262k) and Qwen3 (152k): the whole-vocabulary projection table and the tables
    of common short keys (spaces, a word start, a newline run) equal the reference builds."""
    from transformers import AutoTokenizer

    s_vb = vocab_bytes(AutoTokenizer.from_pretrained(str(REAL / student)))
    t_vb = vocab_bytes(AutoTokenizer.from_pretrained(str(REAL / teacher)))
    mt, ref_mt = MatchTables(s_vb, t_vb), ref.RefMatchTables(s_vb, t_vb)
    pt, ref_pt = ProjectionTables(s_vb, t_vb), ref.RefProjectionTables(s_vb, t_vb)
    for key in (b" ", b"   ", b" th", b"\n\n", b"<", b"\xe4\xb8"):
        pt.table_id(key), ref_pt.table_id(key)
        for longer in (True, False):
            mt.delta_id(key, student_longer=longer), ref_mt.delta_id(key, student_longer=longer)
    assert_same_tables(pt.tables, ref_pt.tables)
    assert_same_tables(mt.tables, ref_mt.tables)
    assert len(pt.tables[0][0]) > 100_000 and (pt.tables[0][1] == -1).any()


# ---------------------------------------------------------------- teacher byte ends


def check_ends(toks, text, spans, pieces) -> None:
    for fam in FAMILIES:
        tok, vb = toks[fam]
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        table = [vb.token_bytes[i] for i in enc["input_ids"]]
        got = text_byte_ends(text, enc["offset_mapping"], table)
        assert got.tolist() == ref.text_byte_ends(text, enc["offset_mapping"], table).tolist()
        assert text_byte_ends(text, enc["offset_mapping"]).tolist() == (
            ref.text_byte_ends(text, enc["offset_mapping"]).tolist()
        )
    # arbitrary spans (overlapping, empty, out of range), each token's bytes a slice of the
    # text's bytes somewhere (so they match at the current position, or nearby, often)
    data = text.encode("utf-8", "surrogatepass")
    own = [data[a : a + n] for a, n in pieces[: len(spans)]] + [b""] * (len(spans) - len(pieces))
    assert (
        text_byte_ends(text, spans, own).tolist() == ref.text_byte_ends(text, spans, own).tolist()
    )


SPANS = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)).map(sorted), max_size=12)
PIECES_AT = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 4)), max_size=12)


@FAST
@given(text=TEXT, spans=SPANS, pieces=PIECES_AT)
def test_text_byte_ends_equal_the_reference(toks, text, spans, pieces):
    check_ends(toks, text, spans, pieces)


@pytest.mark.slow
@LONG
@given(text=TEXT, spans=SPANS, pieces=PIECES_AT)
def test_text_byte_ends_equal_the_reference_long(toks, text, spans, pieces):
    check_ends(toks, text, spans, pieces)


@pytest.mark.parametrize(
    ("text", "spans", "own"),
    [
        ("xx", [(1, 2)], [b"x"]),  # the bytes match just before the span: not taken
        ("xx", [(0, 1), (0, 2)], [b"x", b"x"]),  # shared span split by the bytes
        ("ab", [(0, 1), (0, 1), (1, 2)], [b" ", b"a", b"b"]),  # a prepended '▁'
        ("a  b", [(0, 1), (3, 4), (0, 0)], [b"a", b" b", b""]),  # skipped whitespace
        ("é", [(0, 1), (0, 1)], [b"\xc3", b"\xa9"]),
    ],
)
def test_text_byte_ends_hand_cases_equal_the_reference(text, spans, own):
    assert (
        text_byte_ends(text, spans, own).tolist() == ref.text_byte_ends(text, spans, own).tolist()
    )


def test_warm_plain_batches_take_the_one_call_path(toks, monkeypatch):
    """Rows without specials inside (an EOS ending either side is fine) and with every table
    cached are aligned by `fast.plain_batch`; a row with a special inside, a cut character or
    a DP row sends the batch to the general passes. Both give the reference's result."""
    import distil.align.batch as batch

    taken: list[bool] = []
    plain = batch._plain

    def spy(*args):
        out = plain(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(batch, "_plain", spy)
    # completions continue a text (a leading space: no SentencePiece '▁' of zero bytes)
    plain_rows = [
        (" Hello World the cat", 0, False, -1, True, True, False, False),
        (" the cafe 12", 0, False, -1, False, True, False, False),
        (" a  b c", 0, False, -1, True, False, False, False),
    ]
    for pair in (("bpe", "unigram"), ("char", "bpe"), ("unigram", "wordpiece")):
        taken.clear()
        check_batch(toks, plain_rows, pair, HAND_OFFSETS)
        assert taken[-1], f"{pair}: a warm batch of plain rows took the general passes"
        for odd in (
            (" Hello World", 0, False, 1, False, False, False, False),  # a special inside
            (" Hello World", 0, False, -1, False, False, True, False),  # a teacher BOS first
            (" Hello 🙂", 1, True, -1, False, False, False, False),  # the DP (text differs)
        ):
            taken.clear()
            check_batch(toks, [*plain_rows, odd], pair, HAND_OFFSETS)
            assert not taken[-1], f"{pair}: {odd} is not plain"


def test_a_teacher_token_whose_text_is_not_its_bytes_gets_no_remembered_tables(monkeypatch):
    """The one-call path remembers table ids per (teacher token, key length) only for a token
    whose text spells its own bytes: here the teacher's 'xy' also stands for the text 'ab' (as
    after a normalizer), whose keys ('a') are not the prefixes of 'xy' ('x')."""
    import distil.align.batch as batch

    s_vb = VocabBytes.from_token_bytes([b"", b"a", b"b", b"x", b"y"], {0: "eos"})
    t_vb = VocabBytes.from_token_bytes([b"", b"xy", b"ab", b"a", b"b", b"x", b"y"], {0: "eos"})
    as_ab = RowInputs([1, 2], 3, [1], 2, np.array([2]), b"ab")  # 'xy' over the text 'ab'
    own = RowInputs([3, 4], 3, [1], 2, np.array([2]), b"xy")  # 'xy' over its own bytes
    rows = [as_ab, own, as_ab, own]
    general = batch._plain
    monkeypatch.setattr(batch, "_plain", lambda *a: None)
    want, want_in = build_alignment(rows, s_vb, t_vb, MatchTables(s_vb, t_vb),
                                    ProjectionTables(s_vb, t_vb))  # fmt: skip
    monkeypatch.setattr(batch, "_plain", general)
    tables = (MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb))
    for _ in range(3):  # cold (general passes), then warm twice (the memos filled, then read)
        got, got_in = build_alignment(rows, s_vb, t_vb, *tables)
        assert torch.equal(got_in, want_in)
        assert_same_groups(got, want)
    assert got.proj_table_N.tolist() == want.proj_table_N.tolist()
