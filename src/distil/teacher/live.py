"""A live teacher: one forward pass over prompt + completion, in its own dtype and device.

The forward runs the model's decoder (`get_decoder()`: the body and its final norm; its output
is the final hidden state) and leaves the module untouched: no head swapped, so no lock that a
background seq-KD writer would hold for a whole generate call, and no wrapper a training
framework put on the module's forward (accelerate's fp32-output wrapper on a student scoring as
its own teacher would hand fp32 states to a bf16 head). It runs under `torch.inference_mode`
(`torch.no_grad` for an FSDP-sharded teacher: FSDP2's unshard fails on inference tensors in
torch < 2.12). Head, what the model's forward applies after it (`models.logits`: Gemma 2's
soft-cap, Cohere's and Granite's scales; checked once against the model's own logits when the
teacher is built, an unknown transform refused) and log-softmax are then applied only to the
positions a loss reads (`scored_positions`: the loss mask, or the
teacher positions of a cross-tokenizer alignment), `chunk_rows` positions at a time
(`losses.chunked.auto_chunk_size`, the rule of `loss.chunk_size: auto`), each chunk written into
the output: the (B, T, V) log-probs in the teacher's dtype, or top-k + rest. Log-softmax (at the
loss temperature) is taken in fp32 over the full vocabulary before any top-k, so sparse targets
hold true log-probs plus a rest bucket. Positions no loss reads hold a finite filler (uniform
log-probs, or PAD_LOGPROB top-k). Targets are moved to the student's device at the end.
"""

from __future__ import annotations

import math

import torch

from distil.data.packing import model_forward
from distil.errors import DistilError
from distil.losses.chunked import auto_chunk_size
from distil.models.logits import check_decoder_logits, logits_rule
from distil.teacher.base import sparse_topk
from distil.types import Batch, TeacherTargets

