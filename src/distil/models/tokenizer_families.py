"""Tokenizer families trained on the spot with `tokenizers`, for models built from scratch.

Four families that cut text the way real model families do, each wrapped as a fast
`transformers` tokenizer (`tok.is_fast`):

  bpe        byte-level BPE, 'Ġ' marks a leading space (GPT-2/Qwen); ChatML template; no bos.
  unigram    SentencePiece-style Unigram, '▁' marks a leading space and one is prepended to the
             start of the text (so a leading ' ' is not round-tripped), byte fallback to
             <0xNN> tokens for any unicode; Gemma-like turns; encode adds <bos> by default.
  wordpiece  WordPiece with '##' continuations over whitespace-split words (no punctuation
             split, so single-spaced text round-trips); whitespace is not part of any token;
             [INST]-style template; encode adds nothing.
  char       one token per character (WordLevel) plus `<answer>`/`</answer>`; a tiny vocabulary.

Every family pads on the left, has distinct eos and pad tokens, and adds nothing to
`encode(..., add_special_tokens=False)`. Used by `distil tokenizer train`, the demo and the
tests (`distil.testing` adds a default corpus).
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    processors,
    trainers,
)
from tokenizers import pre_tokenizers as pre
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

FAMILIES = ("bpe", "unigram", "wordpiece", "char")
DEFAULT_VOCAB_SIZE = 512

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Gemma has no system turn: the system text is folded into the first user turn.
GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- set ns = namespace(system='') %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- set ns.system = message['content'] + '\\n\\n' %}"
    "{%- else %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + ns.system + message['content'] + '<end_of_turn>\\n' }}"
    "{%- set ns.system = '' %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
# Single spaces only: WordPiece decoding cannot restore newlines or double spaces.
INST_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if not loop.first %}{{- ' ' }}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYS] ' + message['content'] + ' [/SYS]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- else %}{{- message['content'] + ' ' + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)
# "nums: 12 7 3 target: 33 -> <answer>(12+7)*3</answer><|eos|>": the prompt ends with " ->".
CHAR_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}{{- ' -> ' + message['content'] + eos_token }}"
    "{%- elif message['role'] == 'system' %}{{- message['content'] + ' ' }}"
    "{%- else %}{{- message['content'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- ' ->' }}{%- endif %}"
)

# Per family: special tokens (in id order), the named roles, and the chat template.
_SPECS: dict[str, dict] = {
    "bpe": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "roles": {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
        "template": CHATML_TEMPLATE,
    },
    "unigram": {
        "specials": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        "roles": {
            "pad_token": "<pad>",
            "eos_token": "<end_of_turn>",
            "bos_token": "<bos>",
            "unk_token": "<unk>",
        },
        "template": GEMMA_TEMPLATE,
    },
    "wordpiece": {
        "specials": ["[PAD]", "[UNK]", "</s>", "[INST]", "[/INST]", "[SYS]", "[/SYS]"],
        "roles": {"pad_token": "[PAD]", "eos_token": "</s>", "unk_token": "[UNK]"},
        "template": INST_TEMPLATE,
    },
    "char": {
        "specials": ["<|pad|>", "<|eos|>", "<|unk|>"],
        "roles": {"pad_token": "<|pad|>", "eos_token": "<|eos|>", "unk_token": "<|unk|>"},
        "template": CHAR_TEMPLATE,
    },
}
CHAR_ADDED_TOKENS = ("<answer>", "</answer>")
# Characters every char vocabulary holds (wordpiece: all but whitespace, bare and '##'), so any
# printable ASCII text encodes.
_ASCII = [c for c in string.printable if not c.isspace() or c in " \n"]
_ASCII_VISIBLE = [c for c in _ASCII if not c.isspace()]


def train_tokenizer(
    family: str,
    corpus: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    chat_template: str | None = None,
    lowercase: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `family` ("bpe" | "unigram" | "wordpiece" | "char") on `corpus`.

    `vocab_size` is an upper bound for bpe, unigram
    (including its 256 byte tokens) and wordpiece (the trainer stops when no merge is left);
    the char family ignores it (its vocabulary is every printable ASCII character plus the
    corpus's characters). `lowercase` adds a Lowercase normalizer (wordpiece only).
    Returns a fast tokenizer with left padding and the family's chat template (or `chat_template`).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {FAMILIES}")
    if lowercase and family != "wordpiece":
        raise ValueError(f"lowercase=True is only supported for 'wordpiece', not {family!r}")
    lines = list(corpus)
    spec = _SPECS[family]
    if family == "bpe":
        backend = _train_bpe(lines, vocab_size, spec["specials"])
    elif family == "unigram":
        backend = _train_unigram(lines, vocab_size, spec["specials"])
    elif family == "wordpiece":
        backend = _train_wordpiece(lines, vocab_size, spec["specials"], lowercase)
    else:
        backend = _build_char(lines, spec["specials"])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        **spec["roles"],
    )
    tok.chat_template = chat_template or spec["template"]
    return tok


def _train_bpe(lines: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(lines, trainer=trainer)
    return backend


# The `tokenizers` Unigram and WordPiece trainers give different vocabularies in different
# processes (hash-map order breaks ties), so both families start from plain BPE pieces, whose
# trainer is deterministic, and build the Unigram scores / WordPiece vocabulary from them.
_METASPACE = {"replacement": "▁", "prepend_scheme": "first", "split": True}


def _bpe_pieces(
    lines: Iterable[str], vocab_size: int, pre_tokenizer: pre.PreTokenizer
) -> list[str]:
    """Train a character-level BPE on `lines`; returns its vocabulary in id order."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    backend.train_from_iterator(lines, trainer=trainer)
    return sorted(backend.get_vocab(), key=backend.get_vocab().__getitem__)


