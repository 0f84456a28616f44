"""The student's current weights as (checkpoint name, full tensor) pairs, for an inference
engine that holds its own copy (the vLLM generator).

Names are those of the model's Hugging Face checkpoint (`model.layers.0.self_attn.q_proj.weight`),
which is what an engine's weight loader expects. Under peft LoRA the adapters are merged into
the base weights on the fly (W + scale * B @ A, through peft's own `get_delta_weight`), without
touching the training model; under FSDP2 each sharded parameter is gathered (`full_tensor()`,
a collective: every rank must iterate in the same order), under FSDP1 the full parameters are
summoned for the duration of the iteration. Plain torch and peft only: no engine imports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# wrapper prefixes that FSDP1 and activation checkpointing put into parameter names
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def weights_fingerprint(model: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter is modified in place (optimizer steps bump each tensor's
    version counter; torch's fused AdamW does not, and distil's optimizer bumps them after it:
    train/optim.py `bump_versions`) or replaced; cheap (no data read)."""
    return tuple((id(p), p._version) for p in model.parameters())


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


@torch.no_grad()
def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, full tensor) for every parameter of `model`, LoRA merged, one tensor
    at a time (tied parameters once, under their first name)."""
    base = model.get_base_model() if is_peft_model(model) else model
    deltas = _lora_deltas(base)
    with _fsdp1_full_params(base):
        for name, param in base.named_parameters():
            if ".lora_" in name or "original_module." in name:
                continue  # adapter factors (merged below) and modules_to_save's frozen copy
            tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
            key = _checkpoint_name(name)
            if key in deltas:
                tensor = tensor + deltas.pop(key)()
            yield key, tensor.detach()
    if deltas:  # every LoRA layer's base weight must have been found
        raise RuntimeError(f"LoRA layers whose base weight was not exported: {sorted(deltas)}")


def _checkpoint_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def _lora_deltas(base: torch.nn.Module) -> dict:
    """checkpoint name of each LoRA layer's base weight -> a function computing the summed
    delta of its active, unmerged adapters (computed when needed: one layer's delta at a time)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return {}
    deltas = {}
    for name, module in base.named_modules():
        if not isinstance(module, BaseTunerLayer) or module.merged:
            continue
        adapters = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
        adapters += [
            a for a in module.active_adapters if a in getattr(module, "lora_embedding_A", {})
        ]
        if any(getattr(module, "use_dora", {}).get(a, False) for a in adapters):
            raise NotImplementedError("DoRA adapters cannot be merged for the vLLM generator")
        if adapters:
            deltas[_checkpoint_name(f"{name}.weight")] = _delta_fn(module, adapters)
    return deltas


def _delta_fn(module, adapters):
    def delta() -> torch.Tensor:
        out = module.get_delta_weight(adapters[0])
        for a in adapters[1:]:
            out = out + module.get_delta_weight(a)
        return out

    return delta


@contextlib.contextmanager
def _fsdp1_full_params(model: torch.nn.Module):
    """FSDP1 modules hold flat shards: summon the full parameters (read-only) meanwhile."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # torch built without distributed
        yield
        return
    if not any(isinstance(m, FSDP) for m in model.modules()):
        yield
        return
    with FSDP.summon_full_params(model, writeback=False, recurse=True):
        yield
