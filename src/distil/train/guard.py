"""What the loop decides after each optimizer step besides training: streaks, saves, stops.

A step whose loss or gradient is not finite is skipped; a step whose gradient is exactly zero
on real loss tokens counts towards a dead model. Too many of either in a row stops the run,
naming the last good checkpoint. No checkpoint is written inside such a streak. A checkpoint
is due every `train.save_every` steps, every `train.save_every_minutes` of wall clock (any
rank's timer) and on SIGINT/SIGTERM (any rank's), which then end the run.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from distil.config import TrainConfig
from distil.errors import DistilError
from distil.train.signals import TrainingInterrupted, signal_name


class Guard:
    """The streak counters, the last good checkpoint and the save clock of one run."""

    def __init__(self, cfg: TrainConfig, state: dict[str, Any], last_good: Path | None, *,
                 reward_only: bool = False):  # fmt: skip
        self.cfg = cfg
        self.reward_only = reward_only  # loss.name=grpo: flat groups have no gradient
        self.skips = state.get("consecutive_skips", 0)  # non-finite steps in a row
        self.zeros = state.get("zero_grad_steps", 0)  # zero-gradient steps in a row
        self.last_good = last_good
        self.saved_at = time.monotonic()

    @property
    def healthy(self) -> bool:
        """Outside a bad streak: the weights may be checkpointed."""
        return self.skips == 0 and self.zeros == 0

    def state(self) -> dict[str, int]:
        """The counters a checkpoint keeps (a resume goes on counting)."""
        return {"consecutive_skips": self.skips, "zero_grad_steps": self.zeros}

    def time_due(self) -> bool:
        """This rank's timer asks for a checkpoint (`train.save_every_minutes`)."""
        minutes = self.cfg.save_every_minutes
        return bool(minutes and time.monotonic() - self.saved_at >= 60 * minutes)

    def after_step(
        self, step: int, finite: bool, metrics: dict[str, Any], flags: dict[str, Any], last: bool
    ) -> bool:
        """Count the step into the streaks, warn about a skipped step, stop a streak past its
        limit (DistilError); True when a checkpoint is due now. `flags`: the rank-wide signal,
        timer, bad ranks and reward signal (`rank_flags`); `last`: the run's last step (saved
        anyway)."""
        self.skips = 0 if finite else self.skips + 1
        dead = finite and metrics["grad_norm"] == 0.0 and metrics["tokens/loss"] > 0
        dead = dead and self.cfg.max_zero_grad_steps > 0  # 0: the user trains on regardless
        # a reward alone (grpo) has no gradient when every group's rewards are equal, on every
        # rank: by design. A distillation loss (a logged or added reward) has one regardless.
        dead = dead and not (self.reward_only and not flags["reward_signal"])
        self.zeros = self.zeros + 1 if dead else 0
        if not finite:
            self._report_skip(step, flags["bad_ranks"])
        if self.zeros:
            self._check_alive(step)
        every = self.cfg.save_every
        due = (every and step % every == 0) or flags["time"] or flags["signum"]
        return bool(due and self.healthy and not last)

    def saved(self, path: Path) -> None:
        self.last_good, self.saved_at = path, time.monotonic()

    def stop_on_signal(self, step: int, flags: dict[str, Any], last: bool) -> None:
        """Raise TrainingInterrupted after a signal (the checkpoint, if healthy, is written)."""
        if not flags["signum"] or last:
            return
        where = (
            f"checkpoint {self.last_good} written"
            if self.healthy
            else f"no checkpoint written (inside a non-finite or zero-gradient streak; the last "
            f"good one is {self.last_good or 'none'})"
        )
        raise TrainingInterrupted(
            f"training stopped by {signal_name(flags['signum'])} after step {step}: {where}. "
            "To continue, run the same command again (train.resume=auto)",
            flags["signum"],
        )

    def warn_unsaved(self, step: int) -> None:
        print(
            f"warning: step {step} ended a streak of skipped or zero-gradient steps; no "
            f"checkpoint written for it (the last good one: {self.last_good or 'none'})",
            file=sys.stderr,
        )

    def _report_skip(self, step: int, bad_ranks: list[int]) -> None:
        limit = self.cfg.max_consecutive_skips
        where = f" (non-finite loss on rank {', '.join(map(str, bad_ranks))})" if bad_ranks else ""
        print(
            f"warning: step {step}: non-finite loss or gradient{where}, optimizer step skipped "
            f"({self.skips} in a row, limit {limit}); no checkpoint is written until a step "
            "succeeds",
            file=sys.stderr,
            flush=True,
        )
        if self.skips >= limit:
            clip = "" if self.cfg.max_grad_norm else ", enable train.max_grad_norm (e.g. 1.0)"
            raise DistilError(
                f"training stopped at step {step}: {self.skips} consecutive steps had a "
                f"non-finite loss or gradient{where}. {self._restart()} Fix: lower train.lr "
                f"(now {self.cfg.lr}){clip}, check the data, or raise "
                "train.max_consecutive_skips"
            )

    def _check_alive(self, step: int) -> None:
        """A gradient of exactly zero on real loss tokens, step after step, is a dead model
        (saturated activations after a too-large update), not a converged one."""
        limit = self.cfg.max_zero_grad_steps
        if limit and self.zeros >= limit:
            raise DistilError(
                f"training stopped at step {step}: the gradient norm was exactly 0 for "
                f"{self.zeros} steps in a row although the windows had loss tokens, so the "
                "student no longer learns (its weights saturated, typically after too large a "
                f"learning rate). {self._restart()} Fix: lower train.lr (now {self.cfg.lr}), "
                "or set train.max_zero_grad_steps=0 to train on regardless"
            )

    def _restart(self) -> str:
        """Where to restart after a stop: checkpoints are never written inside a bad streak."""
        if self.last_good is None:
            return (
                "No checkpoint was written before the problem: start over with train.resume=never."
            )
        return (
            f"The last good checkpoint is {self.last_good}: resume from it with "
            f"train.resume={self.last_good} (list the keys you change, e.g. "
            "train.resume_changed=[train.lr]), or start over with train.resume=never."
        )


def rank_flags(
    acc, signum: int, time_due: bool, local_ok, window_metrics: dict, stop_asked: bool = False
) -> dict[str, Any]:
    """The rank-wide flags of one step, from one small all-reduce, so that every rank takes the
    same decisions: "signum" (a signal on any rank: stop), "time" (any rank's timer: save),
    "reward_signal" (some rank's window has a group whose rewards differ:
    `reward/no_signal_groups` below 1, a per-rank share), "stop" (a callback asked, on the main
    process) and "bad_ranks" (the ranks that saw a non-finite loss)."""
    n = acc.num_processes
    flags = torch.zeros(5 + n, dtype=torch.float32, device=acc.device)
    flags[0] = float(signum == signal.SIGTERM)
    flags[1] = float(signum == signal.SIGINT)
    flags[2] = float(bool(time_due))
    flags[3] = float(window_metrics.get("reward/no_signal_groups", 1.0) < 1.0)
    flags[4] = float(bool(stop_asked))
    flags[5 + acc.process_index] = float(not bool(local_ok))
    if n > 1:
        flags = acc.reduce(flags, reduction="sum")
    f = flags.tolist()
    sig = signal.SIGTERM if f[0] else signal.SIGINT if f[1] else 0
    return {"signum": int(sig), "time": bool(f[2]), "reward_signal": bool(f[3]),
            "stop": bool(f[4]), "bad_ranks": [r for r in range(n) if f[5 + r]]}  # fmt: skip
