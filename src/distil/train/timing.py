"""Phase times of a training step without a host sync per micro-batch.

On CUDA each phase boundary records an event on the current stream; the events are read once
per step (`seconds`), after the step's own sync, so timing never stops the host from queueing
the next teacher forward behind the student's backward. Elsewhere the marks are perf_counter.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    """mark() phase boundaries, add(phase, start, end) spans, seconds(phase) once per step."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.spans: dict[str, list] = {}

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, phase: str, start, end) -> None:
        self.spans.setdefault(phase, []).append((start, end))

    def seconds(self, phase: str) -> float:
        """Total seconds of `phase` (waits for the last recorded event on CUDA)."""
        spans = self.spans.get(phase, [])
        if not self.cuda:
            return sum(end - start for start, end in spans)
        if spans:
            spans[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in spans) / 1000.0
