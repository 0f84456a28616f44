"""`distil plan`: before a run, what each phase of a training step holds on each device, whether
it fits, which change makes it fit, and how long a step takes at a device's peak.

    from distil.plan import make_target, plan_config
    plan = plan_config(cfg, make_target("h100", gpus=1))
    print(render(plan))        # or as_dict(plan) for JSON; headline(plan) for one line

The models are built on the meta device from their config.json (no weights are read); the
memory terms are small formulas over their sizes (`memory.py`), assembled per phase
(`phases.py`); docs/memory.md explains how to read a plan.
"""

from __future__ import annotations

from distil.config import DistilConfig
from distil.plan.advice import suggest
from distil.plan.build import DevicePlan, Plan, make_plan
from distil.plan.render import as_dict, headline, render
from distil.plan.target import PRESETS, Target, make_target, parse_bytes


def plan_config(
    cfg: DistilConfig, target: Target, *, advise: bool = True, context_tokens: int | None = None
) -> Plan:
    """The plan of `cfg` on `target`, with the changes that make it fit when it does not
    (`context_tokens`: what privileged context adds to a teacher sequence; None: measured)."""
    plan = make_plan(cfg, target, context_tokens=context_tokens)
    if advise:
        plan.suggestions = suggest(cfg, target, plan)
    return plan


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
    "plan_config",
    "render",
]
