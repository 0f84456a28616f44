"""`distil inspect pair --config CONFIG`: the tokenizer pair a config trains with, and the first
data rows' two prompts side by side, what the student sees and what its teacher sees (with
privileged context, `teacher.context` / `teacher.system` or a routed teacher's own, the
teacher's prompt carries it; docs/privileged-context.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from distil.config import DistilConfig
from distil.errors import ConfigError


@dataclass
class PromptPair:
    """One data row as both models read it: the student's prompt (its template, cut to
    data.max_prompt_tokens as training cuts it) and its teacher's (the teacher's template)."""

    row: int
    teacher: str | None  # the row's teacher of `teachers.models` (None: `teacher`)
    student: str
    teacher_prompt: str
    privileged: bool  # the teacher's prompt carries context the student does not see


def teacher_tokenizer_path(cfg: DistilConfig, name: str | None = None) -> str | None:
    """The tokenizer teacher `name` (None: `teacher`) reads with: its tokenizer or path, the one
    saved in its cache, or the student's (self-distillation, a same-tokenizer cache)."""
    from distil.teacher.cache import TEACHER_TOKENIZER

    t = cfg.teachers.models[name] if name is not None else cfg.teacher
    if t.tokenizer or t.path:
        return t.tokenizer or t.path
    if t.cache and (Path(t.cache) / TEACHER_TOKENIZER).is_dir():
        return str(Path(t.cache) / TEACHER_TOKENIZER)
    return cfg.student.tokenizer


def pair_tokenizers(cfg: DistilConfig) -> tuple[str | None, str | None]:
    """(student, teacher) tokenizer paths of a config: the teacher's is `teacher`'s, or the
    first of `teachers.models`."""
    first = next(iter(cfg.teachers.models), None)
    return cfg.student.tokenizer, teacher_tokenizer_path(cfg, first)


def inspect_config(args):
    """`inspect pair --config`: the config, with --student/--teacher defaulting to its
    tokenizers; without --config both are required."""
    from distil.config import load_config

    args.teacher_given = args.teacher is not None
    cfg = load_config(args.config, args.overrides) if args.config else None
    if cfg is not None:
        student, teacher = pair_tokenizers(cfg)
        args.student, args.teacher = args.student or student, args.teacher or teacher
    if (args.overrides and cfg is None) or not (args.student and args.teacher) or args.rows < 1:
        raise ConfigError(
            "inspect pair needs --student and --teacher, or --config CONFIG [overrides] with "
            f"student.path (and --rows >= 1, got {args.rows}). Fix: name both tokenizers, or "
            "a training config (its tokenizers and prompts)"
        )
    if cfg is not None and not cfg.data.train:
        raise ConfigError("inspect pair --config: data.train is not set. Fix: set data.train")
    return cfg


def prompt_pairs(cfg: DistilConfig, n: int, s_tok, teacher_tok=None) -> list[PromptPair]:
    """The first `n` training rows' prompts as `PromptPair`s. `teacher_tok` (None: each row's
    teacher's own, `teacher_tokenizer_path`) renders the teacher's prompt."""
    from distil.config.contexts import teacher_context
    from distil.data.context import context_prompt
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import encode_prompts, render_prompt
    from distil.tasks.prompts import config_examples
    from distil.teacher.several import row_contexts, row_teachers

    examples = config_examples(cfg.data, limit=n)
    names = list(cfg.teachers.models)
    routed = bool(names and cfg.teachers.column)
    routes = row_teachers(examples, cfg.teachers, names) if routed else [0] * len(examples)
    contexts = row_contexts(cfg, examples) or [teacher_context(cfg)] * len(examples)
    toks: dict[str | None, object] = {}
    ids = encode_prompts(s_tok, [e.prompt for e in examples], max_tokens=cfg.data.max_prompt_tokens)
    out = []
    for i, (e, (context, system)) in enumerate(zip(examples, contexts, strict=True)):
        name = names[routes[i]] if routed else None
        if teacher_tok is None and name not in toks:
            path = teacher_tokenizer_path(cfg, name)
            toks[name] = load_tokenizer(path, key="teacher.tokenizer") if path else s_tok
        t_tok = teacher_tok or toks[name]
        privileged = bool(context or system)
        prompt = context_prompt(e, context, system) if privileged else e.prompt
        text = render_prompt(t_tok, prompt, name="teacher tokenizer")
        out.append(PromptPair(i, name, s_tok.decode(ids[i]), text, privileged))
    return out


def prompts_table(pairs: list[PromptPair]):
    """A rich table: one line per row, the student's prompt beside its teacher's."""
    from rich.table import Table
    from rich.text import Text  # prompt text is shown as is, never read as markup

    table = Table(show_lines=True, expand=True)
    table.add_column("row", no_wrap=True)
    table.add_column("the student sees", ratio=1)
    table.add_column("the teacher sees", ratio=1)
    for p in pairs:
        who = f"{p.row}" + (f"\nteacher {p.teacher}" if p.teacher else "")
        seen = p.teacher_prompt if p.privileged else f"(the student's prompt)\n{p.teacher_prompt}"
        table.add_row(who, Text(p.student), Text(seen))
    return table
