"""The driver every position-wise loss shares: select rows -> chunk -> per-row fn -> reduce.

1. The N loss positions (mask True) are selected from the student and the targets first, so
   prompt and padding cost nothing.
2. The rows are cut into chunks of `chunk_size`. Each chunk computes its logits (from hidden
   states through the head when the student is a `StudentHidden`; a bf16 head under autocast
   adds its chunks' dW up in one fp32 buffer: `head.ChunkedHead`), upcasts them to fp32,
   divides by the temperature and hands them to the loss's `rows_fn`. With more than one chunk
   each chunk runs under `torch.utils.checkpoint` (non-reentrant), so only per-row values are
   kept between forward and backward: the (N, V) fp32 logits never exist at once, in forward
   or backward (the same idea as TRL's chunked divergence and Liger's fused linear losses).
3. The per-row losses are summed and divided by the window's token count (`reduce.py`); the
   per-row metrics are summed into `<name>_sum`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cache, partial

import torch
from torch.utils.checkpoint import checkpoint

from distil.losses.head import ChunkedHead, low_precision_under_autocast
from distil.losses.reduce import count_loss_tokens, token_sum_over
from distil.types import LossOutput, TeacherTargets


@dataclass
class StudentHidden:
    """The student's final hidden states and its output head, for the memory-lean loss path.

    logits_B_T_V = after_head(hidden_B_T_H @ weight_V_H.T + bias_V), computed chunk by chunk
    inside the loss. Like logits, `hidden_B_T_H` is already shifted (position t predicts token
    t+1). `after_head`: what the model's forward applies to its logits after the head (Gemma 2's
    soft-cap, Cohere's and Granite's scales: `models.logits.LogitsRule.after_head`), in the
    head's dtype; None: nothing.
    """

    hidden_B_T_H: torch.Tensor
    weight_V_H: torch.Tensor
    bias_V: torch.Tensor | None = None
    after_head: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class Rows:
    """The loss positions of a micro-batch (or a chunk of them), flattened to N rows.

    Fields mirror `TeacherTargets` (None where the targets have none) plus the realized next
    tokens `labels_N`.
    """

    labels_N: torch.Tensor | None = None
    logprobs_N_V: torch.Tensor | None = None
    topk_ids_N_K: torch.Tensor | None = None
    topk_logprobs_N_K: torch.Tensor | None = None
    rest_logprob_N: torch.Tensor | None = None
    token_logprobs_N: torch.Tensor | None = None

    def __getitem__(self, rows: slice) -> Rows:
        return replace(
            self,
            **{f.name: v[rows] for f in fields(self) if (v := getattr(self, f.name)) is not None},
        )


# rows_fn(logits_n_V, rows) -> (loss_n, {metric name: per-row values_n}); logits are fp32 and
# already divided by the temperature; metric values must be detached.
RowsFn = Callable[[torch.Tensor, Rows], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def select_rows(
    targets: TeacherTargets, mask_B_T: torch.Tensor, labels_B_T: torch.Tensor | None = None
) -> Rows:
    """The targets (and labels) at the loss positions, each (N, ...) in row-major order."""
    return _pick_rows(targets, labels_B_T, lambda x: x[mask_B_T])


def _pick_rows(targets: TeacherTargets, labels_B_T, pick_B_T: Callable) -> Rows:
    # the same selection applied to every (B, T, ...) target that is present
    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else pick_B_T(x)

    return Rows(
        labels_N=pick(labels_B_T),
        logprobs_N_V=pick(targets.logprobs_B_T_V),
        topk_ids_N_K=pick(targets.topk_ids_B_T_K),
        topk_logprobs_N_K=pick(targets.topk_logprobs_B_T_K),
        rest_logprob_N=pick(targets.rest_logprob_B_T),
        token_logprobs_N=pick(targets.token_logprobs_B_T),
    )


def auto_chunk_size(vocab_size: int) -> int:
    """Rows per chunk for `loss.chunk_size: auto`: about 2^25 fp32 logits (128 MiB) per chunk,
    64 to 1024 rows (1024 up to a 32k vocabulary, 256 at 128k)."""
    return max(64, min(1024, 2**25 // max(int(vocab_size), 1)))


def _rows_at(targets: TeacherTargets, labels_B_T, at_n: torch.Tensor) -> Rows:
    """The targets (and labels) at flat positions `at_n` (b * T + t), each (n, ...)."""
    return _pick_rows(targets, labels_B_T, lambda x: x.reshape(-1, *x.shape[2:])[at_n.to(x.device)])


def student_parts(student, mask_B_T: torch.Tensor):
    """(x_B_T_X, weight_V_H | None, bias_V | None, after_head | None): logits, or hidden states,
    the head and what follows it.

    Checks that mask_B_T has the (B, T) shape of the student tensor (both already shifted).
    """
    if isinstance(student, StudentHidden):
        hidden = student.hidden_B_T_H
        weight, bias, after = student.weight_V_H, student.bias_V, student.after_head
    else:
        hidden, weight, bias, after = student, None, None, None
    if hidden.dim() != 3 or tuple(mask_B_T.shape) != tuple(hidden.shape[:2]):
        raise ValueError(
            f"mask_B_T has shape {tuple(mask_B_T.shape)} but the student has shape "
            f"{tuple(hidden.shape)}; expected (B, T) == the first two dims of the (B, T, V|H) "
            "student tensor (both already shifted)"
        )
    return hidden, weight, bias, after


def _student_rows(student, mask_B_T: torch.Tensor, at_N: torch.Tensor):
    """(x_N_X, weight_V_H | None, bias_V | None, after_head | None): the student's rows at the
    flat loss positions `at_N` (b * T + t) and its head, if any. Indexing with the positions
    already found costs no second nonzero (a host sync) as a boolean mask would."""
    hidden, weight, bias, after = student_parts(student, mask_B_T)
    t = hidden.shape[1]
    return hidden[at_N // t, at_N % t], weight, bias, after


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (bf16/fp16 -> fp32; fp64 stays fp64, for references)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def check_temperatures(*temperatures: float) -> None:
    """Softmax temperatures must be positive numbers."""
    for value in temperatures:
        if not value > 0:
            raise ValueError(f"temperatures must be > 0, got {value}")


@cache
def compiled_chunk(backend: str):
    """`_rows_forward` compiled once per process and backend (shapes static: one chunk size)."""
    return torch.compile(_rows_forward, backend=backend, dynamic=False)


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` grown to `rows` rows by repeating its last row (real values: no NaN in padding)."""
    return torch.cat([x, x[-1:].expand(rows - x.shape[0], *x.shape[1:])])


