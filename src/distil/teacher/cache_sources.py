"""What `distil cache-teacher` scores with: one teacher, several teachers routed per row, or a
mixture of several (docs/teacher-cache.md, "Several teachers").

- One teacher (`teacher.path`, or `--teacher NAME` of `teachers.models`): its top-k.
- Routed (`teachers.models` + `teachers.column`): each row scored by its own teacher
  (`RoutedTeacher`, each teacher once per batch on its rows); every row's teacher is recorded
  (manifest `routes.names`, shard array `route`).
- Mixture (`teachers.models` + `teachers.weights`): every row scored by every teacher, full
  distributions mixed as log M(v) = log sum_i w_i T_i(v) (`MixedTeacher`), then the top-k of M
  and its rest bucket log(1 - sum_topk M) stored: the cache of a teacher whose distribution is M.

Several teachers share the student's tokenizer (as they do in training); a teacher with another
tokenizer gets its own cache with `--teacher NAME`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from distil.config import DistilConfig
from distil.config.contexts import teacher_contexts
from distil.config.schema import TeachersConfig
from distil.errors import ConfigError
from distil.teacher import cache as fmt


@dataclass
class Source:
    """The scorer and what the manifest says about the teacher(s)."""

    scorer: Any  # TeacherScorer: top-k targets, or full ones (a mixture) cut to k by the writer
    teacher_tok: Any
    cross: Any  # CrossTokenizer of a teacher with another tokenizer, else None
    vocab_size: int  # logits kept: the ids a cached top-k can hold
    k: int
    header: dict[str, Any] = field(default_factory=dict)
    routes: list[int] | None = None  # routed caches: each data row's teacher (index into names)


def one_teacher_config(cfg: DistilConfig, name: str) -> DistilConfig:
    """`--teacher NAME`: the config of teachers.models.NAME alone (its cache over every row is
    the cache a config with `teacher` = that section writes), with its privileged context: its
    own context/system, else the shared teacher.context/system (`teacher_context`)."""
    names = list(cfg.teachers.models)
    if name not in names:
        have = ", ".join(names) if names else "none: the config has no teachers.models"
        raise ConfigError(
            f"--teacher {name!r}: no such teacher in teachers.models ({have}). Fix: name one "
            "of them, or drop --teacher to cache teacher.path"
        )
    context, system = teacher_contexts(cfg)[name]
    one = cfg.teachers.models[name].model_copy(update={"context": context, "system": system})
    return cfg.model_copy(update={"teacher": one, "teachers": TeachersConfig()})


def cache_k(cfg: DistilConfig, top_k: int | None) -> int | None:
    """The cache's k: the teachers' top_k (all the same), or `--top-k` where they give none."""
    models = cfg.teachers.models or {"teacher": cfg.teacher}
    ks = {t.top_k for t in models.values()}
    if len(ks) > 1:
        each = ", ".join(f"{n}: {t.top_k}" for n, t in models.items())
        raise ConfigError(
            f"teachers.models have different top_k ({each}): one cache holds one k. Fix: set "
            "the same teachers.models.NAME.top_k for all, or cache each with --teacher NAME"
        )
    (own,) = ks
    if top_k is not None and own is not None and top_k != own:
        raise ConfigError(
            f"--top-k {top_k} but the config's top_k is {own}. Fix: drop --top-k, or set the "
            "config's top_k to it"
        )
    return top_k if top_k is not None else own


def problems(cfg: DistilConfig, k: int | None) -> list[str]:
    out = []
    keys = [("student.path", cfg.student.path), ("data.train", cfg.data.train)]
    if not cfg.teachers.models:
        keys.insert(0, ("teacher.path", cfg.teacher.path))
    for key, value in keys:
        if not value:
            out.append(f"{key} is not set; cache-teacher needs it. Fix: set {key}")
    if k is None:
        where = "teachers.models.NAME.top_k" if cfg.teachers.models else "teacher.top_k"
        out.append(
            f"{where} is not set: the cache stores the teacher's top-k. Fix: set {where} "
            "(e.g. 64), or pass --top-k"
        )
    return out


def open_source(cfg: DistilConfig, tok, examples, k: int, keep_student: int | None) -> Source:
    """Load the teacher(s) of `cfg` and the scorer over the rows of `examples`; `keep_student`:
    the student's output rows (None: unknown)."""
    if cfg.teachers.models:
        return _several(cfg, tok, examples, k, keep_student)
    return _single(cfg, tok, k, keep_student)


def _device(t) -> str:
    return t.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _load(t, key: str, offload: bool = False):
    """(model, tokenizer) of teacher config `t`: on its device, or, `offload` (one of several
    teachers), in host memory in its device's dtype (`Offloaded` moves it in per scoring,
    teacher/offload.py); one teacher alone stays on its device."""
    from distil.models.load import load_model, load_tokenizer, resolve_dtype

    device = _device(t)
    dtype = resolve_dtype(t.dtype, t.path, device) if offload else t.dtype
    t_tok = load_tokenizer(t.tokenizer or t.path, key=key.replace(".path", ".tokenizer"))
    model = load_model(
        t.path,
        key=key,
        dtype=dtype,
        attn_implementation=t.attn_implementation,
        device="cpu" if offload else device,
        trust_remote_code=t.trust_remote_code,
    )
    return model, t_tok


def _offloaded(r, names: list[str], scorers: list) -> list:
    """The scorers, those of `offload` teachers behind `Offloaded`: a device holds one
    offloaded teacher at a time, as in training (train/several.py)."""
    from distil.teacher.offload import Offload, Offloaded

    out = []
    for name, s in zip(names, scorers, strict=True):
        t = r.models[name]
        out.append(Offloaded(s, Offload(s.model, _device(t), name)) if t.offload else s)
    return out


