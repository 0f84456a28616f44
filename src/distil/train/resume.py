"""Where a run starts: the checkpoint `train.resume` picks, verified, or step 0.

`train.resume=auto` takes the newest checkpoint that passes its manifest; each newer one that
does not is reported by name (which file, what is wrong) and skipped. When checkpoints exist but
none is complete, or an explicit `train.resume=<dir>` is broken, the run stops with a
`CheckpointError` naming the ways out. The checkpoint's config is compared with the current
one before anything is loaded (`rundir.config_changes`). The main process verifies; the other
ranks follow its choice, so every rank resumes from the same step.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from distil.config import DistilConfig
from distil.train.checkpoint import (
    MANIFEST,
    CheckpointError,
    checkpoint_dir,
    load_checkpoint,
    read_config_text,
    step_dirs,
    verify_checkpoint,
)
from distil.train.rundir import config_changes, refuse_changes

_NONE, _BROKEN = -1, -2


def resume(c, cfg: DistilConfig, out: Path) -> tuple[int, dict[str, Any], Path | None]:
    """Restore the checkpoint `train.resume` asks for; (step, trainer state, its path)."""
    acc = c.accelerator
    if acc.is_main_process:
        for tmp in checkpoint_dir(out).glob("step-*.tmp"):  # a save cut short by a kill
            shutil.rmtree(tmp, ignore_errors=True)
    if cfg.train.resume == "never":
        if acc.is_main_process:
            _clear_checkpoints(out)
        acc.wait_for_everyone()
        return 0, {}, None
    path = _pick(acc, cfg, out)
    if path is None:
        return 0, {}, None
    changes = config_changes(read_config_text(path), cfg)
    if changes:
        raise refuse_changes(changes, path)
    written_by = json.loads((path / MANIFEST).read_text()).get("world_size")
    if written_by != acc.num_processes and acc.is_main_process:
        print(
            f"warning: checkpoint {path} was written by {written_by} processes, this run has "
            f"{acc.num_processes}: the data shards and random streams differ from the original "
            "run from here on (the loss normalization does not depend on the world size)",
            file=sys.stderr,
            flush=True,
        )
    state = load_checkpoint(acc, path, model=c.model, optimizer=c.optimizer)
    c.buffer.load_state(state["buffer"])
    if acc.is_main_process:
        print(f"resumed from {path} at step {state['step']}", flush=True)
    return int(state["step"]), state, path


def _pick(acc, cfg: DistilConfig, out: Path) -> Path | None:
    how, world = cfg.train.resume, acc.num_processes
    if how != "auto":
        path = Path(how)
        problems = verify_checkpoint(path, world) if acc.is_main_process else []
        if _from_main(acc, _BROKEN if problems else 0) == _BROKEN:
            raise CheckpointError(
                f"train.resume = {how!r} cannot be used: {'; '.join(problems) or 'see rank 0'}. "
                "Fix: set train.resume to another run_dir/checkpoints/step-N directory, "
                "train.resume=auto for the newest complete one, or train.resume=never to start "
                "over"
            )
        return path
    candidates = step_dirs(out)
    chosen, rejected = _NONE, []
    if acc.is_main_process:
        for n, p in candidates:
            problems = verify_checkpoint(p, world)
            if not problems:
                chosen = n
                break
            rejected.append(f"{p.name}: {'; '.join(problems)}")
        if rejected and chosen == _NONE:
            chosen = _BROKEN
        for line in rejected if chosen != _BROKEN else []:
            print(
                f"warning: skipping checkpoint {line}; falling back to step-{chosen:08d}",
                file=sys.stderr,
                flush=True,
            )
    chosen = _from_main(acc, chosen)
    if chosen == _BROKEN:
        raise CheckpointError(
            f"no complete checkpoint in {checkpoint_dir(out)} "
            f"({' | '.join(rejected) or 'see rank 0'}). Fix: start over with "
            "train.resume=never (moves these checkpoints aside), or resume from a checkpoint "
            "directory you trust with train.resume=<dir>"
        )
    return None if chosen == _NONE else checkpoint_dir(out) / f"step-{chosen:08d}"


def _from_main(acc, value: int) -> int:
    """The main process's value on every rank."""
    if acc.num_processes == 1:
        return value
    from accelerate.utils import broadcast

    t = torch.tensor([value], dtype=torch.int64, device=acc.device)
    return int(broadcast(t, from_process=0).item())


def _clear_checkpoints(out: Path) -> None:
    """Move an earlier run's checkpoints aside (never delete what a user's run wrote), so that a
    later train.resume=auto cannot pick one of them up."""
    old = step_dirs(out)
    if not old:
        return
    aside = out / f"checkpoints.before-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir(parents=True, exist_ok=True)
    for _, p in old:
        os.replace(p, aside / p.name)
    print(
        f"warning: train.resume=never: moved {len(old)} checkpoint(s) of an earlier run from "
        f"{checkpoint_dir(out)} to {aside} (delete it when it is no longer needed)",
        file=sys.stderr,
        flush=True,
    )
