"""Countdown prompt templates: a problem as chat messages, and its reference completion.

`countdown_chat` is the system + user prompt of the public mini-R1/TinyZero Countdown runs;
`countdown_plain` the compact one for small models trained from scratch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from distil.errors import ConfigError
from distil.tasks.countdown.solver import Problem, compact, solution_steps

_SYSTEM = (
    "You are a helpful assistant. You first think about the reasoning process in the mind "
    "and then provide the user with the answer."
)


@dataclass(frozen=True)
class CountdownChat:
    """System + user prompt in the style of the public mini-R1/TinyZero Countdown prompts; the
    reference completion shows the steps in <think> and the equation in <answer>."""

    name: str = "countdown_chat"

    def messages(self, nums: Sequence[int], target: int) -> list[dict[str, str]]:
        user = (
            f"Here are some numbers: {list(nums)}. Write an equation that uses each of them "
            f"exactly once and evaluates to {target}; you may use +, -, * and /. Reason step by "
            "step inside <think> </think> tags, then put only the final equation inside "
            "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
        )
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]

    def completion(self, problem: Problem) -> str:
        steps = ", ".join(solution_steps(problem.solution))
        return f"<think>{steps}</think>\n<answer>{problem.solution}</answer>"


@dataclass(frozen=True)
class CountdownPlain:
    """Compact prompt and answer for small models trained from scratch: few tokens, no prose."""

    name: str = "countdown_plain"

    def messages(self, nums: Sequence[int], target: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"nums: {' '.join(map(str, nums))} target: {target}"}]

    def completion(self, problem: Problem) -> str:
        return f"<answer>{compact(problem.solution)}</answer>"


Template = CountdownChat | CountdownPlain
TEMPLATES: dict[str, Template] = {t.name: t for t in (CountdownChat(), CountdownPlain())}
DEFAULT_TEMPLATE = "countdown_chat"  # a prompt's template when none is named or recorded


def get_template(name: str | Template) -> Template:
    """A template by name (a template object passes through); unknown names list the valid ones."""
    if not isinstance(name, str):
        return name
    if name not in TEMPLATES:
        raise ConfigError(f"unknown Countdown template {name!r}; valid: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


def template_of(rows: Iterable[dict[str, Any]], prompt_field: str = "prompt") -> str | None:
    """The name of the one Countdown template whose messages for each row's `nums` and `target`
    are that row's prompt (`prompt_field`: the messages, or the text of a single user turn):
    rows written by `distil countdown generate` or the demo carry their rendered prompts and
    no template name. None when a row lacks what this needs, or no single template fits all."""
    rows = list(rows)
    fits = set(TEMPLATES) if rows else set()
    for row in rows:
        nums, target, prompt = row.get("nums"), row.get("target"), row.get(prompt_field)
        if not isinstance(nums, list) or not isinstance(target, int) or prompt is None:
            return None
        for name in list(fits):
            messages = TEMPLATES[name].messages(nums, target)
            text = messages[0]["content"] if len(messages) == 1 else None
            if prompt != messages and prompt != text:
                fits.discard(name)
    return fits.pop() if len(fits) == 1 else None
