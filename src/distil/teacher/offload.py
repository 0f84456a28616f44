"""An offloaded teacher (`teachers.models.NAME.offload`): its weights live in host memory and
are on its device only while it scores.

`Offload` keeps one host copy of every parameter and buffer of the model (pinned when CUDA is
available, so the copy to the device can be `non_blocking`). `place(offload, device)` points
each tensor at a device copy of its host tensor (`to_device`) or back at the host tensor
itself (`to_home`): the teacher is frozen, so nothing is copied back, and dropping the device
copies returns their memory to the allocator (reusable by the student's next step). On a
CPU-only machine, home and device are both the cpu and `place` copies nothing.

`Offloaded` wraps a teacher's scorer: `score` moves the weights in, scores, and moves them out
(also when scoring fails). RoutedTeacher calls it only for teachers with rows in the
micro-batch, MixedTeacher for each teacher in turn, so a device holds one offloaded teacher
at a time.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from distil.types import Batch, TeacherTargets

HOME = torch.device("cpu")


class Offload:
    """The host copies of `model`'s tensors and the device it scores on (`name`: for logs)."""

    def __init__(self, model, device: torch.device | str, name: str = "teacher"):
        self.model, self.name = model, name
        self.device = torch.device(device)
        pin = torch.cuda.is_available()
        self.tensors = [*model.parameters(), *model.buffers()]  # tied weights listed once
        self.host = []
        for t in self.tensors:
            h = t.data.to(HOME)
            h = h.pin_memory() if pin else h
            t.data = h
            self.host.append(h)
        self.resident = False  # whether the weights are on `device` now

    @property
    def nbytes(self) -> int:
        return sum(h.numel() * h.element_size() for h in self.host)


def place(offload: Offload, device: torch.device) -> None:
    """Point every tensor of the offloaded model at its copy on `device` (a non_blocking copy
    from pinned host memory), or at its host tensor when `device` is home."""
    home = device == HOME
    for t, h in zip(offload.tensors, offload.host, strict=True):
        t.data = h if home else h.to(device, non_blocking=True)
    offload.resident = not home


@contextmanager
def resident(offload: Offload):
    """The offloaded model on its device for the block, back home after it."""
    place(offload, offload.device)
    try:
        yield
    finally:
        place(offload, HOME)


class Offloaded:
    """A teacher scorer whose model is offloaded: on its device only inside `score`. Other
    attributes are the scorer's (temperature, top_k, model, ...)."""

    def __init__(self, scorer: Any, offload: Offload):
        self.scorer, self.offload = scorer, offload

    def score(self, batch: Batch) -> TeacherTargets:
        with resident(self.offload):
            return self.scorer.score(batch)

    def __getattr__(self, name: str) -> Any:
        if name in ("scorer", "offload"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.scorer, name)
