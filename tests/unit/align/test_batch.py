"""build_alignment: predicting positions, padding, table ids and the per-row in-group mask."""

from __future__ import annotations

import numpy as np
import torch

from distil.align.batch import PaddedRows, RowInputs, build_alignment
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import encode_with_byte_ends, student_byte_spans
from distil.align.vocab_map import VocabBytes, vocab_bytes
from distil.testing import default_corpus, train_tokenizer

# student: 0 <eos>, 1 'a', 2 'b', 3 'c', 4 'ab', 5 ' '
S = VocabBytes.from_token_bytes([b"", b"a", b"b", b"c", b"ab", b" "], {0: "eos"})
# teacher: 0 <pad>, 1 </s>, 2 'abc', 3 'a', 4 'b', 5 'c', 6 'ab'
T = VocabBytes.from_token_bytes([b"", b"", b"abc", b"a", b"b", b"c", b"ab"], {0: "pad", 1: "eos"})

# row 0: 'a' 'b' 'c' (completion from input index 4) vs 'abc' (from index 6): one 3:1 group
ROW0 = RowInputs(s_ids=[1, 2, 3], s_offset=4, t_ids=[2], t_offset=6, t_ends=[3], t_bytes=b"abc")
# row 1: 'ab' 'c' <eos> (from 2) vs 'a' 'b' 'c' </s> (from 3): 1:2, 1:1 and the EOS pair
ROW1 = RowInputs(
    s_ids=[4, 3, 0], s_offset=2, t_ids=[3, 4, 5, 1], t_offset=3, t_ends=[1, 2, 3, 3], t_bytes=b"abc"
)
# row 2: 'a' <eos> vs 'a' (teacher has no EOS): the student EOS is in no group
ROW2 = RowInputs(s_ids=[1, 0], s_offset=1, t_ids=[3], t_offset=1, t_ends=[1], t_bytes=b"a")


def pairs(table):
    return list(zip(table[0].tolist(), table[1].tolist(), strict=True))


def test_hand_computed_batch():
    mt, pt = MatchTables(S, T), ProjectionTables(S, T)
    ag, in_group = build_alignment([ROW0, ROW1, ROW2], S, T, mt, pt)
    assert ag.group_row_G.tolist() == [0, 1, 1, 1, 2]
    # predicting positions: offset - 1 + j; padding -1
    assert ag.student_pos_G_S.tolist() == [
        [3, 4, 5],
        [1, -1, -1],
        [2, -1, -1],
        [3, -1, -1],
        [0, -1, -1],
    ]
    assert ag.student_tok_G_S.tolist() == [
        [1, 2, 3],
        [4, -1, -1],
        [3, -1, -1],
        [0, -1, -1],
        [1, -1, -1],
    ]
    assert ag.teacher_pos_G_T.tolist() == [[5, -1], [2, 3], [4, -1], [5, -1], [0, -1]]
    assert ag.teacher_tok_G_T.tolist() == [[2, -1], [3, 4], [5, -1], [1, -1], [3, -1]]
    # group 0: ps = 'ab', pt = '' -> teacher y' = 'ab' + y: ('c', 'abc')
    # group 1: ps = '', pt = 'a' -> student y = 'a' + y': ('ab', 'b'); the others: table 0
    assert ag.match_table_G.tolist() == [1, 2, 0, 0, 0]
    assert pairs(ag.match_tables[1]) == [(3, 2)] and pairs(ag.match_tables[2]) == [(4, 4)]
    assert torch.equal(ag.match_tables[0][0], mt.tables[0][0])
    # projection: row 0's 'b' is predicted by the teacher 1 byte behind ('a'): teacher 'abc'
    # and 'ab' both continue with student 'b'; its 'c' is 2 bytes behind: 'abc' -> 'c'.
    # Row 1's 'ab' is longer than the teacher's 'a' that predicts its first byte: no entry
    # (aligned_kl compares that 1:2 group as [token, rest] with the chain rule instead).
    assert ag.proj_row_N.tolist() == [0, 0, 0, 1, 1, 2]
    assert ag.proj_student_pos_N.tolist() == [3, 4, 5, 2, 3, 0]
    assert ag.proj_teacher_pos_N.tolist() == [5, 5, 5, 4, 5, 0]
    assert ag.proj_table_N.tolist() == [0, 1, 2, 0, 0, 0]
    # remainder 'a': teacher 'a' itself ends where the student stands: ambiguous (-1)
    assert pairs(ag.proj_tables[1]) == [(2, 2), (3, -1), (6, 2)]
    assert pairs(ag.proj_tables[2]) == [(2, 3), (6, -1)]  # remainder 'ab': teacher 'ab' ends there
    table0 = dict(pairs(ag.proj_tables[0]))
    assert table0[1] == 0  # teacher </s> -> student <eos>
    assert table0[2] == 4  # teacher 'abc' -> student 'ab' (nothing longer starts with 'abc')
    assert table0[3] == 1  # teacher 'a' -> 'a': the student's 'ab' is a teacher token too
    assert table0[4] == 2 and table0[5] == 3
    assert in_group.tolist() == [[True, True, True], [True, True, True], [True, False, False]]
    assert ag.exact_G.tolist() == [True] * 5
    assert ag.metrics["groups"] == 5 and ag.metrics["student_tokens_in_groups"] == 7
    assert ag.metrics["unalignable_tokens"] == 1 and ag.metrics["bytes"] == 7
    assert ag.metrics["bytes_exact"] == 7 and ag.metrics["dp_rows"] == 0


