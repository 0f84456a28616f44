"""Losses by name: `register` adds one, `get_loss` finds one and lists the valid names if not.

Every registered loss has the signature
`fn(student, targets, mask_B_T, *, num_tokens, **opts) -> LossOutput` and ignores options it
does not use, so the loop can hand one option dict to any of them.
"""

from __future__ import annotations

from collections.abc import Callable

from distil.errors import ConfigError
from distil.types import LossOutput

LossFn = Callable[..., LossOutput]

LOSSES: dict[str, LossFn] = {}

# Losses that compare a student and a teacher with different tokenizers through the batch's
# `AlignmentGroups` (teacher targets in teacher positions); the others need one vocabulary.
CROSS_TOKENIZER_LOSSES = frozenset({"uld", "gold", "aligned_kl", "sampled_chunk_reverse_kl"})


# Losses that read no teacher targets: `sft` (the data's tokens) and `grpo` (a task's reward).
# A run with one of them loads a teacher only to write seq-KD completions.
TEACHERLESS_LOSSES = frozenset({"sft", "grpo"})


def is_cross_tokenizer(name: str) -> bool:
    return name in CROSS_TOKENIZER_LOSSES


def needs_teacher(name: str) -> bool:
    """Whether the loss `name` reads teacher targets (every loss but `sft` and `grpo`)."""
    return name not in TEACHERLESS_LOSSES


def teacher_runs(name: str, seq_kd: bool) -> bool:
    """Whether a run with loss `name` runs its teacher: to score (the loss reads targets) or to
    write seq-KD completions (train.seq_kd)."""
    return needs_teacher(name) or seq_kd


def register(name: str) -> Callable[[LossFn], LossFn]:
    """Decorator: make `fn` available as `get_loss(name)`. A name can be registered once."""

    def add(fn: LossFn) -> LossFn:
        if name in LOSSES and LOSSES[name] is not fn:
            raise ValueError(f"loss {name!r} is already registered (by {LOSSES[name].__module__})")
        LOSSES[name] = fn
        return fn

    return add


def list_losses() -> list[str]:
    """The registered names, sorted."""
    return sorted(LOSSES)


def get_loss(name: str) -> LossFn:
    """The loss registered as `name`; a `ConfigError` listing the valid names otherwise."""
    try:
        return LOSSES[name]
    except KeyError:
        valid = ", ".join(list_losses())
        raise ConfigError(
            f"loss.name={name!r} is not a known loss; choose one of: {valid} "
            "(`distil losses` describes each)"
        ) from None


def describe(name: str) -> str:
    """One line about a loss (the first line of its docstring), for a CLI listing."""
    doc = (get_loss(name).__doc__ or "").strip()
    return doc.splitlines()[0].strip() if doc else ""
