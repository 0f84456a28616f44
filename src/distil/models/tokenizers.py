"""Prompt rendering and token ids: each model's own chat template, stop tokens, padding.

A prompt is either chat messages (rendered with the tokenizer's chat template, so a teacher and
a student from different families each see their own markers) or plain text. Plain text goes
through the chat template as one user turn or stays verbatim, as `PromptFormat.text` says
(`data.text_prompts`); `PromptFormat.kwargs` (`data.chat_template_kwargs`, e.g. Qwen3's
`enable_thinking`) reach every template call.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from distil.errors import ConfigError, DataError
from distil.types import Messages

TEXT_PROMPTS = ("auto", "chat", "verbatim")


@dataclass(frozen=True)
class PromptFormat:
    """How prompts become text for one model: plain text as one user turn of its chat template
    (`chat`), verbatim (`verbatim`), or the first where the tokenizer has a template (`auto`);
    `kwargs` go to every `apply_chat_template` call."""

    text: Literal["auto", "chat", "verbatim"] = "auto"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def chat(self, tok, prompt: Messages | str) -> bool:
        """Whether `prompt` reaches `tok`'s model through its chat template."""
        if not isinstance(prompt, str):
            return True
        if self.text == "auto":
            return bool(getattr(tok, "chat_template", None))
        return self.text == "chat"

    def describe(self, tok) -> str:
        """What a plain-text prompt becomes for `tok`, in a few words (config validate)."""
        how = "one user turn of its chat template" if self.chat(tok, "") else "verbatim"
        if self.text == "auto":
            why = "it has a chat template" if self.chat(tok, "") else "it has no chat template"
            return f"{how} (data.text_prompts=auto: {why})"
        return f"{how} (data.text_prompts={self.text})"


PLAIN = PromptFormat()  # the default: data.text_prompts=auto, no template arguments


def prompt_format(data) -> PromptFormat:
    """The `PromptFormat` of a config's data section (None: the default)."""
    if data is None:
        return PLAIN
    return PromptFormat(data.text_prompts, dict(data.chat_template_kwargs))


