"""One micro-batch: student forward, loss against the teacher's targets, metrics.

With `loss.chunk_size` set, the student's lm_head is bypassed during the forward (its output is
the final hidden state) and the loss applies the head chunk by chunk, so the student's (B, T, V)
fp32 logits never exist. The forward still goes through the (possibly DDP-wrapped) module, so
gradient synchronisation is untouched.
"""

from __future__ import annotations

from distil.data.packing import head_bypassed, model_forward
from distil.types import Batch, LossOutput, TeacherTargets


def student_forward(
    model,
    unwrapped,
    batch: Batch,
    *,
    chunk_size: int | None,
    vocab_size: int | None,
    packing: bool = False,
    pack_length: int | None = None,
):
    """Shifted student logits (B, T, V), or a `StudentHidden` for the chunked loss path.

    With `packing` the forward runs on packed rows (`distil.data.packing.model_forward`) and
    its output comes back in the batch's padded layout, so the loss is unchanged.
    """
    kwargs = dict(
        input_ids_B_L=batch.input_ids_B_L,
        attention_mask_B_L=batch.attention_mask_B_L,
        packing=packing,
        pack_length=pack_length,
    )
    if chunk_size is None:
        logits = model_forward(model, **kwargs)[:, :-1]
        return logits[..., :vocab_size] if vocab_size is not None else logits
    from distil.losses.chunked import StudentHidden

    with head_bypassed(unwrapped) as head:
        hidden = model_forward(model, **kwargs)[:, :-1]
    weight, bias = head.weight, getattr(head, "bias", None)
    if vocab_size is not None:
        weight = weight[:vocab_size]
        bias = None if bias is None else bias[:vocab_size]
    return StudentHidden(hidden, weight, bias)


def micro_step(
    model,
    unwrapped,
    batch: Batch,
    targets: TeacherTargets,
    loss_fn,
    *,
    num_tokens: float,
    loss_opts: dict,
    vocab_size: int | None = None,
    packing: bool = False,
    pack_length: int | None = None,
) -> LossOutput:
    """Forward + loss for one micro-batch; the caller runs backward."""
    student = student_forward(
        model,
        unwrapped,
        batch,
        chunk_size=loss_opts.get("chunk_size"),
        vocab_size=vocab_size,
        packing=packing,
        pack_length=pack_length,
    )
    extra = {} if batch.alignment is None else {"alignment": batch.alignment}
    return loss_fn(
        student,
        targets,
        batch.mask_B_T,
        num_tokens=num_tokens,
        labels_B_T=batch.labels_B_T,
        **extra,
        **loss_opts,
    )
