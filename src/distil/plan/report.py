"""A plan as a table a user can act on, or as one JSON object (every term in bytes)."""

from __future__ import annotations

from distil.plan.build import Plan

GB = 1e9


def gb(n: float) -> str:
    return f"{n / GB:.2f} GB" if n < 10 * GB else f"{n / GB:.1f} GB"


def flops_text(f: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.3g} FLOP"


def headline(plan: Plan) -> str:
    """One line: the expected peak against the device's memory, and the largest term."""
    d, phase, term = plan.largest
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    kind = "" if d.name == plan.target.kind else f" ({plan.target.kind})"
    return (
        f"memory plan: peak {gb(d.peak)} of {gb(d.usable)} usable on {d.name}{kind} in "
        f"{phase.name}: {verdict}; largest term: {term.name} {gb(term.bytes)}"
    )


def render(plan: Plan) -> str:
    s, t, z, tg = plan.student, plan.teacher, plan.sizes, plan.target
    lines = [
        f"student {s.path}: {s.params:,} params ({s.model_type}, vocabulary {s.vocab:,})",
    ]
    for tp in plan.teachers:
        how = "mixed, weight " + f"{tp.weight:g}" if tp.weight is not None else "routed"
        size = f"{tp.shape.params:,} params" if tp.shape else "no weights here"
        lines.append(f"teacher {tp.name} ({tp.kind}, {how}): {size}")
    if t is not None and not plan.teachers:
        lines.append(
            f"teacher {t.path}: {t.params:,} params ({t.model_type}, vocabulary "
            f"{t.vocab:,}; {z.teacher_kind})"
        )
    elif z.teacher_kind == "cache" and not plan.teachers:
        vocab = f"vocabulary {z.teacher_vocab:,}" if z.teacher_vocab else "no manifest yet"
        lines.append(f"teacher: top-k targets read from {plan.teacher_cache} ({vocab}; not loaded)")
    lines.append(
        f"micro-batch {z.batch} x {z.seq} tokens (prompt {z.prompt} + completion "
        f"{z.completion}), {z.accum} micro-batches a step, {tg.gpus} x {tg.kind}"
        + (" with FSDP" if tg.fsdp else "")
    )
    for d in plan.devices:
        lines.append("")
        lines.append(f"{d.name}: {gb(d.usable)} usable")
        for p in d.phases:
            mark = "  <- peak" if p is d.peak_phase else ""
            lines.append(f"  {p.name:<26} {gb(p.peak):>10}{mark}")
            for term in sorted(p.terms, key=lambda x: -x.bytes):
                note = f"  {term.note}" if term.note else ""
                lines.append(f"    {term.name:<30} {gb(term.bytes):>10}{note}")
    lines.append("")
    lines.append(headline(plan))
    lines += _speed(plan)
    if plan.suggestions:
        lines.append("to fit, any one of:" if not plan.fits else "with more room to spare:")
        lines += [f"  {s}" for s in plan.suggestions]
    elif not plan.fits:
        lines.append("no single change found that fits; see docs/memory.md")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def rate_text(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def seconds_text(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:,.0f} s"


def _speed(plan: Plan) -> list[str]:
    tg = plan.target
    bw = (
        f"{tg.bandwidth / 1e12:.2f} TB/s"
        if tg.bandwidth >= 1e11
        else f"{tg.bandwidth / 1e9:.1f} GB/s"
    )
    out = [f"time at {tg.tflops:.3g} TFLOP/s and {bw} ({tg.kind}):"]
    for name, seconds in plan.step_phases():
        phase = next(p for p in plan.devices[0].phases if p.name == name)
        out.append(
            f"  {name:<26} {flops_text(phase.flops):>14}  {seconds_text(seconds):>12} a step"
        )
    out.append(
        f"  step: {seconds_text(plan.step_seconds)}, {rate_text(plan.tokens_per_s)} tokens/s at best; "
        f"bounded by {plan.bound}"
    )
    return out


def as_dict(plan: Plan) -> dict:
    d, phase, term = plan.largest
    tg = plan.target
    return {
        "target": {
            "device": tg.kind,
            "memory": tg.memory,
            "usable": tg.usable,
            "gpus": tg.gpus,
            "fsdp": tg.fsdp,
            "tflops": tg.tflops,
            "bandwidth": tg.bandwidth,
        },
        "student": {
            "path": plan.student.path,
            "params": plan.student.params,
            "vocab": plan.student.vocab,
        },
        "teacher": None
        if plan.teacher is None
        else {
            "path": plan.teacher.path,
            "params": plan.teacher.params,
            "vocab": plan.teacher.vocab,
            "kind": plan.sizes.teacher_kind,
        },
        "teachers": [
            {
                "name": tp.name,
                "kind": tp.kind,
                "weight": tp.weight,
                "device": tp.device,
                "params": tp.shape.params if tp.shape else 0,
            }
            for tp in plan.teachers
        ],
        "devices": [
            {
                "name": dev.name,
                "usable": dev.usable,
                "peak": dev.peak,
                "peak_phase": dev.peak_phase.name,
                "fits": dev.fits,
                "phases": [
                    {
                        "name": p.name,
                        "peak": p.peak,
                        "flops": p.flops,
                        "seconds": p.seconds,
                        "terms": [x.as_dict() for x in p.terms],
                    }
                    for p in dev.phases
                ],
            }
            for dev in plan.devices
        ],
        "fits": plan.fits,
        "peak": d.peak,
        "largest": {"device": d.name, "phase": phase.name, **term.as_dict()},
        "step": {
            "seconds": plan.step_seconds,
            "tokens": plan.tokens_per_step,
            "tokens_per_s": plan.tokens_per_s,
            "bound": plan.bound,
        },
        "suggestions": plan.suggestions,
        "notes": plan.notes,
    }