PAD_LOGPROB = -30.0  # top-k filler at positions no loss reads: finite, as the cache's


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
        chunk_rows: int | None = None,
        follows_student: bool = False,
    ):
        # follows_student: the model is the student being trained (self-distillation on its
        # current weights): left trainable, switched to eval mode only while scoring
        self.follows_student = follows_student
        self.model = model if follows_student else model.eval()
        self.packing, self.pack_length = packing, pack_length
        self.chunk_rows = chunk_rows  # positions per head + log-softmax chunk (None: auto)
        self.temperature = temperature
        self.top_k = top_k
        self.vocab_size = vocab_size  # keep only the first V logits (padded embedding rows)
        # what the forward does around the head (read once: a student that follows swaps it
        # off during its own forwards), checked against the model's logits once
        self.rule = logits_rule(model)
        if not _is_fsdp(model) and hasattr(model, "get_decoder"):
            check_decoder_logits(model, self.rule)
        if not follows_student:
            for p in self.model.parameters():
                p.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, batch: Batch):
        """(x_B_T_X, head): the shifted final hidden states (B, T, H) and the output head, or
        the shifted logits (B, T, V) and None when the head cannot be applied apart (an
        FSDP-sharded teacher, whose head weight is a shard outside its forward).

        Cross-tokenizer batches carry the teacher's own inputs (its chat template, its tokens);
        the targets are then in teacher positions and the alignment maps them to the student.
        """
        ids, attn = batch.input_ids_B_L, batch.attention_mask_B_L
        if batch.teacher_input_ids_B_L is not None:
            ids, attn = batch.teacher_input_ids_B_L, batch.teacher_attention_mask_B_L
        elif batch.context_input_ids_B_L is not None:  # privileged context, same tokens
            ids, attn = batch.context_input_ids_B_L, batch.context_attention_mask_B_L
        kw = dict(packing=self.packing, pack_length=self.pack_length)
        sharded = _is_fsdp(self.model)
        ids, attn = ids.to(self.device), attn.to(self.device)
        with torch.no_grad() if sharded else torch.inference_mode():
            if sharded or not hasattr(self.model, "get_decoder"):
                return model_forward(self.model, ids, attn, **kw)[:, :-1], None
            x = model_forward(self.model, ids, attn, hidden=True, **kw)
            return x[:, :-1], self.model.get_output_embeddings()

    @torch.no_grad()
    def idle(self) -> None:
        """A sharded (FSDP) teacher with no rows in this rank's micro-batch: one forward of a
        single token, so that this rank joins the all-gathers of the ranks that score (each
        `score` is one forward: the same collectives in the same order). Nothing otherwise."""
        if _is_fsdp(self.model):
            ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        """Full log-probs (in the teacher's dtype) or top-k + rest at the scored positions."""
        training = self.model.training
        self.model.eval()  # no dropout in the teacher pass (the student's own mode restored)
        try:
            x_B_T_X, head = self.forward(batch)
        finally:
            self.model.train(training)
        weight, bias = (None, None) if head is None else _head_params(head, self.vocab_size)
        V = x_B_T_X.shape[-1] if weight is None else weight.shape[0]
        if weight is None and self.vocab_size is not None:
            V = min(V, self.vocab_size)
        b, t = x_B_T_X.shape[:2]
        if batch.context_shift_B is not None:  # targets in the student's positions
            b, t = batch.mask_B_T.shape
        rows_B_T = scored_positions(batch, (b, t)).to(x_B_T_X.device)
        row_N, pos_N = rows_B_T.nonzero(as_tuple=True)
        labels_N = None
        if batch.teacher_input_ids_B_L is None:  # same tokens: the student's labels are ours
            labels_N = batch.labels_B_T.to(x_B_T_X.device)[row_N, pos_N]
        dtype = x_B_T_X.dtype if weight is None else weight.dtype
        out = _Output(b, t, V, self.top_k, dtype, x_B_T_X.device)
        step = self.chunk_rows or auto_chunk_size(V)
        # privileged context: teacher position p + shift predicts what student position p does
        at_N = pos_N
        if batch.context_shift_B is not None:
            at_N = pos_N + batch.context_shift_B.to(pos_N.device)[row_N]
        bad = []  # per chunk, which rows are not finite: read once after the loop (one sync)
        for s in range(0, len(row_N), step):
            r, p = row_N[s : s + step], pos_N[s : s + step]
            x_n = x_B_T_X[r, at_N[s : s + step]]  # gathers n rows only, from any layout
            # the head in its dtype, whatever a wrapper made of the hidden states; or logits
            logits_n_V = x_n[:, :V] if weight is None else self.rule.logits(x_n, weight, bias)
            logits_n_V = logits_n_V.float()
            if self.temperature != 1.0:
                logits_n_V = logits_n_V / self.temperature
            lp_n_V = torch.log_softmax(logits_n_V, dim=-1)
            del logits_n_V
            bad.append(~torch.isfinite(lp_n_V.amax(dim=-1)))
            out.write(r, p, lp_n_V, None if labels_N is None else labels_N[s : s + step])
        _check_finite(bad, row_N, pos_N)
        return out.targets(labels_N is not None).to(batch.input_ids_B_L.device)


class _Output:
    """The targets being filled chunk by chunk: full (B, T, V) log-probs, or top-k + rest."""

    def __init__(self, b: int, t: int, V: int, top_k: int | None, dtype, device):
        self.top_k = top_k
        self.token = torch.zeros(b, t, device=device)
        if top_k is None:  # uniform rows where nothing is scored: finite, never read
            self.full = torch.full((b, t, V), -math.log(V), dtype=dtype, device=device)
        else:
            self.ids = torch.arange(top_k, device=device).expand(b, t, top_k).clone()
            self.lps = torch.full((b, t, top_k), PAD_LOGPROB, device=device)
            self.rest = torch.zeros(b, t, device=device)

    def write(self, r, p, lp_n_V: torch.Tensor, labels_n: torch.Tensor | None) -> None:
        if labels_n is not None:
            self.token[r, p] = lp_n_V.gather(-1, labels_n[:, None])[:, 0]
        if self.top_k is None:
            self.full[r, p] = lp_n_V.to(self.full.dtype)
        else:
            self.ids[r, p], self.lps[r, p], self.rest[r, p] = sparse_topk(lp_n_V, self.top_k)

    def targets(self, with_tokens: bool) -> TeacherTargets:
        token = self.token if with_tokens else None
        if self.top_k is None:
            return TeacherTargets(logprobs_B_T_V=self.full, token_logprobs_B_T=token)
        return TeacherTargets(
            topk_ids_B_T_K=self.ids,
            topk_logprobs_B_T_K=self.lps,
            rest_logprob_B_T=self.rest,
            token_logprobs_B_T=token,
        )


