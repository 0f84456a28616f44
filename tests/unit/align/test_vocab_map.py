"""Byte tables per tokenizer family, roles, the matched vocabulary and the candidate tables."""

from __future__ import annotations

import pytest
import torch
from tokenizers import decoders

from distil.align.tables import MatchTables, ProjectionTables
from distil.align.vocab_map import (
    VocabBytes,
    gpt2_bytes_to_unicode,
    matched_vocab,
    role_map,
    vocab_bytes,
)
from distil.errors import AlignmentError
from distil.testing import default_corpus, train_tokenizer


def table_of(tok, pieces: list[str]) -> dict[str, bytes]:
    vb = vocab_bytes(tok)
    vocab = tok.get_vocab()
    missing = [p for p in pieces if p not in vocab]
    assert not missing, f"test tokens not in the trained vocabulary: {missing}"
    return {p: vb.token_bytes[vocab[p]] for p in pieces}


def test_gpt2_byte_map_is_a_bijection_with_the_known_landmarks():
    table = gpt2_bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == chr(256)
    assert table[ord("a")] == "a" and table[0xC3] == "Ã"


def test_bpe_byte_level_tokens(bpe_tokenizer):
    got = table_of(bpe_tokenizer, ["Ġ27", "Ġthe", "Ġ", "Ċ", "ĉ", "Ã", "©", "a"])
    assert got == {
        "Ġ27": b" 27",
        "Ġthe": b" the",
        "Ġ": b" ",
        "Ċ": b"\n",
        "ĉ": b"\t",
        "Ã": b"\xc3",
        "©": b"\xa9",
        "a": b"a",
    }
    vb = vocab_bytes(bpe_tokenizer)
    assert vb.convention == "byte_level"
    assert vb.specials == {0: "pad", 1: "<|im_start|>", 2: "eos"}
    assert all(vb.token_bytes[i] == b"" for i in vb.specials)


def test_unigram_metaspace_and_byte_fallback(unigram_tokenizer):
    got = table_of(unigram_tokenizer, ["▁the", "▁", "<0xE2>", "<0x0A>", "<0x41>", "▁nums:"])
    assert got == {
        "▁the": b" the",
        "▁": b" ",
        "<0xE2>": b"\xe2",
        "<0x0A>": b"\n",
        "<0x41>": b"A",
        "▁nums:": b" nums:",
    }
    vb = vocab_bytes(unigram_tokenizer)
    vocab = unigram_tokenizer.get_vocab()
    # 'a' exists as a piece and as <0x61>: the piece is canonical (the tokenizer emits it)
    assert vb.by_bytes[b"a"] == vocab["a"] and vocab["<0x61>"] < vocab["a"]
    assert vb.specials[vocab["<end_of_turn>"]] == "eos" and vb.specials[vocab["<bos>"]] == "bos"


def test_wordpiece_continuations_and_word_starts(wordpiece_tokenizer):
    got = table_of(wordpiece_tokenizer, ["##ing", "the", "##e", "a", "."])
    assert got == {"##ing": b"ing", "the": b" the", "##e": b"e", "a": b" a", ".": b" ."}
    assert vocab_bytes(wordpiece_tokenizer).convention == "wordpiece"


def test_char_tokens_and_added_tokens(char_tokenizer):
    got = table_of(char_tokenizer, ["a", " ", "\n", "7", "<answer>", "</answer>"])
    assert got == {
        "a": b"a",
        " ": b" ",
        "\n": b"\n",
        "7": b"7",
        "<answer>": b"<answer>",  # non-special added token: its content
        "</answer>": b"</answer>",
    }
    vb = vocab_bytes(char_tokenizer)
    assert vb.specials == {0: "pad", 1: "eos", 2: "unk"}


@pytest.mark.parametrize("family", ["bpe", "unigram", "wordpiece", "char"])
def test_concatenated_token_bytes_spell_the_text(family, request):
    """What is checked exactly: bpe and char spell the text's UTF-8; unigram spells b" " + text
    (Metaspace prepends '▁' to a text that does not start with a space); wordpiece spells
    b" " + the words joined by single spaces (whitespace is not part of any token)."""
    tok = request.getfixturevalue(f"{family}_tokenizer")
    vb = vocab_bytes(tok)
    texts = default_corpus(300, seed=3)
    for text in texts:
        got = b"".join(vb.token_bytes[i] for i in tok.encode(text, add_special_tokens=False))
        if family == "unigram":
            want = (" " + text).encode()
        elif family == "wordpiece":
            want = (" " + " ".join(text.split())).encode()
        else:
            want = text.encode()
        assert got == want, (family, text)


