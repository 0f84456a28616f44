"""The run directory's bookkeeping: one run at a time, every config it ran with, and what may
change on resume.

- `RunLock`: an exclusive `fcntl.flock` on `run_dir/.distil.lock`, holding the pid and host of
  its owner. The kernel releases it when the process dies (even on SIGKILL), so a stale lock is
  simply taken over; a live one makes a second run on the same directory a clear error.
- `record_config`: `config.yaml` is the config of the run's first step; each resume adds
  `config-resume-<step>.yaml` and never rewrites an earlier file.
- `config_changes`: the resolved keys that differ from the checkpoint's own config, minus the
  keys that cannot change what the steps so far did (`RESUMABLE_KEYS`) and the ones the user
  allows with `train.resume_changed=[...]`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import socket
from pathlib import Path
from typing import Any

import yaml

from distil.config import DistilConfig, flatten, to_dict, to_yaml
from distil.errors import ConfigError, DistilError

LOCK_FILE = ".distil.lock"

# Keys that say how long to run, how often to log/evaluate/save, or where: they leave the
# trajectory of the steps already taken unchanged, so a resume may change them without asking.
# (train.max_steps, train.max_minutes and train.max_student_flops do reshape the learning-rate schedule from here on:
# extending a run is what they are changed for.)
RESUMABLE_KEYS = (
    "train.output_dir",
    "train.max_steps",
    "train.max_minutes",
    "train.max_student_flops",
    "train.save_every",
    "train.save_every_minutes",
    "train.keep_last",
    "train.resume",
    "train.resume_changed",
    "train.eval_every",
    "train.push_to_hub",
    "train.hub_model_id",
    "train.hub_private",
    "train.log_every",
    "train.max_consecutive_skips",
    "train.max_zero_grad_steps",
    "train.num_threads",
    "eval.*",
    "logging.*",
)


class RunLockedError(DistilError):
    """Another live process holds the run directory."""


class RunLock:
    """Exclusive lock of a run directory for the lifetime of a run (main process only)."""

    def __init__(self, run_dir: str | Path, *, enabled: bool = True):
        self.path = Path(run_dir) / LOCK_FILE
        self.enabled = enabled
        self._fd: int | None = None
        self._created: list[Path] = []

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        import fcntl

        from distil.paths import output_dir_problem

        if problem := output_dir_problem(self.path.parent, "train.output_dir"):
            raise ConfigError(problem)
        missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._created = missing
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a file where the directory should be, no permission, ...
            raise DistilError(
                f"train.output_dir = {str(self.path.parent)!r} cannot be used as the run "
                f"directory ({exc.strerror or exc}). Fix: point train.output_dir to a new or "
                "existing directory you can write to"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"train.output_dir = {str(self.path.parent)!r} is in use by another distil run "
                f"({holder}). Two runs in one directory would interleave their checkpoints and "
                "metrics. Fix: wait for that run to finish or stop it, or set another "
                "train.output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
            if exc_type is not None and self._created:
                self._remove_if_untouched()

    def _remove_if_untouched(self) -> None:
        # a run that failed before writing anything (bad data, a model that does not load)
        # leaves no directory behind: only what this lock created, and only while empty
        with contextlib.suppress(OSError):
            self.path.unlink()
            for d in self._created:
                d.rmdir()


def record_config(cfg: DistilConfig, run_dir: str | Path, resumed_step: int | None) -> Path:
    """Write the resolved config: config.yaml for a fresh run, config-resume-<step>.yaml (a new
    name each time) for a resume."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resumed_step is None:
        path = run_dir / "config.yaml"
    else:
        path, n = run_dir / f"config-resume-{resumed_step}.yaml", 1
        while path.exists():
            n += 1
            path = run_dir / f"config-resume-{resumed_step}-{n}.yaml"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(to_yaml(cfg))
    tmp.replace(path)
    return path


def config_changes(saved_yaml: str, cfg: DistilConfig) -> list[tuple[str, Any, Any]]:
    """(key, value in the checkpoint, value now) for every key that changed and is not allowed
    to change. Keys present on one side only (a newer distil added them) are not compared."""
    saved = flatten(yaml.safe_load(saved_yaml) or {})
    now = flatten(to_dict(cfg))
    allowed = (*RESUMABLE_KEYS, *cfg.train.resume_changed)
    return [
        (key, saved[key], value)
        for key, value in now.items()
        if key in saved
        and _normal(saved[key]) != _normal(value)
        and not any(fnmatch.fnmatchcase(key, pat) for pat in allowed)
    ]


def _normal(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def refuse_changes(changes: list[tuple[str, Any, Any]], checkpoint: Path) -> DistilError:
    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes)
    keys = ",".join(k for k, _, _ in changes)
    return DistilError(
        f"the config differs from the one checkpoint {checkpoint} was trained with ({shown}). "
        "Resuming would silently mix two runs. Fix: to continue with the new values, allow "
        f"them with train.resume_changed=[{keys}]; to start over, set train.resume=never; or "
        "use another train.output_dir"
    )
