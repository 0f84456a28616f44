"""AdamW and the learning-rate schedule.

The schedule is a function of the run's progress: linear warmup over `warmup_steps`, then
constant, linear, cosine or WSD (warmup-stable-decay: constant, then a linear decay to
`min_lr_ratio` over the last `decay_fraction` of the run). Progress counts steps against
`max_steps` and, when `train.max_minutes` is set, training seconds against that budget
and, when `train.max_student_flops` is set, the student's FLOPs against that budget
(whichever is further along), so a run limited by wall-clock or compute still ends in its decay.
"""

from __future__ import annotations

import math

import torch

from distil.config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; biases and norms get no weight decay."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.adam_betas))


def progress(step: int, seconds: float, cfg: TrainConfig, flops: float = 0.0) -> float:
    """Fraction of the post-warmup run done before optimizer step `step` (0-based)."""
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    done = (step - cfg.warmup_steps) / span
    if cfg.max_minutes is not None:
        done = max(done, seconds / (60.0 * cfg.max_minutes))
    if cfg.max_student_flops is not None:
        done = max(done, flops / cfg.max_student_flops)
    return min(1.0, max(0.0, done))


def lr_factor(step: int, seconds: float, cfg: TrainConfig, flops: float = 0.0) -> float:
    """Multiplier of the peak lr for optimizer step `step` after `seconds` of training and
    `flops` of student compute."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    p = progress(step, seconds, cfg, flops)
    if cfg.schedule == "constant":
        shape = 1.0
    elif cfg.schedule == "linear":
        shape = 1.0 - p
    elif cfg.schedule == "wsd":
        start = 1.0 - cfg.decay_fraction
        shape = 1.0 if p <= start else (1.0 - p) / cfg.decay_fraction
    else:  # cosine
        shape = 0.5 * (1.0 + math.cos(math.pi * p))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def set_lr(
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    step: int,
    seconds: float,
    flops: float = 0.0,
) -> float:
    lr = cfg.lr * lr_factor(step, seconds, cfg, flops)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
