"""A live teacher: one forward pass over prompt + completion, in its own dtype and device.

The forward runs under `torch.inference_mode`; log-softmax (at the loss temperature) happens over
the full vocabulary before any top-k, so sparse targets hold true log-probs plus a rest bucket.
Targets are moved to the student's device at the end.
"""

from __future__ import annotations

import torch

from distil.data.packing import model_forward
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
        packing: bool = False,
        pack_length: int | None = None,
        chunk_rows: int = 1024,
    ):
        self.model = model.eval()
        self.packing, self.pack_length = packing, pack_length
        self.chunk_rows = chunk_rows  # positions per fp32 log-softmax chunk of top-k targets
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
            logits = model_forward(
                self.model,
                ids.to(self.device),
                attn.to(self.device),
                packing=self.packing,
                pack_length=self.pack_length,
            )[:, :-1]
            if self.vocab_size is not None:
                logits = logits[..., : self.vocab_size]
            return logits

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        """Full log-probs (in the teacher's dtype) or top-k + rest, the fp32 log-softmax taken
        `chunk_rows` positions at a time, so the (B, T, V) fp32 log-probs never exist at once."""
        logits = self.logits(batch)
        b, t, v = logits.shape
        flat = logits.reshape(b * t, v)
        labels = None
        if batch.teacher_input_ids_B_L is None:  # same tokens: the student's labels are ours
            labels = batch.labels_B_T.to(flat.device).reshape(b * t)
        full = torch.empty_like(flat) if self.top_k is None else None
        parts: list[tuple[torch.Tensor, ...]] = []
        for s in range(0, b * t, self.chunk_rows):
            lp = torch.log_softmax(flat[s : s + self.chunk_rows].float() / self.temperature, -1)
            peak = lp.amax(-1)
            tok = peak if labels is None else lp.gather(-1, labels[s : s + len(lp), None])[:, 0]
            if full is not None:
                full[s : s + len(lp)] = lp
                parts.append((tok, peak))
            else:
                parts.append((tok, peak, *sparse_topk(lp, self.top_k)))
        cat = [torch.cat(x).reshape(b, t, *x[0].shape[1:]) for x in zip(*parts, strict=True)]
        _check_finite(cat[1].unsqueeze(-1), batch)
        token_logprobs = None if labels is None else cat[0]
        if full is not None:
            targets = TeacherTargets(
                logprobs_B_T_V=full.reshape(b, t, v), token_logprobs_B_T=token_logprobs
            )
        else:
            targets = TeacherTargets(
                topk_ids_B_T_K=cat[2],
                topk_logprobs_B_T_K=cat[3],
                rest_logprob_B_T=cat[4],
                token_logprobs_B_T=token_logprobs,
            )
        return targets.to(batch.input_ids_B_L.device)


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
