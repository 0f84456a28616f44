"""One micro-batch: student forward, loss against the teacher's targets, metrics.

With `loss.chunk_size` set, the student's lm_head is bypassed during the forward (its output is
the head's input) and the loss applies the head chunk by chunk, then what the model's forward
applies after it (`models.logits`: Gemma 2's soft-cap, Cohere's and Granite's scales), so the
student's (B, T, V) fp32 logits never exist. The forward still goes through the (possibly
DDP-wrapped) module, so gradient synchronisation is untouched.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch

from distil.data.packing import head_bypassed, model_forward
from distil.train.reward import reward_inputs
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
    from distil.models.logits import logits_rule

    rule = logits_rule(unwrapped)  # read before the bypass turns the after-head steps off
    with head_bypassed(unwrapped) as head:
        hidden = model_forward(model, **kwargs)[:, :-1]  # the head's input
    weight, bias = head.weight, getattr(head, "bias", None)
    if vocab_size is not None:
        weight = weight[:vocab_size]
        bias = None if bias is None else bias[:vocab_size]
    return StudentHidden(hidden, weight, bias, rule.after_head if rule.has_after_head else None)


def check_bypassed_logits(model) -> None:
    """`models.logits.check_logits` for a student whose forward runs with its head bypassed
    (the chunked loss): the forward's output is the head's input."""
    from distil.models.logits import check_logits, logits_rule

    def head_input(kw):
        with head_bypassed(model):
            return model(**kw).logits

    check_logits(model, logits_rule(model), head_input, role="student")


def micro_step(
    model,
    unwrapped,
    batch: Batch,
    targets: TeacherTargets | None,
    loss_fn,
    *,
    num_tokens: float,
    loss_opts: dict,
    vocab_size: int | None = None,
    packing: bool = False,
    pack_length: int | None = None,
    parts: list | None = None,
    routes: list[str] | None = None,
) -> LossOutput:
    """Forward + loss for one micro-batch; the caller runs backward.

    Several teachers: `parts` (`RoutedTeacher.score_parts`: each teacher's rows, as a batch in
    its own tokens, and its targets) or `routes` (each row's teacher name, with one `targets`
    for the whole batch). The student runs once on the whole micro-batch; the loss is the sum
    of each teacher's loss on its rows, and the metrics add `teacher/<name>/loss_sum` and
    `teacher/<name>/tokens_count`.
    """
    student = student_forward(
        model,
        unwrapped,
        batch,
        chunk_size=loss_opts.get("chunk_size"),
        vocab_size=vocab_size,
        packing=packing,
        pack_length=pack_length,
    )
    if parts is None and routes is None:
        return _loss(loss_fn, student, batch, targets, num_tokens, loss_opts)
    pieces = [
        (p.name, student_rows(student, p.rows, p.batch), p.batch, p.targets) for p in parts or []
    ]
    if parts is None:  # one set of targets: each teacher's rows by their loss mask
        names = list(dict.fromkeys(routes))
        for name in names:
            sub = batch
            if len(names) > 1:
                mine = torch.tensor([r == name for r in routes], device=batch.mask_B_T.device)
                done = batch.completion_mask_B_T  # a reward term's tokens, when narrowed
                done = None if done is None else done & mine[:, None]
                sub = replace(batch, mask_B_T=batch.mask_B_T & mine[:, None],
                              completion_mask_B_T=done)  # fmt: skip
            pieces.append((name, student, sub, targets))
    total, metrics = None, {}
    for name, s, sub, t in pieces:
        out = _loss(loss_fn, s, sub, t, num_tokens, loss_opts)
        total = out.loss if total is None else total + out.loss
        for k, v in out.metrics.items():
            metrics[k] = metrics[k] + v if k in metrics else v
        metrics[f"teacher/{name}/loss_sum"] = out.metrics["loss_sum"]
        metrics[f"teacher/{name}/tokens_count"] = out.metrics["tokens_count"]
    return LossOutput(loss=total, metrics=metrics)


def _loss(loss_fn, student, batch: Batch, targets, num_tokens: float, loss_opts: dict):
    extra = {} if batch.alignment is None else {"alignment": batch.alignment}
    extra.update(reward_inputs(batch))  # on-policy rows of a run that scores rewards
    return loss_fn(
        student,
        targets,
        batch.mask_B_T,
        num_tokens=num_tokens,
        labels_B_T=batch.labels_B_T,
        **extra,
        **loss_opts,
    )


def student_rows(student, rows: list[int], sub: Batch):
    """The student's output (logits or `StudentHidden`) for `rows` of the micro-batch, cut to
    `sub`'s positions (a part collated on its own may be padded shorter)."""
    from distil.losses.chunked import StudentHidden

    x = student.hidden_B_T_H if isinstance(student, StudentHidden) else student
    T = sub.mask_B_T.shape[1]
    if rows == list(range(x.shape[0])) and x.shape[1] == T:
        return student
    x = x[torch.tensor(rows, device=x.device), :T]
    if isinstance(student, StudentHidden):
        return replace(student, hidden_B_T_H=x)
    return x


TEACHER_SUMS = ("loss_sum", "tokens_count")


def teacher_names(teacher) -> list[str]:
    """The names of a routed teacher's teachers (`loss/teacher/<name>`); [] for one teacher."""
    return list(getattr(teacher, "names", None) or []) if hasattr(teacher, "last_routes") else []


def score_micro_batch(teacher, micro, autocast=None) -> tuple:
    """(targets, parts, routes): a routed teacher scores each teacher's rows on their own
    (`parts`); a teacher that records each row's teacher (`last_routes`) gives them as
    `routes`; a single teacher only targets.

    A teacher that follows the student (`teacher.from_student: current`) scores under
    `autocast()` (the run's, `train.bf16`), as the student's own forward runs: its decoder
    call bypasses accelerate's autocast wrapper, and would otherwise run fp32 matmuls on the
    fp32 weights, about twice the time on a GPU."""
    if hasattr(teacher, "score_parts"):
        return None, teacher.score_parts(micro), None
    follows = autocast is not None and getattr(teacher, "follows_student", False)
    with autocast() if follows else nullcontext():
        targets = teacher.score(micro)
    routes = getattr(teacher, "last_routes", None)
    return targets, None, (list(routes) if routes else None)


def teacher_metrics(sums: dict[str, float]) -> dict[str, Any]:
    """`loss/teacher/<name>` (the loss averaged over that teacher's loss tokens of the window;
    absent when it had none) and `tokens/teacher/<name>`, from the window's sums."""
    out: dict[str, Any] = {}
    for k, n in sums.items():
        if k.startswith("teacher/") and k.endswith("/tokens_count"):
            name = k[len("teacher/") : -len("/tokens_count")]
            out[f"tokens/teacher/{name}"] = int(n)
            if n > 0:
                out[f"loss/teacher/{name}"] = float(sums[f"teacher/{name}/loss_sum"]) / float(n)
    return out
