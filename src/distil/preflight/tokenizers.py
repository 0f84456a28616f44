"""Preflight's tokenizer checks: each side's tokenizer loads (a hub id's few files, as the run
loads them), has an EOS token and renders the prompts as data.text_prompts and
data.chat_template_kwargs ask; several teachers' tokenizers agree with the loss."""

from __future__ import annotations

import os
from pathlib import Path

from distil.config import DistilConfig
from distil.errors import DistilError


def side_tokenizers(cfg: DistilConfig, examples, found, notes: list[str]) -> dict:
    """Load the tokenizers (no weights; a hub id's few files, as the run loads them); render a
    prompt as data.text_prompts and data.chat_template_kwargs ask; measure the student's rows;
    note what plain text becomes for each side, template arguments a template ignores, which
    token ends a turn and which stop generation."""
    from distil.data.lengths import check_lengths, completion_warnings, uses_completions
    from distil.losses import teacher_runs
    from distil.models.tokenizers import (
        generation_defaults,
        prompt_format,
        render_prompt,
        stop_token_ids,
        stops_summary,
        unused_template_kwargs,
    )

    sides = [("student", cfg.student)]
    if cfg.teacher.path and teacher_runs(cfg.loss.name, cfg.train.seq_kd):
        sides.append(("teacher", cfg.teacher))
    fmt = prompt_format(cfg.data)
    toks = {}
    for name, section in sides:
        key = f"{name}.tokenizer" if section.tokenizer != section.path else f"{name}.path"
        # a cached teacher's tokenizer is the cache's: its hub id is not fetched
        fetch = not (name == "teacher" and cfg.teacher.cache)
        tok = _side_tokenizer(section, key, found, notes, fetch=fetch)
        if tok is None:
            continue
        toks[name] = tok
        if found.attempt(stop_token_ids, tok) is not None:
            model = generation_defaults(section.path)  # a local directory's; never the hub
            notes.append(f"{name}: {stops_summary(tok, model)}")
        if examples and any(isinstance(e.prompt, str) for e in examples):
            notes.append(f"{name}: plain-text prompts are rendered as {fmt.describe(tok)}")
        if examples:
            notes += found.attempt(completion_warnings, cfg, examples, tok, name) or []
        ignored = found.attempt(unused_template_kwargs, tok, fmt) or []
        if ignored:
            notes.append(
                f"{name}: its chat template does not read data.chat_template_kwargs "
                f"{', '.join(ignored)} (they change nothing in its prompts)"
            )
        rendered = examples and found.attempt(
            render_prompt, tok, examples[0].prompt, name=f"{name} tokenizer", fmt=fmt
        )
        if rendered and name == "student":
            found.attempt(
                check_lengths, examples, tok, cfg.data, completions_used=uses_completions(cfg)
            )
    return toks


def _side_tokenizer(section, key: str, found, notes: list[str], *, fetch: bool):
    """The tokenizer of a `student`/`teacher` section: a local directory's (a broken one is a
    problem), or, with `fetch`, a hub id's from the hub or its local cache (unreachable: a
    note)."""
    from distil.models.load import load_tokenizer

    path = section.tokenizer
    if Path(os.path.expanduser(path)).exists():
        return found.attempt(
            load_tokenizer, path, key=key, trust_remote_code=section.trust_remote_code
        )
    if not fetch:
        return None
    try:
        return load_tokenizer(path, key=key, trust_remote_code=section.trust_remote_code)
    except DistilError as exc:
        notes.append(
            f"{key} = {path!r}: its tokenizer could not be read from the hub or the local hub "
            f"cache, so its prompts were not checked ({str(exc).splitlines()[0][:160]})"
        )
        return None


def several_tokenizers(cfg: DistilConfig, student_tok, found) -> None:
    """Each of several teachers as `teacher` alone is checked: a cache's settings, a url's
    tokenizer and loss, a cross-tokenizer loss's full distribution, and, for a same-tokenizer
    loss, a local teacher tokenizer of the student's vocabulary; a cross-tokenizer mixture
    needs one teacher tokenizer."""
    from distil.losses import is_cross_tokenizer
    from distil.models.load import load_tokenizer, vocab_mismatch

    name, cross = cfg.loss.name, is_cross_tokenizer(cfg.loss.name)
    vocabs = {}
    for teacher, t in cfg.teachers.models.items():
        key = f"teachers.models.{teacher}"
        if t.cache:  # this teacher alone, with its privileged context
            from distil.teacher.cache_sources import one_teacher_config
            from distil.teacher.cached import check_settings

            found.attempt(check_settings, one_teacher_config(cfg, teacher))
        if t.url and not t.tokenizer:
            found.append(
                f"{key}.url = {t.url!r} with {key}.path and .tokenizer null: distil sends the "
                f"server token ids, so it needs the served model's tokenizer. Fix: set "
                f"{key}.tokenizer"
            )
        if t.url and cross and name != "sampled_chunk_reverse_kl":
            found.append(
                f"loss.name = {name!r} with {key}.url: this cross-tokenizer loss reads the "
                "teacher's full distribution, a server returns its top-k. Fix: "
                "loss.name=sampled_chunk_reverse_kl, or a local teacher"
            )
        elif cross and t.top_k is not None and not t.url:
            found.append(
                f"{key}.top_k = {t.top_k} with loss.name = {name!r}: the cross-tokenizer losses "
                f"need the teacher's full distribution. Fix: {key}.top_k=null"
            )
        if not t.tokenizer or t.cache or not Path(os.path.expanduser(t.tokenizer)).exists():
            continue  # a hub id is not fetched; a cache's tokenizers are checked when it opens
        tok = found.attempt(load_tokenizer, t.tokenizer, key=f"{key}.tokenizer")
        if tok is None:
            continue
        vocabs[teacher] = tok.get_vocab()
        mismatch = not cross and student_tok is not None and vocab_mismatch(name, student_tok, tok)
        if mismatch:
            found.append(f"{key}: {mismatch}")
    if (
        cross
        and cfg.teachers.weights is not None
        and len({str(sorted(v.items())) for v in vocabs.values()}) > 1
    ):
        found.append(
            f"teachers.weights mixes {', '.join(vocabs)} with a cross-tokenizer loss, but their "
            "tokenizers differ: a mixture adds distributions over one vocabulary. Fix: mix "
            "teachers of one tokenizer, or route rows (teachers.column)"
        )
