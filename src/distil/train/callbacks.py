"""Callbacks: user code the training loop calls with each step's metrics, after each evaluation
and after each checkpoint (on the main process). Any of them can stop the run; it then ends as
a finished run does, with a checkpoint and the final model, after the current step.

    class StopAtAccuracy(distil.Callback):
        def on_evaluate(self, step, metrics):
            return metrics["eval/accuracy"] >= 0.9     # True: stop after this step

A plain function is taken as `on_step(step, metrics)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class Callback:
    """Override any of the three; a method that returns True stops the run after the current
    step. The metrics are a copy: changing them changes nothing that is logged."""

    def on_step(self, step: int, metrics: dict[str, Any]) -> bool | None:
        """After every optimizer step, with the step's metrics (those of metrics.jsonl)."""
        return None

    def on_evaluate(self, step: int, metrics: dict[str, Any]) -> bool | None:
        """After each evaluation (train.eval_every and the last step), with its eval/* values."""
        return None

    def on_checkpoint(self, step: int, path: Path) -> bool | None:
        """After each checkpoint is written, with its directory."""
        return None


class _OnStep(Callback):
    def __init__(self, fn: Callable[[int, dict[str, Any]], bool | None]):
        self.fn = fn

    def on_step(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return self.fn(step, metrics)


class Callbacks:
    """A run's callbacks, called in order on the main process (`enabled`); `stop` turns true
    once one of them asks to stop."""

    def __init__(self, callbacks: Iterable[Callback | Callable] = (), *, enabled: bool = True):
        self.items = [c if hasattr(c, "on_step") else _OnStep(c) for c in callbacks]
        self.enabled = enabled and bool(self.items)
        self.stop = False

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        self._call("on_step", step, metrics)

    def evaluated(self, step: int, metrics: dict[str, Any]) -> None:
        self._call("on_evaluate", step, metrics)

    def checkpoint(self, step: int, path: Path) -> None:
        self._call("on_checkpoint", step, path)

    def _call(self, method: str, step: int, value: Any) -> None:
        if not self.enabled:
            return
        for callback in self.items:
            fn = getattr(callback, method, None)
            shown = dict(value) if isinstance(value, dict) else value
            if fn is not None and fn(step, shown):
                self.stop = True