def _describe(t, t_tok, model) -> dict[str, Any]:
    """The teacher in the manifest; `dtype`: the one its weights were loaded in (`auto` is
    resolved: bf16 on CUDA, fp32 on a CPU), which the scores depend on."""
    return {
        "teacher_path": str(t.path),
        "teacher_weights_sha256": fmt.weights_sha256(t.path),
        "teacher_tokenizer_sha256": fmt.tokenizer_sha256(t_tok),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def _live(cfg: DistilConfig, model, top_k: int | None, keep: int | None):
    from distil.teacher.live import LiveTeacher

    return LiveTeacher(
        model,
        temperature=cfg.loss.temperature,
        top_k=top_k,
        vocab_size=keep,
        packing=cfg.train.packing,  # padding-free forwards (data/packing.py), same values
        pack_length=cfg.train.pack_length,
    )


def _single(cfg: DistilConfig, tok, k: int, s_rows: int | None) -> Source:
    t = cfg.teacher
    model, t_tok = _load(t, "teacher.path")
    cross = None
    if t_tok.get_vocab() != tok.get_vocab():  # the teacher's own template and tokens
        from distil.data.crosstok import CrossTokenizer

        cross = CrossTokenizer.for_data(tok, t_tok, cfg.data)
    t_rows = model.get_output_embeddings().weight.shape[0]
    keep = min(t_rows, s_rows) if s_rows and s_rows != t_rows else None
    if cross is not None:  # logits past the teacher's tokenizer are padded embedding rows
        from distil.models.tokenizers import id_rows

        keep = id_rows(t_tok) if t_rows > id_rows(t_tok) else None
    header = _describe(t, t_tok, model)
    if cross is not None:  # keys only cross caches have: same-tokenizer manifests are unchanged
        header["cross_tokenizer"] = True
        header["teacher_template_sha256"] = fmt.template_sha256(t_tok)
    scorer = _live(cfg, model, k, keep)
    return Source(scorer, t_tok, cross, keep or t_rows, k, header)


def _several(cfg: DistilConfig, tok, examples, k: int, s_rows: int | None) -> Source:
    from distil.teacher.several import MixedTeacher, RoutedTeacher, row_teachers

    r = cfg.teachers
    names = list(r.models)
    if len(set(teacher_contexts(cfg).values())) > 1:
        raise ConfigError(
            f"teachers.models ({', '.join(names)}) have their own privileged contexts "
            "(teachers.models.NAME.context/system): one routed cache is trained from as "
            "teacher.cache, with one teacher.context/system. Fix: cache each teacher alone "
            "(--teacher NAME) and train with teachers.models.NAME.cache"
        )
    routes = row_teachers(examples, r, names) if r.column else None  # before any weights load
    loaded, described = [], {}
    for name in names:
        t = r.models[name]
        model, t_tok = _load(t, f"teachers.models.{name}.path", offload=t.offload)
        if t_tok.get_vocab() != tok.get_vocab():
            raise ConfigError(
                f"teachers.models.{name} has another tokenizer than the student's: a cache of "
                "several teachers holds same-tokenizer targets, as training with several "
                f"teachers does. Fix: cache that teacher alone (--teacher {name}), or give it "
                "the student's tokenizer"
            )
        loaded.append((model, t_tok))
        described[name] = {**_describe(t, t_tok, model), "top_k": t.top_k}
    rows = [m.get_output_embeddings().weight.shape[0] for m, _ in loaded]
    vs = s_rows or rows[0]
    keep = min(vs, *rows) if any(n != vs for n in rows) else None
    header = {
        **_describe(r.models[names[0]], loaded[0][1], loaded[0][0]),
        "teacher_path": None,  # several: each is under `teachers`
        "teacher_weights_sha256": None,
        "teachers": described,
    }
    if routes is not None:
        scorers = _offloaded(r, names, [_live(cfg, m, k, keep) for m, _ in loaded])
        scorer = RoutedTeacher(scorers, names, routes)
        counts = {n: routes.count(i) for i, n in enumerate(names)}
        header["routes"] = {"column": r.column, "map": dict(r.map), "names": names, "rows": counts}
    else:  # full distributions, mixed, cut to k by the writer (`topk_targets`)
        scorers = _offloaded(r, names, [_live(cfg, m, None, keep) for m, _ in loaded])
        weights = [float((r.weights or {}).get(n, 0.0)) for n in names]
        scorer = MixedTeacher(scorers, weights)
        header["mixture"] = {"weights": dict(zip(names, weights, strict=True))}
    return Source(scorer, loaded[0][1], None, keep or vs, k, header, routes)


def topk_targets(targets, batch, k: int):
    """(ids, log-probs, rest, token log-prob) at the batch's completion positions, in row
    order: the scorer's top-k, or the top-k of full targets (a mixture) and its rest bucket."""
    from distil.teacher.base import sparse_topk

    m = batch.mask_B_T  # completion positions, row by row: the rows' tokens in order
    if targets.topk_ids_B_T_K is not None:
        return (
            targets.topk_ids_B_T_K[m],
            targets.topk_logprobs_B_T_K[m],
            targets.rest_logprob_B_T[m],
            targets.token_logprobs_B_T[m],
        )
    lp_N_V = targets.logprobs_B_T_V[m].float()
    ids, lps, rest = sparse_topk(lp_N_V, k)
    labels_N = batch.labels_B_T[m]
    return ids, lps, rest, lp_N_V.gather(-1, labels_N[:, None])[:, 0]