def test_table_ids_are_renumbered_per_batch():
    mt, pt = MatchTables(S, T), ProjectionTables(S, T)
    build_alignment([ROW0], S, T, mt, pt)  # fills the caches with row 0's tables first
    ag, _ = build_alignment([ROW1], S, T, mt, pt)
    assert len(mt.tables) == 3 and len(ag.match_tables) == 2
    assert ag.match_table_G.tolist() == [1, 0, 0] and pairs(ag.match_tables[1]) == [(4, 4)]
    assert len(ag.proj_tables) == 1 and ag.proj_table_N.tolist() == [0, 0]  # 'c', <eos>


def test_empty_batch_and_row_without_groups():
    mt, pt = MatchTables(S, T), ProjectionTables(S, T)
    ag, in_group = build_alignment([], S, T, mt, pt)
    assert ag.num_groups == 0 and ag.proj_row_N.numel() == 0 and in_group.shape == (0, 0)
    row = RowInputs(s_ids=[1], s_offset=1, t_ids=[], t_offset=1, t_ends=[], t_bytes=b"")
    ag, in_group = build_alignment([row], S, T, mt, pt)
    assert (
        ag.num_groups == 0
        and in_group.tolist() == [[False]]
        and ag.metrics["unalignable_tokens"] == 1
    )
    assert ag.student_pos_G_S.shape == (0, 1) and len(ag.match_tables) == 1


def rows_for(s_tok, t_tok, texts, s_offsets, t_offsets):
    s_vb, t_vb = vocab_bytes(s_tok), vocab_bytes(t_tok)
    rows = []
    for text, so, to in zip(texts, s_offsets, t_offsets, strict=True):
        s_ids = s_tok.encode(text, add_special_tokens=False)
        data, _ = student_byte_spans(s_ids, s_vb)
        t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, data.decode(), t_vb)
        rows.append(RowInputs(s_ids, so, t_ids, to, t_ends, t_bytes))
    return rows, s_vb, t_vb


def test_identical_tokenizers_one_projection_entry_per_token(bpe_tokenizer):
    texts = default_corpus(2, seed=7)
    rows, s_vb, t_vb = rows_for(bpe_tokenizer, bpe_tokenizer, texts, [5, 12], [5, 12])
    ag, in_group = build_alignment(
        rows, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    )
    n = sum(len(r.s_ids) for r in rows)
    assert ag.proj_row_N.numel() == n == ag.num_groups
    assert torch.equal(ag.proj_teacher_pos_N, ag.proj_student_pos_N)
    assert ag.proj_table_N.eq(0).all() and ag.match_table_G.eq(0).all()
    assert torch.equal(ag.student_tok_G_S, ag.teacher_tok_G_T)
    assert in_group.sum(1).tolist() == [len(r.s_ids) for r in rows]
    first = len(rows[0].s_ids)
    assert ag.proj_student_pos_N[:first].tolist() == list(range(4, 4 + first))
    assert ag.proj_student_pos_N[first:].tolist() == list(range(11, 11 + len(rows[1].s_ids)))


