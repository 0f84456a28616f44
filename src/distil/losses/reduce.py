"""Reduction of per-token loss values: sum over loss tokens / loss tokens of the whole window.

Every micro-batch divides its *sum* by the number of loss tokens in the whole optimizer window
(all micro-batches, all ranks), so the accumulated gradient is the gradient of the window's
token mean whatever the micro-batch size, accumulation steps or world size. A per-micro-batch
mean would weight the tokens of a short micro-batch more.
"""

from __future__ import annotations

import torch


def count_loss_tokens(mask_B_T: torch.Tensor) -> torch.Tensor:
    """Number of loss positions (True entries of `mask_B_T`), as a 0-dim int64 tensor.

    The loop adds this over the micro-batches of a window (and all-reduces it over ranks) to get
    the `num_tokens` every loss divides by.
    """
    return mask_B_T.bool().sum()


def token_sum_over(values_N: torch.Tensor, num_tokens: int | float | torch.Tensor) -> torch.Tensor:
    """sum_n values_N[n] / num_tokens: the loss of one micro-batch under window normalization.

    `num_tokens` (python number or 0-dim tensor) is the window's loss-token count across ranks;
    it is clamped to >= 1, so a window without loss tokens gives an exact 0 (still in the graph).
    """
    total = values_N.sum()
    if isinstance(num_tokens, torch.Tensor):
        return total / num_tokens.to(device=total.device, dtype=total.dtype).clamp_min(1)
    return total / max(float(num_tokens), 1.0)
