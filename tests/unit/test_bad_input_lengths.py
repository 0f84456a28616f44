"""Rows over the token limits: found exactly (the byte pre-filter never hides one), an error
naming file:line by default, a counted warning with data.overlong=truncate."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from distil.data.lengths import check_lengths, over_limit
from distil.errors import DataError
from distil.models.tokenizers import render_prompt
from distil.types import Example


def examples(chat: bool, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for i in range(60):
        text = " ".join(
            rng.choice(["12", "+", "answer", "é", "数", "🙂", "x"])
            for _ in range(rng.randint(1, 90))
        )
        prompt = [{"role": "user", "content": text}] if chat else text
        out.append(Example(i, prompt, text, {"_where": f"d.jsonl:{i + 1}"}))
    return out


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("name", ["bpe_tokenizer", "char_tokenizer", "unigram_tokenizer"])
def test_over_limit_equals_tokenizing_every_row(request, name, chat):
    tok = request.getfixturevalue(name)
    rows = examples(chat)
    for limit in (8, 40, 120):
        for prompts in (True, False):
            texts = [render_prompt(tok, e.prompt) if prompts else e.completion for e in rows]
            lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
            expected = [(e.id, n) for e, n in zip(rows, lengths, strict=True) if n > limit]
            found = [(e.id, n) for e, n in over_limit(rows, tok, limit, prompts=prompts)]
            assert found == expected, (name, chat, limit, prompts)


def test_error_names_the_longest_row_and_truncate_counts(bpe_tokenizer, capsys):
    rows = examples(False)
    data = SimpleNamespace(
        max_prompt_tokens=40,
        max_completion_tokens=10**6,
        overlong="error",
        train="d.jsonl",
        text_prompts="verbatim",  # the lengths below are the raw texts' token counts
        chat_template_kwargs={},
    )
    lengths = [len(bpe_tokenizer(e.prompt, add_special_tokens=False)["input_ids"]) for e in rows]
    over = sum(n > 40 for n in lengths)
    longest = max(range(len(rows)), key=lambda i: lengths[i])
    assert 0 < over < len(rows)
    with pytest.raises(DataError) as info:
        check_lengths(rows, bpe_tokenizer, data, completions_used=True)
    msg = str(info.value)
    assert f"{over} of {len(rows)} prompts are longer than data.max_prompt_tokens = 40" in msg
    assert f"d.jsonl:{longest + 1}, has {lengths[longest]}" in msg
    data.overlong = "truncate"
    check_lengths(rows, bpe_tokenizer, data, completions_used=True)
    assert f"warning: {over} of {len(rows)} prompts" in capsys.readouterr().err
    data.max_prompt_tokens = 10**6
    check_lengths(rows, bpe_tokenizer, data, completions_used=True)
    assert capsys.readouterr().err == ""
