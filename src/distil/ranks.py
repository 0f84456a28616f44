"""This process's place in a launch, as the launcher (torchrun, accelerate launch) states it in
the environment before any process group exists: what runs before or outside the process group
(the run lock, the hub push, printing once, a server's start) reads it here."""

from __future__ import annotations

import os


def launch_rank() -> int:
    """The global rank the launcher gave this process (`RANK`; 0 when launched alone)."""
    return int(os.environ.get("RANK") or 0)


def is_first_rank() -> bool:
    """Whether this process is rank 0 of its launch (or launched alone)."""
    return launch_rank() == 0
