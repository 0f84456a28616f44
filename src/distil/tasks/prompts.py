"""Prompts for training data: `data.template` names how a row becomes a prompt.

A Countdown template (countdown_chat, countdown_plain) re-renders each row's `nums` and
`target` (and the completion from `solution`), so one dataset serves every template. A task
name (gsm8k, math, mmlu, module:Class) gives the task's own zero-shot prompt, so training sees
the prompts the evaluation uses; completions stay the data's `completion_field`.

The data layer reads rows and receives the renderer (`load_examples(render=)`); this module,
above it, knows the tasks. `config_examples` is the one reader that trainer, cache, generate
and validate share, so all of them see the same rows.
"""

from __future__ import annotations

from typing import Any

from distil.config import EvalConfig
from distil.data.datasets import Render, completion_text, load_examples, short
from distil.errors import ConfigError, DataError
from distil.tasks.countdown.solver import Problem
from distil.tasks.countdown.templates import TEMPLATES, get_template
from distil.tasks.registry import TASKS, is_import_path, make_task
from distil.types import Example


def config_examples(data: Any, source: str | None = None, limit: int | None = None):
    """`examples_from` with the data section's settings (split, subset, fields, template), for
    `source` (default: data.train)."""
    return examples_from(
        source or data.train,
        template=data.template,
        split=data.split,
        subset=data.subset,
        prompt_field=data.prompt_field,
        completion_field=data.completion_field,
        limit=limit,
    )


def examples_from(
    source: str,
    *,
    template: str | None = None,
    split: str = "train",
    subset: str | None = None,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    limit: int | None = None,
) -> list[Example]:
    """`load_examples` of `source`, rendered by `template` (a `data.template` value) if given."""
    return load_examples(
        source,
        split=split,
        subset=subset,
        prompt_field=prompt_field,
        completion_field=completion_field,
        render=renderer(template, completion_field) if template else None,
        limit=limit,
    )


def renderer(name: str, completion_field: str) -> Render:
    """render(row, where) -> (prompt, completion) for `data.template = name`."""
    if name in TEMPLATES:
        return countdown_renderer(name)
    if not (name in TASKS or is_import_path(name)):
        raise ConfigError(
            f"data.template = {name!r} is neither a Countdown template ({', '.join(TEMPLATES)}) "
            f"nor a task ({', '.join(TASKS)}, or module:Class). Fix: use one of those, or null "
            "to keep the data's prompt column"
        )
    task = make_task(EvalConfig(task=name, num_fewshot=0))

    def render(row: dict[str, Any], where: dict[str, Any]):
        prompt = task.messages(task.problem(row, where))
        return prompt, completion_text(row.get(completion_field), completion_field, where)

    return render


def countdown_renderer(name: str) -> Render:
    """Prompt and reference completion from a Countdown row's nums, target and solution."""
    template = get_template(name)

    def render(row: dict[str, Any], where: dict[str, Any]):
        nums, target = row.get("nums"), row.get("target")
        # type() is int, not isinstance: JSON true/false would pass as 1/0
        if not (isinstance(nums, list) and nums and all(type(x) is int and x > 0 for x in nums)):
            raise DataError(
                f"'nums' must be a list of positive integers (not booleans), got {short(nums)}",
                **where,
            )
        if type(target) is not int:
            raise DataError(
                f"'target' must be an integer (not a boolean), got {short(target)}", **where
            )
        solution = row.get("solution")
        completion = None
        if isinstance(solution, str) and solution:
            try:
                completion = template.completion(Problem(tuple(nums), target, solution))
            except DataError as exc:  # the solution's own message, with the row's file and line
                raise DataError(f"column 'solution': {exc.message}", **where) from exc
        return template.messages(nums, target), completion

    return render


def corpus_from_data(path: str, *, template: str | None = None, limit: int | None = 20000):
    """Lines to train a tokenizer on: each example's prompt contents and its completion (the
    first `limit` rows)."""
    lines = []
    for ex in examples_from(path, template=template, limit=limit):
        prompt = (
            ex.prompt if isinstance(ex.prompt, str) else " ".join(m["content"] for m in ex.prompt)
        )
        lines.append(prompt if ex.completion is None else f"{prompt} -> {ex.completion}")
    return lines
