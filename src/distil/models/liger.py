"""Optional Liger kernels on the student (`student.liger: true`, the `liger` extra).

Liger's per-model patches swap the student's RMSNorm and SwiGLU forwards for fused Triton
kernels and its rotary embedding for a fused one (liger-kernel, arXiv 2410.10989). Its fused
linear + cross-entropy forward is not used: distil's losses take the student's hidden states
or logits and apply the head chunk by chunk themselves (`losses/chunked.py`).

Liger's patch also rebinds classes in the model type's modeling module
(`modeling_qwen3.Qwen3RMSNorm = LigerRMSNorm`, `Qwen3MLP = LigerSwiGLUMLP`), so every model of
that type built afterwards (the teacher, loaded after the student) would be built from Liger's
classes. `apply_liger` puts those classes back once the student's own modules are patched: only
the student instance changes. Module-level functions stay patched: the rotary embedding is
looked up at call time, so a teacher of the same model type computes RoPE with the same
(numerically equivalent) kernel.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from distil.errors import ConfigError, require

# what distil asks of Liger's patch for a model type; arguments its patch does not take
# (e.g. swiglu for a GeGLU model) are dropped
KERNELS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def apply_liger(model: torch.nn.Module, device: torch.device | str) -> list[str]:
    """Patch `model` in place with Liger's kernels for its model type; returns their names.

    Raises `MissingExtraError` without the extra and `ConfigError` off CUDA or for a model
    type Liger has no patch for (never a silent no-op)."""
    import inspect

    if torch.device(device).type != "cuda":
        raise ConfigError(
            f"student.liger=true runs Liger's Triton kernels, which need a CUDA GPU; this run's "
            f"device is {torch.device(device).type}. Fix: student.liger=false"
        )
    liger = require("liger_kernel.transformers.monkey_patch", "liger", "student.liger=true")
    model_type = getattr(model.config, "model_type", None)
    patches = liger.MODEL_TYPE_TO_APPLY_LIGER_FN
    if model_type not in patches:
        raise ConfigError(
            f"student.liger=true, but Liger has no kernels for the student's model type "
            f"{model_type!r} (it has: {', '.join(sorted(patches))}). Fix: student.liger=false"
        )
    patch = patches[model_type]
    accepted = inspect.signature(patch).parameters
    kwargs = {k: v for k, v in KERNELS.items() if k in accepted}
    with _classes_kept(model):
        patch(model=model, **kwargs)
    return [k for k, v in kwargs.items() if v]


@contextmanager
def _classes_kept(model: torch.nn.Module):
    """Restore the classes of `model`'s modeling module that the block rebinds."""
    module = sys.modules.get(type(model).__module__)
    names = vars(module) if module is not None else {}
    before = {k: v for k, v in names.items() if isinstance(v, type)}
    try:
        yield
    finally:
        for name, cls in before.items():
            if names.get(name) is not cls:
                setattr(module, name, cls)
