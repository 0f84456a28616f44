"""The Generator protocol: sample completions for tokenized prompts with the current weights.

Backends (chosen by `generation.backend` in `select.py`): `hf.HFGenerator` (transformers
`generate`, CPU and GPU), `static.StaticCacheGenerator` (fixed-shape KV cache, compiled decode
step) and `vllm.VLLMGenerator` (imported lazily; GPUs). All return a `Rollout` and share the EOS
masking rule below. Every backend takes a `vocab_limit` (the tokenizer's largest id + 1,
`models.tokenizers.id_rows`) and never samples an id at or past it (`mask_past_vocab`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch

from distil.types import Rollout


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    n: int = 1  # samples per prompt
    # None: torch's global RNG (the synchronous loop). An int: draws come from a private
    # generator seeded with it, so a call's samples are a pure function of (weights, prompts,
    # seed) whatever other threads draw (generation.async samples in a background thread).
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Generator(Protocol):
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt; rows of one prompt are adjacent."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the sampler use `model`'s current weights (a no-op when it samples from them)."""
        ...

    def scratch_caches(self) -> AbstractContextManager[None]:
        """A context whose calls (an evaluation) leave no memory allocated afterwards that the
        sampler would otherwise keep between calls (hf_static's KV caches)."""
        ...


def mask_past_vocab(scores_B_V: torch.Tensor, vocab_limit: int | None) -> torch.Tensor:
    """`scores_B_V` with -inf at every id >= `vocab_limit` (the tokenizer's id rows), so that no
    sampler, greedy or not, draws an id the tokenizer cannot decode: a model's vocabulary is
    often padded past its tokenizer (Qwen3: 151,936 rows for 151,669 tokens), and those rows'
    logits, small in a trained checkpoint, are not -inf. A new tensor; `scores_B_V` as is when
    nothing lies past the limit (None: no limit)."""
    if vocab_limit is None or scores_B_V.shape[-1] <= vocab_limit:
        return scores_B_V
    out = scores_B_V.clone()
    out[..., vocab_limit:] = float("-inf")
    return out


def past_vocab_bias(model: torch.nn.Module, vocab_limit: int | None) -> dict[int, float]:
    """{id: -inf} for every row of the model's vocabulary at or past `vocab_limit`: the
    same mask as a logit bias, for an engine that takes one per request (vLLM)."""
    rows = model.get_output_embeddings().weight.shape[0]
    if vocab_limit is None or rows <= vocab_limit:
        return {}
    return dict.fromkeys(range(vocab_limit, rows), float("-inf"))


def mask_after_eos(ids_B_C: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """True up to and including the first stop token of each row, False after it."""
    is_stop = torch.isin(ids_B_C, torch.tensor(list(stop_ids), device=ids_B_C.device))
    # stops strictly before position c: cumulative count shifted right by one
    before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return before == 0
