"""Models and tokenizers from scratch, for small experiments and the CPU demo.

    distil tokenizer train --family bpe --vocab-size 512 --data data/train.jsonl --out tok/bpe
    distil init-model --tokenizer tok/bpe --hidden-size 256 --layers 6 --out models/teacher

Tokenizers are trained with the `tokenizers` library on lines of text (a dataset's prompts and
completions); models are random-init Llama/Qwen2 causal LMs sized to the tokenizer. Both are saved
with `save_pretrained`, so every other command loads them like any hub checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distil.errors import ConfigError
from distil.models import tokenizer_families as families

if TYPE_CHECKING:  # torch and the model classes are imported by the functions that build
    # models: `distil tokenizer train` starts without them
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CHAT_TEMPLATES = ("family", "compact")


def make_tokenizer(
    family: str,
    lines: list[str],
    out: str | Path,
    *,
    vocab_size: int = 512,
    chat_template: str = "family",
):
    """Train a `family` tokenizer on `lines` (`distil.tasks.prompts.corpus_from_data` reads
    them from a dataset), save it to `out`, return it.

    chat_template "family" keeps the family's own turn markers (ChatML for bpe, Gemma-like for
    unigram, ...); "compact" renders a prompt as its text followed by " ->" (no markers), the
    cheapest format for tiny models trained from scratch.
    """
    if family not in families.FAMILIES:
        raise ConfigError(f"--family {family!r} is not one of {', '.join(families.FAMILIES)}")
    if chat_template not in CHAT_TEMPLATES:
        raise ConfigError(
            f"--chat-template {chat_template!r} is not one of {', '.join(CHAT_TEMPLATES)}"
        )
    template_text = families.CHAR_TEMPLATE if chat_template == "compact" else None
    tok = families.train_tokenizer(family, lines, vocab_size, chat_template=template_text)
    families.save_tokenizer(tok, out)
    return tok


def init_model(
    tokenizer_dir: str | Path,
    out: str | Path,
    *,
    arch: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 6,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
) -> int:
    """A random-init causal LM sized to the tokenizer, saved with it to `out`; returns the
    number of parameters."""
    from distil.models.load import load_tokenizer, quiet_transformers
    from distil.models.tokenizers import id_rows

    if arch not in ("llama", "qwen2"):
        raise ConfigError(f"--arch {arch!r} is not one of llama, qwen2")
    if hidden_size % num_heads:
        raise ConfigError(f"--hidden-size {hidden_size} must be a multiple of --heads {num_heads}")
    quiet_transformers()
    tok = load_tokenizer(str(tokenizer_dir), key="--tokenizer")
    model = tiny_model(
        arch,
        id_rows(tok),  # every id the tokenizer has, gaps included
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        seed=seed,
        tokenizer=tok,
    )
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return count_parameters(model)


# arch -> transformers' (config class, model class) names
_ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),  # Qwen2 = Llama + biases on q/k/v
}


def tiny_model(
    arch: str,
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **overrides: Any,
) -> PreTrainedModel:
    """Return a randomly initialised causal LM of `arch` ("llama" | "qwen2"): sdpa, fp32, eval.

    `num_kv_heads=None` means multi-head attention; `intermediate_size=None` is ~8/3 of the
    hidden size (rounded up to a multiple of 16). bos/eos/pad ids come from `tokenizer` when
    given (else None), also in the generation config. `overrides` go to the config. The same
    arguments and seed always give the same weights; the global RNG state is left untouched.
    """
    import torch
    import transformers

    if arch not in _ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(_ARCHS)}")
    config_cls, model_cls = (getattr(transformers, name) for name in _ARCHS[arch])
    special_ids = {
        name: getattr(tokenizer, name, None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id")
    }
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        intermediate_size=intermediate_size or -(-8 * hidden_size // 48) * 16,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation="sdpa",
        **{**special_ids, **overrides},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    for name in special_ids:
        setattr(model.generation_config, name, getattr(config, name))
    return model.eval()


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Return the number of parameters of `model`, counting tied weights once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
