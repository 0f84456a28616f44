"""What a chat template writes around an answer, found by rendering probe conversations once
per run: text between the generation prompt and the answer (Qwen3's empty think block with
thinking on: `answer_prefix`, and the warning for data completions that lack it) and the
whitespace it strips from the answer's ends (`answer_strips`, applied to data completions by
tokenizers.completion_rows).
"""

from __future__ import annotations

from typing import Any


def _kwargs(fmt: Any) -> dict:
    """A `tokenizers.PromptFormat`'s template arguments ({} for None); this module is below
    tokenizers (which reads `answer_strips`), so the type is not imported."""
    return dict(fmt.kwargs) if fmt is not None else {}


_ANSWER_MARKER = "distil-answer-marker"


def answer_prefix(tok, fmt: Any = None) -> str:
    """What `tok`'s chat template writes between the generation prompt and the text of a
    final assistant turn (Qwen3 with thinking on: an empty `<think>` block), "" for nothing or
    when the rendering does not tell (no template, a template that refuses the probe)."""
    if not getattr(tok, "chat_template", None):
        return ""
    user = {"role": "user", "content": "distil-probe"}
    try:
        prompt = tok.apply_chat_template(
            [user], tokenize=False, add_generation_prompt=True, **_kwargs(fmt)
        )
        full = tok.apply_chat_template(
            [user, {"role": "assistant", "content": _ANSWER_MARKER}], tokenize=False, **_kwargs(fmt)
        )
    except Exception:  # a template that refuses the probe says nothing about its answers
        return ""
    if not (isinstance(full, str) and full.startswith(prompt) and _ANSWER_MARKER in full):
        return ""
    return full[len(prompt) : full.index(_ANSWER_MARKER)]


def answer_prefix_warning(prefix: str, name: str) -> str:
    """The warning when a template writes `prefix` (`answer_prefix`) before an answer and the
    data's reference completions, trained right after the generation prompt, lack it."""
    return (
        f"{name}: its chat template writes {prefix!r} between the generation prompt and an "
        "answer, and the data's completions are trained right after the generation prompt "
        f"without it: the {name} learns answers in a form its template does not write. Fix: "
        "a data.chat_template_kwargs setting that ends the prompt with it (Qwen3: "
        "{enable_thinking: false}), or begin each completion with it"
    )


_BLANKS = " \n\t"


def answer_strips(tok, fmt: Any = None) -> tuple[str, str]:
    """The whitespace characters `tok`'s chat template strips from the start and from the end
    of an answer's text (Llama 3's and Gemma's `| trim`: all; Qwen3's `lstrip('\\n')` with
    thinking on: newlines at the start), found by rendering probe answers; ("", "") without a
    template or when the rendering does not tell."""
    if not getattr(tok, "chat_template", None):
        return "", ""

    def around(content: str) -> tuple[str, str] | None:
        turn = [
            {"role": "user", "content": "distil-probe"},
            {"role": "assistant", "content": content},
        ]
        try:
            full = tok.apply_chat_template(turn, tokenize=False, **_kwargs(fmt))
        except Exception:  # a template that refuses the probe says nothing about its answers
            return None
        if not isinstance(full, str) or full.count(_ANSWER_MARKER) != 1:
            return None
        before, after = full.split(_ANSWER_MARKER)
        return before, after

    bare = around(_ANSWER_MARKER)
    if bare is None:
        return "", ""
    left = right = ""
    for c in _BLANKS:
        padded = around(c + _ANSWER_MARKER + c)
        if padded is None:
            return "", ""
        left += c if padded[0] == bare[0] else ""
        right += c if padded[1] == bare[1] else ""
    return left, right
