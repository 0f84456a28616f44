"""Property tests: alignment invariants on random unicode text for every pair of families.

Student ids come from encoding the text (optionally cut by a few tokens, as a length limit
does, possibly inside a character); the teacher encodes the student's bytes as text, or, for
the DP property, the original text (which differs: Metaspace adds a space, WordPiece drops
whitespace and unknown words, the char tokenizer drops unknown characters).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from distil.align.batch import RowInputs, build_alignment
from distil.align.dp import align_bytes
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import (
    align_completion,
    completion_text,
    encode_with_byte_ends,
    student_byte_spans,
    token_starts,
)
from distil.align.vocab_map import vocab_bytes

FAMILIES = ("bpe", "unigram", "wordpiece", "char")
PIECES = [
    *"abcxyzABC0123456789.,;:!?()-+*/'\"<>",
    " ", "  ", "\n", "\t", " the", "12", "<answer>", "é", "ü", "ß", "中", "文", "字",
    "🙂", "👍🏽", "\u0301", "\u0308", "\u00a0", "\u3000", "ﬁ", "▁", "Ġ", "##",
]  # fmt: skip
TEXT = st.lists(
    st.one_of(st.sampled_from(PIECES), st.characters(codec="utf-8", exclude_categories=["Cs"])),
    max_size=30,
).map("".join)
SETTINGS = settings(
    max_examples=int(os.environ.get("DISTIL_HYPOTHESIS_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


class Families(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Families({list(self)})"


@pytest.fixture(scope="module")
def toks(bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer, char_tokenizer):
    found = dict(
        zip(
            FAMILIES,
            (bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer, char_tokenizer),
            strict=True,
        )
    )
    return Families({f: (tok, vocab_bytes(tok)) for f, tok in found.items()})


def check_partition(ra, n_s: int, n_t: int) -> None:
    """Groups are ordered, disjoint, non-empty token ranges; every student token is in exactly
    one group or unalignable."""
    g = ra.groups
    assert ((g[:, 1] > g[:, 0]) & (g[:, 3] > g[:, 2])).all()
    assert (g[1:, 0] >= g[:-1, 1]).all() and (g[1:, 2] >= g[:-1, 3]).all()
    assert g[:, 1].max(initial=0) <= n_s and g[:, 3].max(initial=0) <= n_t
    owned = np.zeros(n_s, dtype=int)
    for a, b, _, _ in g.tolist():
        owned[a:b] += 1
    owned[ra.unalignable] += 1
    assert (owned == 1).all()


@SETTINGS
@given(text=TEXT, cut=st.integers(0, 3))
@example(text="##(a", cut=0)  # found by a CI run: a wordpiece text that re-encodes otherwise
def test_groups_tile_the_common_bytes(toks, text, cut):
    for s_fam in FAMILIES:
        for t_fam in FAMILIES:
            (s_tok, s_vb), (t_tok, t_vb) = toks[s_fam], toks[t_fam]
            s_ids = s_tok.encode(text, add_special_tokens=False)
            s_ids = s_ids[: max(len(s_ids) - cut, 0)]
            s_bytes, _ = student_byte_spans(s_ids, s_vb)
            t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, completion_text(s_bytes), t_vb)
            ra = align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
            assert not ra.used_dp and s_bytes.startswith(t_bytes)
            check_partition(ra, len(s_ids), len(t_ids))
            s_start, t_start = token_starts(ra.s_ends), token_starts(ra.t_ends)
            # a student special (unknown word/char) inside a group drops it; else no holes
            tiles = not s_vb.is_special[s_ids].any() if s_ids else True
            covered = 0
            for a, b, c, d in ra.groups.tolist():
                # both sides start and end a token at the group's edges: the same byte range
                lo, hi = int(s_start[a]), int(ra.s_ends[b - 1])
                assert (lo, hi) == (int(t_start[c]), int(ra.t_ends[d - 1]))
                assert lo >= covered and s_bytes[lo:hi] == t_bytes[lo:hi]
                assert lo == covered or not tiles
                covered = hi
            assert ra.exact.all()
            if tiles:  # groups tile [0, A): A = the last byte where both sides end a token
                assert ra.n_bytes_exact == covered
                common = np.intersect1d(ra.s_ends, ra.t_ends)
                assert covered == common[common <= len(t_bytes)].max(initial=0)
            # one tokenizer whose text re-encodes to the same tokens: every group is 1:1 (a
            # tokenizer need not re-encode its own decoded text so: wordpiece reads '##(a' back
            # with '##' as its continuation mark, two tokens where it wrote one)
            if s_fam == t_fam and cut == 0 and list(t_ids) == list(s_ids):
                assert (
                    (ra.groups[:, 1] - ra.groups[:, 0] == 1)
                    & (ra.groups[:, 3] - ra.groups[:, 2] == 1)
                ).all()


@SETTINGS
@given(text=TEXT)
def test_teacher_tokens_spell_their_own_bytes(toks, text):
    for t_fam in ("bpe", "unigram", "char"):
        if t_fam == "unigram" and "▁" in text:
            continue  # a literal '▁' in the text is read as a space marker (b" ")
        t_tok, t_vb = toks[t_fam]
        t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, text, t_vb)
        for k, (a, b) in enumerate(
            zip(token_starts(t_ends).tolist(), t_ends.tolist(), strict=True)
        ):
            if t_ids[k] in t_vb.specials:  # an unknown character: spans it, spells nothing
                continue
            if t_fam == "unigram" and k == 0 and not text.startswith(" "):
                # Metaspace prepends '▁' to the text: alone ('▁', zero bytes of the text) or
                # merged into the first piece ('▁b' over the text "b")
                assert t_vb.token_bytes[t_ids[k]] == b" " + t_bytes[a:b]
                continue
            assert t_bytes[a:b] == t_vb.token_bytes[t_ids[k]]
        assert (t_ends[-1] if len(t_ends) else 0) == len(t_bytes)


@SETTINGS
@given(text=TEXT)
def test_dp_groups_end_on_mapped_token_boundaries(toks, text):
    for s_fam in FAMILIES:
        for t_fam in FAMILIES:
            (s_tok, s_vb), (t_tok, t_vb) = toks[s_fam], toks[t_fam]
            s_ids = s_tok.encode(text, add_special_tokens=False)
            t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, text, t_vb)
            ra = align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
            check_partition(ra, len(s_ids), len(t_ids))
            if not ra.used_dp:
                continue
            t2s, _ = align_bytes(t_bytes, ra.s_bytes)
            s_start, t_start = token_starts(ra.s_ends), token_starts(ra.t_ends)
            for (a, b, c, d), exact in zip(ra.groups.tolist(), ra.exact.tolist(), strict=True):
                s_hi, t_hi = int(ra.s_ends[b - 1]), int(ra.t_ends[d - 1])
                assert t2s[t_hi] == s_hi  # the group closes where the DP maps both ends
                same = ra.s_bytes[s_start[a] : s_hi] == t_bytes[t_start[c] : t_hi]
                assert same == exact
            assert ra.n_bytes_exact <= ra.n_bytes


@SETTINGS
@given(text=TEXT, dp=st.booleans())
def test_projection_entries_predict_the_student_continuation(toks, text, dp):
    """Each projection entry of an exact group: the teacher token realized at its position, when
    its bytes are the text's bytes there, is in the entry's table and maps to a student token
    that the student's remaining bytes start with (bpe/unigram students can spell any byte, so
    the token is never missing). The text starts with a space, as a completion after a prompt
    does; dp=True gives the teacher the original text (the DP aligns the two)."""
    text = " " + text
    for s_fam in FAMILIES:
        for t_fam in FAMILIES:
            (s_tok, s_vb), (t_tok, t_vb) = toks[s_fam], toks[t_fam]
            s_ids = s_tok.encode(text, add_special_tokens=False)
            s_bytes, _ = student_byte_spans(s_ids, s_vb)
            t_text = text if dp else completion_text(s_bytes)
            t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, t_text, t_vb)
            row = RowInputs(s_ids, 1, t_ids, 1, t_ends, t_bytes)
            ra = align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
            ag, _ = build_alignment(
                [row], s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
            )
            exact_tokens = {
                k
                for (a, b, _, _), ok, sp in zip(ra.groups, ra.exact, ra.special, strict=True)
                if ok and not sp
                for k in range(a, b)
            }
            s_start, t_start = token_starts(ra.s_ends), token_starts(ra.t_ends)
            for k, j, table in zip(
                ag.proj_student_pos_N.tolist(),
                ag.proj_teacher_pos_N.tolist(),
                ag.proj_table_N.tolist(),
                strict=True,
            ):
                t_tok_id = t_ids[j]
                spelled = t_bytes[t_start[j] : ra.t_ends[j]]
                if k not in exact_tokens or spelled != t_vb.token_bytes[t_tok_id]:
                    continue
                teacher_K, student_K = ag.proj_tables[table]
                hit = (teacher_K == t_tok_id).nonzero()
                if s_fam in ("bpe", "unigram"):
                    assert len(hit) == 1
                if len(hit) and int(student_K[hit[0, 0]]) != -1:  # -1: ambiguous, no claim
                    mapped = s_vb.token_bytes[int(student_K[hit[0, 0]])]
                    assert mapped and s_bytes[s_start[k] :].startswith(mapped)
