"""The changes that bring a plan under its budget, each checked by planning again with it.

A suggestion is a line a user can paste: `key=value` overrides for `distil train`, or the
launch flags of `distil plan` (`--gpus N --fsdp`) that stand for an FSDP launch. Candidates are
tried one at a time, cheapest to the run's algorithm first (micro-batch size with the window
kept, gradient checkpointing, the loss chunk, LoRA, where the teacher runs, FSDP); when none
fits alone, they are combined in that order until the plan fits.
"""

from __future__ import annotations

from dataclasses import replace

from distil.config import DistilConfig, apply_overrides, build_config, to_dict
from distil.errors import DistilError
from distil.losses import is_cross_tokenizer, needs_teacher, teacher_runs
from distil.plan.build import Plan, make_plan
from distil.plan.target import Target

SHOWN = 5


def with_overrides(cfg: DistilConfig, overrides: list[str]) -> DistilConfig:
    raw = to_dict(cfg)
    return build_config(raw, apply_overrides(raw, overrides))


def candidates(cfg: DistilConfig, target: Target) -> list[list[str]]:
    """Changes worth trying for this config, as override lists ('--gpus N --fsdp' for FSDP)."""
    t, out = cfg.train, []
    b, window = t.per_device_batch_size, t.per_device_batch_size * t.grad_accum_steps
    while b > 1:  # smaller micro-batches, the same window (and so the same gradients)
        b //= 2
        if window % b == 0:
            out.append(
                [f"train.per_device_batch_size={b}", f"train.grad_accum_steps={window // b}"]
            )
    if not cfg.student.gradient_checkpointing:
        out.append(["student.gradient_checkpointing=true"])
    if cfg.loss.chunk_size is None:
        out.append(["loss.chunk_size=auto"])
    elif cfg.loss.chunk_size != "auto" and cfg.loss.chunk_size > 256:
        out.append(["loss.chunk_size=256"])
    out += _teacher(cfg, target)
    g = cfg.generation
    if g.backend == "vllm" and t.lambda_ > 0:
        if g.vllm.sleep_level == 0:
            out.append(["generation.vllm.sleep_level=1"])
        if g.vllm.gpu_memory_utilization > 0.2:
            out.append(["generation.vllm.gpu_memory_utilization=0.2"])
    if not cfg.student.lora.enabled:
        out.append(["student.lora.enabled=true"])
    if target.cuda and not target.fsdp:
        out += [[f"--gpus {n} --fsdp"] for n in (2, 4, 8) if n >= target.gpus]
    return out


def _teacher(cfg: DistilConfig, target: Target) -> list[list[str]]:
    tc = cfg.teacher
    runs = teacher_runs(cfg.loss.name, cfg.train.seq_kd)
    live = tc.path and not (tc.cache or tc.url) and runs
    if not live:
        return []
    out = []
    cross = is_cross_tokenizer(cfg.loss.name)
    if tc.top_k is None and not cross and needs_teacher(cfg.loss.name):
        out.append(["teacher.top_k=64"])
    if target.cuda and not tc.device:
        out.append(["teacher.device=cuda:1"])
    if not cross or cfg.loss.name == "sampled_chunk_reverse_kl":
        k = [] if tc.top_k else ["teacher.top_k=64"]
        out.append(["teacher.url=http://HOST:8000/v1", *k])
    if cfg.train.lambda_ == 0 and not cfg.train.seq_kd and needs_teacher(cfg.loss.name):
        k = [] if tc.top_k else ["teacher.top_k=64"]
        out.append(["teacher.cache=DIR", *k])
    return out


def parse_change(line: str) -> list[str]:
    """A suggestion line back into its changes ('--gpus N --fsdp' stays one)."""
    parts, out = line.split(), []
    while parts:
        if parts[0] == "--gpus":
            out.append(" ".join(parts[:3]))
            parts = parts[3:]
        else:
            out.append(parts.pop(0))
    return out


def replan(
    cfg: DistilConfig, target: Target, change: list[str], context_tokens: int | None = None
) -> Plan | None:
    """The plan with `change` applied, or None when the change makes an invalid config
    (`context_tokens`: the first plan's, so the context is not measured again)."""
    overrides = [c for c in change if not c.startswith("--")]
    for flag in (c for c in change if c.startswith("--gpus")):
        target = replace(target, gpus=int(flag.split()[1]), fsdp=True)
    try:
        changed = with_overrides(cfg, overrides) if overrides else cfg
        return make_plan(changed, target, context_tokens=context_tokens)
    except DistilError:
        return None


def suggest(cfg: DistilConfig, target: Target, plan: Plan) -> list[str]:
    """Up to SHOWN changes, each a pasteable line, under which the plan fits (none if it fits)."""
    if plan.fits:
        return []
    found, tried = [], candidates(cfg, target)
    for change in tried:
        p = replan(cfg, target, change, plan.sizes.context)
        if p is not None and p.fits:
            found.append(" ".join(change))
            if len(found) == SHOWN:
                break
    if found:
        return found
    combined: list[str] = []
    best = plan.worst.peak
    for change in tried:  # greedy: keep each change that lowers the peak, until it fits
        if any(c.startswith("--gpus") for c in change) and any(
            c.startswith("--gpus") for c in combined
        ):
            continue
        trial = merge(combined, change)
        p = replan(cfg, target, trial, plan.sizes.context)
        if p is not None and p.worst.peak < best:
            combined, best = trial, p.worst.peak
            if p.fits:
                return [" ".join(combined)]
    return []


def merge(changes: list[str], more: list[str]) -> list[str]:
    """`changes` then `more`, a key set twice keeping its last value (in its first place)."""
    out: dict[str, str] = {}
    for change in [*changes, *more]:
        key = change.split("=", 1)[0] if "=" in change else change.split()[0]
        out[key] = change
    return list(out.values())
