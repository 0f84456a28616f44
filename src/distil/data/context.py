"""Privileged context: the teacher sees more than the student (`teacher.context`,
`teacher.system`), and both score exactly the same completion.

The teacher's prompt is the student's with the row's fields filled into a template (a reference
solution, a hint) and/or a fixed system text before it (context distillation: a long system
prompt the student learns to do without). Chat prompts keep their messages: the template
rewrites the last user message (`{prompt}` is its text) and the system text becomes a system
message; a plain-text prompt is rewritten as a whole.

Same tokenizer: `ContextCollate` adds the teacher's inputs (its prompt ids + the completion ids)
and, per row, the shift from a student position to the teacher position that predicts the same
completion token; the student's inputs, labels and loss mask are untouched. Across tokenizers
the teacher renders the context prompt with its own template (`CrossTokenizer` reads
`Sample.prompt` for the teacher side only) and the alignment runs on the completion's bytes.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from distil.data.datasets import source_row
from distil.errors import DataError
from distil.models.tokenizers import right_pad
from distil.types import Batch, Example, Messages, Sample


def template_fields(template: str) -> list[str]:
    """The {field} names a context template reads."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def context_prompt(
    example: Example, context: str | None, system: str | None, *, key: str = "teacher.context"
) -> Messages | str:
    """The teacher's prompt for `example`; a field the template (config `key`) names but the
    row lacks is a DataError naming the row's file and line."""
    row = source_row(example)
    prompt = example.prompt
    if isinstance(prompt, str):
        text = _fill(context, row, prompt, example, key) if context else prompt
        return f"{system}\n\n{text}" if system else text
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if context and users:
        last = users[-1]
        messages[last]["content"] = _fill(context, row, messages[last]["content"], example, key)
    if system:
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{system}\n\n{messages[0]['content']}"
        else:
            messages.insert(0, {"role": "system", "content": system})
    return messages


def teacher_prompts(teacher, examples: Sequence[Example]) -> list[Messages | str] | None:
    """Each example's teacher prompt under `teacher.context/system` (a `TeacherConfig`), or
    None without privileged context: what the teacher scores and, with seq-KD, writes after."""
    if not (teacher.context or teacher.system):
        return None
    return [context_prompt(e, teacher.context, teacher.system) for e in examples]


def row_prompts(
    examples: Sequence[Example], contexts: Sequence[tuple[str | None, str | None]]
) -> list[Messages | str | None]:
    """Each example's teacher prompt under its own teacher's (context, system) (several
    routed teachers: each row its teacher's); None where that teacher sees the student's."""
    return [
        context_prompt(e, c, s) if (c or s) else None
        for e, (c, s) in zip(examples, contexts, strict=True)
    ]


def _fill(template: str, row: dict[str, Any], prompt: str, example: Example, key: str) -> str:
    values = {**row, "prompt": prompt}
    missing = [f for f in template_fields(template) if f not in values]
    if missing:
        path, _, line = example.meta.get("_where", "").rpartition(":")
        raise DataError(
            f"{key} reads {', '.join(repr(f) for f in missing)}, which this row does not "
            f"have (its columns: {', '.join(sorted(row)) or 'none'}; {{prompt}} is the "
            f"student's prompt). Fix: add the column, or change {key}",
            path=path or None,
            line=int(line) if line.isdigit() else None,
        )
    return template.format_map(values)


class ContextCollate:
    """A collate function that gives the teacher its privileged prompt: `context_ids[example]`
    (same tokenizer: token ids) or `context_prompts[example]` (across tokenizers: the prompt
    the teacher renders itself). Picklable, for the buffer's worker processes."""

    def __init__(
        self,
        collate_fn: Callable[[Sequence[Sample], int], Batch],
        *,
        context_ids: Sequence[list[int]] | None = None,
        context_prompts: Sequence[Messages | str] | None = None,
    ):
        self.collate_fn = collate_fn
        self.context_ids, self.context_prompts = context_ids, context_prompts

    def __call__(self, samples: Sequence[Sample], pad_id: int) -> Batch:
        if self.context_prompts is not None:  # the teacher side reads Sample.prompt
            return self.collate_fn(
                [replace(s, prompt=self.context_prompts[s.example_id]) for s in samples], pad_id
            )
        batch = self.collate_fn(samples, pad_id)
        assert self.context_ids is not None
        prompts = [self.context_ids[s.example_id] for s in samples]
        return with_context_inputs(batch, prompts, pad_id)


def with_context_inputs(batch: Batch, teacher_prompts: Sequence[list[int]], pad_id: int) -> Batch:
    """`batch` with the teacher's inputs (its prompt + each row's completion, right-padded
    like the student's) and `context_shift_B`: teacher prompt length - student prompt length,
    so teacher position t + shift predicts what student position t predicts."""
    rows, shifts = [], []
    for s, prompt in zip(batch.samples, teacher_prompts, strict=True):
        rows.append(list(prompt) + list(s.completion_ids))
        shifts.append(len(prompt) - len(s.prompt_ids))
    ids, attn = right_pad(rows, pad_id)
    return replace(
        batch,
        context_input_ids_B_L=ids,
        context_attention_mask_B_L=attn,
        context_shift_B=torch.tensor(shifts, dtype=torch.long),
    )


def both_prompts(batch: Batch, row: int, tok, cross=None) -> tuple[str, str]:
    """(the student's prompt, the teacher's privileged one) of `batch` row `row` as each model
    reads it: the teacher's prompt ids (same tokenizer), or its own template's rendering of
    the context prompt the sample carries to the teacher side (`cross`, a CrossTokenizer)."""
    sample = batch.samples[row]
    student = tok.decode(sample.prompt_ids)
    if batch.context_input_ids_B_L is not None and batch.context_shift_B is not None:
        n = len(sample.prompt_ids) + int(batch.context_shift_B[row])
        return student, tok.decode(batch.context_input_ids_B_L[row][:n])
    if cross is not None:
        return student, cross.teacher_prompt_text(sample)
    return student, student


def prompts_side_by_side(batch: Batch, row: int, tok, cross=None):
    """A two-column table of `both_prompts`, for the training example printout."""
    from rich.table import Table

    table = Table(show_lines=True, expand=True)
    table.add_column("the student sees", ratio=1)
    table.add_column("the teacher sees", ratio=1)
    table.add_row(*both_prompts(batch, row, tok, cross))
    return table
