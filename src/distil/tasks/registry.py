"""Tasks by name (lazy import paths), or a user's own task by import path "pkg.module:Class".

get_task("gsm8k")                       # the class
make_task(cfg.eval)                     # an instance built with the eval section
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from distil.errors import ConfigError
from distil.tasks.base import Task

if TYPE_CHECKING:
    from distil.config import EvalConfig

TASKS = {
    "countdown": "distil.tasks.countdown:Countdown",
    "gsm8k": "distil.tasks.gsm8k:GSM8K",
    "math": "distil.tasks.math:Math",
    "mmlu": "distil.tasks.mmlu:MMLU",
}


def is_import_path(name: str) -> bool:
    module, sep, attr = name.partition(":")
    parts = module.split(".")
    return bool(sep) and all(p.isidentifier() for p in parts) and attr.isidentifier()


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a task (checked without importing anything), or None."""
    if name in TASKS or is_import_path(name):
        return None
    return (
        f"eval.task = {name!r} is not a registered task (valid: {', '.join(TASKS)}) nor an import "
        "path such as mypkg.tasks:MyTask. Fix: pick one of those names or give module:Class"
    )


def get_task(name: str) -> type[Task]:
    """The task class registered as `name`, or imported from "module:Class"."""
    if problem := name_problem(name):
        raise ConfigError(problem)
    module_name, _, attr = TASKS.get(name, name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"eval.task = {name!r}: cannot import module {module_name!r} ({exc}). Fix: install "
            "the package or put its directory on PYTHONPATH"
        ) from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"eval.task = {name!r}: module {module_name!r} has no {attr!r}")
    missing = [m for m in ("problem", "messages", "check") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing or not getattr(cls, "outcomes", None):
        raise ConfigError(
            f"eval.task = {name!r} is not a task class: subclass distil.tasks.Task and define "
            "outcomes, problem, messages and check"
            + (f" (missing: {', '.join(missing)})" if missing else "")
        )
    if "correct" not in cls.outcomes:
        raise ConfigError(f"eval.task = {name!r}: its outcomes must include 'correct'")
    return cls


def make_task(cfg: EvalConfig) -> Task:
    """The task of `cfg.task`, built with the eval section (a nameless user task is named by its
    import path)."""
    task = get_task(cfg.task)(cfg)
    if not task.name:
        task.name = cfg.task
    return task
