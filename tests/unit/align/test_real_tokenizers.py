"""The byte tables and the alignment on real tokenizers: Qwen3, Llama 3 and Gemma 3.

Their tokenizer files live in ../shared/tokenizers/ next to the project (or wherever
DISTIL_REAL_TOKENIZERS points); without them every test here is skipped, saying why.
What is checked, per tokenizer and per ordered pair:
- every id's bytes equal what the tokenizer's own `decode` gives mid-text (every id, added
  tokens included: Gemma's '▁▁▁' is three spaces);
- the concatenated bytes of a text's tokens are the text's bytes (after the tokenizer's
  normalizer: NFC for Qwen) for code, whitespace runs, CJK, emoji sequences, combining marks
  and math;
- alignment groups of every ordered pair cover every byte once, at token boundaries of both;
- the matched vocabulary of each pair is large and the overlap figures are the ones
  docs/cross-tokenizer.md reports.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from distil.align.batch import RowInputs, build_alignment
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import align_completion, encode_with_byte_ends
from distil.align.vocab_map import matched_vocab, vocab_bytes

ROOT = Path(
    os.environ.get(
        "DISTIL_REAL_TOKENIZERS", Path(__file__).resolve().parents[4] / "shared" / "tokenizers"
    )
)
NAMES = ("qwen3", "llama3", "gemma3")
pytestmark = pytest.mark.skipif(
    not all((ROOT / n / "tokenizer.json").exists() for n in NAMES),
    reason=f"real tokenizer files not found under {ROOT} (set DISTIL_REAL_TOKENIZERS)",
)

TEXTS = {
    "code": 'def f(x):\n    if x:\n\t\treturn {"a": [1, 2]}  # done\n\n\n    return None\r\n',
    "whitespace": "and   spaces,\ttabs\t\t and\n\n\nnewlines   \n  end  ",
    "cjk": "蒸馏模型：教师和学生。日本語のテキスト、한국어 문장.",
    "emoji": "family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin 👍🏽, keycap 1️⃣ ✨",
    "combining": "cafe\u0301 vs café, n\u0303, a\u0308\u0301, Å vs A\u030a",
    "math": "∑_{i=1}^{n} x_i² ≤ √(∫₀^∞ e^{-x} dx) ⇒ α+β≠γ; 3.14159 × 10⁻³",
    "mixed": "<answer>(12 + 7) * 3</answer>  Ünïcödé ß ﬁ\u00a0nbsp\u3000ideographic",
}


def _normalized(name: str, text: str) -> str:
    return unicodedata.normalize("NFC", text) if name == "qwen3" else text


@pytest.fixture(scope="module")
def real():
    from transformers import AutoTokenizer

    out = {}
    for name in NAMES:
        tok = AutoTokenizer.from_pretrained(str(ROOT / name))
        assert tok.is_fast, f"{name} did not load as a fast tokenizer"
        out[name] = (tok, vocab_bytes(tok))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_id_spells_what_decode_gives(real, name):
    tok, vb = real[name]
    kw = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    anchor = tok.encode("a", add_special_tokens=False)[-1]
    base = tok.decode([anchor], **kw)
    ids = [i for i in range(len(tok)) if i not in vb.specials]
    decoded = tok.batch_decode([[anchor, i] for i in ids], **kw)
    wrong = [
        (i, tok.convert_ids_to_tokens(i), d[len(base) :], vb.token_bytes[i])
        for i, d in zip(ids, decoded, strict=True)
        if d[len(base) :] != vb.token_bytes[i].decode("utf-8", "replace")
    ]
    assert not wrong, f"{len(wrong)} ids of {name} spell other bytes than decode: {wrong[:5]}"
    assert vb.convention == ("metaspace" if name == "gemma3" else "byte_level")


def test_gemma_added_whitespace_runs_are_spaces_and_newlines(real):
    tok, vb = real["gemma3"]
    assert vb.token_bytes[tok.convert_tokens_to_ids("▁▁▁")] == b"   "
    assert vb.token_bytes[tok.convert_tokens_to_ids("\n\n\n")] == b"\n\n\n"
    ids = tok("and   spaces", add_special_tokens=False)["input_ids"]
    assert b"".join(vb.token_bytes[i] for i in ids) == b"and   spaces"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", list(TEXTS))
def test_token_bytes_concatenate_to_the_text(real, name, kind):
    tok, vb = real[name]
    text = TEXTS[kind]
    ids, ends, data = encode_with_byte_ends(tok, text, vb)
    joined = b"".join(vb.token_bytes[i] for i in ids)
    assert joined == _normalized(name, text).encode("utf-8")
    if name != "qwen3":  # NFC changes the text, so offsets and bytes differ (see docs)
        assert data == joined and ends[-1] == len(data)
        lengths = np.diff(np.concatenate([[0], ends]))
        assert lengths.tolist() == [len(vb.token_bytes[i]) for i in ids]


def _check_cover(ra, n_s: int, n_bytes: int) -> None:
    # every student token in exactly one group; groups tile the bytes at both sides' boundaries
    owned = np.zeros(n_s, dtype=int)
    for s0, s1, _, _ in ra.groups.tolist():
        owned[s0:s1] += 1
    assert (owned == 1).all() and len(ra.unalignable) == 0
    s_cuts = [int(ra.s_ends[s1 - 1]) for _, s1, _, _ in ra.groups.tolist()]
    t_cuts = [int(ra.t_ends[t1 - 1]) for _, _, _, t1 in ra.groups.tolist()]
    assert s_cuts == t_cuts and s_cuts[-1] == n_bytes
    assert ra.exact.all() and ra.n_bytes_exact == n_bytes


@pytest.mark.parametrize("student", NAMES)
@pytest.mark.parametrize("teacher", NAMES)
def test_groups_of_every_pair_cover_every_byte_once(real, student, teacher):
    s_tok, s_vb = real[student]
    t_tok, t_vb = real[teacher]
    for kind, raw in TEXTS.items():
        text = unicodedata.normalize("NFC", raw)  # the student writes what Qwen reads back
        s_ids = s_tok(text, add_special_tokens=False)["input_ids"]
        s_text = b"".join(s_vb.token_bytes[i] for i in s_ids).decode("utf-8")
        t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, s_text, t_vb)
        ra = align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
        assert not ra.used_dp, f"{student}->{teacher} {kind}: byte strings differ"
        _check_cover(ra, len(s_ids), len(t_bytes))
        if student == teacher:
            assert (ra.groups[:, 1] - ra.groups[:, 0] == 1).all()


def test_non_nfc_student_text_under_a_qwen_teacher_falls_back_to_the_dp(real):
    """Qwen's NFC turns 'e' + U+0301 into 'é': the teacher's bytes differ from the student's,
    so the DP aligns them; the groups around the changed character are not exact, all others
    are."""
    s_tok, s_vb = real["llama3"]
    t_tok, t_vb = real["qwen3"]
    text = "the cafe\u0301 is open and the tea is hot"
    s_ids = s_tok(text, add_special_tokens=False)["input_ids"]
    t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, text, t_vb)
    assert t_bytes == text.encode()  # offsets index the text as given
    ra = align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
    assert ra.n_bytes == len(text.encode()) and ra.n_bytes_exact >= ra.n_bytes - 8
    assert len(ra.unalignable) <= 3


@pytest.mark.parametrize("student", NAMES)
@pytest.mark.parametrize("teacher", NAMES)
def test_batch_build_on_real_pairs(real, student, teacher):
    s_tok, s_vb = real[student]
    t_tok, t_vb = real[teacher]
    rows = []
    for raw in TEXTS.values():
        text = unicodedata.normalize("NFC", raw)
        s_ids = s_tok(text, add_special_tokens=False)["input_ids"]
        s_text = b"".join(s_vb.token_bytes[i] for i in s_ids).decode("utf-8")
        t_ids, t_ends, t_bytes = encode_with_byte_ends(t_tok, s_text, t_vb)
        rows.append(RowInputs(s_ids, 3, list(t_ids), 5, list(t_ends), t_bytes))
    groups, in_group = build_alignment(
        rows, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    )
    assert in_group.sum(1).tolist() == [len(r.s_ids) for r in rows]
    assert groups.metrics["bytes"] == groups.metrics["bytes_exact"] > 0
    assert groups.metrics["unalignable_tokens"] == 0


def test_overlap_figures_of_the_blog_pairs(real):
    """Token-string Jaccard reproduces the GOLD blog's table (Llama-3.2 vs Qwen 0.640, Gemma-3
    vs Qwen 0.063); distil matches by bytes, where 'Ġ' and '▁' spellings meet: the same for the
    two byte-level families, almost 4x more pairs for Gemma (docs/cross-tokenizer.md)."""
    from distil.align.inspect import overlap_figures

    llama = overlap_figures(real["llama3"][0], real["qwen3"][0])
    gemma = overlap_figures(real["gemma3"][0], real["qwen3"][0])
    assert round(llama["string_jaccard"], 2) == 0.64 and round(gemma["string_jaccard"], 3) == 0.063
    assert llama["shared_bytes"] == llama["shared_strings"] == 109_566
    assert gemma["shared_strings"] == 24_519 and gemma["shared_bytes"] == 95_968
    assert round(llama["bytes_over_smaller"], 3) == 0.856


@pytest.mark.parametrize("student", NAMES)
@pytest.mark.parametrize("teacher", NAMES)
def test_matched_vocabulary_of_every_pair(real, student, teacher):
    _, s_vb = real[student]
    _, t_vb = real[teacher]
    s_ids, t_ids = matched_vocab(s_vb, t_vb)
    # one-to-one: a student id twice would count its probability twice in the hybrid loss
    assert len(set(s_ids.tolist())) == len(s_ids) and len(set(t_ids.tolist())) == len(t_ids)
    content = [
        (s, t)
        for s, t in zip(s_ids.tolist(), t_ids.tolist(), strict=True)
        if s not in s_vb.specials
    ]
    assert all(s_vb.token_bytes[s] == t_vb.token_bytes[t] for s, t in content)
    assert len(content) == len(s_vb.by_bytes.keys() & t_vb.by_bytes.keys())
    if student == teacher:
        assert len(content) == len(s_vb.by_bytes)