def test_cross_family_projection_tables_contain_the_realized_continuation(
    bpe_tokenizer, unigram_tokenizer
):
    """For every entry, the teacher token realized at that position, seen from the student's
    point r bytes ahead, maps to a student token that is a prefix of the student's remaining
    bytes (the projection predicts a continuation consistent with the text). Texts start with
    a space as a completion after a prompt does: a Metaspace teacher reads a text without one
    as if it had one (its first token '▁Is' spells b" Is" over the text "Is")."""
    texts = [" " + t for t in default_corpus(8, seed=11)]
    rows, s_vb, t_vb = rows_for(bpe_tokenizer, unigram_tokenizer, texts, [3] * 8, [7] * 8)
    mt, pt = MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    ag, _ = build_alignment(rows, s_vb, t_vb, mt, pt)
    assert ag.proj_table_N.max() > 0  # some entries have the teacher behind the student
    entries = zip(
        ag.proj_row_N.tolist(),
        ag.proj_student_pos_N.tolist(),
        ag.proj_teacher_pos_N.tolist(),
        ag.proj_table_N.tolist(),
        strict=True,
    )
    checked = ambiguous = 0
    for b, s_pos, t_pos, k in entries:
        row = rows[b]
        t_tok = row.t_ids[t_pos - row.t_offset + 1]
        teacher_ids, student_ids = ag.proj_tables[k]
        hit = (teacher_ids == t_tok).nonzero()
        if len(hit):  # the realized teacher token reaches past the student's point
            mapped_id = int(student_ids[hit[0, 0]])
            if mapped_id == -1:  # a longer student token may cover it: no prediction made
                ambiguous += 1
                continue
            mapped = s_vb.token_bytes[mapped_id]
            s_rest = b"".join(s_vb.token_bytes[i] for i in row.s_ids[s_pos - row.s_offset + 1 :])
            assert mapped and s_rest.startswith(mapped)
            checked += 1
    assert checked > 0 and checked + ambiguous > ag.proj_row_N.numel() // 2


def test_dp_row_exact_groups_use_group_relative_bytes(bpe_tokenizer):
    """In a DP row the two texts are offset (the lowercasing WordPiece student has a leading
    space): an exact group's remainders and match deltas are measured from the group's start
    on each side, so 1:1 exact groups get table 0 on both counts."""
    wp = train_tokenizer("wordpiece", lowercase=True)
    s_vb, t_vb = vocab_bytes(wp), vocab_bytes(bpe_tokenizer)
    text = "Hello World the cat sat on the mat"
    s_ids = wp.encode(text, add_special_tokens=False)
    t_ids, t_ends, t_bytes = encode_with_byte_ends(bpe_tokenizer, text, t_vb)
    row = RowInputs(s_ids, 1, t_ids, 1, t_ends, t_bytes)
    mt, pt = MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    ag, _ = build_alignment([row], s_vb, t_vb, mt, pt)
    assert ag.metrics["dp_rows"] == 1 and 0 < ag.metrics["bytes_exact"] < ag.metrics["bytes"]
    one_to_one = (ag.student_pos_G_S >= 0).sum(1).eq(1) & (ag.teacher_pos_G_T >= 0).sum(1).eq(1)
    assert one_to_one.sum() >= 5  # ' the', ' cat', ' sat', ' on', ...
    assert ag.match_table_G[one_to_one].eq(0).all()
    first_pos = ag.student_pos_G_S[one_to_one, 0]
    entries = torch.isin(ag.proj_student_pos_N, first_pos)
    assert entries.sum() == one_to_one.sum() and ag.proj_table_N[entries].eq(0).all()
    # the teacher position of each 1:1 group's entry is that group's teacher position
    lookup = dict(zip(first_pos.tolist(), ag.teacher_pos_G_T[one_to_one, 0].tolist(), strict=True))
    for s_pos, t_pos in zip(
        ag.proj_student_pos_N.tolist(), ag.proj_teacher_pos_N.tolist(), strict=True
    ):
        if s_pos in lookup:
            assert lookup[s_pos] == t_pos