def test_vocab_bytes_is_cached_per_tokenizer_object(bpe_tokenizer):
    assert vocab_bytes(bpe_tokenizer) is vocab_bytes(bpe_tokenizer)


def test_llama2_style_decoder_replace_bytefallback_fuse_strip():
    tok = train_tokenizer("unigram")
    tok.backend_tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    got = table_of(tok, ["▁the", "<0xE2>", "▁"])
    assert got == {"▁the": b" the", "<0xE2>": b"\xe2", "▁": b" "}
    assert vocab_bytes(tok).convention == "metaspace"


def test_bert_style_cleanup_glues_punctuation():
    tok = train_tokenizer("wordpiece")
    tok.backend_tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    assert table_of(tok, [".", ",", "the", "##e"]) == {
        ".": b".",
        ",": b",",
        "the": b" the",
        "##e": b"e",
    }


def test_byte_level_without_decoder_entry_and_unknown_decoder_fallback():
    bpe = train_tokenizer("bpe")
    bpe.backend_tokenizer.decoder = None
    assert vocab_bytes(bpe).convention == "byte_level"
    assert table_of(bpe, ["Ġthe"]) == {"Ġthe": b" the"}
    char = train_tokenizer("char")
    char.backend_tokenizer.decoder = decoders.Sequence([decoders.Strip("x", 0, 0)])  # unknown step
    vb = vocab_bytes(char)
    assert vb.convention == "decode"
    vocab = char.get_vocab()
    for piece in ["a", "Z", " ", "(", "<answer>"]:
        assert vb.token_bytes[vocab[piece]] == piece.encode()


def test_role_map_between_families(bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer):
    s, t = vocab_bytes(bpe_tokenizer), vocab_bytes(unigram_tokenizer)
    # teacher <pad>(0) -> student <|endoftext|>(0, pad); <end_of_turn>(5, eos) -> <|im_end|>(2)
    assert role_map(s, t) == {0: 0, 5: 2}
    w = vocab_bytes(wordpiece_tokenizer)
    # [PAD] -> <pad>, [UNK] -> <unk>, </s>(eos) -> <end_of_turn>
    assert role_map(t, w) == {0: 0, 1: 3, 2: 5}


def test_role_map_pad_falls_back_to_eos_and_markers_by_string():
    student = VocabBytes.from_token_bytes(
        [b"", b"", b"a"], {0: "eos", 1: "<|im_start|>"}
    )  # no pad: Llama-style
    teacher = VocabBytes.from_token_bytes(
        [b"", b"", b"", b"a"], {0: "pad", 1: "eos", 2: "<|im_start|>"}
    )
    assert role_map(student, teacher) == {0: 0, 1: 0, 2: 1}


def test_matched_vocab_meets_across_conventions(bpe_tokenizer, unigram_tokenizer):
    s, t = vocab_bytes(bpe_tokenizer), vocab_bytes(unigram_tokenizer)
    s_ids, t_ids = matched_vocab(s, t)
    assert s_ids.dtype == torch.long and s_ids.shape == t_ids.shape
    pairs = set(zip(s_ids.tolist(), t_ids.tolist(), strict=True))
    sv, tv = bpe_tokenizer.get_vocab(), unigram_tokenizer.get_vocab()
    assert (sv["Ġthe"], tv["▁the"]) in pairs and (sv["a"], tv["a"]) in pairs
    assert (2, 5) in pairs and (0, 0) in pairs  # eos and pad by role
    shared = s.by_bytes.keys() & t.by_bytes.keys()
    assert len(pairs) == len(shared) + 2
    for a, b in pairs - {(2, 5), (0, 0)}:
        assert s.token_bytes[a] == t.token_bytes[b] != b""


def test_matched_vocab_empty_overlap_raises():
    s = VocabBytes.from_token_bytes([b"", b"a", b"b"], {0: "eos"})
    t = VocabBytes.from_token_bytes([b"", b"x", b"y"], {0: "eos"})
    with pytest.raises(AlignmentError, match=r"share no token bytes.*loss\.name=uld"):
        matched_vocab(s, t)


def small_pair():
    # student:  0 <eos>, 1 '8', 2 '7', 3 '87', 4 ' ', 5 ' 8', 6 '7a', 7 'a'
    # teacher:  0 <pad>, 1 </s>, 2 ' 87', 3 ' 8', 4 '7', 5 ' 87a', 6 ' ', 7 ' 9', 8 'a'
    s = VocabBytes.from_token_bytes([b"", b"8", b"7", b"87", b" ", b" 8", b"7a", b"a"], {0: "eos"})
    t = VocabBytes.from_token_bytes(
        [b"", b"", b" 87", b" 8", b"7", b" 87a", b" ", b" 9", b"a"], {0: "pad", 1: "eos"}
    )
    return s, t


