"""The teacher a run scores with: a live model, a cache of its targets, or a server.

`SCORERS` names each TeacherScorer class by its import path, imported on first use (as
`generation.select` does for the generators). `build_scorer` reads the config (`loss.name`,
`teacher.cache`, `teacher.url`) and returns the scorer with what the run needs from the
teacher's side: its tokenizer, the `CrossTokenizer` of a cross-tokenizer loss, and how many
student logits to keep.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from distil.align import matched_vocab
from distil.config import DistilConfig
from distil.data.crosstok import CrossTokenizer
from distil.errors import ConfigError
from distil.losses import is_cross_tokenizer, needs_teacher
from distil.models.load import load_tokenizer
from distil.models.tokenizers import id_rows
from distil.ranks import is_first_rank
from distil.teacher.cache import (
    TEACHER_TOKENIZER,
    CacheError,
    read_manifest,
    row_fingerprints,
    template_sha256,
    tokenizer_sha256,
)
from distil.types import Batch, TeacherTargets

# the teacher scorer, by what the config gives: a model (`teacher.path`), `teacher.cache` or a
# server (`teacher.url`)
SCORERS = {
    "live": "distil.teacher.live:LiveTeacher",
    "cache": "distil.teacher.cached:CachedTeacher",
    "remote": "distil.teacher.remote:RemoteTeacher",
}

# the data in student tokens: (prompt ids, completion ids or None) per example
Rows = tuple[Sequence[list[int]], Sequence[list[int] | None]]


def scorer_class(name: str):
    """The TeacherScorer class registered as `name`, imported on first use."""
    module, attr = SCORERS[name].split(":")
    return getattr(importlib.import_module(module), attr)


class NullTeacher:
    """The `sft` and `grpo` losses need no teacher targets: scoring is free."""

    temperature = 1.0

    def score(self, batch: Batch) -> TeacherTargets:
        return TeacherTargets()


def loads_teacher_model(cfg: DistilConfig) -> bool:
    """Whether the run needs the teacher model itself: to score (unless a cache or a server
    stands in for it) or, with `sft`, to write seq-KD completions (`grpo` reads none)."""
    if not cfg.teacher.path:
        return False
    if not needs_teacher(cfg.loss.name):
        return cfg.train.seq_kd
    return not (cfg.teacher.cache or cfg.teacher.url)


def build_scorer(
    cfg: DistilConfig, student, tok, teacher_model=None, teacher_tok=None, *, rows: Rows
) -> tuple:
    """(TeacherScorer, teacher tokenizer, CrossTokenizer or None, student logits to keep).

    `student`/`tok`: the student model and tokenizer; `teacher_model`/`teacher_tok`: the teacher
    when `loads_teacher_model(cfg)`, else None. `rows`: the data as the buffer tokenizes it,
    which a cache is checked against. The logits to keep are None when every student logit is
    a token of the compared vocabulary.
    """
    if not needs_teacher(cfg.loss.name):  # sft, grpo: the teacher (if any) only writes
        cross = None
        if teacher_tok is not None and teacher_tok.get_vocab() != tok.get_vocab():
            cross = CrossTokenizer.for_data(tok, teacher_tok, cfg.data)
        return NullTeacher(), teacher_tok, cross, None
    if cfg.teacher.url:  # only the teacher's tokenizer is loaded; the server is checked once
        return scorer_class("remote").from_config(cfg, tok, student)
    if cfg.teacher.cache:
        return open_cache(cfg, tok, student, rows)
    if is_cross_tokenizer(cfg.loss.name):
        cross, keep, teacher_keep = cross_tokenizer_setup(
            cfg, tok, teacher_tok, student, teacher_model
        )
        return live_scorer(cfg, teacher_model, None, teacher_keep), teacher_tok, cross, keep
    keep = shared_vocab_size(cfg, tok, teacher_tok, student, teacher_model)
    return live_scorer(cfg, teacher_model, cfg.teacher.top_k, keep), teacher_tok, None, keep


def live_scorer(cfg: DistilConfig, teacher_model, top_k: int | None, vocab_size: int | None):
    """A LiveTeacher for `teacher_model` with the config's temperature and packing."""
    return scorer_class("live")(
        teacher_model,
        follows_student=cfg.teacher.from_student == "current",
        temperature=cfg.loss.temperature,
        top_k=top_k,
        vocab_size=vocab_size,
        packing=cfg.train.packing,
        pack_length=cfg.train.pack_length,
    )