def test_same_alignment_from_lists_arrays_tensors_and_padded_views(
    bpe_tokenizer, unigram_tokenizer
):
    """The collator hands its padded id arrays over (`PaddedRows`); lists, arrays, tensors and
    views of padded tensors give the same alignment. Row 1 ends with the EOS pair (the general
    passes), the others have no zero-length token (the plain walk)."""
    texts = [" " + t for t in default_corpus(3, seed=5)]
    rows, s_vb, t_vb = rows_for(bpe_tokenizer, unigram_tokenizer, texts, [3, 4, 5], [6, 2, 9])
    s_eos = bpe_tokenizer.convert_tokens_to_ids(bpe_tokenizer.eos_token)
    t_eos = unigram_tokenizer.convert_tokens_to_ids(unigram_tokenizer.eos_token)
    r = rows[1]
    rows[1] = RowInputs(
        [*r.s_ids, s_eos], r.s_offset, [*r.t_ids, t_eos], r.t_offset, [*r.t_ends, r.t_ends[-1]],
        r.t_bytes,
    )  # fmt: skip
    width = 2 + max(len(x.s_ids) for x in rows)
    s_pad = torch.full((3, width), 7, dtype=torch.long)
    t_pad = torch.full((3, 2 + max(len(x.t_ids) for x in rows)), 7, dtype=torch.long)
    for b, x in enumerate(rows):
        s_pad[b, 2 : 2 + len(x.s_ids)] = torch.tensor(x.s_ids)
        t_pad[b, 2 : 2 + len(x.t_ids)] = torch.tensor(x.t_ids)
    forms = {
        "arrays": [
            RowInputs(np.asarray(x.s_ids), x.s_offset, np.asarray(x.t_ids), x.t_offset,
                      np.asarray(x.t_ends), x.t_bytes)
            for x in rows
        ],
        "tensors": [
            RowInputs(torch.tensor(x.s_ids), x.s_offset, torch.tensor(x.t_ids), x.t_offset,
                      torch.tensor(x.t_ends), x.t_bytes)
            for x in rows
        ],
        "padded views": [
            RowInputs(s_pad.numpy()[b, 2 : 2 + len(x.s_ids)], x.s_offset,
                      t_pad.numpy()[b, 2 : 2 + len(x.t_ids)], x.t_offset,
                      np.asarray(x.t_ends, np.int64), x.t_bytes)
            for b, x in enumerate(rows)
        ],
    }  # fmt: skip
    # `PaddedRows`: each row's completion where its offset says, in padded id arrays
    s_at = np.full((3, max(x.s_offset + len(x.s_ids) for x in rows) + 1), 7)
    t_at = np.full((3, max(x.t_offset + len(x.t_ids) for x in rows) + 1), 7)
    for b, x in enumerate(rows):
        s_at[b, x.s_offset : x.s_offset + len(x.s_ids)] = x.s_ids
        t_at[b, x.t_offset : x.t_offset + len(x.t_ids)] = x.t_ids
    forms["padded rows"] = PaddedRows(
        s_at, np.array([x.s_offset for x in rows]), np.array([len(x.s_ids) for x in rows]),
        t_at, np.array([x.t_offset for x in rows]), np.array([len(x.t_ids) for x in rows]),
        [np.asarray(x.t_ends, np.int64) for x in rows], [x.t_bytes for x in rows],
    )  # fmt: skip
    ref, ref_in = build_alignment(
        rows, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    )
    special = ref.student_tok_G_S[:, 0].eq(s_eos) & ref.teacher_tok_G_T[:, 0].eq(t_eos)
    assert ref.group_row_G[special].tolist() == [1]  # the EOS pair of row 1
    assert ref_in.sum(1).tolist() == [len(x.s_ids) for x in rows]
    for name, form in forms.items():
        ag, in_group = build_alignment(
            form, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
        )
        assert torch.equal(in_group, ref_in), name
        for field in ("group_row_G", "student_pos_G_S", "student_tok_G_S", "teacher_pos_G_T",
                      "teacher_tok_G_T", "match_table_G", "proj_row_N", "proj_student_pos_N",
                      "proj_teacher_pos_N", "proj_table_N", "exact_G"):  # fmt: skip
            assert torch.equal(getattr(ag, field), getattr(ref, field)), (name, field)
        assert ag.metrics == ref.metrics, name