def pairs_of(table):
    return list(zip(table[0].tolist(), table[1].tolist(), strict=True))


def test_match_tables_by_delta():
    s, t = small_pair()
    mt = MatchTables(s, t)
    # delta b"": equal bytes: '7'-'7', ' '-' ', ' 8'-' 8', 'a'-'a', plus eos-eos; the teacher's
    # pad also maps to the student's eos by role, but the table is one-to-one (a student id
    # twice would count its probability twice), and the same role wins
    assert pairs_of(mt.tables[0]) == [(0, 1), (2, 4), (4, 6), (5, 3), (7, 8)]
    # student prefix ' 8', teacher prefix '': teacher y' == ' 8' + y: ' 87' = ' 8'+'7',
    # ' 87a' = ' 8'+'7a'
    i = mt.table_id(b" 8", b"")
    assert i == 1 and pairs_of(mt.tables[i]) == [(2, 2), (6, 5)]
    assert mt.delta_id(b" 8", student_longer=True) == 1  # cached
    # student prefix '', teacher prefix ' ': student y == ' ' + y': ' 8' = ' '+'8'? teacher has
    # no '8'; nothing else starts with ' ' -> empty table is allowed
    j = mt.table_id(b"", b" ")
    assert j == 2 and mt.tables[j][0].numel() == 0
    # teacher prefix ' 8' longer than student prefix ' ': delta '8': student '87' = '8' + '7'
    k = mt.table_id(b" ", b" 8")
    assert pairs_of(mt.tables[k]) == [(3, 4)]
    assert mt.table_id(b"ab", b"ab") == 0
    e = mt.empty_id()
    assert mt.tables[e][0].numel() == 0 and mt.empty_id() == e


def test_projection_tables_longest_prefix_and_specials():
    s, t = small_pair()
    pt = ProjectionTables(s, t)
    # remainder b"": ' 87' -> longest student prefix ' 8'; ' 8' -> ' 8'; ' 87a' -> ' 8';
    # ' ' -> ' ' (the student's longer ' 8' is a teacher token too: the teacher meant ' ');
    # ' 9' -> ' '; 'a' -> 'a'; pad -> eos, eos -> eos. '7' is AMBIGUOUS (-1): the student
    # could continue with '7a', one token the teacher does not have
    assert pairs_of(pt.tables[0]) == [
        (0, 0),
        (1, 0),
        (2, 5),
        (3, 5),
        (4, -1),
        (5, 5),
        (6, 4),
        (7, 4),
        (8, 7),
    ]
    # teacher 1 byte behind (remainder ' '): ' 87' -> '87' (not '8'), ' 8' -> '8' (the
    # student's '87' would be the teacher's ' 87'), ' 87a' -> '87'; ' 9' -> no student token
    # starts '9' -> dropped
    r = pt.table_id(b" ")
    # and ' ' itself ends where the student stands: its mass is ambiguous (-1), not dropped
    assert pairs_of(pt.tables[r]) == [(2, 3), (3, 1), (5, 3), (6, -1)]
    assert pt.table_id(b" ") == r and not pt.is_empty(r)
    # remainder ' 87': only ' 87a' -> 'a'; specials never appear for a non-empty remainder
    assert pairs_of(pt.tables[pt.table_id(b" 87")]) == [(2, -1), (5, 7)]
    z = pt.table_id(b"zz")
    assert pt.is_empty(z) and z in pt.empty_ids().tolist()


def test_projection_ambiguity_needs_a_student_token_the_teacher_lacks(
    char_tokenizer, bpe_tokenizer
):
    """With one tokenizer on both sides nothing is ambiguous; against a char student with a
    single '<answer>' token, the bpe teacher's '<' is (the student may say '<answer>')."""
    vb = vocab_bytes(bpe_tokenizer)
    same = ProjectionTables(vb, vb)
    assert (same.tables[0][1] >= 0).all()
    char_vb = vocab_bytes(char_tokenizer)
    cross = ProjectionTables(char_vb, vb)
    t_ids, s_ids = cross.tables[0]
    lt = vb.by_bytes[b"<"]
    assert int(s_ids[(t_ids == lt).nonzero()[0, 0]]) == -1
    digit = vb.by_bytes[b"7"]
    assert int(s_ids[(t_ids == digit).nonzero()[0, 0]]) == char_vb.by_bytes[b"7"]
