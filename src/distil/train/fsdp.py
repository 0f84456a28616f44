"""FSDP2 (`torch.distributed.fsdp.fully_shard`) through accelerate: what distil adds around it.

accelerate shards the student in `prepare` when `accelerate launch --config_file
configs/accelerate/fsdp_*.yaml` sets `ACCELERATE_USE_FSDP=true` (FSDP_* variables carry the
plugin's settings). distil adds four things:

- the same FSDP2 code path on CPU processes (gloo), which accelerate only sets up for GPUs, so
  that CI proves FSDP == DDP on a CPU machine (`enable_fsdp_on_cpu`);
- full weights for generation: every rank all-gathers every shard once, generates with plain
  local forwards (no collective per token, so ranks may stop at different lengths), then frees
  the gathered copies (`full_weights`, `GatheringGenerator`);
- a live teacher sharded like the student (`shard_teacher`, `teacher.placement=shard`);
- full (unsharded) model and optimizer state dicts for checkpoints, keyed exactly like a
  single process's `optimizer.state_dict()`, so that a checkpoint written under FSDP resumes
  under DDP or in one process and the reverse (`full_optimizer_state`, `load_full_state`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from distil.errors import ConfigError

if TYPE_CHECKING:
    from distil.config import DistilConfig


def fsdp_requested() -> bool:
    """True when the launcher asked for FSDP (`distributed_type: FSDP` in the accelerate config)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_fsdp_version() -> None:
    version = os.environ.get("FSDP_VERSION", "1")
    if fsdp_requested() and version != "2":
        raise ConfigError(
            f"the accelerate config asks for FSDP version {version}; distil supports FSDP2 "
            "(`fully_shard`) only. Fix: set `fsdp_version: 2` under fsdp_config in the "
            "accelerate config file (see configs/accelerate/fsdp_8gpu.yaml)"
        )