def chunk_head(weight, bias, x_N: torch.Tensor, step: int, after=None) -> ChunkedHead:
    """The head the chunks apply, then `after` (the forward's post-head transform): with
    several chunks of a low-precision head under autocast, its dW added up in fp32
    (`head.ChunkedHead`)."""
    several = step < x_N.shape[0]
    fp32_grad = several and low_precision_under_autocast(weight, x_N.device.type)
    return ChunkedHead(weight, bias, fp32_grad=fp32_grad, after=after)


def _chunk_forward(rows_forward, head: ChunkedHead, x_n, rows: Rows):
    """One chunk: the head (eager: its backward adds dW into the fp32 buffer), then the rows'
    loss (`rows_forward`, compiled or not)."""
    return rows_forward(head(x_n), rows)


def _rows_forward(rows_fn: RowsFn, temperature: float, ce_weight: float, logits_n_V, rows: Rows):
    logits_n_V = upcast(logits_n_V)  # one chunk at a time
    if temperature != 1.0:
        logits_n_V = logits_n_V / temperature
    loss_n, metrics = rows_fn(logits_n_V, rows)
    if ce_weight:
        # cross-entropy on the data's next token, at temperature 1: -log S(x_{t+1})
        raw = logits_n_V * temperature if temperature != 1.0 else logits_n_V
        ce_n = -torch.log_softmax(raw, dim=-1).gather(1, rows.labels_N[:, None]).squeeze(1)
        loss_n = loss_n + ce_weight * ce_n
        metrics = {**metrics, "ce": ce_n.detach()}
    return loss_n, metrics


