"""Tests of distil.testing: the tokenizers and tiny models that every other test builds on."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distil.testing import (
    FAMILIES,
    build_model_dir,
    count_parameters,
    default_corpus,
    load_tokenizer,
    save_tokenizer,
    tiny_llama,
    tiny_model,
    tiny_qwen2,
    train_tokenizer,
)

# Single-spaced printable ASCII the corpus never had (WordPiece cannot restore other whitespace).
UNSEEN = [
    "Zebras quietly juggle 7 purple kites near Oslo, don't they?",
    'x=(3.5*y)/[z-1] & {a:b} @#~`|^_ "quoted" 100%',
]
UNICODE = "café 数字 🙂 e\u0301 ½"  # multi-byte, CJK, emoji, a combining mark
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "It is 5."},
]
PROMPTS = {
    "bpe": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "unigram": "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2 + 3?<end_of_turn>\n"
    "<start_of_turn>model\n",
    "wordpiece": "[SYS] Be brief. [/SYS] [INST] What is 2 + 3? [/INST]",
    "char": "Be brief. What is 2 + 3? ->",
}
GENERATION_PROMPTS = {
    "bpe": "<|im_start|>assistant\n",
    "unigram": "<start_of_turn>model\n",
    "wordpiece": "",  # like Llama 2 / Mistral: [/INST] already ends the prompt
    "char": " ->",
}
COMPLETIONS = {
    "bpe": "It is 5.<|im_end|>\n",
    "unigram": "It is 5.<end_of_turn>\n",
    "wordpiece": " It is 5. </s>",
    "char": " It is 5.<|eos|>",
}


@pytest.fixture
def tok(request, family):
    return request.getfixturevalue(f"{family}_tokenizer")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (what 'Ġ' means)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    shifted = [b for b in range(256) if b not in keep]
    table = {chr(b): b for b in keep}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


BYTE_LEVEL = _byte_level_decoder()


def _surfaces(tok, family: str, text: str, ids: list[int]) -> list[bytes]:
    """The bytes of `text` each token stands for, undoing the family's conventions:
    bpe 'Ġ' etc. -> bytes; unigram '▁' -> ' ' and <0xNN> -> that byte, minus the '▁' that
    Metaspace prepends to the first word; wordpiece drops '##'; added tokens are themselves."""
    added = set(tok.get_added_vocab())
    out = []
    for i, token in enumerate(tok.convert_ids_to_tokens(ids)):
        if token in added:
            out.append(token.encode())
        elif family == "bpe":
            out.append(bytes(BYTE_LEVEL[c] for c in token))
        elif family == "unigram":
            byte = re.fullmatch(r"<0x([0-9A-F]{2})>", token)
            surface = bytes([int(byte[1], 16)]) if byte else token.replace("▁", " ").encode()
            prepended = i == 0 and token.startswith("▁") and not text.startswith(" ")
            out.append(surface[1:] if prepended else surface)
        elif family == "wordpiece":
            out.append(token.removeprefix("##").encode())
        else:
            out.append(token.encode())
    return out


def _expected_offsets(
    text: str, surfaces: list[bytes], *, skip_whitespace: bool = False, fold_case: bool = False
) -> list[tuple[int, int]]:
    """Walk the token surfaces over the bytes of `text`; each token's expected offsets are the
    smallest character span holding its bytes. A token with no bytes (the prepended '▁') is
    expected on the next character, where tokenizers puts it. WordPiece tokens skip whitespace."""
    data = text.encode()
    char_of = [i for i, ch in enumerate(text) for _ in ch.encode()]
    pos, spans = 0, []
    for surface in surfaces:
        while skip_whitespace and data[pos : pos + 1].isspace():
            pos += 1
        chunk = data[pos : pos + len(surface)]
        assert (chunk.lower() if fold_case else chunk) == surface, (text, pos, surface)
        last = pos + max(len(surface), 1) - 1
        spans.append((char_of[pos], char_of[last] + 1))
        pos += len(surface)
    assert data[pos:].strip() == b"" if skip_whitespace else pos == len(data)
    return spans


def _widen_byte_fallback_runs(tokens: list[str], spans: list[tuple[int, int]]) -> list:
    """tokenizers fuses a run of consecutive unknown characters into one piece before byte
    fallback, so every <0xNN> token of the run carries the span of the whole run."""
    out, i = list(spans), 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and re.fullmatch(r"<0x[0-9A-F]{2}>", tokens[j]):
            j += 1
        if j > i:
            out[i:j] = [(spans[i][0], spans[j - 1][1])] * (j - i)
        i = j + 1
    return out


def _texts(family: str) -> list[str]:
    texts = default_corpus(30, seed=7) + UNSEEN
    return [*texts, UNICODE] if family in ("bpe", "unigram") else texts


# --- tokenizers -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_is_fast_and_left_padding(tok, family):
    assert tok.is_fast  # in transformers 5.x the class is TokenizersBackend, not ...Fast
    assert tok.padding_side == "left"
    batch = tok(["12", "nums: 1 2 3"], padding=True, add_special_tokens=False)
    short = len(tok("12", add_special_tokens=False)["input_ids"])
    width = len(batch["input_ids"][0])
    assert batch["input_ids"][0][: width - short] == [tok.pad_token_id] * (width - short)
    assert batch["attention_mask"][0] == [0] * (width - short) + [1] * short


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(tok, family):
    for text in _texts(family):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert tok.unk_token_id is None or tok.unk_token_id not in ids


@pytest.mark.parametrize("family", FAMILIES)
def test_offsets_cover_each_tokens_text(tok, family):
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False)
    for text in [*_texts(family), rendered]:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        surfaces = _surfaces(tok, family, text, enc["input_ids"])
        expected = _expected_offsets(text, surfaces, skip_whitespace=family == "wordpiece")
        if family == "unigram":
            tokens = tok.convert_ids_to_tokens(enc["input_ids"])
            expected = _widen_byte_fallback_runs(tokens, expected)
        assert [tuple(span) for span in enc["offset_mapping"]] == expected, text


def test_bpe_offsets_include_the_leading_space(bpe_tokenizer):
    text = "What is the target?"
    enc = bpe_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = bpe_tokenizer.convert_ids_to_tokens(enc["input_ids"])
    spaced = [span for t, span in zip(tokens, enc["offset_mapping"], strict=True) if t[0] == "Ġ"]
    assert len(spaced) == 3
    assert all(text[start] == " " for start, _ in spaced)


@pytest.mark.parametrize("family", FAMILIES)
def test_special_tokens(tok, family):
    ids = [tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id]
    named = [i for i in ids if i is not None]
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert len(set(named)) == len(named)
    plain = tok("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert not set(plain) & set(tok.all_special_ids)
    with_specials = tok("What is 2 + 3?")["input_ids"]
    # Like Gemma/Llama, only the unigram family adds <bos>; the others add nothing.
    assert with_specials == ([tok.bos_token_id, *plain] if family == "unigram" else plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template(tok, family):
    prompt = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    no_gen = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=False)
    full = tok.apply_chat_template(MESSAGES, tokenize=False)
    assert prompt == PROMPTS[family]
    assert no_gen + GENERATION_PROMPTS[family] == prompt
    assert full == prompt + COMPLETIONS[family]
    for text in (prompt, full):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    # The assistant turn ends with eos; ChatML and Gemma then add a "\n" token.
    eos_at = -2 if family in ("bpe", "unigram") else -1
    assert tok(full, add_special_tokens=False)["input_ids"][eos_at] == tok.eos_token_id


def test_unigram_rendered_prompt_gets_a_second_bos(unigram_tokenizer):
    # The Gemma template renders <bos>; encoding it with add_special_tokens=True doubles it.
    tok = unigram_tokenizer
    prompt = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert tok(prompt)["input_ids"][:3] == [tok.bos_token_id] * 2 + [
        tok.convert_tokens_to_ids("<start_of_turn>")
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_reload_gives_identical_ids(tok, family, tmp_path):
    fresh = train_tokenizer(family)  # in memory; `tok` was saved and reloaded
    again = load_tokenizer(save_tokenizer(tok, tmp_path))
    rendered = fresh.apply_chat_template(MESSAGES, tokenize=False)
    for text in [*_texts(family), rendered]:
        ids = fresh(text)["input_ids"]
        assert tok(text)["input_ids"] == ids
        assert again(text)["input_ids"] == ids
    for other in (tok, again):
        assert other.get_vocab() == fresh.get_vocab()
        assert other.chat_template == fresh.chat_template
        assert (other.eos_token, other.pad_token) == (fresh.eos_token, fresh.pad_token)
        assert other.padding_side == "left"


_HASH_SCRIPT = """
import hashlib
from distil.testing import FAMILIES, train_tokenizer
for f in FAMILIES:
    print(hashlib.sha256(train_tokenizer(f).backend_tokenizer.to_str().encode()).hexdigest())