def fsdp_plugin(precision: str):
    """accelerate's FSDP plugin (the launcher's FSDP_* variables) with distil's mixed-precision
    policy: parameters all-gathered and computed in bf16 (fp16), gradients reduce-scattered and
    accumulated in fp32. accelerate's own `set_mixed_precision("bf16")` reduces in bf16 too,
    which rounds every rank's contribution and every no_sync accumulation to 8 bits."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    if precision != "no":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        low = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        plugin.mixed_precision_policy = MixedPrecisionPolicy(
            param_dtype=low, reduce_dtype=torch.float32, output_dtype=low
        )
    return plugin


def enable_fsdp_on_cpu(accelerator, precision: str) -> None:
    """Turn accelerate's CPU process group (MULTI_CPU, gloo) into the FSDP2 path.

    accelerate selects FSDP only for GPU process groups; `fully_shard` itself runs on CPU with
    gloo, and everything after the state's `distributed_type` (prepare, state dicts, clipping,
    no_sync) is accelerate's ordinary FSDP2 code, so a CPU run exercises what a GPU run does.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    state = AcceleratorState()
    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = fsdp_plugin(precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def check_launch(cfg: DistilConfig) -> None:
    """What an FSDP or DeepSpeed launch (the accelerate config's environment) cannot do."""
    check_fsdp_version()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise ConfigError(
            "this run was launched with DeepSpeed (distributed_type: DEEPSPEED in the "
            "accelerate config). distil's loop accumulates gradients over a window and steps "
            "the optimizer itself, which the DeepSpeed engine does on its own; it is not "
            "supported. Fix: launch with FSDP2, which shards the same way: "
            "configs/accelerate/fsdp_8gpu.yaml (ZeRO-3: parameters, gradients, optimizer "
            "states) or configs/accelerate/fsdp_zero2_8gpu.yaml (ZeRO-2: gradients and "
            "optimizer states); docs/scaling-out.md"
        )
    for key, t in _teacher_sections(cfg):
        if t.placement == "shard" and not fsdp_requested():
            raise ConfigError(
                f"{key}.placement = 'shard' shards the teacher with FSDP, but this run was not "
                "launched with FSDP. Fix: launch with accelerate launch --config_file "
                "configs/accelerate/fsdp_8gpu.yaml (or another FSDP config), or set "
                f"{key}.placement=replicate"
            )
        if t.placement == "shard" and t.device:
            raise ConfigError(
                f"{key}.device = {t.device!r} with {key}.placement = 'shard': a sharded "
                f"teacher lives on every rank's own device. Fix: unset {key}.device, or set "
                f"{key}.placement=replicate to keep a whole teacher on that device"
            )
    if fsdp_requested() and cfg.student.lora.enabled:
        raise ConfigError(
            "student.lora.enabled = true under FSDP: distil merges LoRA adapters into the final "
            "model on one process, which a sharded model does not allow yet. Fix: train LoRA "
            "with DDP (configs/accelerate/ddp_8gpu.yaml), or train all weights under FSDP"
        )
    if fsdp_requested() and cfg.generation.async_:
        raise ConfigError(
            "generation.async = true under FSDP: the background sampler needs a whole copy of "
            "the student's weights, which a sharded student does not keep. Fix: set "
            "generation.async=false under FSDP, or launch with DDP "
            "(configs/accelerate/ddp_8gpu.yaml)"
        )


def _teacher_sections(cfg: DistilConfig) -> list[tuple[str, Any]]:
    """(config key, teacher section) of the run's teacher and of each of teachers.models."""
    return [("teacher", cfg.teacher)] + [
        (f"teachers.models.{name}", t) for name, t in cfg.teachers.models.items()
    ]


def report_sharding(accelerator, student, teacher, several: dict | None = None) -> None:
    """One line on the main process saying what FSDP sharded (nothing under DDP); `several`:
    teachers.models' live models by name."""
    if not accelerator.is_main_process or not is_sharded(student):
        return
    n = accelerator.num_processes
    parts = [f"FSDP2: student sharded over {n} processes ({count_units(student)} units)"]
    if teacher is not None and is_sharded(teacher):
        parts.append(f"teacher sharded ({count_units(teacher)} units)")
    elif teacher is not None:
        parts.append("teacher replicated on every rank")
    for name, m in (several or {}).items():
        how = f"sharded ({count_units(m)} units)" if is_sharded(m) else "replicated on every rank"
        parts.append(f"teacher {name} {how}")
    print("; ".join(parts), flush=True)


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def count_units(model) -> int:
    """How many FSDP units (all-gather groups) `model` has."""
    return len(_fsdp_modules(model))


def _fsdp_modules(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_weights(model) -> Iterator[None]:
    """Every FSDP unit of `model` all-gathered for the duration; sharded again on exit.

    Inside, forwards are local (`reshard_after_forward` off), so `generate` runs as many steps
    as this rank needs without a collective per token. Every rank must enter together (the
    all-gathers are collectives); a model that is not sharded passes through unchanged.
    """
    modules = _fsdp_modules(model)
    if not modules:
        yield
        return
    # the settings accelerate chose per unit (blocks reshard, the root and tail do not)
    saved = [
        (m._get_fsdp_state(), [(g, g.post_forward_mesh_info) for g in _groups(m)]) for m in modules
    ]
    auto = [s._auto_reshard_after_forward for s, _ in saved]
    model.set_reshard_after_forward(False, recurse=True)
    try:
        for m in modules:
            m.unshard()
        yield
    finally:
        if is_sharded(model):
            # reshards every unit and drops the forward order these forwards recorded (the
            # next backward's prefetch reads it; after a rank-0-only evaluation the ranks'
            # orders would differ). Nothing is in flight: generation runs between steps.
            model.reset_iter_state()
        else:
            for m in modules:
                m.reshard()
        for (state, groups), a in zip(saved, auto, strict=True):
            state._auto_reshard_after_forward = a
            for g, info in groups:
                g.post_forward_mesh_info = info


def _groups(module) -> list:
    return list(module._get_fsdp_state()._fsdp_param_groups)


class GatheringGenerator:
    """A Generator over a sharded model: `generate` runs inside `full_weights(model)`.

    Everything else (`sync_weights`, `calls`, ...) is the wrapped generator's.
    """

    def __init__(self, inner, model):
        self.inner = inner
        self.model = model

    def generate(self, prompt_ids, params):
        with full_weights(self.model):
            return self.inner.generate(prompt_ids, params)

    def worker_copy(self) -> GatheringGenerator:
        """The copy another thread samples with (`generation.async`): still gathering, around
        the inner generator's own worker copy (or a plain copy of it). Defined here, not
        forwarded, so the copy never loses the gathering."""
        make = getattr(self.inner, "worker_copy", None)
        return GatheringGenerator(make() if make is not None else copy.copy(self.inner), self.model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def shard_teacher(model, accelerator) -> None:
    """Shard a frozen teacher over the ranks like the student (one FSDP unit per decoder layer,
    then the root), in place. It is used for forwards only, so no optimizer is involved."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.requires_grad_(False)
    model.to(accelerator.device)
    layers = set(getattr(model, "_no_split_modules", None) or [])
    mp = accelerator.state.fsdp_plugin.mixed_precision_policy or MixedPrecisionPolicy()
    for module in list(model.modules())[1:]:
        if type(module).__name__ in layers:
            fully_shard(module, mp_policy=mp)
    fully_shard(model, mp_policy=mp, reshard_after_forward=True)


# ----------------------------------------------------------------------------- state dicts


def _full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(accelerator, model) -> dict[str, torch.Tensor]:
    """`accelerator.get_state_dict(model)` (whole on rank 0 under FSDP; a collective), without
    the second name of tied weights: the gathered copies no longer share storage, so without
    this `lm_head.weight` would be written next to `embed_tokens.weight`."""
    sd = accelerator.get_state_dict(model)
    unwrapped = accelerator.unwrap_model(model)
    if not is_sharded(unwrapped):
        return sd
    every = {n for n, _ in unwrapped.named_parameters(remove_duplicate=False)}
    tied = every - {n for n, _ in unwrapped.named_parameters()}
    return {k: v for k, v in sd.items() if k not in tied}


def full_optimizer_state(model, optimizer) -> dict[str, Any]:
    """The whole optimizer state on rank 0 ({} elsewhere), keyed by parameter index like
    `torch.optim.Optimizer.state_dict()` of an unsharded run. A collective: all ranks call it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from distil.train.optim import _inner

    inner = _inner(optimizer)  # under accelerate's wrapper
    if not inner.state:
        # before any optimizer step (grpo's first windows skipped: reward.skip_flat), torch
        # would make the state by a zero-lr step, which AdamW counts: its bias correction
        # would then shrink the first real update. The empty state is the state (every rank
        # skips the same windows, so none calls the collective).
        return inner.state_dict()
    sd = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    if not sd:
        return {}
    index = {fqn: i for i, fqn in enumerate(_fqn_order(sd["param_groups"]))}
    groups = []
    for g in sd["param_groups"]:
        groups.append({**g, "params": [index[f] for f in g["params"]]})
    return {"state": {index[f]: s for f, s in sd["state"].items()}, "param_groups": groups}


def _fqn_order(groups: list[dict]) -> list[str]:
    return [fqn for g in groups for fqn in g["params"]]


def load_full_state(model, optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load full (unsharded) state dicts into a sharded model and its optimizer; each rank
    keeps its shard. `optim_sd` is index-keyed (as `full_optimizer_state` returns)."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, model_sd, options=_full_options(strict=False))
    if not optim_sd["state"]:  # saved before any optimizer step: a new optimizer is that state
        return
    # the parameter names in optimizer order, from this run's own (empty) optimizer
    names = _fqn_order(get_optimizer_state_dict(model, optimizer)["param_groups"])
    by_name = {
        "state": {names[int(i)]: s for i, s in optim_sd["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in optim_sd["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=_full_options())
