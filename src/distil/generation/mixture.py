"""Sampling from a mixture of teachers (`teachers.weights` with `train.seq_kd`): each token is
drawn from M(v) = sum_i w_i T_i(v | prefix), the mixture the teachers' targets are (teacher/
several.py's MixedTeacher), here of the teachers' own distributions (temperature 1).

One transformers `generate` call runs on the first teacher with a weight (the driver). Its
scores reach `MixtureLogits` first of the logits processors, which runs every other teacher on
the same tokens (a KV cache each, the prompt's left padding and position ids as the driver's)
and returns log M; the sampling warpers (temperature, top-k, top-p), the log-prob recorder and
the seeded sampler then act on log M as they act on one model's logits. Every teacher shares
the student's tokenizer; their output rows are cut to the smallest (rows past a tokenizer's
vocabulary are padding) and log M is -inf past it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from distil.generation.hf import HFGenerator
from distil.generation.static import cache_argument


def _positions(attn_B_L: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch (0 at each row's first real token), as generate
    makes them for the driver."""
    pos = attn_B_L.long().cumsum(-1) - 1
    return pos.masked_fill(attn_B_L == 0, 1)


class MixtureLogits:
    """Logits processor: the driver's scores (B, V) -> log M over the first `keep` rows."""

    def __init__(self, others: Sequence, log_w: Sequence[float], keep: int, prompt_attn_B_P):
        self.others, self.log_w, self.keep = list(others), list(log_w), keep
        self.prompt_attn = prompt_attn_B_P
        self.caches: list = [None] * len(self.others)
        self.seen = 0  # tokens of input_ids the other teachers have read

    def __call__(self, input_ids_B_L: torch.Tensor, scores_B_V: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        B, L = input_ids_B_L.shape
        grown = L - self.prompt_attn.shape[1]
        attn = torch.cat([self.prompt_attn, self.prompt_attn.new_ones(B, grown)], dim=1)
        new = input_ids_B_L[:, self.seen :]
        pos = _positions(attn)[:, self.seen :]
        k = self.keep
        mixed = torch.log_softmax(scores_B_V[:, :k].float(), dim=-1) + self.log_w[0]
        for i, model in enumerate(self.others):
            if self.caches[i] is None:  # filled in place by each forward
                self.caches[i] = DynamicCache(config=model.config)
            kv = {cache_argument(model): self.caches[i]}
            d = next(model.parameters()).device  # a teacher on its own device reads there
            out = model(input_ids=new.to(d), attention_mask=attn.to(d), position_ids=pos.to(d),
                        use_cache=True, **kv)  # fmt: skip
            lp = torch.log_softmax(out.logits[:, -1, :k].float(), dim=-1).to(mixed.device)
            mixed = torch.logaddexp(mixed, lp + self.log_w[i + 1])
        self.seen = L
        full = mixed.new_full((B, scores_B_V.shape[1]), -math.inf)
        full[:, :k] = mixed
        return full


def mixture_generator(models: Sequence, weights: Sequence[float], *, pad_id: int,
                      stop_ids: Sequence[int]) -> HFGenerator:  # fmt: skip
    """An HFGenerator that samples from the teachers' mixture (weights normalised; a teacher of
    weight 0 is not run). One teacher of weight 1 is an HFGenerator over it."""
    if len(models) != len(weights) or min(weights, default=0) < 0 or not sum(weights) > 0:
        raise ValueError("one weight >= 0 per teacher, with a positive sum")
    total = float(sum(weights))
    used = [(m, math.log(w / total)) for m, w in zip(models, weights, strict=True) if w > 0]
    driver, others = used[0][0], [m for m, _ in used[1:]]
    if not others:
        return HFGenerator(driver, pad_id=pad_id, stop_ids=stop_ids)
    keep = min(m.get_output_embeddings().weight.shape[0] for m, _ in used)
    log_w = [lw for _, lw in used]

    def processors(ids_B_P: torch.Tensor, attn_B_P: torch.Tensor) -> list:
        for m in others:
            m.eval()
        return [MixtureLogits(others, log_w, keep, attn_B_P)]

    gen = HFGenerator(driver, pad_id=pad_id, stop_ids=stop_ids)
    gen.first_processors = processors
    return gen
