"""What a run says once before it starts: the notices about what it was asked for but
probably did not mean, and the memory `distil plan` expects (moved out of setup.py)."""

from __future__ import annotations

import sys

from distil.config import DistilConfig
from distil.config.rules import fp32_on_cuda_note, precision_notices, warmup_notice
from distil.train.fsdp import fsdp_requested


def print_notices(cfg: DistilConfig, accelerator) -> None:
    """What the run was asked for but probably did not mean, said once at its start."""
    from distil.preflight import cpu_precision_note

    for notice in precision_notices(cfg):
        print(f"distil: warning: {notice}", file=sys.stderr, flush=True)
    cuda = accelerator.device.type == "cuda"
    notes = [cpu_precision_note(cfg, cuda=cuda), fp32_on_cuda_note(cfg, cuda=cuda)]
    notes.append(warmup_notice(cfg))
    for note in filter(None, notes):
        print(f"note: {note}", file=sys.stderr)


def print_completion_warnings(cfg: DistilConfig, examples, tok, accelerator) -> None:
    """The warnings about the data's reference completions (`completion_warnings`: empty
    answers, what the student's template writes before an answer), said once at the run's
    start (main process)."""
    from distil.data.lengths import completion_warnings

    for warning in completion_warnings(cfg, examples, tok) if accelerator.is_main_process else []:
        print(f"distil: warning: {warning}", file=sys.stderr, flush=True)


def memory_plan(cfg: DistilConfig, accelerator) -> int | None:
    """The peak `distil plan` expects on this device, its headline printed once (expected peak
    against the device's memory); None, with a one-line note, when the config cannot be
    planned (a plan is advice: it never stops a run)."""
    from distil.plan import headline, make_plan
    from distil.plan.target import for_device

    # on stdout, with the run's other reports ("resumed from", "final model:"): stderr carries
    # notices and a user's mistake as one paragraph (distil: error: ...)
    try:
        target = for_device(accelerator.device, accelerator.num_processes, fsdp_requested())
        plan = make_plan(cfg, target)
    except Exception as exc:  # an unknown architecture, remote code, a hub id offline
        if accelerator.is_main_process:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            print(f"memory plan: not made ({reason})", flush=True)
        return None
    if accelerator.is_main_process:
        print(headline(plan), flush=True)
    return plan.devices[0].peak