def run_rowwise(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    rows_fn: RowsFn,
    *,
    num_tokens: int | float | torch.Tensor,
    labels_B_T: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    compile_backend: str | None = None,
) -> LossOutput:
    """Apply `rows_fn` to the student's loss rows, chunked, and reduce to a `LossOutput`.

    student: logits (B, T, V) or `StudentHidden`; mask_B_T: bool (B, T); labels_B_T: (B, T)
    realized next tokens. The loss is sum(loss_N) / num_tokens; metrics are detached sums
    `<name>_sum` of the per-row metrics plus `loss_sum` and `tokens_count`. With no loss rows the
    loss is an exact 0 that still back-propagates (zero gradients). `ce_weight` > 0 adds that
    weight times the cross-entropy of the labels (data tokens; the loop passes it for off-policy
    and seq-KD slices only) and reports it as `ce_sum`. `compile_backend` (e.g. "inductor"):
    with several chunks, each chunk's upcast, `rows_fn` and cross-entropy run as one
    `torch.compile`d graph (after the head's matmul, run eagerly) of a fixed chunk shape (the last chunk padded with copies of its last
    row, whose values are dropped), so the ~40 full-width elementwise passes per chunk fuse into
    a few kernels; the values equal the eager ones up to float rounding.
    """
    check_temperatures(temperature)
    if ce_weight and labels_B_T is None:
        raise ValueError("ce_weight > 0 needs labels_B_T (the data's next tokens)")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of rows or None, got {chunk_size}")
    mask_B_T = mask_B_T.bool()
    # the targets' rows are gathered chunk by chunk (from flat positions), so a full (N, V)
    # copy of the teacher's log-probs never exists next to the (B, T, V) original
    at_N = mask_B_T.reshape(-1).nonzero().squeeze(1)
    x_N, weight, bias, after = _student_rows(student, mask_B_T, at_N)
    n = x_N.shape[0]
    step = n if chunk_size is None else min(chunk_size, n)
    step = max(step, 1)  # n == 0 still runs one (empty) chunk so the graph stays connected
    compiled = compile_backend is not None and step < n
    rows_forward = compiled_chunk(compile_backend) if compiled else _rows_forward
    rows_forward = partial(rows_forward, rows_fn, temperature, ce_weight)
    forward = partial(_chunk_forward, rows_forward, chunk_head(weight, bias, x_N, step, after))
    parts = []
    for start in range(0, max(n, 1), step):
        at_n, x_n = at_N[start : start + step], x_N[start : start + step]
        real = x_n.shape[0]
        if compiled and real < step:  # one chunk shape for the compiled graph: pad the last
            at_n, x_n = _pad_rows(at_n, step), _pad_rows(x_n, step)
        chunk = (x_n, _rows_at(targets, labels_B_T, at_n))
        if step < n:  # several chunks: recompute each in backward instead of storing (n, V)
            loss_n, m = checkpoint(forward, *chunk, use_reentrant=False)
        else:
            loss_n, m = forward(*chunk)
        parts.append((loss_n[:real], {k: v[:real] for k, v in m.items()}))
    loss_N = torch.cat([loss_n for loss_n, _ in parts])
    metrics = {
        f"{name}_sum": torch.cat([m[name] for _, m in parts]).sum().detach() for name in parts[0][1]
    }
    metrics["loss_sum"] = loss_N.detach().sum()
    metrics["tokens_count"] = count_loss_tokens(mask_B_T).to(loss_N.dtype)
    return LossOutput(loss=token_sum_over(loss_N, num_tokens), metrics=metrics)
