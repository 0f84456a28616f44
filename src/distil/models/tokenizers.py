"""Prompt rendering and token ids: each model's own chat template, stop tokens, padding.

A prompt is either chat messages (rendered with the tokenizer's chat template, so a teacher and
a student from different families each see their own markers) or plain text used verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distil.errors import ConfigError
from distil.types import Messages


def render_prompt(tok, prompt: Messages | str, *, name: str = "tokenizer") -> str:
    """The text a model sees before its completion (generation prompt included)."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tok, "chat_template", None):
        raise ConfigError(
            f"the {name} has no chat template, so chat-message prompts cannot be rendered. "
            "Fix: set tokenizer.chat_template and save it, or use plain-text prompts"
        )
    return tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def encode_prompts(
    tok,
    prompts: Sequence[Messages | str],
    *,
    max_tokens: int | None = None,
    name: str = "tokenizer",
) -> list[list[int]]:
    """Render and tokenize prompts; keep the last `max_tokens` tokens (the end matters most)."""
    texts = [render_prompt(tok, p, name=name) for p in prompts]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    if max_tokens is not None:
        ids = [row[-max_tokens:] for row in ids]
    return ids


def reference_ids(tok, text: str | None, max_tokens: int, eos: int) -> list[int] | None:
    """A dataset completion as token ids: its first `max_tokens` tokens, or all of them plus
    `eos` when they fit; None when the example has no completion."""
    if text is None:
        return None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[:max_tokens] if len(ids) >= max_tokens else [*ids, eos]


def stop_token_ids(tok, model=None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation EOS ids."""
    ids: list[int] = []
    candidates: list[object] = [tok.eos_token_id]
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        candidates.append(gen_cfg.eos_token_id)
    for c in candidates:
        for i in c if isinstance(c, (list, tuple)) else [c]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ConfigError("the tokenizer defines no EOS token; set tokenizer.eos_token")
    return ids


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into (ids_B_P, attention_mask_B_P)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask
