"""pair_report numbers and the rendered alignments (plain text holds every token)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from rich.text import Text

from distil.align.batch import RowInputs, build_alignment
from distil.align.inspect import (
    pair_report,
    render_alignment,
    render_batch_row,
    render_pair,
    token_text,
)
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import encode_with_byte_ends, student_byte_spans
from distil.align.vocab_map import matched_vocab, vocab_bytes


def test_pair_report_bpe_unigram(bpe_tokenizer, unigram_tokenizer):
    rep = pair_report(bpe_tokenizer, unigram_tokenizer)
    assert rep["student"]["vocab_size"] == 512 and rep["teacher"]["vocab_size"] == 512
    assert rep["student"]["convention"] == "byte_level"
    assert rep["teacher"]["convention"] == "metaspace"
    s_vb, t_vb = vocab_bytes(bpe_tokenizer), vocab_bytes(unigram_tokenizer)
    shared = {
        k
        for k, i in bpe_tokenizer.get_vocab().items()
        if i not in s_vb.specials
        and k in unigram_tokenizer.get_vocab()
        and unigram_tokenizer.get_vocab()[k] not in t_vb.specials
    }
    assert rep["overlap"]["shared_strings"] == len(shared)
    n_matched = matched_vocab(s_vb, t_vb)[0].numel()
    assert rep["matched"] == n_matched == rep["overlap"]["shared_bytes"] + 2
    assert rep["overlap"]["shared_bytes"] > rep["overlap"]["shared_strings"]
    assert rep["special_pairs"] == [("<|endoftext|>", "<pad>"), ("<|im_end|>", "<end_of_turn>")]
    assert rep["student"]["specials"] == [
        {"id": 0, "token": "<|endoftext|>", "role": "pad"},
        {"id": 1, "token": "<|im_start|>", "role": "<|im_start|>"},
        {"id": 2, "token": "<|im_end|>", "role": "eos"},
    ]
    assert {"id": 2, "token": "<bos>", "role": "bos"} in rep["teacher"]["specials"]
    assert rep["student"]["chat_template"] and rep["teacher"]["chat_template"]


def test_pair_report_without_shared_bytes_reports_zero(char_tokenizer, wordpiece_tokenizer):
    rep = pair_report(char_tokenizer, wordpiece_tokenizer)
    # char tokens are bare characters; wordpiece's '##x' spell the same single bytes
    assert rep["overlap"]["shared_bytes"] > 90
    assert rep["student"]["chat_template"]


def test_render_pair_shows_every_token_and_a_summary(bpe_tokenizer, wordpiece_tokenizer):
    text = "The cat sat on 12 mats, (about 40%)."
    out = render_pair(text, bpe_tokenizer, wordpiece_tokenizer, width=60)
    assert isinstance(out, Text)
    plain = out.plain
    s_vb, t_vb = vocab_bytes(bpe_tokenizer), vocab_bytes(wordpiece_tokenizer)
    s_ids = bpe_tokenizer.encode(text, add_special_tokens=False)
    t_ids = wordpiece_tokenizer.encode(text, add_special_tokens=False)
    for i in s_ids:
        assert token_text(s_vb, i) in plain
    for i in t_ids:
        assert token_text(t_vb, i) in plain
    assert "␣cat" in [token_text(s_vb, i) for i in s_ids]
    last = plain.strip().splitlines()[-1]
    # 'The cat ... 40%).' is 36 bytes; a WordPiece word never ends inside a BPE token here
    assert re.fullmatch(
        r"(\d+) groups \((\d+) multi-token\), exact bytes 36/36, 0 unalignable student tokens",
        last,
    )
    assert int(last.split()[0]) == len(t_ids)


def test_render_alignment_without_teacher_offsets(bpe_tokenizer, unigram_tokenizer):
    s_ids = [*bpe_tokenizer.encode(" the cat", add_special_tokens=False), 2]
    t_ids = [*unigram_tokenizer.encode(" the cat", add_special_tokens=False), 5]
    plain = render_alignment(bpe_tokenizer, unigram_tokenizer, s_ids, t_ids).plain
    assert "<|im_end|>" in plain and "<end_of_turn>" in plain
    assert (
        plain.splitlines()[-1]
        == "3 groups (0 multi-token), exact bytes 8/8, 0 unalignable student tokens"
    )


def test_render_batch_row(bpe_tokenizer, unigram_tokenizer):
    s_vb, t_vb = vocab_bytes(bpe_tokenizer), vocab_bytes(unigram_tokenizer)
    text = " the river flows"
    s_ids = bpe_tokenizer.encode(text, add_special_tokens=False)
    t_ids, t_ends, t_bytes = encode_with_byte_ends(
        unigram_tokenizer, student_byte_spans(s_ids, s_vb)[0].decode(), t_vb
    )
    row = RowInputs(s_ids, 3, t_ids, 5, t_ends, t_bytes)
    ag, _ = build_alignment(
        [row], s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
    )
    sample = SimpleNamespace(prompt_ids=[7, 7, 7], completion_ids=s_ids)
    batch = SimpleNamespace(alignment=ag, samples=[sample])
    plain = render_batch_row(batch, 0, bpe_tokenizer, unigram_tokenizer).plain
    for i in s_ids:
        assert token_text(s_vb, i) in plain
    for i in t_ids:
        assert token_text(t_vb, i) in plain
    assert plain.splitlines()[-1].startswith(f"{ag.num_groups} groups")
    assert f"0 of {len(s_ids)} student tokens outside groups" in plain
