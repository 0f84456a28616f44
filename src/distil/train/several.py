"""Several teachers (`teachers.models`) built for a run: each one as `teacher` alone would be
(`teacher.select.build_scorer`), behind one RoutedTeacher or MixedTeacher (teacher/several.py).
"""

from __future__ import annotations

from typing import Any

from distil.config import DistilConfig
from distil.errors import ConfigError
from distil.teacher.cache_sources import one_teacher_config
from distil.teacher.select import Rows, build_scorer, loads_teacher_model


def several_teachers(cfg: DistilConfig, load_teacher, model, tok, examples, rows: Rows) -> tuple:
    """`build_scorer` for `teachers.models`: each teacher built as `teacher` alone would be (a
    model, `cache` or `url`; same- or cross-tokenizer), behind one RoutedTeacher or
    MixedTeacher (teacher/several.py). The `cross` returned is a `RoutedCollate` for routed
    cross-tokenizer teachers (each teacher's rows aligned in its own tokens). `load_teacher`
    (a one-teacher config) -> (model, tokenizer) loads a live teacher."""
    from distil.teacher.several import MixedTeacher, RoutedCollate, RoutedTeacher, row_teachers

    names = list(cfg.teachers.models)
    built = []
    for name in names:
        one = one_teacher_config(cfg, name)  # with its privileged context (a cache checks it)
        t_model, t_tok = load_teacher(one) if loads_teacher_model(one) else (None,) * 2
        built.append(build_scorer(one, model, tok, t_model, t_tok, rows=rows))
    scorers, crosses = [b[0] for b in built], [b[2] for b in built]
    keep = _common_keep(model, built)
    if crosses[0] is None and keep is not None:  # one student vocabulary for every target
        for s in scorers:
            if hasattr(s, "vocab_size"):
                s.vocab_size = keep
    if cfg.teachers.weights is not None:
        if crosses[0] is not None:
            _one_teacher_vocabulary(names, crosses)
        teacher = MixedTeacher(scorers, [cfg.teachers.weights.get(n, 0.0) for n in names])
        return teacher, built[0][1], crosses[0], keep
    route_of = row_teachers(examples, cfg.teachers, names)
    teacher = RoutedTeacher(scorers, names, route_of)
    cross = None if crosses[0] is None else RoutedCollate(_shared(crosses), names, route_of)
    return teacher, built[0][1], cross, keep


def _common_keep(model, built) -> int | None:
    """The student logits every teacher's targets fit: the smallest of the teachers' (None:
    all of them)."""
    keeps = [b[3] for b in built if b[3] is not None]
    if not keeps:
        return None
    return min(model.get_output_embeddings().weight.shape[0], *keeps)


def _shared(crosses: list) -> list:
    """The teachers' CrossTokenizers, one object per distinct teacher tokenizer."""
    from distil.teacher.cache import tokenizer_sha256

    seen: dict[str, Any] = {}
    return [seen.setdefault(tokenizer_sha256(c.teacher_tok), c) for c in crosses]


def _one_teacher_vocabulary(names: list[str], crosses: list) -> None:
    """A cross-tokenizer mixture adds distributions over one teacher vocabulary."""
    from distil.teacher.cache import tokenizer_sha256

    shas = [tokenizer_sha256(c.teacher_tok) for c in crosses]
    if len(set(shas)) > 1:
        raise ConfigError(
            f"teachers.weights mixes teachers {', '.join(names)} with a cross-tokenizer loss, "
            "but their tokenizers differ: a mixture adds distributions over one vocabulary. "
            "Fix: mix teachers of one tokenizer, or route rows (teachers.column)"
        )
