"""Which privileged context each teacher has: `teachers.models.NAME.context/system` where set,
else the `teacher.context/system` every teacher shares (docs/privileged-context.md)."""

from __future__ import annotations

from distil.config.schema import DistilConfig


def teacher_context(cfg: DistilConfig, name: str | None = None) -> tuple[str | None, str | None]:
    """(context, system) of teacher `name` of `teachers.models` (None: `teacher`): its own
    where set, else the `teacher.context` / `teacher.system` every teacher shares."""
    shared = cfg.teacher
    own = cfg.teachers.models[name] if name is not None else shared
    return (
        own.context if own.context is not None else shared.context,
        own.system if own.system is not None else shared.system,
    )


def teacher_contexts(cfg: DistilConfig) -> dict[str | None, tuple[str | None, str | None]]:
    """`teacher_context` of every teacher by name (one teacher: under None)."""
    names = list(cfg.teachers.models) or [None]
    return {n: teacher_context(cfg, n) for n in names}


def has_context(cfg: DistilConfig) -> bool:
    """Whether any teacher sees a privileged prompt."""
    return any(c or s for c, s in teacher_contexts(cfg).values())
