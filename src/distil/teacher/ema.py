"""An exponential moving average of the student as its own teacher
(`teacher.from_student: ema`).

The teacher is a frozen copy of the student whose trainable parameters follow it after every
optimizer step: ema <- decay * ema + (1 - decay) * student (`torch.lerp`, in the parameters'
own dtype). A checkpoint holds the average (`ema_teacher.safetensors`), so a resumed run scores
with exactly the teacher the uninterrupted run would have.
"""

from __future__ import annotations

from pathlib import Path

import torch

from distil.errors import DistilError
from distil.types import Batch, TeacherTargets

EMA_FILE = "ema_teacher.safetensors"


class EmaTeacher:
    """A `TeacherScorer` over `live` (a LiveTeacher of the copy) that follows the student."""

    def __init__(self, live, student, decay: float):
        self.live, self.decay = live, decay
        self.temperature = live.temperature
        names = {n for n, p in student.named_parameters() if p.requires_grad}
        self._ema = {n: p for n, p in live.model.named_parameters() if n in names}

    @property
    def model(self):
        return self.live.model

    def score(self, batch: Batch) -> TeacherTargets:
        return self.live.score(batch)

    @torch.no_grad()
    def after_step(self, student) -> None:
        """One update of the average toward the student's weights after an optimizer step."""
        for n, p in student.named_parameters():
            if n in self._ema:
                self._ema[n].lerp_(p.detach().to(self._ema[n].dtype), 1.0 - self.decay)

    def checkpoint_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        return {EMA_FILE: {n: p.detach().to("cpu").contiguous() for n, p in self._ema.items()}}

    @torch.no_grad()
    def load_checkpoint(self, checkpoint: Path) -> None:
        from safetensors.torch import load_file

        path = Path(checkpoint) / EMA_FILE
        if not path.exists():
            raise DistilError(
                f"{checkpoint} has no {EMA_FILE}: it was not written by a run with "
                "teacher.from_student=ema, so the average cannot be resumed. Fix: resume with "
                "the config that wrote it, or start a new run (train.resume=never)"
            )
        saved = load_file(str(path))
        for n, p in self._ema.items():
            p.copy_(saved[n].to(p.device, p.dtype))
