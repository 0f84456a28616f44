"""SIGINT/SIGTERM (a user's Ctrl-C, SLURM's or Kubernetes' preemption notice) stop a run cleanly.

While training runs, the first SIGINT or SIGTERM only sets a flag: the loop finishes the step
in progress, writes a checkpoint and raises `TrainingInterrupted`, whose exit code is
128 + signal number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process killed by
that signal. The handler of the signal is then reset to the default, so a second Ctrl-C
stops at once (the checkpoint being written stays atomic: a half-written one is never used).
"""

from __future__ import annotations

import signal
import threading

from distil.errors import DistilError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(DistilError):
    """The run was stopped by a signal after writing a checkpoint (a stop that was asked for,
    not an error)."""

    label = "stopped"

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopRequest:
    """Records the first SIGINT/SIGTERM received while active (a context manager).

    Outside the main thread (signal handlers cannot be installed there) it does nothing.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if not self.signum:
            self.signum = signum
        # a second signal acts at once (KeyboardInterrupt for SIGINT, termination for SIGTERM)
        for sig in HANDLED:
            signal.signal(
                sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler
            )


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
