"""A task's reward on each on-policy completion: scored where the window is sampled, turned
into group-relative advantages, handed to the loss.

    window = buffer.next_window()   # generate, then WindowRewards(on-policy samples):
                                    #   reward r_i = values[checker(completion).outcome]
                                    #   (or the user's function(row, completion);
                                    #   reward.truncated if cut at max_new_tokens)
                                    #   advantage A_i within each prompt's num_generations
    loss(..., advantages_B=A of the micro-batch's rows)   # losses/reward.py

The scoring runs inside `GenerationBuffer.next_window`, on the CPU, after the generate call:
with `generation.async` that is the sampler's worker thread, so the checker's time overlaps the
training step instead of stalling it. Window metrics (`reward/mean`, `reward/share/<outcome>`,
`reward/no_signal_groups`: the share of groups whose rewards are all equal, which teach
nothing) go to metrics.jsonl and the progress line with the window's other metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from distil.config import DistilConfig
from distil.config.rules_reward import GRPO, rewarded, scores_rewards
from distil.losses import get_loss, group_advantages, with_reward
from distil.models.tokenizers import id_rows
from distil.tasks.reward import Scored, reward_scorer
from distil.types import Batch, Example, Sample

TRUNCATED = "truncated"  # the outcome of a completion cut at max_new_tokens (reward.truncated)


class WindowRewards:
    """Called by the buffer with a window's on-policy samples (each prompt's `group_size` rows
    adjacent): sets each sample's `reward` and `advantage`; returns the window's metrics."""

    def __init__(self, reward: Callable[[Example, str], Scored], examples: Sequence[Example],
                 decode: Callable[[list[int]], str], *, group_size: int,
                 normalize_std: bool, outcomes: Sequence[str] = (),
                 truncated: float | None = None):  # fmt: skip
        self.reward, self.examples, self.decode = reward, examples, decode
        self.group_size, self.normalize_std = group_size, normalize_std
        self.truncated = truncated  # the reward of a completion cut at max_new_tokens
        # every task outcome gets a share, 0 when absent
        self.outcomes = [*outcomes, *([TRUNCATED] if truncated is not None else [])]

    def __call__(self, samples: Sequence[Sample]) -> dict[str, float]:
        scored = []
        for s in samples:
            if self.truncated is not None and s.stopped is False:
                scored.append((self.truncated, TRUNCATED))
                continue
            text = s.completion_text
            if text is None:
                text = self.decode(s.completion_ids)
            scored.append(self.reward(self.examples[s.example_id], text))
        rewards = torch.tensor([r for r, _ in scored], dtype=torch.float64)
        advantages = group_advantages(rewards, self.group_size, normalize_std=self.normalize_std)
        for s, r, a in zip(samples, rewards.tolist(), advantages.tolist(), strict=True):
            s.reward, s.advantage = r, a
        groups = rewards.reshape(-1, self.group_size)
        flat = (groups == groups[:, :1]).all(dim=1)
        counts = Counter(c for _, c in scored)
        metrics = {
            "reward/mean": float(rewards.mean()),
            "reward/no_signal_groups": float(flat.double().mean()),
        }
        for outcome in dict.fromkeys([*self.outcomes, *counts]):
            metrics[f"reward/share/{outcome}"] = counts[outcome] / len(scored)
        return metrics


def build_rewards(cfg: DistilConfig, examples: Sequence[Example], tok) -> WindowRewards | None:
    """The run's window scorer (None when it scores no rewards): reward.function, else the
    checker of reward.task (null: eval.task) built with the eval section (`reward_scorer`)."""
    if not scores_rewards(cfg):
        return None
    reward, outcomes = reward_scorer(cfg)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    return WindowRewards(reward, examples, decode, group_size=cfg.generation.num_generations,
                         normalize_std=cfg.reward.normalize_std, outcomes=outcomes,
                         truncated=cfg.reward.truncated)  # fmt: skip


def flat_everywhere(cfg: DistilConfig, acc, window_metrics: dict) -> bool:
    """Whether a window trains nothing and is skipped (reward.skip_flat): loss.name=grpo and
    every group of the window, on every rank, has equal rewards (advantage 0, so no gradient).
    One small all-reduce on several ranks, so every rank skips the same windows."""
    if not (cfg.loss.name == GRPO and cfg.reward.skip_flat):
        return False
    signal = float(window_metrics.get("reward/no_signal_groups", 0.0) < 1.0)
    if acc.num_processes > 1:
        signal = float(acc.reduce(torch.tensor(signal, device=acc.device), reduction="sum"))
    return signal == 0.0


def reward_loss(cfg: DistilConfig):
    """(loss function, its extra options): loss.name from the registry, plus the reward term
    (`with_reward`) when loss.reward_weight > 0; the options the reward term reads when the
    loss uses a reward."""
    loss_fn = get_loss(cfg.loss.name)
    if cfg.loss.reward_weight > 0:
        loss_fn = with_reward(loss_fn, cfg.loss.reward_weight)
    if not rewarded(cfg):
        return loss_fn, {}
    return loss_fn, {
        "sampling_temperature": cfg.generation.temperature,
        "importance_ratio": cfg.generation.async_,
        "clip_eps": cfg.reward.clip,
    }


def sampler_rows(model, tok) -> dict[str, int]:
    """{"policy_rows": the tokenizer's id rows} when the model's vocabulary is padded past them:
    every sampler masks those rows (`generation.base`), so the reward term's log S, which the
    sampler's log-probs are compared with, leaves them out too (as `cross_tokenizer_setup`
    keeps a cross-tokenizer loss's logits); {} otherwise."""
    rows = id_rows(tok)
    return {"policy_rows": rows} if model.get_output_embeddings().weight.shape[0] > rows else {}


def reward_inputs(batch: Batch) -> dict[str, Any]:
    """The loss options of a micro-batch whose rows carry advantages (on-policy rows of a run
    that scores rewards): advantages_B, the sampler's log-probs and, when an alignment
    narrowed the loss mask, every completion token's (reward_mask_B_T); {} otherwise."""
    advantages = [s.advantage for s in batch.samples]
    if all(a is None for a in advantages):
        return {}
    if any(a is None for a in advantages):  # whole slices share a policy (config rules)
        raise RuntimeError("a micro-batch mixes rows with and without a reward advantage")
    device = batch.mask_B_T.device
    out = {
        "advantages_B": torch.tensor(advantages, dtype=torch.float32, device=device),
        "sampling_logprobs_B_T": batch.sampling_logprobs_B_T,
    }
    if batch.completion_mask_B_T is not None:  # cross-tokenizer: unaligned tokens too
        out["reward_mask_B_T"] = batch.completion_mask_B_T
    return out