def render_prompt(
    tok, prompt: Messages | str, *, name: str = "tokenizer", fmt: PromptFormat = PLAIN
) -> str:
    """The text a model sees before its completion (generation prompt included); verbatim text
    gets its tokenizer's start tokens as ids (`rendered_ids`)."""
    if not fmt.chat(tok, prompt):
        return prompt  # plain text, verbatim
    if not getattr(tok, "chat_template", None):
        what = "chat-message prompts" if not isinstance(prompt, str) else "plain-text prompts"
        fix = (
            "use plain-text prompts"
            if not isinstance(prompt, str)
            else "set data.text_prompts=verbatim (or auto) to feed the text as it is"
        )
        raise ConfigError(
            f"the {name} has no chat template, so {what} cannot be rendered as a chat "
            f"(data.text_prompts={fmt.text}). Fix: set tokenizer.chat_template and save it, "
            f"or {fix}"
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return apply_template(tok, messages, fmt.kwargs, name=name)


_START_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start_ids(tok) -> list[int]:
    """The ids `tok`'s own encoding (with its special tokens) puts before a text: its BOS where
    it adds one (Gemma's <bos>), [] where it adds none (Qwen, GPT-2). A chat template writes
    its BOS itself; verbatim text gets these (`rendered_ids`)."""
    with contextlib.suppress(KeyError, TypeError):
        return _START_IDS[tok]
    try:
        plain = tok("a", add_special_tokens=False)["input_ids"]
        full = tok("a", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot encode with its specials adds none
        plain, full = [], []
    k = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
    start = [int(i) for i in full[:k]] if plain else []
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _START_IDS[tok] = start
    return start


def rendered_ids(tok, text: str, chat: bool, ids: list[int] | None = None) -> list[int]:
    """A rendered prompt's ids: the chat template's text as it is (its BOS written in it), or
    verbatim text after `start_ids` (never twice). `ids`: the text's ids, already computed."""
    ids = tok(text, add_special_tokens=False)["input_ids"] if ids is None else ids
    start = [] if chat else start_ids(tok)
    return ids if not start or ids[: len(start)] == start else [*start, *ids]


def keep_end(tok, ids: list[int], max_tokens: int) -> list[int]:
    """A prompt's ids cut to its last `max_tokens` (the end matters most), its start ids
    (`start_ids`: the BOS a model expects first) kept when it began with them."""
    if len(ids) <= max_tokens:
        return ids
    start = start_ids(tok)
    if start and ids[: len(start)] == start and max_tokens > len(start):
        return [*start, *ids[len(ids) - (max_tokens - len(start)) :]]
    return ids[-max_tokens:]


def apply_template(tok, messages: Messages, kwargs: dict[str, Any], *, name: str) -> str:
    """`tok.apply_chat_template` with the generation prompt and `kwargs`. A template that
    refuses `kwargs` (raises with them, renders without) is a ConfigError naming
    data.chat_template_kwargs; one that refuses the conversation itself (Gemma's: turns that do
    not alternate) a DataError naming its roles (EncodedPrompts adds the row)."""
    try:
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )
    except Exception as exc:  # jinja2's TemplateError and whatever a template raises itself
        if not kwargs or not _renders(tok, messages):
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise DataError(
                f"the {name}'s chat template refused a conversation (roles: {roles}): "
                f"{' '.join(str(exc).split())[:200]}. Fix: change the row to a conversation "
                "this template accepts, or drop it"
            ) from exc
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ConfigError(
            f"the {name}'s chat template refused data.chat_template_kwargs ({shown}): "
            f"{' '.join(str(exc).split())[:200]}. Fix: remove the keys this template does not "
            "take (each side's template gets the same ones)"
        ) from exc


def _renders(tok, messages: Messages) -> bool:
    """Whether `tok`'s template renders `messages` without template arguments."""
    try:
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return True


def unused_template_kwargs(tok, fmt: PromptFormat) -> list[str]:
    """The keys of `fmt.kwargs` that change nothing in `tok`'s rendering of a one-turn chat
    (its template does not read them); [] without a template or kwargs."""
    if not fmt.kwargs or not getattr(tok, "chat_template", None):
        return []
    turn = [{"role": "user", "content": "distil-probe"}]
    base = apply_template(tok, turn, {}, name="tokenizer")
    return [
        k
        for k, v in fmt.kwargs.items()
        if apply_template(tok, turn, {k: v}, name="tokenizer") == base
    ]


def encode_prompts(
    tok,
    prompts: Sequence[Messages | str],
    *,
    max_tokens: int | None = None,
    name: str = "tokenizer",
    fmt: PromptFormat = PLAIN,
) -> list[list[int]]:
    """Render and tokenize prompts; keep the last `max_tokens` tokens (the end matters most)."""
    texts = [render_prompt(tok, p, name=name, fmt=fmt) for p in prompts]
    ids = [
        rendered_ids(tok, text, fmt.chat(tok, p), row)
        for p, text, row in zip(
            prompts, texts, tok(texts, add_special_tokens=False)["input_ids"], strict=True
        )
    ]
    if max_tokens is not None:
        ids = [keep_end(tok, row, max_tokens) for row in ids]
    return ids


class EncodedPrompts(Sequence[list[int]]):
    """`encode_prompts(tok, prompts, ...)` computed one prompt at a time, the first time its
    index is read, and kept: a run that reads 35k of 196k prompts renders and tokenizes 35k.
    The ids are those `encode_prompts` gives. What would fail at setup still fails here: the
    first prompt of each shape (plain text, or a conversation's sequence of roles: what a
    template accepts or refuses) is encoded now, so chat prompts without a chat template and
    conversations the template refuses raise before any step, naming the row (`where`: each
    prompt's "file:line"). `len()` encodes nothing; a slice is a list of the ids it covers."""

    def __init__(
        self,
        tok,
        prompts: Sequence[Messages | str],
        *,
        max_tokens: int | None = None,
        name: str = "tokenizer",
        fmt: PromptFormat = PLAIN,
        where: Sequence[str | None] | None = None,
    ):
        self.tok, self.prompts, self.max_tokens, self.name = tok, prompts, max_tokens, name
        self.fmt, self.where = fmt, where
        self._ids: list[list[int] | None] = [None] * len(prompts)
        first: dict[Any, int] = {}
        for i, p in enumerate(prompts):
            first.setdefault("text" if isinstance(p, str) else tuple(m["role"] for m in p), i)
        for i in first.values():
            self[i]

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        ids = self._ids[index]  # IndexError / negative indices as a list's
        if ids is None:
            try:
                text = render_prompt(self.tok, self.prompts[index], name=self.name, fmt=self.fmt)
            except DataError as exc:
                where = self.where[index] if self.where is not None else None
                if exc.path is not None or not where:
                    raise
                path, _, line = where.rpartition(":")
                if not (path and line.isdigit()):
                    path, line = where, ""
                raise DataError(exc.message, path=path, line=int(line) if line else None) from exc
            ids = rendered_ids(self.tok, text, self.fmt.chat(self.tok, self.prompts[index]))
            if self.max_tokens is not None:
                ids = keep_end(self.tok, ids, self.max_tokens)
            self._ids[index] = ids
        return ids

    def encoded(self) -> int:
        """How many prompts have been encoded so far."""
        return sum(ids is not None for ids in self._ids)


def reference_ids(tok, text: str | None, max_tokens: int, eos: int) -> list[int] | None:
    """A dataset completion as token ids: its first `max_tokens` tokens, or all of them plus
    `eos` when they fit; None when the example has no completion."""
    if text is None:
        return None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[:max_tokens] if len(ids) >= max_tokens else [*ids, eos]


_TURN_MARKER = "distil-turn-marker"


def turn_end_id(tok) -> int | None:
    """The special token the chat template writes right after an assistant turn (Llama 3's
    <|eot_id|>, ChatML's <|im_end|>), found by rendering a one-turn conversation; None without a
    chat template or when the turn ends with no special token."""
    if not getattr(tok, "chat_template", None):
        return None
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _TURN_MARKER}]
    try:
        text = tok.apply_chat_template(turn, tokenize=False)
    except Exception:  # a template that refuses this conversation says nothing about its end
        return None
    if not isinstance(text, str) or _TURN_MARKER not in text:
        return None
    after = text.split(_TURN_MARKER, 1)[1]
    specials = set(tok.all_special_ids) | {
        i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if t.special
    }
    ids = tok(after, add_special_tokens=False)["input_ids"] if after else []
    return next((int(i) for i in ids if i in specials), None)