def _train_unigram(lines: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    # Pieces from BPE over '▁'-words; scores = log unigram probabilities re-estimated from
    # Viterbi counts (hard EM, 3 rounds). The 256 <0xNN> byte tokens follow the specials (as in
    # Llama/Gemma) so that byte_fallback can encode any unicode.
    metaspace = pre.Metaspace(**_METASPACE)
    words = Counter(w for line in lines for w, _ in metaspace.pre_tokenize_str(line))
    n_pieces = max(vocab_size - 256 - len(specials), 32)
    byte_tokens = [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    reserved = set(specials) | {b for b, _ in byte_tokens}
    pieces = [
        p for p in _bpe_pieces(lines, n_pieces, pre.Metaspace(**_METASPACE)) if p not in reserved
    ]
    unique = sorted(words)
    text = " ".join(w for w in unique for _ in range(words[w]))  # pieces hold no ' '
    counts = {p: text.count(p) for p in pieces}
    for _ in range(3):
        total = sum(counts.values()) + 0.1 * len(pieces)
        scores = {p: math.log((counts[p] + 0.1) / total) for p in pieces}
        model = Tokenizer(models.Unigram([("<unk>", 0.0), *scores.items()], unk_id=0))
        counts = dict.fromkeys(pieces, 0)
        for word, enc in zip(unique, model.encode_batch(unique), strict=True):
            for t in enc.tokens:
                counts[t] += words[word]
    ordered = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    vocab = [(s, 0.0) for s in specials] + byte_tokens + ordered
    backend = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=True))
    backend.pre_tokenizer = pre.Metaspace(**_METASPACE)
    backend.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(**_METASPACE), decoders.Fuse()]
    )
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    # Like Gemma/Llama, encode() adds <bos>. Set here rather than with add_bos_token=True, which
    # transformers 5 does not save: a reloaded tokenizer would still add <bos> but say it does not.
    bos = ("<bos>", specials.index("<bos>"))
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos>:1 $B:1", special_tokens=[bos]
    )
    return backend


def _train_wordpiece(
    lines: list[str], vocab_size: int, specials: list[str], lowercase: bool
) -> Tokenizer:
    # WordPiece training is BPE where non-initial characters carry '##'. Mapping those characters
    # to private-use code points lets plain BPE learn the same pieces. Whitespace-only split (no
    # punctuation split) so that single-spaced text round-trips; every printable ASCII
    # character is in the vocabulary both bare and with '##'.
    if lowercase:
        lines = [line.lower() for line in lines]
    chars = sorted({c for line in lines for w in line.split() for c in w[1:]})
    to_private = {c: chr(0xF0000 + i) for i, c in enumerate(chars)}
    from_private = {v: k for k, v in to_private.items()}
    mapped = (
        " ".join(w[0] + "".join(to_private[c] for c in w[1:]) for w in line.split())
        for line in lines
    )
    learned = [
        ("##" + from_private[p[0]] if p[0] in from_private else p[0])
        + "".join(from_private[c] for c in p[1:])
        for p in _bpe_pieces(mapped, vocab_size, pre.WhitespaceSplit())
    ]
    ascii_pieces = [*_ASCII_VISIBLE, *("##" + c for c in _ASCII_VISIBLE)]
    missing = [p for p in ascii_pieces if p not in set(learned)]
    # BPE ids put single characters first, so trimming from the end drops only merges.
    budget = max(vocab_size - len(specials) - len(missing), len(ascii_pieces))
    vocab = {s: i for i, s in enumerate(specials)}
    for piece in learned[:budget] + missing:
        vocab.setdefault(piece, len(vocab))
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    if lowercase:
        backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return backend


def _build_char(lines: list[str], specials: list[str]) -> Tokenizer:
    chars = sorted(set(_ASCII).union(*map(set, lines)))
    vocab = {s: i for i, s in enumerate(specials)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    backend.pre_tokenizer = pre.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAR_ADDED_TOKENS])
    return backend


def save_tokenizer(tok: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Save `tok` with `save_pretrained` into `path` (created if needed); returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(path)
    return path
