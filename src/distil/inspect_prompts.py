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
    """The tokenizer teacher `name` (None: `teacher`) reads with: the one saved in its cache
    (training reads that one), its tokenizer or path, or the student's (self-distillation, a
    same-tokenizer cache)."""
    from distil.teacher.cache import TEACHER_TOKENIZER

    t = cfg.teachers.models[name] if name is not None else cfg.teacher
    if t.cache and (Path(t.cache) / TEACHER_TOKENIZER).is_dir():
        return str(Path(t.cache) / TEACHER_TOKENIZER)
    if t.tokenizer or t.path:
        return t.tokenizer or t.path
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
    from distil.models.tokenizers import (
        encode_prompts,
        prompt_format,
        render_prompt,
        rendered_ids,
        start_ids,
    )
    from distil.tasks.prompts import config_examples
    from distil.teacher.several import row_contexts, row_teachers

    examples = config_examples(cfg.data, limit=n)
    names = list(cfg.teachers.models)
    routed = bool(names and cfg.teachers.column)
    routes = row_teachers(examples, cfg.teachers, names) if routed else [0] * len(examples)
    contexts = row_contexts(cfg, examples) or [teacher_context(cfg)] * len(examples)
    toks: dict[str | None, object] = {}
    fmt = prompt_format(cfg.data)
    prompts = [e.prompt for e in examples]
    ids = encode_prompts(s_tok, prompts, max_tokens=cfg.data.max_prompt_tokens, fmt=fmt)
    out = []
    for i, (e, (context, system)) in enumerate(zip(examples, contexts, strict=True)):
        name = names[routes[i]] if routed else None
        if teacher_tok is None and name not in toks:
            path = teacher_tokenizer_path(cfg, name)
            toks[name] = load_tokenizer(path, key="teacher.tokenizer") if path else s_tok
        t_tok = teacher_tok or toks[name]
        privileged = bool(context or system)
        prompt = context_prompt(e, context, system) if privileged else e.prompt
        text = render_prompt(t_tok, prompt, name="teacher tokenizer", fmt=fmt)
        if not fmt.chat(t_tok, prompt):  # verbatim: after its start ids, as training reads it
            t_ids = t_tok(text, add_special_tokens=False)["input_ids"]
            added = len(rendered_ids(t_tok, text, False, t_ids)) - len(t_ids)
            text = t_tok.decode(start_ids(t_tok)[:added]) + text
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


def first_row(cfg: DistilConfig, toks: dict, examples) -> str | None:
    """`distil config validate`'s view of the first training row: the student's prompt and its
    teacher's, rendered and cut as training renders and cuts them, and what the completion is
    (the data's first tokens, or who writes it). None without the student's tokenizer or local
    rows. `toks`: the tokenizers preflight loaded ("student", "teacher")."""
    s_tok = toks.get("student")
    if s_tok is None or not examples:
        return None
    e = examples[0]
    teacher = _has_teacher(cfg)
    t_tok = _teacher_tok(cfg, toks) if teacher else s_tok
    pair = prompt_pairs(cfg, 1, s_tok, t_tok or s_tok)[0]
    n = len(s_tok(pair.student, add_special_tokens=False)["input_ids"])
    lines = [
        f"first row ({e.meta.get('_where', 'row 1')}), as the models will read it:",
        f"  student prompt ({n} tokens):",
        _indent(pair.student),
    ]
    if teacher and t_tok is None:
        lines.append("  teacher prompt: not shown (its tokenizer was not read)")
    elif teacher and pair.teacher_prompt == pair.student:
        lines.append("  teacher prompt: the same text as the student's")
    elif teacher:
        who = f" (teacher {pair.teacher})" if pair.teacher else ""
        lines += [f"  teacher prompt{who}:", _indent(pair.teacher_prompt)]
    lines.append(_completion_line(s_tok, e, cfg))
    return "\n".join(lines)


def _has_teacher(cfg: DistilConfig) -> bool:
    from distil.losses import teacher_runs

    return teacher_runs(cfg.loss.name, cfg.train.seq_kd)


def _teacher_tok(cfg: DistilConfig, toks: dict):
    """The teacher's tokenizer if it can be had without the hub: the one preflight loaded, the
    student's (same tokenizer), a local directory's (a cache's own); None otherwise. Several
    teachers: None, each row's own is loaded by `prompt_pairs`."""
    if cfg.teachers.models:
        return None
    if "teacher" in toks:
        return toks["teacher"]
    path = teacher_tokenizer_path(cfg)
    if path in (None, cfg.student.tokenizer):
        return toks["student"]
    if Path(path).is_dir():
        from distil.models.load import load_tokenizer

        return load_tokenizer(path, key="teacher.cache")
    return None


def _completion_line(tok, example, cfg: DistilConfig, shown: int = 16) -> str:
    """What the first row's completion is: the data's (its first tokens) or who writes it."""
    from distil.models.tokenizers import completion_rows, prompt_format

    t = cfg.train
    if t.lambda_ >= 1.0:
        return "  completion: written by the student (on-policy, lambda=1)"
    if t.seq_kd:
        share = f"the student (on-policy share lambda={t.lambda_}) or " if t.lambda_ > 0 else ""
        return f"  completion: written by {share}the teacher (train.seq_kd)"
    if example.completion is None:
        return "  completion: none in this row (off-policy slices need one)"
    (ids,) = completion_rows(
        tok, [example], cfg.data.max_completion_tokens, prompt_format(cfg.data)
    )
    head = tok.decode(ids[:shown])
    return (
        f"  completion, from the data (first {min(shown, len(ids))} of {len(ids)} tokens): {head!r}"
    )


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines() or [""])
