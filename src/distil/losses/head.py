"""The student's output head applied chunk by chunk inside a loss, its weight gradient added up
in one fp32 buffer.

A bf16 head under autocast, with several chunks: each chunk's dW = g_n^T x_n is added into one
fp32 (V, H) buffer (`addmm`, as Liger's fused linear losses accumulate it), which is rounded to
the weight's dtype once, after the last chunk's backward. So the sum over chunks is not rounded
to bf16 chunk after chunk, and no fp32 copy of the weight is made: the former fp32 view
(`weight.float()`) was re-cast to bf16 by autocast in every chunk's forward and checkpoint
recompute (autocast caches casts of leaf tensors only), and each chunk's bf16 dW was cast to
fp32 and added: about 4.7 GB of traffic per 220-row chunk at V = 151,936, H = 1024, some 4x the
head's own matmuls (gpu-review-2 finding 6). A frozen head (LoRA) gets no buffer: its chunks
are plain matmuls.

The buffer reaches the weight through a 0-dim "token" the chunks take as an input: autograd runs
the token's backward (`_Finalize`) only after every chunk that used it, so the rounding happens
once all chunks have added their share, whatever order the engine runs them in.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

_LOW = (torch.bfloat16, torch.float16)
_FUSED = ("cuda",)  # devices where addmm with out_dtype (a bf16 GEMM writing fp32) is tried
_OUT_DTYPE = [True]  # it has not failed in this process (torch 2.8+ has it on CUDA)


class ChunkedHead:
    """logits_n_V = after(x_n @ weight_V_H.T + bias_V), one chunk per call; see the module
    docstring.

    `fp32_grad`: accumulate dW (and db) in fp32 across the calls. Only for a low-precision
    weight that requires grad; otherwise the calls are plain `F.linear`. `after`: what the
    model's forward applies after its head (a soft-cap, a scale), in the head's dtype.
    """

    def __init__(
        self, weight: torch.Tensor | None, bias: torch.Tensor | None, *, fp32_grad: bool,
        after: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):  # fmt: skip
        self.weight, self.bias = weight, bias
        self.after = after
        usable = weight is not None and weight.dtype in _LOW and weight.requires_grad
        self.sums = _Sums(weight, bias) if fp32_grad and usable else None
        # the autograd nodes hold `sums`, never the token (no cycle through an output)
        self.token = _Finalize.apply(weight, bias, self.sums) if self.sums else None

    def __call__(self, x_n: torch.Tensor) -> torch.Tensor:
        if self.weight is None:  # the student gave logits: nothing to apply
            return x_n
        if self.token is None:
            logits_n_V = F.linear(x_n, self.weight, self.bias)
        else:
            logits_n_V = _HeadChunk.apply(x_n, self.weight, self.bias, self.token, self.sums)
        return logits_n_V if self.after is None else self.after(logits_n_V)


class _Sums:
    """The fp32 dW (and db) of the chunks so far."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias
        self.acc_w: torch.Tensor | None = None
        self.acc_b: torch.Tensor | None = None

    def add(self, g_n_V: torch.Tensor, x_n: torch.Tensor) -> None:
        """acc_w += g^T x (and acc_b += sum_n g) in fp32."""
        if self.acc_w is None:
            self.acc_w = torch.zeros(self.weight.shape, dtype=torch.float32, device=g_n_V.device)
        self.acc_w = _addmm_fp32(self.acc_w, g_n_V.t(), x_n)
        if self.bias is not None and self.bias.requires_grad:
            db = g_n_V.float().sum(0)
            self.acc_b = db if self.acc_b is None else self.acc_b.add_(db)


def low_precision_under_autocast(weight: torch.Tensor | None, device_type: str) -> bool:
    """A bf16/fp16 head inside an autocast region: the case `ChunkedHead(fp32_grad=True)` is
    for. With an fp32 head the matmuls and their sum are fp32 anyway. A bf16 head outside
    autocast (student.dtype=bfloat16 without train.bf16 or train.bf16_weights) gets plain chunks:
    each chunk's dW is bf16 and autograd adds them up in bf16."""
    return weight is not None and weight.dtype in _LOW and torch.is_autocast_enabled(device_type)


def _addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b in fp32 from low-precision a, b: one GEMM reading them as they are where
    torch has it (CUDA), else through fp32 copies of the chunk's (small) inputs. A torch or
    GPU without it falls back once, with a warning; running out of memory (or a CUDA error)
    is raised, not taken for a missing kernel."""
    if acc.device.type in _FUSED and _OUT_DTYPE[0]:
        try:
            return torch.addmm(acc, a, b, out_dtype=torch.float32)
        except (torch.OutOfMemoryError, torch.AcceleratorError):
            raise
        except (RuntimeError, TypeError, NotImplementedError) as exc:  # a torch without it
            _OUT_DTYPE[0] = False
            warnings.warn(
                "the head's fp32 gradient buffer cannot use torch.addmm(..., out_dtype="
                f"torch.float32) here ({type(exc).__name__}: {str(exc)[:200]}); each chunk's "
                "dW is computed from fp32 copies of its inputs instead (the same sums, slower)",
                RuntimeWarning,
                stacklevel=2,
            )
    return acc.addmm_(a.float(), b.float())


class _Finalize(torch.autograd.Function):
    """weight (, bias) -> a 0-dim token; its backward hands the fp32 sums over, rounded once."""

    @staticmethod
    def forward(ctx, weight, bias, sums):
        ctx.head = sums
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, _grad):
        head, (w_dtype, b_dtype) = ctx.head, ctx.dtypes
        dw = head.acc_w.to(w_dtype) if head.acc_w is not None else torch.zeros_like(head.weight)
        db = None
        if b_dtype is not None and head.bias.requires_grad:
            db = head.acc_b.to(b_dtype) if head.acc_b is not None else torch.zeros_like(head.bias)
        head.acc_w = head.acc_b = None  # the buffer is freed once handed over
        return dw, db, None


class _HeadChunk(torch.autograd.Function):
    """One chunk's logits in the weight's dtype; backward: dx, and dW added to the buffer."""

    @staticmethod
    def forward(ctx, x_n, weight, bias, token, sums):
        ctx.head = sums
        ctx.x_dtype = x_n.dtype
        x = x_n.to(weight.dtype)  # what autocast does for a matmul in the weight's dtype
        ctx.save_for_backward(x, weight)
        with torch.autocast(x.device.type, enabled=False):
            b = None if bias is None else bias.to(weight.dtype)
            return F.linear(x, weight, b)

    @staticmethod
    def backward(ctx, g_n_V):
        x, weight = ctx.saved_tensors
        g = g_n_V.to(weight.dtype)
        dx = (g @ weight).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        ctx.head.add(g, x)
        return dx, None, None, g.new_zeros(()), None
