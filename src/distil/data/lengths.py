"""Rows longer than the configured token limits: an error naming the row, or a counted warning.

`distil train` cuts prompts to `data.max_prompt_tokens` (keeping their end) and reference
completions to `data.max_completion_tokens`. A row far over a limit usually means a wrong
template, field or tokenizer, so by default (`data.overlong=error`) the run stops before the
first step, naming the file:line, the row's length and the limit; `data.overlong=truncate`
cuts such rows and prints how many were cut. `completion_warnings`: empty reference answers,
and completions that lack what the chat template writes before an answer.

Only rows that can be over a limit are tokenized twice: a token covers at least one byte of
text for the tokenizers distil trains and for byte-level/char/WordPiece/byte-fallback ones, so
a text of fewer bytes than the limit (plus a margin) cannot exceed it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distil.errors import DataError
from distil.models.answers import answer_prefix, answer_prefix_warning
from distil.models.tokenizers import (
    PLAIN,
    PromptFormat,
    prompt_format,
    render_prompt,
    rendered_ids,
)
from distil.types import Example

MARGIN = 64  # bytes of slack for template markers whose size varies between rows


def _contents_bytes(prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8"))
    return sum(len(m["content"].encode("utf-8")) for m in prompt)


def over_limit(
    examples: Sequence[Example], tok, limit: int, *, prompts: bool, fmt: PromptFormat = PLAIN
) -> list[tuple]:
    """[(example, tokens)] for the examples whose prompt (or completion) exceeds `limit`."""
    if prompts:
        first = examples[0].prompt
        rendered = render_prompt(tok, first, fmt=fmt)
        slack = len(rendered.encode("utf-8")) - _contents_bytes(first)
        candidates = [e for e in examples if _contents_bytes(e.prompt) + slack + MARGIN > limit]
        texts = [render_prompt(tok, e.prompt, fmt=fmt) for e in candidates]
    else:
        candidates = [
            e
            for e in examples
            if e.completion is not None and len(e.completion.encode("utf-8")) + MARGIN > limit
        ]
        texts = [e.completion for e in candidates]
    if not candidates:
        return []
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    if prompts:  # as training reads them: verbatim text after the tokenizer's start ids
        ids = [rendered_ids(tok, t, fmt.chat(tok, e.prompt), row)
               for e, t, row in zip(candidates, texts, ids, strict=True)]  # fmt: skip
    return [(e, len(row)) for e, row in zip(candidates, ids, strict=True) if len(row) > limit]


def check_lengths(examples: Sequence[Example], tok, data, *, completions_used: bool) -> None:
    """Apply `data.overlong` (error | truncate) to prompts and, when the run trains on them,
    reference completions. `data` is the config's data section."""
    if not examples:
        return
    checks = [("prompt", "data.max_prompt_tokens", data.max_prompt_tokens, True)]
    if completions_used:
        checks.append(
            ("completion", "data.max_completion_tokens", data.max_completion_tokens, False)
        )
    for what, key, limit, prompts in checks:
        over = over_limit(examples, tok, limit, prompts=prompts, fmt=prompt_format(data))
        if not over:
            continue
        example, tokens = max(over, key=lambda pair: pair[1])
        where = example.meta.get("_where") or f"row {example.id + 1} of {data.train}"
        summary = (
            f"{len(over)} of {len(examples)} {what}s are longer than {key} = {limit} tokens "
            f"(the longest, {where}, has {tokens})"
        )
        if data.overlong == "error":
            raise DataError(
                f"{summary}; they would be cut silently. Fix: raise {key} to at least {tokens}, "
                "check data.template / data.prompt_field / the tokenizer, or set "
                f"data.overlong=truncate to cut them ({'keeping their end' if prompts else 'keeping their start'})"
            )
        print(
            f"distil: warning: {summary}; cut to {limit} (data.overlong=truncate)", file=sys.stderr
        )


def uses_completions(cfg) -> bool:
    """Whether a run trains on the dataset's reference completions (off-policy slices that
    are not teacher-written)."""
    return cfg.train.lambda_ < 1.0 and not cfg.train.seq_kd


def completion_warnings(cfg, examples, tok, name: str = "student") -> list[str]:
    """What to warn of when the run trains on the data's reference completions: rows whose
    answer is empty (a target of the turn's end alone teaches `name` to stop at once; a
    teacher's written file can hold a few, so they are counted, not refused), and, after chat
    prompts, text `tok`'s template writes before an answer that they lack (Qwen3's empty think
    block with thinking on: `answer_prefix_warning`)."""
    if not uses_completions(cfg):
        return []
    out = []
    empty = [e for e in examples if e.completion is not None and not e.completion.strip()]
    if empty and name == "student":
        where = empty[0].meta.get("_where") or f"row {empty[0].id + 1}"
        out.append(
            f"{len(empty)} of {len(examples)} rows have an empty answer (the first: {where}): "
            "trained on, each teaches the student to stop at once. Fix: drop them, or give "
            "them their answer (for a teacher's written file: its generation settings)"
        )
    fmt = prompt_format(cfg.data)
    chat = [e.completion for e in examples[:64] if e.completion and fmt.chat(tok, e.prompt)]
    prefix = answer_prefix(tok, fmt) if chat else ""
    if prefix.strip() and any(not c.startswith(prefix) for c in chat):
        out.append(answer_prefix_warning(prefix, name))
    return out
