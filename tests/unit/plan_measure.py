"""Measure one real training step's peak memory on CPU and plan the same config (run as a
process of its own: `python plan_measure.py config.json result.json`).

Method: tensor memory above the loaded baseline, read from the kernel. glibc is told to serve
every allocation over 64 KiB with its own mmap and to give freed memory back at once
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, set by the caller before the interpreter
starts), so the resident set follows the live tensors instead of the allocator's caches. After
`distil.train.setup.build` has loaded everything and one warm-up step has run (it creates the
optimizer's states and imports what the step imports), the resident set is the baseline;
writing 5 to /proc/self/clear_refs resets the high-water mark (VmHWM) to it; a second step
runs the real code (`next_window`, the loop's `_accumulate` and `_update`); VmHWM minus the
baseline is the step's peak above what stays loaded. The plan of the same config is compared
to it: its peak less the terms that stay between steps (weights, fp32 masters, LoRA adapters,
optimizer states).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

LOADED_TERMS = (
    "student weights",
    "teacher weights",
    "fp32 master weights",
    "LoRA adapters",
    "optimizer states",
)


def status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """VmHWM := VmRSS (Linux: 5 in clear_refs resets the peak resident set size)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def watch_phases(c) -> dict[str, int]:
    """Record the peak of each phase (above the baseline RSS read later) and reset it when the
    next phase starts: teacher scoring ends when `score` returns, the student's forward and
    backward when the optimizer steps."""
    peaks: dict[str, int] = {}
    base = status("VmRSS")
    score, opt_step = c.teacher.score, c.optimizer.step

    def scored(batch):
        peaks["student fwd/bwd + loss"] = max(peaks.get("student fwd/bwd + loss", 0),
                                              status("VmHWM") - base)  # fmt: skip
        reset_peak()
        out = score(batch)
        peaks["teacher scoring"] = max(peaks.get("teacher scoring", 0), status("VmHWM") - base)
        reset_peak()
        return out

    def stepped(*a, **k):
        peaks["student fwd/bwd + loss"] = max(peaks.get("student fwd/bwd + loss", 0),
                                              status("VmHWM") - base)  # fmt: skip
        reset_peak()
        return opt_step(*a, **k)

    c.teacher.score, c.optimizer.step = scored, stepped
    return peaks


def teacher_weight_bytes(c) -> int:
    """Bytes of the parameters of every teacher model the run loaded (a teacher that is the
    student itself holds none of its own)."""
    own = {p.data_ptr() for p in c.unwrapped.parameters()}
    todo, models = [c.teacher], []
    while todo:
        t = todo.pop()
        todo += list(getattr(t, "teachers", [])) + ([t.live] if hasattr(t, "live") else [])
        if getattr(t, "model", None) is not None and not hasattr(t, "teachers"):
            models.append(t.model)
    seen = {}
    for m in models:
        for p in m.parameters():
            if p.data_ptr() not in own:
                seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def step(c, cfg, accumulate, update) -> None:
    window = c.buffer.next_window()
    sums, _ok, _t1, _t2 = accumulate(c, cfg, window)
    update(c, cfg, sums)


def main(config_path: str, out_path: str) -> None:
    import torch

    from distil.config import build_config
    from distil.plan import make_plan, make_target
    from distil.train.loop import _accumulate, _update
    from distil.train.setup import build

    torch.manual_seed(0)
    cfg = build_config(json.loads(Path(config_path).read_text()))
    c = build(cfg)
    step(c, cfg, _accumulate, _update)  # warm-up: the optimizer's states exist from here on
    gc.collect()
    base = status("VmRSS")
    reset_peak()
    phases = watch_phases(c)
    step(c, cfg, _accumulate, _update)
    phases["optimizer step"] = status("VmHWM") - base
    peak = max(phases.values()) + base
    plan = make_plan(cfg, make_target("cpu", memory="64GiB", tflops=1.0, bandwidth=1e10))
    dev = plan.devices[0]
    terms = {p.name: {t.name: t.bytes for t in p.terms} for p in dev.phases}
    planned = {
        p.name: p.peak - sum(v for k, v in terms[p.name].items() if k.startswith(LOADED_TERMS))
        for p in dev.phases
    }
    result = {
        "measured": peak - base,
        "planned": max(planned.values()),
        "measured_phases": phases,
        "planned_phases": planned,
        "terms": terms,
        "baseline_rss": base,
        "teacher_weights": teacher_weight_bytes(c),
    }
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
