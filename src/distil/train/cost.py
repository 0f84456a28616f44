"""What a run has spent, by a measure that does not depend on the machine or its load.

Tokens are counted per optimizer step (all ranks) and kept as running totals; FLOPs follow the
usual 2 N per token forward and 4 N backward (Kaplan et al. 2020, "Scaling Laws", C = 6 N D):

    student FLOPs = 2 N_student (3 T_train + T_prefill + T_gen)
    teacher FLOPs = 2 N_teacher (T_score + T_prefill + T_gen)

T_train: non-pad tokens through the student's training forward and backward (prompt +
completion); T_prefill: prompt tokens the model prefilled in its generate calls (one prompt
per sampled row: `num_generations` rows re-read their prompt); T_gen: tokens it sampled, up to
and including the stop token; T_score: non-pad tokens through the live teacher's scoring
forward (its own tokens across tokenizers). N counts each parameter once (tied embeddings
once: the output head's matmul is the real cost, the embedding lookup is not). Attention's
T^2 term is left out: at these lengths it is a few percent. A cached teacher costs nothing at
training time (the cache was paid for once by `distil cache-teacher`).

Several teachers (`teachers.models`): N_teacher of a mixture is the sum of its weighted live
teachers' (each runs on every token, scoring and writing); of routed teachers, the largest live
teacher's, an upper bound (each row runs on its own teacher only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from distil.models.scratch import count_parameters

# running totals, as logged (`cost/<name>`) and saved with every checkpoint
TOKEN_COUNTERS = (
    "student_train_tokens",
    "student_prefill_tokens",
    "student_generated_tokens",
    "teacher_score_tokens",
    "teacher_prefill_tokens",
    "teacher_generated_tokens",
)
# the buffer's per-window counts (`tokens/<policy>_prefill`, `tokens/<policy>_generated`)
_GENERATED_BY = {"student": "on_policy", "teacher": "seq_kd"}


def student_flops(n_params: int, train: float, prefill: float, generated: float) -> float:
    """2 N (3 T_train + T_prefill + T_gen): forward + backward on training tokens, forward only
    on prefilled and sampled tokens."""
    return 2.0 * n_params * (3.0 * train + prefill + generated)


def teacher_flops(n_params: int, score: float, prefill: float, generated: float) -> float:
    """2 N (T_score + T_prefill + T_gen): the teacher only runs forwards."""
    return 2.0 * n_params * (score + prefill + generated)


@dataclass
class CostMeter:
    """Running token totals of one run and the FLOPs they stand for."""

    student_params: int
    teacher_params: int = 0  # the teacher model run here (scoring or seq-KD); 0: none
    teacher_scores: bool = False  # a live teacher runs a forward on every micro-batch
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TOKEN_COUNTERS, 0.0))

    @classmethod
    def for_components(cls, c: Any, saved: dict[str, float] | None = None) -> CostMeter:
        """A meter for the loop's components, continuing the `saved` totals of a checkpoint."""
        # a live teacher's module; a cached one has none, a remote one a served model's name
        scorer = _module(getattr(c.teacher, "model", None))
        writer = _module(getattr(getattr(c.buffer.teacher, "generator", None), "model", None))
        teacher = scorer if scorer is not None else writer
        n_teacher = 0 if teacher is None else count_parameters(teacher)
        scores = scorer is not None
        if getattr(c.teacher, "teachers", None) is not None:  # several: see the docstring
            n_teacher, scores = _several_params(c.teacher)
        meter = cls(count_parameters(c.unwrapped), n_teacher, teacher_scores=scores)
        meter.totals.update({k: float(v) for k, v in (saved or {}).items() if k in meter.totals})
        return meter

    def add_window(self, window: Any, accelerator: Any = None, *, trained: bool = True) -> None:
        """Add one optimizer window's tokens (summed over ranks when `accelerator` has several);
        `trained` False: a window skipped after its generation (reward.skip_flat), which costs
        its generation only."""
        step = self.window_tokens(window, teacher_scored=self.teacher_scores, trained=trained)
        if accelerator is not None and accelerator.num_processes > 1:
            local = torch.tensor([step[k] for k in TOKEN_COUNTERS], device=accelerator.device)
            step = dict(zip(TOKEN_COUNTERS, accelerator.reduce(local, "sum").tolist(), strict=True))
        for k in TOKEN_COUNTERS:
            self.totals[k] += step[k]

    @staticmethod
    def window_tokens(
        window: Any, *, teacher_scored: bool, trained: bool = True
    ) -> dict[str, float]:
        """This rank's token counts of one window (`trained` False: its generation alone)."""
        counts = dict.fromkeys(TOKEN_COUNTERS, 0.0)
        for micro in window.micro_batches if trained else ():
            counts["student_train_tokens"] += float(micro.attention_mask_B_L.sum())
            if teacher_scored:
                mask = micro.teacher_attention_mask_B_L
                mask = micro.attention_mask_B_L if mask is None else mask
                counts["teacher_score_tokens"] += float(mask.sum())
        for who, policy in _GENERATED_BY.items():
            counts[f"{who}_prefill_tokens"] = float(
                window.metrics.get(f"tokens/{policy}_prefill", 0)
            )
            counts[f"{who}_generated_tokens"] = float(
                window.metrics.get(f"tokens/{policy}_generated", 0)
            )
        return counts

    @property
    def student_flops(self) -> float:
        t = self.totals
        return student_flops(
            self.student_params,
            t["student_train_tokens"],
            t["student_prefill_tokens"],
            t["student_generated_tokens"],
        )

    @property
    def teacher_flops(self) -> float:
        t = self.totals
        return teacher_flops(
            self.teacher_params,
            t["teacher_score_tokens"],
            t["teacher_prefill_tokens"],
            t["teacher_generated_tokens"],
        )

    def metrics(self) -> dict[str, float]:
        """`cost/*`: the running totals, both FLOP counts and the parameter counts used."""
        out = {f"cost/{k}": v for k, v in self.totals.items()}
        out["cost/student_flops"] = self.student_flops
        out["cost/teacher_flops"] = self.teacher_flops
        out["cost/student_params"] = self.student_params
        out["cost/teacher_params"] = self.teacher_params
        return out


def _module(obj: Any) -> torch.nn.Module | None:
    return obj if isinstance(obj, torch.nn.Module) else None


def _several_params(teacher: Any) -> tuple[int, bool]:
    """(N_teacher, whether a live one scores) of a RoutedTeacher or MixedTeacher: a mixture's
    weighted live teachers summed, routed teachers' largest (cached or served ones count 0)."""
    import math

    mixed = hasattr(teacher, "log_w")
    log_w = teacher.log_w if mixed else [0.0] * len(teacher.teachers)
    counts = [
        count_parameters(m)
        for t, lw in zip(teacher.teachers, log_w, strict=True)
        if lw != -math.inf and (m := _module(getattr(t, "model", None))) is not None
    ]
    return (sum(counts) if mixed else max(counts, default=0)), bool(counts)
