"""A live teacher: one forward pass over prompt + completion, in its own dtype and device.

The forward runs under `torch.inference_mode`; log-softmax (at the loss temperature) happens over
the full vocabulary before any top-k, so sparse targets hold true log-probs plus a rest bucket.
Targets are moved to the student's device at the end.
"""

from __future__ import annotations

import torch

from distil.errors import DistilError
from distil.teacher.base import sparse_topk
from distil.types import Batch, TeacherTargets


class LiveTeacher:
    """Scores a micro-batch with a forward pass of the teacher model."""

    def __init__(
        self,
        model,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        vocab_size: int | None = None,
    ):
        self.model = model.eval()
        self.temperature = temperature
        self.top_k = top_k
        self.vocab_size = vocab_size  # keep only the first V logits (padded embedding rows)
        for p in self.model.parameters():
            p.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def logits(self, batch: Batch) -> torch.Tensor:
        """Shifted teacher logits (B, T, V) in the teacher's dtype, as an inference tensor.

        Cross-tokenizer batches carry the teacher's own inputs (its chat template, its tokens);
        the targets are then in teacher positions and the alignment maps them to the student.
        """
        ids, attn = batch.input_ids_B_L, batch.attention_mask_B_L
        if batch.teacher_input_ids_B_L is not None:
            ids, attn = batch.teacher_input_ids_B_L, batch.teacher_attention_mask_B_L
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(self.device), attention_mask=attn.to(self.device), use_cache=False
            )
            logits = out.logits[:, :-1]
            if self.vocab_size is not None:
                logits = logits[..., : self.vocab_size]
            return logits

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        logits = self.logits(batch)
        # log-softmax in fp32 one row at a time would save memory; the whole (B, T, V) in fp32
        # is what the loss needs anyway unless targets are sparse.
        logprobs = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        _check_finite(logprobs, batch)
        token_logprobs = None
        if batch.teacher_input_ids_B_L is None:  # same tokens: the student's labels are ours
            labels = batch.labels_B_T.to(logprobs.device).unsqueeze(-1)
            token_logprobs = logprobs.gather(-1, labels).squeeze(-1)
        student_device = batch.input_ids_B_L.device
        if self.top_k is None:
            targets = TeacherTargets(
                logprobs_B_T_V=logprobs.to(logits.dtype), token_logprobs_B_T=token_logprobs
            )
        else:
            ids, vals, rest = sparse_topk(logprobs, self.top_k)
            targets = TeacherTargets(
                topk_ids_B_T_K=ids,
                topk_logprobs_B_T_K=vals,
                rest_logprob_B_T=rest,
                token_logprobs_B_T=token_logprobs,
            )
        return targets.to(student_device)


class TeacherOutputError(DistilError):
    """The teacher produced NaN or infinite logits on real (non-padding) tokens."""


def _check_finite(logprobs_B_T_V: torch.Tensor, batch: Batch) -> None:
    """Stop before the loss when a teacher row is NaN/inf: a KL against it is NaN, and a
    skipped step would only hide a broken teacher. max over the vocabulary propagates NaN, and
    is -inf or NaN when the logits held +inf or only -inf; padding positions are not checked
    (some attention kernels return NaN on fully masked rows)."""
    attn = batch.attention_mask_B_L
    if batch.teacher_input_ids_B_L is not None:
        attn = batch.teacher_attention_mask_B_L
    real_B_T = attn[:, :-1].to(logprobs_B_T_V.device).bool()
    bad_B_T = ~torch.isfinite(logprobs_B_T_V.amax(dim=-1)) & real_B_T
    if bool(bad_B_T.any()):
        rows, cols = bad_B_T.nonzero(as_tuple=True)
        raise TeacherOutputError(
            f"the teacher's logits are NaN or infinite at {int(bad_B_T.sum())} of "
            f"{int(real_B_T.sum())} token positions of this micro-batch (first: row "
            f"{int(rows[0])}, position {int(cols[0])}), so every loss against them would be NaN. "
            "Fix: load the teacher in a wider dtype (teacher.dtype=bfloat16 or float32; float16 "
            "overflows in many models), or check that teacher.path holds intact weights"
        )