def test_group_tensors_are_separate_contiguous_int64():
    # the four padded outputs are views of one allocation (`outputs.padded_cpu`): each must
    # be its own region (writing one changes no other) and what the losses index with (int64)
    ag, _ = build_alignment([ROW0, ROW1, ROW2], S, T, MatchTables(S, T), ProjectionTables(S, T))
    names = ("group_row_G", "student_pos_G_S", "student_tok_G_S", "teacher_pos_G_T")
    names += ("teacher_tok_G_T",)
    tensors = [getattr(ag, n) for n in names]
    before = [x.clone() for x in tensors]
    for k, x in enumerate(tensors):
        assert x.dtype == torch.int64 and x.is_contiguous(), names[k]
        x.fill_(-7)
        for m, y in enumerate(tensors):
            expected = torch.full_like(y, -7) if m <= k else before[m]
            assert torch.equal(y, expected), (names[k], names[m])


def _spans_batch():
    # the hand-computed rows, and every row of a real cross-family batch (n:m groups, EOS pairs)
    s_tok = train_tokenizer("char", default_corpus(300, seed=3), 512)
    t_tok = train_tokenizer("bpe", default_corpus(300, seed=4), 400)
    s_vb, t_vb = vocab_bytes(s_tok), vocab_bytes(t_tok)
    rows = []
    for k, line in enumerate(default_corpus(12, seed=9)):
        s_ids = s_tok(" " + line, add_special_tokens=False)["input_ids"]
        text = student_byte_spans(s_ids, s_vb)[0]
        t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, text.decode(), t_vb)
        rows.append(RowInputs(s_ids, 3 + k, t_ids, 5, t_ends, t_bytes))
    return rows, s_vb, t_vb


def test_padded_tensors_are_expanded_from_spans_alike_on_every_device():
    # the builder leaves the padded tensors to `GroupSpans`: the compiled CPU expansion and the
    # tensor ops that run on a GPU give the same tensors (widths >= 1, -1 padding), also for a
    # batch without groups
    rows, s_vb, t_vb = _spans_batch()
    no_groups = RowInputs([5], 1, [], 1, np.zeros(0, np.int64), b"")
    cases = [([ROW0, ROW1, ROW2], S, T), (rows, s_vb, t_vb), ([no_groups], S, T)]
    for batch, s_vb, t_vb in cases:
        ag, _ = build_alignment(
            batch, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
        )
        assert ag.spans is not None
        assert ag.__dict__["_student_pos_G_S"] is None  # not expanded until read
        by_ops = ag.spans.padded_by_tensor_ops(ag.group_row_G)
        compiled = (ag.student_pos_G_S, ag.student_tok_G_S, ag.teacher_pos_G_T, ag.teacher_tok_G_T)
        for a, b in zip(compiled, by_ops, strict=True):
            assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)
            assert a.shape[1] >= 1


def test_moving_an_alignment_moves_its_spans_and_pads_there():
    rows, s_vb, t_vb = _spans_batch()
    ag, _ = build_alignment(rows, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb))
    moved = ag.to("cpu")
    assert moved.__dict__["_student_tok_G_S"] is None and moved.spans is not None
    assert torch.equal(moved.student_tok_G_S, ag.student_tok_G_S)
    assert torch.equal(moved.teacher_pos_G_T, ag.teacher_pos_G_T)
    # an expanded alignment moves its padded tensors as they are
    again = ag.to("cpu")
    assert torch.equal(again.__dict__["_student_pos_G_S"], ag.student_pos_G_S)
