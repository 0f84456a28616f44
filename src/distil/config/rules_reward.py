"""Rules over a task's reward in the loss (loss.name=grpo, loss.reward_weight, the reward
section): each takes a config and returns (keys involved, message) or None, like the rules in
`distil.config.rules`, which runs the ones listed in CHECKS. Whether reward.task or
reward.function resolves, and whether reward.values names the task's outcomes, is checked
when the run builds its reward (distil.train.reward)."""

from __future__ import annotations

import re

from distil.config.schema import DistilConfig

GRPO = "grpo"
# the losses that read no teacher: losses.TEACHERLESS_LOSSES, which the config layer may not
# import (it sits below losses/); a test holds the two equal
TEACHERLESS = frozenset({"sft", GRPO})
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def rewarded(cfg: DistilConfig) -> bool:
    """Whether the loss uses a task's reward (grpo, or reward_weight > 0)."""
    return cfg.loss.name == GRPO or cfg.loss.reward_weight > 0


def scores_rewards(cfg: DistilConfig) -> bool:
    """Whether the run scores its on-policy completions (the loss uses them, or reward.log)."""
    return rewarded(cfg) or cfg.reward.log


def _grpo_is_on_policy(cfg: DistilConfig):
    """loss.name=grpo: every slice on-policy (train.lambda=1, no seq_kd) and no teacher built."""
    if cfg.loss.name != GRPO:
        return None
    if cfg.train.lambda_ != 1.0 or cfg.train.seq_kd:
        return ("loss.name", "train.lambda", "train.seq_kd"), (
            f"loss.name = 'grpo' learns from the reward of the student's own samples, but "
            f"train.lambda = {cfg.train.lambda_} and train.seq_kd = {cfg.train.seq_kd} ask for "
            "slices of completions it did not write, which have no reward. Fix: "
            "train.lambda=1 and train.seq_kd=false"
        )
    t = cfg.teacher
    if cfg.teachers.models or t.from_student or t.context or t.system:
        return ("loss.name", "teachers.models", "teacher.from_student", "teacher.context"), (
            "loss.name = 'grpo' reads no teacher, but the config builds one (teachers.models, "
            "teacher.from_student, teacher.context or teacher.system). Fix: drop them (a "
            "teacher.path is ignored), or add the reward to a distillation loss with "
            "loss.reward_weight"
        )
    return None


def _reward_weight_needs_distillation(cfg: DistilConfig):
    """loss.reward_weight > 0: an on-policy distillation loss (not grpo or sft) and lambda > 0."""
    w = cfg.loss.reward_weight
    if w <= 0:
        return None
    if cfg.loss.name in TEACHERLESS:
        return ("loss.name", "loss.reward_weight"), (
            f"loss.reward_weight = {w} adds a reward to an on-policy distillation loss, but "
            f"loss.name = {cfg.loss.name!r}"
            + (" is the reward alone" if cfg.loss.name == GRPO else " trains on data it did "
               "not sample") + ". Fix: loss.reward_weight=0, or a distillation loss such as "
            "forward_kl, reverse_kl, sampled_reverse_kl or aligned_kl"
        )  # fmt: skip
    if cfg.train.lambda_ == 0:
        return ("loss.reward_weight", "train.lambda"), (
            f"loss.reward_weight = {w} with train.lambda = 0: a reward scores the student's own "
            "samples and this run draws none. Fix: train.lambda > 0 (1: on-policy only)"
        )
    return None


def _groups_to_compare(cfg: DistilConfig):
    """A reward in the loss: generation.num_generations >= 2 and a sampling temperature > 0;
    reward.log alone: num_generations >= 2 too."""
    if not scores_rewards(cfg):
        return None
    g = cfg.generation
    fix = (
        "Fix: generation.num_generations=8 (at least 2; train.per_device_batch_size * "
        "train.grad_accum_steps a multiple of it)"
    )
    if g.num_generations < 2 and not rewarded(cfg):  # reward.log alone
        return ("reward.log", "generation.num_generations"), (
            f"reward.log = true with generation.num_generations = {g.num_generations}: the "
            "logged reward/no_signal_groups compares each prompt's samples with each other, "
            f"and a group of one sample never has a signal (it would read 100%). {fix}, or "
            "reward.log=false"
        )
    if g.num_generations < 2:
        return ("generation.num_generations",), (
            f"generation.num_generations = {g.num_generations}: the reward's advantage compares "
            "each prompt's samples with each other (GRPO), so one sample per prompt always has "
            f"advantage 0 and nothing is learned. {fix}"
        )
    if not rewarded(cfg):
        return None
    if g.temperature == 0:
        return ("generation.temperature",), (
            "generation.temperature = 0 (greedy) with a reward in the loss: every sample of a "
            "prompt is the same, so no group has a signal. Fix: generation.temperature=1 (or "
            "another value > 0)"
        )
    return None


def _ratio_needs_plain_sampling(cfg: DistilConfig):
    """A reward in the loss with generation.async: no top-k / top-p truncation of the sampler."""
    g = cfg.generation
    if not (rewarded(cfg) and g.async_) or (g.top_k == 0 and g.top_p == 1.0):
        return None
    return ("generation.async", "generation.top_k", "generation.top_p"), (
        f"generation.async with a reward in the loss: the importance ratio to the lagging "
        f"sampler compares the learner's tempered distribution with the one the sampler drew "
        f"from, which generation.top_k = {g.top_k} / top_p = {g.top_p} truncate, so the ratio "
        "is biased even at no lag. Fix: generation.top_k=0 and generation.top_p=1, or "
        "generation.async=false"
    )


def _reward_function_path(cfg: DistilConfig):
    """reward.function: an import path module:function."""
    fn = cfg.reward.function
    if fn is None or _IMPORT_PATH.match(fn):
        return None
    return ("reward.function",), (
        f"reward.function = {fn!r} is not an import path. Fix: module:function, e.g. "
        "mypkg.rewards:score (the module importable where the run starts)"
    )


CHECKS = [
    _grpo_is_on_policy,
    _reward_weight_needs_distillation,
    _groups_to_compare,
    _ratio_needs_plain_sampling,
    _reward_function_path,
]
