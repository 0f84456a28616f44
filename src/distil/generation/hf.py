"""HF `generate` backend: batched, left-padded prompts, KV cache, several EOS ids.

It samples from the student module it was given, so it always sees the current weights (no copy
and nothing to sync). The log-prob of each chosen token under the distribution it was sampled
from is recorded on the fly by a logits processor that runs after the sampling warpers, keeping
one (B, V) slice in memory instead of every step's scores.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence

import torch

from distil.generation.base import SamplingParams, mask_after_eos, mask_past_vocab
from distil.generation.seeded import part_params, seeded_processors
from distil.models.inuse import module_lock
from distil.models.tokenizers import left_pad
from distil.types import Rollout


class _ChosenLogprobs:
    """Logits processor: remembers log-softmax of the final scores, gathers the chosen token."""

    def __init__(self, prompt_width: int):
        self.prompt_width = prompt_width
        self.last_logprobs_B_V: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        self.collect(input_ids)
        self.last_logprobs_B_V = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def collect(self, input_ids: torch.Tensor) -> None:
        if self.last_logprobs_B_V is not None:
            token = input_ids[:, -1:]
            self.chosen.append(self.last_logprobs_B_V.gather(1, token).squeeze(1))
            self.last_logprobs_B_V = None


class PastVocabMasked:
    """Logits processor: -inf at the ids past the tokenizer (`mask_past_vocab`). It runs first,
    before the warpers and the log-prob recorder, so the recorded log-prob is that of the
    distribution the token is drawn from."""

    def __init__(self, vocab_limit: int):
        self.vocab_limit = vocab_limit

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return mask_past_vocab(scores, self.vocab_limit)


def sampling_warpers(params: SamplingParams) -> list:
    """transformers' logits warpers for `params`, in the order generate applies them
    (temperature, top-k, top-p); none for greedy decoding."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers: list = []
    if not params.greedy:
        if params.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


class HFGenerator:
    """Generator over a transformers causal LM (unwrapped from DDP/FSDP by the caller)."""

    @classmethod
    def from_config(
        cls, cfg, model, *, pad_id: int, stop_ids: Sequence[int], vocab_limit: int | None = None
    ) -> HFGenerator:
        """The `generation.backend=hf` generator (the config has no knob for it)."""
        return cls(model, pad_id=pad_id, stop_ids=stop_ids, vocab_limit=vocab_limit)

    def __init__(
        self,
        model,
        *,
        pad_id: int,
        stop_ids: Sequence[int],
        max_batch: int | None = None,
        vocab_limit: int | None = None,
    ):
        self.model = model
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.max_batch = max_batch  # split very large windows into several calls
        # ids >= vocab_limit (the tokenizer's largest id + 1) are never sampled: a padded vocabulary
        self.vocab_limit = vocab_limit
        self.calls = 0  # number of generate calls made (tests assert one per window)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    def worker_copy(self) -> HFGenerator:
        """A copy to sample on a worker thread (generation.async), its state its own."""
        return copy.copy(self)

    def scratch_caches(self) -> contextlib.AbstractContextManager[None]:
        """Calls inside keep nothing afterwards: generate keeps nothing between calls."""
        return contextlib.nullcontext()

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollout:
        with module_lock(self.model):  # not while a training step swaps its head (inuse.py)
            return self._generate(prompt_ids, params)

    def _generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollout:
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        step = self.max_batch or len(rows)
        parts = [
            self._generate_rows(rows[s : s + step], part_params(params, s))
            for s in range(0, len(rows), step)
        ]
        width = max(p[0].shape[1] for p in parts)
        ids = torch.cat([pad_columns(p[0], width, self.pad_id) for p in parts])
        logprobs = torch.cat([pad_columns(p[1], width, 0.0) for p in parts])
        mask = mask_after_eos(ids, self.stop_ids)
        stopped = (torch.isin(ids, torch.tensor(self.stop_ids)) & mask).any(dim=1)
        ids = ids.masked_fill(~mask, self.pad_id)
        return Rollout(index, ids, mask, logprobs.masked_fill(~mask, 0.0), stopped)

    def _generate_rows(self, rows: list[list[int]], params: SamplingParams):
        from transformers import LogitsProcessorList

        device = next(self.model.parameters()).device
        ids, attn = left_pad(rows, self.pad_id)
        ids, attn = ids.to(device), attn.to(device)
        recorder = _ChosenLogprobs(ids.shape[1])
        # Warpers are passed explicitly (and the config's left neutral) so that the recorder
        # runs after them and sees the distribution the token is actually drawn from.
        warpers = sampling_warpers(params)
        was_training = self.model.training
        self.model.eval()
        try:
            # neutral flags so the model's generation_config adds no warper of its own
            # (transformers fills an unset top_k with 50)
            sampling = {} if params.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
            seeded = seeded_processors(params, device)  # its own RNG: greedy over Gumbel noise
            out = self.model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=params.max_new_tokens,
                do_sample=not params.greedy and not seeded,
                **({} if seeded else sampling),
                logits_processor=LogitsProcessorList([*self._masks(), *warpers, recorder, *seeded]),
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
                use_cache=True,
                # transformers turns this on for FSDP modules (an all-reduce per token); distil
                # gathers the weights before generating (train/fsdp.py), so ranks run alone
                synced_gpus=False,
            )
        finally:
            self.model.train(was_training)
        self.calls += 1
        recorder.collect(out)
        completion = out[:, ids.shape[1] :].cpu()
        chosen = torch.stack(recorder.chosen, dim=1).cpu() if recorder.chosen else None
        if chosen is None:
            chosen = torch.zeros(completion.shape, dtype=torch.float32)
        return completion, chosen[:, : completion.shape[1]]

    def _masks(self) -> list:
        """The processors that run before the warpers: the padded vocabulary's mask."""
        return [] if self.vocab_limit is None else [PastVocabMasked(self.vocab_limit)]


def pad_columns(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """(B, C) -> (B, width): `value` in the new columns on the right."""
    if t.shape[1] == width:
        return t
    pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=1)