def shared_vocab_size(cfg: DistilConfig, s_tok, t_tok, s_model, t_model) -> int | None:
    """Same-tokenizer losses need one vocabulary; never resize embeddings silently.

    Returns the number of logits to keep when the two models pad their embedding matrices
    differently (same tokenizer, e.g. 151936 vs 152064 rows), else None.
    """
    if s_tok.get_vocab() != t_tok.get_vocab():
        only_s = len(set(s_tok.get_vocab()) - set(t_tok.get_vocab()))
        only_t = len(set(t_tok.get_vocab()) - set(s_tok.get_vocab()))
        raise ConfigError(
            f"loss.name = {cfg.loss.name!r} compares the two models token by token, but the "
            f"teacher's tokenizer differs from the student's ({len(t_tok)} vs {len(s_tok)} "
            f"tokens; {only_s} only in the student's, {only_t} only in the teacher's). distil "
            "never resizes embeddings to hide this. Fix: use a cross-tokenizer loss "
            "(loss.name=uld, gold or aligned_kl), or a teacher with the student's tokenizer"
        )
    vs = s_model.get_output_embeddings().weight.shape[0]
    vt = t_model.get_output_embeddings().weight.shape[0]
    if vs == vt:
        return None
    if id_rows(s_tok) > min(vs, vt):
        raise ConfigError(
            f"the tokenizer's ids go up to {id_rows(s_tok) - 1} but a model has only "
            f"{min(vs, vt)} output rows; the checkpoints do not match it"
        )
    return min(vs, vt)


def cross_tokenizer_setup(cfg: DistilConfig, tok, teacher_tok, model, teacher_model):
    """(CrossTokenizer, student logits to keep, teacher logits to keep) for cross losses.

    Logits beyond each tokenizer's ids (`id_rows`: padded embedding rows) are dropped on both
    sides.
    """
    if cfg.teacher.top_k is not None:
        raise ConfigError(
            f"teacher.top_k = {cfg.teacher.top_k} with loss.name = {cfg.loss.name!r}: the "
            "cross-tokenizer losses need the teacher's full distribution. Fix: set "
            "teacher.top_k=null"
        )
    cross = CrossTokenizer.for_data(tok, teacher_tok, cfg.data)
    if cfg.loss.name == "gold":
        matched_vocab(cross.student_vb, cross.teacher_vb)  # raises when nothing is shared
    vs = model.get_output_embeddings().weight.shape[0]
    vt = teacher_model.get_output_embeddings().weight.shape[0]
    rows_s, rows_t = id_rows(tok), id_rows(teacher_tok)
    keep_s = rows_s if vs > rows_s else None
    keep_t = rows_t if vt > rows_t else None
    return cross, keep_s, keep_t


def cached_cross_setup(cfg: DistilConfig, tok, model):
    """(CrossTokenizer, student logits to keep) for a cross-tokenizer loss from a cache: the
    teacher's tokenizer is the one the cache saved (its hash is checked against the manifest in
    `open_cache`), so `teacher.path` / `teacher.tokenizer` are not read and the hub is never
    asked; a cache written before tokenizers were saved falls back to them."""
    t = cfg.teacher
    saved = Path(t.cache) / TEACHER_TOKENIZER
    named = t.tokenizer or t.path
    if saved.is_dir():
        teacher_tok = load_tokenizer(str(saved), key="teacher.cache")
        if named:
            _note_unread_teacher(cfg, named, teacher_tok)
    elif named:
        teacher_tok = load_tokenizer(named, key="teacher.tokenizer")
    else:
        raise ConfigError(
            f"teacher.cache = {t.cache!r} holds no {TEACHER_TOKENIZER}/ directory (a cache "
            "written by an older distil) and teacher.path is null: the cross-tokenizer losses "
            "need the teacher's tokenizer. Fix: set teacher.tokenizer to it, or rewrite the cache"
        )
    cross = CrossTokenizer.for_data(tok, teacher_tok, cfg.data)
    vs = model.get_output_embeddings().weight.shape[0]
    return cross, (id_rows(tok) if vs > id_rows(tok) else None)