"""


@pytest.mark.slow  # a fresh interpreter importing transformers: ~5 s
def test_training_is_deterministic_across_processes():
    # The `tokenizers` Unigram/WordPiece trainers differ from process to process (hash-map
    # order); distil.testing avoids them, and this guards that.
    here = [
        hashlib.sha256(train_tokenizer(f).backend_tokenizer.to_str().encode()).hexdigest()
        for f in FAMILIES
    ]
    out = subprocess.run(
        [sys.executable, "-c", _HASH_SCRIPT], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == here


def test_vocab_sizes_and_family_conventions(
    bpe_tokenizer, unigram_tokenizer, wordpiece_tokenizer, char_tokenizer
):
    assert len(bpe_tokenizer) == 512
    assert len(unigram_tokenizer) == 512
    assert len(wordpiece_tokenizer) == 512
    assert len(char_tokenizer) < 110
    assert any(t.startswith("Ġ") for t in bpe_tokenizer.get_vocab())
    assert all(f"<0x{b:02X}>" in unigram_tokenizer.get_vocab() for b in range(256))
    assert any(t.startswith("##") for t in wordpiece_tokenizer.get_vocab())
    assert unigram_tokenizer.convert_ids_to_tokens(
        unigram_tokenizer("🙂", add_special_tokens=False)["input_ids"]
    ) == ["▁", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]


def test_known_lossy_cases(unigram_tokenizer, wordpiece_tokenizer, char_tokenizer):
    # SentencePiece convention: a leading space merges with the prepended '▁' and is lost.
    ids = unigram_tokenizer(" x y", add_special_tokens=False)["input_ids"]
    assert unigram_tokenizer.decode(ids) == "x y"
    # WordPiece keeps no whitespace: runs of whitespace decode as one space; no byte fallback.
    ids = wordpiece_tokenizer("a  b\nc", add_special_tokens=False)["input_ids"]
    assert wordpiece_tokenizer.decode(ids) == "a b c"
    assert wordpiece_tokenizer("数字", add_special_tokens=False)["input_ids"] == [
        wordpiece_tokenizer.unk_token_id
    ]
    assert char_tokenizer("é", add_special_tokens=False)["input_ids"] == [
        char_tokenizer.unk_token_id
    ]


def test_char_answer_tags_are_single_non_special_tokens(char_tokenizer):
    text = "nums: 12 7 3 target: 33 -> <answer>(12+7)*3</answer>"
    ids = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = char_tokenizer.convert_ids_to_tokens(ids)
    assert tokens[-1] == "</answer>" and "<answer>" in tokens
    assert len(ids) == len(text) - len("<answer>") - len("</answer>") + 2
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_wordpiece_lowercase_option():
    tok = train_tokenizer("wordpiece", lowercase=True)
    text = "Zebras quietly juggle 7 purple KITES near Oslo."
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert tok.decode(enc["input_ids"]) == text.lower()
    surfaces = _surfaces(tok, "wordpiece", text, enc["input_ids"])
    expected = _expected_offsets(text, surfaces, skip_whitespace=True, fold_case=True)
    assert [tuple(s) for s in enc["offset_mapping"]] == expected
    with pytest.raises(ValueError, match="lowercase"):
        train_tokenizer("bpe", lowercase=True)


def test_default_corpus_is_seeded_and_countdown_lines_are_correct():
    corpus = default_corpus(300, seed=0)
    assert corpus == default_corpus(300, seed=0) != default_corpus(300, seed=1)
    countdown = [line for line in corpus if line.startswith("nums:")]
    assert len(countdown) == 100
    for line in countdown:
        m = re.fullmatch(r"nums: (\d+) (\d+) (\d+) target: (\d+) -> <answer>(.+)</answer>", line)
        assert m, line
        assert sorted(re.findall(r"\d+", m[5])) == sorted(m.group(1, 2, 3))
        assert eval(m[5], {"__builtins__": {}}) == int(m[4])


# --- models -----------------------------------------------------------------------------------


def _expected_params(v, h, layers, heads, kv, inter, *, tied=True, qkv_bias=False) -> int:
    head_dim = h // heads
    attention = 2 * h * h + 2 * h * kv * head_dim + (h + 2 * kv * head_dim) * qkv_bias
    per_layer = attention + 3 * h * inter + 2 * h  # + two RMSNorm weights
    return v * h * (1 if tied else 2) + layers * per_layer + h


def test_parameter_counts():
    llama = tiny_llama(512)  # intermediate size defaults to ceil(8/3 * 64 / 16) * 16 = 176
    assert llama.config.intermediate_size == 176
    assert count_parameters(llama) == _expected_params(512, 64, 2, 4, 4, 176) == 133_440
    qwen = tiny_qwen2(100, hidden_size=32, num_kv_heads=2, tie_word_embeddings=False)
    expected = _expected_params(100, 32, 2, 4, 2, 96, tied=False, qkv_bias=True)
    assert count_parameters(qwen) == expected
    assert type(qwen).__name__ == "Qwen2ForCausalLM"
    assert llama.config._attn_implementation == "sdpa"


def test_forward_shape(tiny_llama_model, bpe_tokenizer):
    ids = torch.randint(0, len(bpe_tokenizer), (3, 11))
    with torch.no_grad():
        logits = tiny_llama_model(ids).logits
    assert logits.shape == (3, 11, len(bpe_tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_seeding(arch):
    a, b = tiny_model(arch, 64, seed=1), tiny_model(arch, 64, seed=1)
    c = tiny_model(arch, 64, seed=2)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if "norm" not in name and "bias" not in name:  # these start at ones / zeros
            assert not torch.equal(pa, pc), name
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(arch, 64, seed=5)
    assert torch.equal(torch.rand(3), before)  # the global RNG was not consumed


def test_token_ids_come_from_the_tokenizer(tiny_llama_model, bpe_tokenizer):
    for config in (tiny_llama_model.config, tiny_llama_model.generation_config):
        assert config.eos_token_id == bpe_tokenizer.eos_token_id
        assert config.pad_token_id == bpe_tokenizer.pad_token_id
        assert config.bos_token_id is None


def test_model_dir_loads_back(tiny_model_dir, tiny_llama_model, bpe_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template(MESSAGES, tokenize=False)
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == bpe_tokenizer(text)["input_ids"]
    assert tok.chat_template == bpe_tokenizer.chat_template
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny_llama_model(ids).logits)
    assert model.config._attn_implementation == "sdpa"


def test_qwen2_dir_needs_load_tokenizer(tiny_qwen2_dir, unigram_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).eval()
    reference = tiny_qwen2(len(unigram_tokenizer), tokenizer=unigram_tokenizer)
    text = "nums: 12 7 3 target: 33 -> <answer>(12+7)*3</answer>"
    ids = unigram_tokenizer(text)["input_ids"]
    assert load_tokenizer(tiny_qwen2_dir)(text)["input_ids"] == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, reference(x).logits)
    # transformers 5.23 pitfall: AutoTokenizer next to a qwen2 config ignores tokenizer.json and
    # rebuilds a Qwen2 byte-level BPE from the vocabulary. If this starts failing, transformers
    # changed and load_tokenizer's fallback may be unnecessary.
    auto = AutoTokenizer.from_pretrained(tiny_qwen2_dir)
    assert auto(text)["input_ids"] != ids


@pytest.mark.parametrize("family", ["bpe", "unigram", "char"])
def test_the_loaded_pipeline_read_from_its_parts_equals_the_whole_serialized_one(
    family, tmp_path, request
):
    """load_tokenizer compares the loaded pipeline with tokenizer.json's from the tokenizer's
    parts (serializing a 262k vocabulary whole costs seconds): the same tuple as parsing the
    whole serialization, and a file edited on disk is read again, not served from the cache."""
    import json

    from distil.models.load import _loaded_pipeline, _saved_pipeline

    tok = request.getfixturevalue(f"{family}_tokenizer")
    whole = json.loads(tok.backend_tokenizer.to_str())
    parts = (whole.get("normalizer"), whole.get("pre_tokenizer"), whole.get("decoder"))
    reference = (whole["model"]["type"], *(json.dumps(p, sort_keys=True) for p in parts))
    assert _loaded_pipeline(tok.backend_tokenizer) == reference
    saved = tmp_path / "tokenizer.json"
    saved.write_text(tok.backend_tokenizer.to_str())
    assert _saved_pipeline(saved) == reference
    whole["decoder"] = None
    saved.write_text(json.dumps(whole) + "  ")  # another size: another file version
    assert _saved_pipeline(saved) == (*reference[:3], "null")


def test_build_model_dir_trains_a_tokenizer(tmp_path):
    path = build_model_dir(tmp_path / "m", "char", "qwen2", hidden_size=32, num_layers=1, seed=3)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok) == len(train_tokenizer("char"))
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 1)
    assert tok.apply_chat_template(MESSAGES[1:2], tokenize=False, add_generation_prompt=True) == (
        "What is 2 + 3? ->"
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_sequences_are_isolated_only_without_cache(arch):
    # Two sequences in one row, position_ids restarting at 0, attention_mask=None. transformers
    # then builds a block-diagonal mask, but only when no cache exists; the default
    # use_cache=True creates a DynamicCache first, so tokens attend across the boundary.
    model = tiny_model(arch, 128, seed=0)
    a, b = torch.randint(0, 128, (1, 9)), torch.randint(0, 128, (1, 6))
    packed = torch.cat([a, b], dim=1)
    position_ids = torch.cat([torch.arange(9), torch.arange(6)]).unsqueeze(0)
    with torch.no_grad():
        alone = torch.cat([model(a).logits, model(b).logits], dim=1)
        isolated = model(packed, position_ids=position_ids, use_cache=False).logits
        default = model(packed, position_ids=position_ids).logits
    torch.testing.assert_close(isolated, alone, atol=1e-5, rtol=0)
    assert (default[:, 9:] - alone[:, 9:]).abs().max() > 1e-2  # silently wrong: no error
    torch.testing.assert_close(default[:, :9], alone[:, :9], atol=1e-5, rtol=0)
