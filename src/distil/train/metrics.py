"""The metrics of one optimizer step: the micro-batches' sums added up (`add_metrics`,
`add_align_metrics`), then turned into per-token means, window totals and timings
(`step_metrics`), the dict the loop logs, prints and hands to callbacks."""

from __future__ import annotations

from typing import Any

import torch

from distil.train.step import teacher_metrics


def add_align_metrics(sums: dict, metrics: dict, device: torch.device) -> None:
    """Add a micro-batch's alignment counts to `sums` as tensors on `device` (the rank's
    device: NCCL all-reduces only device tensors)."""
    for k, v in metrics.items():
        sums[f"align/{k}"] = sums.get(f"align/{k}", 0) + torch.tensor(float(v), device=device)


def add_metrics(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor], policy: str):
    """Add a micro-batch's loss metrics to `sums`, the loss and token count also under its
    policy (on_policy/, off_policy/, seq_kd/)."""
    for k, v in metrics.items():
        v = v.detach().float()
        sums[k] = sums.get(k, 0) + v
        if k in ("loss_sum", "tokens_count"):
            key = f"{policy}/{k}"
            sums[key] = sums.get(key, 0) + v


# the reward term's sums: means over its tokens (every completion token, aligned or not)
REWARD_SUMS = ("reward_loss_sum", "advantage_sum", "ratio_clipped_sum")


def step_metrics(step, sums, window, grad_norm, lr, finite, t_teacher, t_train, t_step):
    """The step's logged metrics from the window's reduced `sums` and the step's timings."""
    if sums:  # one device-to-host copy for every metric of the step
        sums = dict(zip(sums, torch.stack([v.reshape(()) for v in sums.values()]).tolist()))
    tokens = float(sums.get("tokens_count", 0.0))
    rewarded = float(sums.get("reward_tokens_count", tokens))  # a reward term's own tokens
    # the distillation part of a loss with a reward exists on on-policy micro-batches only
    # (off-policy and seq-KD ones carry no advantages): a mean over the on-policy tokens
    on_policy = float(sums.get("on_policy/tokens_count", tokens))
    m: dict[str, Any] = {"step": step}
    for k, v in sums.items():
        if k.endswith("_sum") and "/" not in k:  # per-token means
            n = rewarded if k in REWARD_SUMS else on_policy if k == "distill_loss_sum" else tokens
            m[k[: -len("_sum")]] = float(v) / max(n, 1.0)
        elif (k.endswith("_count") and "/" not in k and k != "tokens_count") or k.startswith(
            "align/"
        ):  # totals over the window (all ranks)
            m[k.removesuffix("_count")] = float(v)
    for policy in ("on_policy", "off_policy", "seq_kd"):
        if f"{policy}/tokens_count" in sums:
            n = float(sums[f"{policy}/tokens_count"])
            m[f"loss/{policy}"] = float(sums[f"{policy}/loss_sum"]) / max(n, 1.0)
    m.update(teacher_metrics(sums))
    m.update(window.metrics)
    n_inputs = sum(int(b.attention_mask_B_L.sum()) for b in window.micro_batches)
    m.update(
        {
            "grad_norm": float(grad_norm),
            "lr": lr,
            "skipped": int(not finite),
            "tokens/loss": int(tokens),
            "tokens/input_local": n_inputs,
            "time/teacher": t_teacher,
            "time/train": t_train,
            "time/step": t_step,
            "time/other": max(0.0, t_step - t_teacher - t_train - _window_seconds(window)),
            "throughput/tokens_per_s": n_inputs / max(t_step, 1e-9),
        }
    )
    return m


def _window_seconds(window) -> float:
    """Seconds of the step spent getting the window: sampling and collating it, or (with
    generation.async, where both run in the background) waiting for it."""
    t = window.metrics
    if "time/generate_wait" in t:
        return t["time/generate_wait"]
    return t.get("time/generate", 0.0) + t.get("time/collate", 0.0) + t.get("time/reward", 0.0)
