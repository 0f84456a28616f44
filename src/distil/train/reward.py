"""A task's reward on each on-policy completion: scored where the window is sampled, turned
into group-relative advantages, handed to the loss.

    window = buffer.next_window()   # generate, then WindowRewards(on-policy samples):
                                    #   reward r_i = values[checker(completion).outcome]
                                    #   (or the user's function(row, completion))
                                    #   advantage A_i within each prompt's num_generations
    loss(..., advantages_B=A of the micro-batch's rows)   # losses/reward.py

The scoring runs inside `GenerationBuffer.next_window`, on the CPU, after the generate call:
with `generation.async` that is the sampler's worker thread, so the checker's time overlaps the
training step instead of stalling it. Window metrics (`reward/mean`, `reward/share/<outcome>`,
`reward/no_signal_groups`: the share of groups whose rewards are all equal, which teach
nothing) go to metrics.jsonl and the progress line with the window's other metrics.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from distil.config import DistilConfig
from distil.config.rules_reward import rewarded, scores_rewards
from distil.data.datasets import short, source_row
from distil.errors import ConfigError, DataError
from distil.losses import get_loss, group_advantages, with_reward
from distil.types import Batch, Example, Sample

# what a reward function returns: a number, or (number, outcome category)
Scored = tuple[float, str]


class TaskReward:
    """reward(example, text) -> (value, outcome): the task's checker on the completion, the
    outcome's value from `values` (else `default`). Problems are built once per example."""

    def __init__(self, task, values: dict[str, float], default: float):
        unknown = sorted(set(values) - set(task.outcomes))
        if unknown:
            raise ConfigError(
                f"reward.values names {unknown}, which are not outcomes of task {task.name!r}. "
                f"Fix: use its outcomes: {', '.join(task.outcomes)}"
            )
        self.task, self.values, self.default = task, dict(values), float(default)
        self._problems: dict[int, dict[str, Any]] = {}

    def __call__(self, example: Example, text: str) -> Scored:
        problem = self._problems.get(example.id)
        if problem is None:
            path, _, line = example.meta.get("_where", "").rpartition(":")
            where = {"path": path or None, "line": int(line) if line.isdigit() else None}
            problem = self.task.make_problem(source_row(example), where, example.id)
            self._problems[example.id] = problem
        outcome = self.task.check(text, problem).outcome
        return self.values.get(outcome, self.default), outcome


class FunctionReward:
    """reward(example, text) -> (value, category): a user's `fn(row, completion)` by import
    path, its answer checked (a finite number, or (number, str)); errors name the row."""

    def __init__(self, path: str):
        module, _, attr = path.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError as exc:
            raise ConfigError(
                f"reward.function = {path!r}: cannot import module {module!r} ({exc}). Fix: "
                "install the package or put its directory on PYTHONPATH"
            ) from exc
        if not callable(fn):
            raise ConfigError(
                f"reward.function = {path!r}: module {module!r} has no function {attr!r}"
            )
        self.path, self.fn = path, fn

    def __call__(self, example: Example, text: str) -> Scored:
        row = source_row(example)
        try:
            out = self.fn(row, text)
        except Exception as exc:
            raise self._error(example, text, f"raised {type(exc).__name__}: {exc}") from exc
        value, category = out if isinstance(out, tuple) and len(out) == 2 else (out, "scored")
        if not isinstance(category, str):
            raise self._error(example, text, f"returned the category {short(category)}, not a str")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise self._error(example, text, f"returned {short(out)}")
        return float(value), category

    def _error(self, example: Example, text: str, what: str) -> DataError:
        path, _, line = example.meta.get("_where", "").rpartition(":")
        return DataError(
            f"data row {example.id}: reward.function {self.path} {what} for the completion "
            f"{short(text)}. Fix: return a finite number (or (number, category name)) for "
            "every row and completion",
            path=path or None,
            line=int(line) if line.isdigit() else None,
        )


class WindowRewards:
    """Called by the buffer with a window's on-policy samples (each prompt's `group_size` rows
    adjacent): sets each sample's `reward` and `advantage`; returns the window's metrics."""

    def __init__(self, reward: Callable[[Example, str], Scored], examples: Sequence[Example],
                 decode: Callable[[list[int]], str], *, group_size: int,
                 normalize_std: bool, outcomes: Sequence[str] = ()):  # fmt: skip
        self.reward, self.examples, self.decode = reward, examples, decode
        self.group_size, self.normalize_std = group_size, normalize_std
        self.outcomes = list(outcomes)  # every task outcome gets a share, 0 when absent

    def __call__(self, samples: Sequence[Sample]) -> dict[str, float]:
        scored = []
        for s in samples:
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
    checker of reward.task (null: eval.task) built with the eval section."""
    if not scores_rewards(cfg):
        return None
    r = cfg.reward
    if r.function:
        reward: Callable[[Example, str], Scored] = FunctionReward(r.function)
        outcomes: Sequence[str] = ()
    else:
        from distil.tasks import make_task

        name = r.task or cfg.eval.task
        task = make_task(cfg.eval.model_copy(update={"task": name}))
        reward, outcomes = TaskReward(task, r.values, r.default), task.outcomes

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    return WindowRewards(reward, examples, decode, group_size=cfg.generation.num_generations,
                         normalize_std=r.normalize_std, outcomes=outcomes)  # fmt: skip


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


def reward_inputs(batch: Batch) -> dict[str, Any]:
    """The loss options of a micro-batch whose rows carry advantages (on-policy rows of a run
    that scores rewards): advantages_B and the sampler's log-probs; {} otherwise."""
    advantages = [s.advantage for s in batch.samples]
    if all(a is None for a in advantages):
        return {}
    if any(a is None for a in advantages):  # whole slices share a policy (config rules)
        raise RuntimeError("a micro-batch mixes rows with and without a reward advantage")
    device = batch.mask_B_T.device
    return {
        "advantages_B": torch.tensor(advantages, dtype=torch.float32, device=device),
        "sampling_logprobs_B_T": batch.sampling_logprobs_B_T,
    }