def id_rows(tok) -> int:
    """The rows of a logits or embedding table that the tokenizer's ids index: its largest id
    (vocabulary, added and special tokens) + 1. `len(tok)` counts tokens, which is fewer when
    the ids have gaps (a WordLevel vocabulary of 4 tokens with `<eos>` at id 10 has len 4 and
    11 rows): a limit of len(tok) would mask its EOS. Ids in a gap are rows of the model that
    decode to no text; they are not masked (a limit is one slice of the logits)."""
    ids = list(tok.get_vocab().values())
    ids += [int(i) for i in getattr(tok, "added_tokens_decoder", None) or {}]
    ids += [int(i) for i in getattr(tok, "all_special_ids", None) or [] if i is not None]
    return max(ids, default=-1) + 1


def completion_rows(
    tok, examples, max_tokens: int, fmt: PromptFormat = PLAIN
) -> list[list[int] | None]:
    """Each example's dataset completion as ids (`reference_ids`), ended as its prompt asks:
    the template's turn terminator after a chat-rendered prompt, EOS after verbatim text.
    After a chat prompt the text is first stripped of the whitespace the template strips from
    an answer (`answer_strips`: Llama 3's and Gemma's `trim`), as the model saw its answers."""
    from distil.models.answers import answer_strips

    ends = {chat: completion_end_id(tok, chat) for chat in (False, True)}
    left, right = answer_strips(tok, fmt)

    def text(e):
        if e.completion is None or not fmt.chat(tok, e.prompt):
            return e.completion
        return e.completion.lstrip(left).rstrip(right) if left or right else e.completion

    return [
        reference_ids(tok, text(e), max_tokens, ends[fmt.chat(tok, e.prompt)]) for e in examples
    ]


def stop_token_ids(tok, model=None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS, the model's generation EOS ids and
    the chat template's assistant-turn terminator (`turn_end_id`), in that order."""
    ids: list[int] = []
    candidates: list[object] = [tok.eos_token_id]
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        candidates.append(gen_cfg.eos_token_id)
    candidates.append(turn_end_id(tok))
    for c in candidates:
        for i in c if isinstance(c, (list, tuple)) else [c]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ConfigError("the tokenizer defines no EOS token; set tokenizer.eos_token")
    return ids


def completion_end_id(tok, chat: bool) -> int:
    """The token a finished completion ends with: the chat template's turn terminator when the
    prompts are rendered as a chat (Llama 3 closes a turn with <|eot_id|>, not its EOS
    <|end_of_text|>), else the tokenizer's EOS."""
    end = turn_end_id(tok) if chat else None
    return end if end is not None else stop_token_ids(tok)[0]


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into (ids_B_L, attention_mask_B_L)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into (ids_B_P, attention_mask_B_P)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def stops_summary(tok, model=None) -> str:
    """One line: which token ends an assistant turn and which tokens stop generation."""

    def name(i: int) -> str:
        return f"{tok.convert_ids_to_tokens(i)} ({i})"

    end = turn_end_id(tok)
    turn = name(end) if end is not None else "no chat template turn terminator found"
    stops = ", ".join(name(i) for i in stop_token_ids(tok, model))
    return f"a turn ends with {turn}; generation stops at {stops}"


def generation_defaults(path: str):
    """An object with the `generation_config` saved in a local model directory (None when it
    has none, or `path` is not a local directory: the hub is never asked), so `stop_token_ids`
    sees the model's own EOS ids without loading weights."""
    import os
    from types import SimpleNamespace

    from transformers import GenerationConfig

    if not path or not os.path.isdir(os.path.expanduser(path)):
        return None
    try:
        return SimpleNamespace(
            generation_config=GenerationConfig.from_pretrained(os.path.expanduser(path))
        )
    except (OSError, ValueError):
        return None
