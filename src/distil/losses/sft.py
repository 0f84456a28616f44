"""Supervised fine-tuning as a loss: cross-entropy of the data's next tokens, no teacher.

`sft` trains on completions the student did not write: the dataset's (train.lambda = 0) or the
teacher's (train.seq_kd = true, the sequence-level KD of Kim & Rush 2016). It shares the row
driver, so the memory-lean chunked path and the global-token reduction apply unchanged.
per token: -log S(x_{t+1})
"""

from __future__ import annotations

from functools import partial

import torch

from distil.losses.chunked import Rows, run_rowwise
from distil.losses.divergences import entropy_rows
from distil.losses.registry import register
from distil.types import LossOutput, TeacherTargets


def _ce_rows(diagnostics: bool, logits_n_V: torch.Tensor, rows: Rows):
    logp = torch.log_softmax(logits_n_V, dim=-1)
    nll = -logp.gather(1, rows.labels_N[:, None]).squeeze(1)
    metrics = {"student_logprob": -nll.detach()}
    if diagnostics:  # a full-vocabulary pass: only on steps that log it
        metrics["student_entropy"] = entropy_rows(logp).detach()
    return nll, metrics


@register("sft")
def sft(
    student,
    targets: TeacherTargets | None,
    mask_B_T,
    *,
    num_tokens,
    labels_B_T=None,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    diagnostics: bool = True,
    **unused,
) -> LossOutput:
    """Cross-entropy on the data's tokens (dataset or teacher-written completions); no teacher.
    diagnostics=False leaves out the student's entropy."""
    if labels_B_T is None:
        raise ValueError("the sft loss needs labels_B_T (the data's next tokens)")
    return run_rowwise(
        student,
        targets or TeacherTargets(),
        mask_B_T,
        partial(_ce_rows, diagnostics),
        num_tokens=num_tokens,
        labels_B_T=labels_B_T,
        chunk_size=chunk_size,
        ce_weight=ce_weight,  # adds to the CE itself: (1 + ce_weight) * CE
    )