def _note_unread_teacher(cfg: DistilConfig, named: str, teacher_tok) -> None:
    """Say once that the config's teacher tokenizer is not used (and whether a local one
    differs from the cache's); a hub id is never looked up."""
    key = "teacher.tokenizer" if cfg.teacher.tokenizer != cfg.teacher.path else "teacher.path"
    local = Path(os.path.expanduser(named))
    differs = ""
    if local.is_dir():
        try:
            other = load_tokenizer(str(local), key=key)
        except ConfigError:
            other = None
        if other is None or tokenizer_sha256(other) != tokenizer_sha256(teacher_tok):
            differs = " (it is not the tokenizer the cache was written with)"
    if is_first_rank():
        print(
            f"note: {key} = {named!r} is not read{differs}: training from teacher.cache = "
            f"{cfg.teacher.cache!r} uses the teacher tokenizer saved in the cache",
            file=sys.stderr,
        )


def compute_dtype(cfg: DistilConfig) -> torch.dtype:
    """The dtype the student computes in: bf16 under `train.bf16` / `train.bf16_weights`."""
    return torch.bfloat16 if cfg.train.bf16 or cfg.train.bf16_weights else torch.float32


def open_cache(cfg: DistilConfig, tok, model, rows: Rows) -> tuple:
    """`build_scorer` for `teacher.cache`: the CachedTeacher verified against this run, i.e.
    tokenizers (and the teacher's chat template for a cross cache), k, temperature, vocabulary
    and the data `rows` exactly as the buffer tokenizes them; every shard's checksum is checked
    before the first step."""
    from distil.teacher.cached import prompt_format_header

    cross, keep = None, None
    if is_cross_tokenizer(cfg.loss.name):
        cross, keep = cached_cross_setup(cfg, tok, model)
    manifest = read_manifest(cfg.teacher.cache)
    k = cfg.teacher.top_k if cfg.teacher.top_k is not None else manifest.get("k")
    out_rows = model.get_output_embeddings().weight.shape[0]
    cache_vocab = manifest.get("vocab_size")
    if cross is None and isinstance(cache_vocab, int) and out_rows < cache_vocab:
        raise CacheError(
            f"the student has {out_rows} output rows but the teacher cache {cfg.teacher.cache} "
            f"holds ids up to {cache_vocab}; they do not share a vocabulary. Fix: a cache made "
            "for this student (cache-teacher reads the student from the config)"
        )
    expect = {
        "student_tokenizer_sha256": tokenizer_sha256(tok),
        "k": k,
        "temperature": cfg.loss.temperature,
        "template": cfg.data.template,
        "cross_tokenizer": True if cross is not None else None,
        # how the teacher's prompts were rendered (privileged context: checked per row, cached.py)
        "prompt_format": prompt_format_header(cfg),
    }
    if cross is not None:
        expect["teacher_tokenizer_sha256"] = tokenizer_sha256(cross.teacher_tok)
        expect["teacher_template_sha256"] = template_sha256(cross.teacher_tok)
    teacher = scorer_class("cache").open(
        cfg.teacher.cache,
        expect=expect,
        row_fingerprints=row_fingerprints(*rows),
        dense_dtype=compute_dtype(cfg),
    )
    if cross is not None:
        return teacher, cross.teacher_tok, cross, keep
    return teacher, None, None, (cache_vocab if out_rows != cache_vocab else None)
