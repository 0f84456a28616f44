"""Seeded sampling for transformers `generate`, independent of torch's global RNG.

`generation.async` samples the next window in a background thread while the training thread
runs; both would draw from torch's one global generator, in an order that changes from run to
run, and a checkpoint would save that generator mid-draw. Instead an async window is sampled
from a private `torch.Generator` seeded per (run seed, rank, window, policy), so a resumed run
draws exactly the samples the uninterrupted one drew.

The draw is the Gumbel-max trick (argmax(s + G), G ~ Gumbel(0, 1), is a sample from
softmax(s)), applied as the last logits processor of a greedy `generate`: the warpers
(temperature, top-k, top-p) and the log-prob recorder run before it, so the recorded log-probs
are those of the distribution the token is drawn from, as in the unseeded path.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch

from distil.generation.base import SamplingParams


class GumbelMaxSampler:
    """Logits processor: adds Gumbel noise from its own generator; greedy decoding then samples."""

    def __init__(self, seed: int, device: torch.device | str):
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, input_ids: torch.Tensor, scores_B_V: torch.Tensor) -> torch.Tensor:
        # -log E with E ~ Exp(1) is Gumbel(0, 1); masked (-inf) entries stay -inf
        e_B_V = torch.empty_like(scores_B_V, dtype=torch.float32)
        e_B_V.exponential_(generator=self.generator)
        return scores_B_V.float() - e_B_V.log()


def seeded_processors(params: SamplingParams, device: torch.device | str) -> list:
    """[GumbelMaxSampler] when `params` asks for seeded sampling, else [] (greedy, or the
    global RNG)."""
    if params.seed is None or params.greedy:
        return []
    return [GumbelMaxSampler(params.seed, device)]


def part_params(params: SamplingParams, start: int) -> SamplingParams:
    """`params` for the part of a call that starts at row `start`, when a backend splits a call
    into several (a row cap): the first part keeps the call's seed, each later one draws from
    a seed of its own, so no two parts replay the same noise."""
    if params.seed is None or start == 0:
        return params
    return replace(params, seed=sampling_seed(params.seed, "rows", start))


def sampling_seed(*parts: object) -> int:
    """A 63-bit seed from the parts (run seed, rank, window, ...), the same in every process."""
    digest = hashlib.sha256(":".join(map(str, ("distil-sample", *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)
