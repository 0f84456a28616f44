"""A tokenizer whose ids have gaps (a WordLevel vocabulary of 4 tokens with <eos> at id 10):
its id rows (`models.tokenizers.id_rows`) are its largest id + 1, not `len(tok)`, so no sampler
masks its EOS and generation stops there. Ids inside a gap are rows of the model that decode to
no text: they are not masked (a limit is one slice of the logits), and the cross-tokenizer
tables give them no bytes."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.models.tokenizers import id_rows
from distil.testing import tiny_llama

EOS, GAP = 10, 5


def gapped():
    vocab = {"<pad>": 0, "a": 1, "b": 2, "<eos>": EOS}
    t = Tokenizer(models.WordLevel(vocab, unk_token=None))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", pad_token="<pad>")


def favouring(token: int, rows: int = EOS + 1):
    """A tiny Llama of `rows` rows whose head adds +30 to `token`'s logit: greedy and sampled
    decoding pick it at every step unless it is masked."""
    model = tiny_llama(rows, tie_word_embeddings=False, seed=0)
    head = torch.nn.Linear(model.config.hidden_size, rows, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[token] = 30.0
    model.lm_head = head
    return model.eval()


def test_id_rows_are_the_largest_id_plus_one(bpe_tokenizer):
    tok = gapped()
    assert len(tok) == 4 and id_rows(tok) == EOS + 1
    assert id_rows(bpe_tokenizer) == len(bpe_tokenizer)  # no gaps: the same number


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_stops_at_an_eos_past_len_tok(temperature):
    tok = gapped()
    params = SamplingParams(6, temperature=temperature, seed=0)

    def generate(limit):
        gen = HFGenerator(favouring(EOS), pad_id=0, stop_ids=[EOS], vocab_limit=limit)
        out = gen.generate([[1, 2], [2]], params)
        return [ids[m].tolist() for ids, m in zip(out.completion_ids_B_C,
                                                  out.completion_mask_B_C, strict=True)]  # fmt: skip

    assert generate(id_rows(tok)) == [[EOS], [EOS]]  # stops at once
    masked = generate(len(tok))  # the old limit: EOS masked, each row runs to the length cap
    assert all(len(c) == 6 and EOS not in c for c in masked)


def test_an_id_in_a_gap_is_a_row_that_decodes_to_no_text():
    from distil.align.vocab_map import vocab_bytes

    tok = gapped()
    gen = HFGenerator(favouring(GAP), pad_id=0, stop_ids=[EOS], vocab_limit=id_rows(tok))
    out = gen.generate([[1]], SamplingParams(3, temperature=0.0))
    assert out.completion_ids_B_C[0].tolist() == [GAP] * 3  # not masked: below the limit
    assert tok.decode([1, GAP, 2]) == "a b"  # the tokenizer spells it as nothing
    vb = vocab_bytes(tok)
    assert vb.size == EOS + 1 and vb.token_bytes[GAP] == b"" and vb.token_bytes[1] == b"a"


def test_no_sampler_or_table_is_sized_by_len_of_a_tokenizer():
    """Every vocab_limit and every logits cut goes through `id_rows` (setup, several teachers,
    eval, generate-teacher, the cache and remote setups, the alignment tables)."""
    import re
    from pathlib import Path

    import distil

    sized = re.compile(r"(vocab_limit=|keep\w* = |size = )len\(\w*tok")
    root = Path(distil.__file__).parent
    found = [
        f"{p.relative_to(root)}:{n}"
        for p in sorted(root.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if sized.search(line)
    ]
    assert found == []
