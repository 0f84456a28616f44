"""AdamW (plain, or over fp32 master copies of bf16 weights) and the learning-rate schedule.

`train.bf16_weights`: the student's parameters are held in bf16 on the device (forward,
backward and generation run on bf16 weights, nothing re-casts them per step) while
`MasterAdamW` keeps an fp32 copy of each trainable parameter and fp32 moments, as in
mixed-precision training (Micikevicius et al. 2018) without a loss scale (bf16 has fp32's
exponent range). Each micro-batch's bf16 gradient is added into the fp32 master gradient
(`fold_grads`), clipping acts on those fp32 gradients, the step updates the masters and
writes them back rounded to bf16. The masters travel in the optimizer's state dict, so a
checkpoint restores them exactly.

The schedule is a function of the run's progress: linear warmup over `warmup_steps`, then
constant, linear, cosine or WSD (warmup-stable-decay: constant, then a linear decay to
`min_lr_ratio` over the last `decay_fraction` of the run). Progress counts steps against
`max_steps` and, when `train.max_minutes` is set, training seconds against that budget
and, when `train.max_student_flops` is set, the student's FLOPs against that budget
(whichever is further along), so a run limited by wall-clock or compute still ends in its decay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from distil.config import TrainConfig
from distil.config.rules import effective_warmup


def build_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, device: torch.device | str | None = None
) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; biases and norms get no weight decay.

    With `cfg.bf16_weights` the model's parameters are moved to `device` and cast to bf16
    here, after their fp32 master copies are taken (see `MasterAdamW`).
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    device = torch.device(device) if device is not None else next(model.parameters()).device
    kwargs = {"lr": cfg.lr, "betas": tuple(cfg.adam_betas), "fused": use_fused(cfg, device)}
    if cfg.bf16_weights:
        opt = MasterAdamW(groups, model, device=device, **kwargs)
    else:
        opt = torch.optim.AdamW(groups, **kwargs)
    if kwargs["fused"]:
        opt.register_step_post_hook(bump_versions)
    return opt


def bump_versions(optimizer: torch.optim.Optimizer, *_) -> None:
    """Mark every parameter the step updated as modified in place: `torch._fused_adamw_`
    writes them without bumping their version counters (the foreach and for-loop steps bump
    them), and what tells changed weights apart by those counters (the vLLM generator's
    weight fingerprint, generation/weights.py) would see the initial weights all run long."""
    from torch.autograd.graph import increment_version

    with torch.no_grad():
        increment_version([p for g in optimizer.param_groups for p in g["params"]])


def use_fused(cfg: TrainConfig, device: torch.device) -> bool | None:
    """`train.fused_adamw`; auto: fused on CUDA, torch's default elsewhere.

    On CPU the fused kernel is 3-4x faster than the default for-loop step (bench/RESULTS.md)
    but rounds differently, so auto leaves CPU runs (the demo's numbers) as they were."""
    if cfg.fused_adamw == "auto":
        return True if device.type == "cuda" else None
    return cfg.fused_adamw or None


class MasterAdamW(torch.optim.AdamW):
    """AdamW over fp32 master copies of a model's (bf16) parameters.

    The optimizer's own parameters are the masters; `model_params` are the model's tensors in
    the same order. The model's parameters are cast to bf16 (and moved to `device`) when this
    is built; `step` folds the model's gradients into the masters, runs AdamW and copies the
    masters back, rounded to nearest.
    """

    def __init__(self, groups: list[dict], model: torch.nn.Module, *, device, **kwargs):
        self.model_params: list[torch.nn.Parameter] = []
        self.load_dtypes: list[torch.dtype] = []
        master_groups = []
        for group in groups:
            masters = []
            for p in group["params"]:
                masters.append(p.detach().to(device=device, dtype=torch.float32, copy=True))
                self.model_params.append(p)
                self.load_dtypes.append(p.dtype)
            master_groups.append({**group, "params": masters})
        super().__init__(master_groups, **kwargs)
        with torch.no_grad():  # every parameter in bf16, frozen ones too
            for p in model.parameters():
                p.data = p.data.to(device=device, dtype=torch.bfloat16)

    def masters(self) -> list[torch.Tensor]:
        return [m for g in self.param_groups for m in g["params"]]

    @torch.no_grad()
    def fold_grads(self) -> None:
        """Add the model's gradients into the fp32 master gradients and free them."""
        adds, masters = [], []
        for p, m in zip(self.model_params, self.masters(), strict=True):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.to(torch.float32)
            else:
                adds.append(p.grad)
                masters.append(m.grad)
            p.grad = None
        if adds:
            torch._foreach_add_(masters, adds)  # fp32 += bf16, exact upcast then fp32 add

    @torch.no_grad()
    def step(self, closure=None):
        self.fold_grads()
        loss = super().step(closure)
        self.copy_to_model()
        return loss

    @torch.no_grad()
    def copy_to_model(self, dtypes: list[torch.dtype] | None = None) -> None:
        """model <- masters: rounded to the model's bf16, or cast to `dtypes` (one each)."""
        masters = self.masters()
        if dtypes is None:
            torch._foreach_copy_(self.model_params, masters)
            return
        for p, m, dtype in zip(self.model_params, masters, dtypes, strict=True):
            p.data = m.to(dtype, copy=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.model_params:
            p.grad = None

    def state_dict(self) -> dict:
        """torch's state dict with each master copy as `state[i]["master"]`."""
        sd = super().state_dict()
        for i, m in enumerate(self.masters()):
            sd["state"][i] = {**sd["state"].get(i, {}), "master": m.detach()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state = {i: dict(e) for i, e in state_dict["state"].items()}
        saved = {i: e.pop("master") for i, e in state.items() if "master" in e}
        super().load_state_dict({**state_dict, "state": {i: e for i, e in state.items() if e}})
        with torch.no_grad():  # no saved master (a checkpoint of a run without bf16 weights):
            for i, (p, m) in enumerate(zip(self.model_params, self.masters(), strict=True)):
                m.copy_(saved.get(i, p))  # else: the weights just loaded into the model
        self.copy_to_model()


def _inner(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer under accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def fold_grads(optimizer) -> None:
    """After a backward: move bf16 gradients into fp32 masters (a no-op without masters)."""
    inner = _inner(optimizer)
    if isinstance(inner, MasterAdamW):
        inner.fold_grads()


def grad_params(optimizer, model: torch.nn.Module) -> Iterable[torch.Tensor]:
    """The tensors holding this step's gradients, to clip: the fp32 masters (gradients folded
    in first) or the model's parameters."""
    inner = _inner(optimizer)
    if isinstance(inner, MasterAdamW):
        inner.fold_grads()
        return inner.masters()
    return model.parameters()


def drop_masters(optimizer, state_dict: dict) -> dict:
    """A saved state for a plain AdamW: the master copies a bf16-weights run saved (a run
    resumed with train.bf16_weights turned off) become the parameters' values, exactly, and
    leave the state."""
    inner = _inner(optimizer)
    if isinstance(inner, MasterAdamW):
        return state_dict
    params = [p for g in inner.param_groups for p in g["params"]]
    state = {i: dict(e) for i, e in state_dict["state"].items()}
    with torch.no_grad():
        for i, entry in state.items():
            if "master" in entry:
                params[i].copy_(entry.pop("master"))
    return {**state_dict, "state": {i: e for i, e in state.items() if e}}


def final_weights(optimizer) -> None:
    """Before saving the final model: the model's parameters become the fp32 masters, in the
    dtype each was loaded in (student.dtype), so bf16 training saves what fp32 training would."""
    inner = _inner(optimizer)
    if isinstance(inner, MasterAdamW):
        inner.copy_to_model(inner.load_dtypes)


def progress(step: int, seconds: float, cfg: TrainConfig, flops: float = 0.0) -> float:
    """Fraction of the post-warmup run done before optimizer step `step` (0-based)."""
    warmup = effective_warmup(cfg)
    span = max(1, cfg.max_steps - warmup)
    done = (step - warmup) / span
    if cfg.max_minutes is not None:
        done = max(done, seconds / (60.0 * cfg.max_minutes))
    if cfg.max_student_flops is not None:
        done = max(done, flops / cfg.max_student_flops)
    return min(1.0, max(0.0, done))


def lr_factor(step: int, seconds: float, cfg: TrainConfig, flops: float = 0.0) -> float:
    """Multiplier of the peak lr for optimizer step `step` after `seconds` of training and
    `flops` of student compute."""
    warmup = effective_warmup(cfg)
    if step < warmup:
        return (step + 1) / warmup
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
