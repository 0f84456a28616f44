"""`distil plan`: before a run, what each phase of a training step holds on each device, whether
it fits, which change makes it fit, and how long a step takes at a device's peak.

    from distil.plan import make_target, plan_config
    plan = plan_config(cfg, make_target("h100", gpus=1))
    print(render(plan))        # or as_dict(plan) for JSON; headline(plan) for one line

    distil.plan("configs/x.yaml", {"train.max_steps": 10}, gpus=8, fsdp=True)   # the same

The package itself is callable, `distil.plan(...)` being `plan` below (the Python API's name
for `distil plan`); its modules import as usual.

The models are built on the meta device from their config.json (no weights are read); the
memory terms are small formulas over their sizes (`memory.py`), assembled per phase
(`phases.py`); docs/memory.md explains how to read a plan.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distil.config import DistilConfig
    from distil.config.loading import ConfigLike, Overrides
    from distil.plan.build import DevicePlan, Plan, make_plan
    from distil.plan.report import as_dict, headline, render
    from distil.plan.target import PRESETS, Target, make_target, parse_bytes

# The names below are imported on first use: `import distil.plan` (and `distil --help`, whose
# `plan` sub-command lives in distil.plan.cli) does not pay for torch and the model shapes.
_LAZY = {
    "DevicePlan": "distil.plan.build",
    "Plan": "distil.plan.build",
    "make_plan": "distil.plan.build",
    "as_dict": "distil.plan.report",
    "headline": "distil.plan.report",
    "render": "distil.plan.report",
    "PRESETS": "distil.plan.target",
    "Target": "distil.plan.target",
    "make_target": "distil.plan.target",
    "parse_bytes": "distil.plan.target",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def plan_config(
    cfg: DistilConfig, target: Target, *, advise: bool = True, context_tokens: int | None = None
) -> Plan:
    """The plan of `cfg` on `target`, with the changes that make it fit when it does not
    (`context_tokens`: what privileged context adds to a teacher sequence; None: measured)."""
    from distil.plan.advice import suggest
    from distil.plan.build import make_plan

    plan = make_plan(cfg, target, context_tokens=context_tokens)
    if advise:
        plan.suggestions = suggest(cfg, target, plan)
    return plan


def plan(
    config: ConfigLike,
    overrides: Overrides = (),
    *,
    device: str = "h100",
    gpus: int = 1,
    fsdp: bool = False,
    gpu_memory: str | None = None,
    tflops: float | None = None,
    bandwidth: float | None = None,
    context_tokens: int | None = None,
) -> Plan:
    """`distil plan CONFIG [overrides] --device ... --gpus ... --fsdp` from Python: `config` a
    YAML file or run directory, a dict or a DistilConfig, `overrides` as for `distil.Distiller`.
    Returns the `Plan` (`render(plan)` is the command's text, `as_dict(plan)` its --json)."""
    from distil.config.loading import as_config
    from distil.plan.target import make_target

    target = make_target(
        device, memory=gpu_memory, gpus=gpus, fsdp=fsdp, tflops=tflops, bandwidth=bandwidth
    )
    return plan_config(as_config(config, overrides), target, context_tokens=context_tokens)


class _CallablePackage(types.ModuleType):
    """`distil.plan(...)` calls `plan`; everything else is the package as usual."""

    def __call__(self, *args, **kwargs) -> Plan:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = [
    "PRESETS",
    "DevicePlan",
    "Plan",
    "Target",
    "as_dict",
    "headline",
    "make_plan",
    "make_target",
    "parse_bytes",
    "plan",
    "plan_config",
    "render",
]