def scored_positions(batch: Batch, shape_B_T: tuple[int, int]) -> torch.Tensor:
    """bool (B, T) of the shifted teacher positions a loss reads: the loss mask (same tokens),
    or every teacher position of the alignment's groups and projection entries, and the one
    before each boundary entry (cross)."""
    if batch.teacher_input_ids_B_L is None:
        return batch.mask_B_T.bool()
    a = batch.alignment
    if a is None:  # cross inputs without an alignment (cache-teacher): every real position
        return batch.teacher_attention_mask_B_L[:, 1:].bool()
    pos_G_T, proj_N = a.teacher_pos_G_T, a.proj_teacher_pos_N
    rows_B_T = torch.zeros(shape_B_T, dtype=torch.bool, device=pos_G_T.device)
    keep = pos_G_T >= 0
    rows_B_T[a.group_row_G[:, None].expand_as(pos_G_T)[keep], pos_G_T[keep]] = True
    keep = proj_N >= 0
    rows_B_T[a.proj_row_N[keep], proj_N[keep]] = True
    if a.proj_prev_table_N is not None:  # a boundary entry also reads the position before
        keep = (proj_N >= 1) & (a.proj_prev_table_N >= 0)
        rows_B_T[a.proj_row_N[keep], proj_N[keep] - 1] = True
    if a.group_prev_table_G is not None:  # ... and so does a group at a boundary
        first = pos_G_T[:, 0]
        keep = (first >= 1) & (a.group_prev_table_G >= 0)
        rows_B_T[a.group_row_G[keep], first[keep] - 1] = True
    return rows_B_T


def _head_params(head, vocab_size: int | None):
    weight, bias = head.weight, getattr(head, "bias", None)
    if vocab_size is not None:
        weight = weight[:vocab_size]
        bias = None if bias is None else bias[:vocab_size]
    return weight, bias


def _is_fsdp(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(model, FSDPModule)


class TeacherOutputError(DistilError):
    """The teacher produced NaN or infinite logits on real (non-padding) tokens."""


def _check_finite(bad: list[torch.Tensor], row_N, pos_N) -> None:
    """Stop before the loss when a scored teacher row is NaN/inf: a KL against it is NaN, and
    a skipped step would only hide a broken teacher. `bad`: per chunk, whether each row's max
    log-prob is not finite (max propagates NaN, and is -inf or NaN when the logits held +inf or
    only -inf); positions no loss reads (prompt, padding: some attention kernels return NaN on
    fully masked rows) are not scored. One host read for the micro-batch, after every chunk
    is queued, not one per chunk (which would keep the host from running ahead)."""
    bad_N = torch.cat(bad) if bad else torch.zeros(0, dtype=torch.bool)
    if bool(bad_N.any()):
        first = int(bad_N.nonzero()[0, 0])
        raise TeacherOutputError(
            f"the teacher's logits are NaN or infinite at {int(bad_N.sum())} of the "
            f"{len(bad_N)} token positions the loss reads in this micro-batch (first: row "
            f"{int(row_N[first])}, position {int(pos_N[first])}), so every loss against them "
            "would be NaN. Fix: load the teacher in a wider dtype (teacher.dtype=bfloat16 or "
            "float32; float16 overflows in many models), or check that teacher.path holds "
            "intact weights"
        )
