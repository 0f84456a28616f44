"""Several teachers (`teachers.models`, teacher/several.py) in a plan.

Every live teacher's weights stay on its device (the student's, or its own `device`) through
the whole step; a cached or served teacher holds none (its top-k arrives per micro-batch). An
offloaded teacher (`offload`) is on its device only while it scores, one at a time: its weights
are not counted in any phase but scoring, where the largest offloaded teacher's are counted
once; they are in host memory (a note), copied in per micro-batch with rows for it. Per
micro-batch:

- routed (`teachers.column`): only the teachers with rows in it run, each once on its own
  rows, and their targets are written back into one (B, ...) array in row order. The plan
  takes the worst micro-batch: the teacher with the largest scoring peak holding every row,
  next to the assembled array (an upper bound; the time likewise).
- mixed (`teachers.weights`): every teacher with a weight runs on every row, one after the
  other; the others' log-probs (each in its dtype) stay alive while the last one scores, then
  the loss positions are mixed in fp32 a chunk of rows at a time (MixedTeacher.score). Its
  seq-KD writer decodes at most `generation.mixture.MAX_BATCH` rows at once, so each
  teacher's KV cache holds that many rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distil.config import DistilConfig
from distil.generation.mixture import MAX_BATCH
from distil.losses.chunked import auto_chunk_size
from distil.plan import phases as ph
from distil.plan.memory import nbytes
from distil.plan.shapes import ModelShape, model_shape
from distil.plan.sizes import Sizes, resolve_dtype
from distil.plan.target import Target

LOCAL = (None, "", "cuda", "cuda:0", "cpu")  # a teacher `device` that is the student's
PCIE_BPS = 25e9  # host-to-device bytes/s of pinned memory over PCIe gen4 x16 (offload notes)


@dataclass(frozen=True)
class TeacherPlan:
    name: str
    cfg: DistilConfig  # the run's config with `teacher` set to this teacher
    kind: str  # live | cache | remote
    shape: ModelShape | None  # None: no weights here (cache, server)
    sizes: Sizes  # the run's sizes with this teacher's kind, dtype and top-k
    weight: float | None = None  # its mixture weight (None: routed)

    @property
    def offload(self) -> bool:
        return self.kind == "live" and self.cfg.teacher.offload

    @property
    def device(self) -> str | None:
        d = self.cfg.teacher.device
        return None if d in LOCAL else d


def mixed(cfg: DistilConfig) -> bool:
    return cfg.teachers.weights is not None


def teacher_plans(cfg: DistilConfig, z: Sizes, target: Target) -> list[TeacherPlan]:
    """One TeacherPlan per teacher of `teachers.models`, in their order."""
    out = []
    weights = cfg.teachers.weights
    for name, tc in cfg.teachers.models.items():
        one = cfg.model_copy(update={"teacher": tc})
        kind = "cache" if tc.cache else "remote" if tc.url else "live"
        shape = None
        if kind == "live":
            shape = model_shape(tc.path, key=f"teachers.models.{name}.path",
                                trust_remote_code=tc.trust_remote_code)  # fmt: skip
        dtype = resolve_dtype(tc.dtype, shape, target) if shape else "float32"
        zi = replace(z, teacher_kind=kind, teacher_bytes=nbytes(dtype), top_k=tc.top_k,
                     teacher_rows=auto_chunk_size(shape.vocab) if shape else 0)  # fmt: skip
        w = None if weights is None else float(weights.get(name, 0.0))
        out.append(TeacherPlan(name, one, kind, shape, zi, w))
    return out


def largest(plans: list[TeacherPlan]) -> ModelShape | None:
    live = [tp.shape for tp in plans if tp.shape is not None]
    return max(live, key=lambda t: t.params) if live else None


def _weights(tp: TeacherPlan) -> int:
    assert tp.shape is not None
    return ph.teacher_weights(tp.cfg, tp.sizes, tp.shape)


def weight_terms(plans: list[TeacherPlan], phase: ph.Phase, *, scoring: bool = False) -> None:
    """Each resident live teacher's weights, one term apiece; while `scoring`, also the
    largest offloaded teacher that runs (one offloaded teacher on the device at a time)."""
    for tp in plans:
        if tp.shape is not None and not tp.offload:
            phase.add(f"teacher weights ({tp.name})", _weights(tp),
                      f"{tp.shape.params:,} params x {tp.sizes.teacher_bytes} B")  # fmt: skip
    moved = [tp for tp in plans if tp.offload and (tp.weight is None or tp.weight > 0)]
    if scoring and moved:
        tp = max(moved, key=_weights)
        phase.add(f"teacher weights ({tp.name}, offloaded)", _weights(tp),
                  "the largest offloaded teacher, on the device while it scores")  # fmt: skip


def host_notes(plans: list[TeacherPlan]) -> list[str]:
    """Where the offloaded teachers' weights live, and what moving them in costs."""
    moved = [tp for tp in plans if tp.offload]
    if not moved:
        return []
    total = sum(_weights(tp) for tp in moved)
    each = ", ".join(
        f"{tp.name} {_weights(tp) / 1e9:.2f} GB, ~{_weights(tp) / PCIE_BPS:.2f} s a copy"
        for tp in moved
    )
    return [
        f"host memory: offloaded teachers' weights (pinned) {total / 1e9:.2f} GB ({each}); "
        "each is copied to its device per micro-batch with rows for it (a mixture: every "
        f"micro-batch) at ~{PCIE_BPS / 1e9:.0f} GB/s over PCIe gen4, a time not in the step "
        "time here"
    ]


def _alone(tp: TeacherPlan, s: ModelShape, target: Target) -> ph.Phase:
    """One teacher scoring the whole micro-batch, without the student's or its own weights."""
    p = ph.teacher_scoring(tp.cfg, tp.sizes, s, tp.shape, target, student_here=False)
    assert p is not None
    p.terms = [t for t in p.terms if t.name != "teacher weights"]
    return p


def _targets_bytes(tp: TeacherPlan) -> int:
    rows_bt = tp.sizes.batch * (tp.sizes.seq - 1)
    return sum(t.bytes for t in ph.targets_terms(tp.sizes, tp.shape, rows_bt))


def scoring(cfg: DistilConfig, z: Sizes, s: ModelShape, plans: list[TeacherPlan],
            target: Target, *, student_here: bool = True) -> ph.Phase | None:  # fmt: skip
    """The teacher-scoring phase of the teachers in `plans` (those on one device)."""
    running = [tp for tp in plans if tp.weight is None or tp.weight > 0]
    if not running:
        return None
    base = ph.resident(cfg, z, s, target, grads=z.accum > 1) if student_here else []
    p = ph.Phase("teacher scoring", base)
    weight_terms(plans, p, scoring=True)
    alone = {tp.name: _alone(tp, s, target) for tp in running}
    worst = max(running, key=lambda tp: alone[tp.name].peak)
    for term in alone[worst.name].terms:
        p.add(f"{term.name} ({worst.name})", term.bytes, term.note)
    rows_bt = z.batch * (z.seq - 1)
    if mixed(cfg) and len(running) > 1:
        vocab = max(tp.shape.vocab for tp in running if tp.shape is not None)
        others = sum(_targets_bytes(tp) for tp in running) - _targets_bytes(worst)
        p.add("the other teachers' log-probs", others,
              "log T_i of each, in its dtype, alive until the last has scored")  # fmt: skip
        chunk = min(auto_chunk_size(vocab), rows_bt)
        p.add("mixing chunk (fp32)", chunk * vocab * 4 * 3,
              f"{chunk} rows x {vocab:,} x 4 B x 3 (term, running log M, its update)")  # fmt: skip
        p.flops = sum(alone[tp.name].flops for tp in running)
    else:
        if len(running) > 1:
            p.add("routed targets (assembled)", max(_targets_bytes(tp) for tp in running),
                  "every row's targets, written back in row order")  # fmt: skip
        p.flops = alone[worst.name].flops
    p.bytes_moved = sum(alone[tp.name].bytes_moved for tp in running)
    return p


def student_step(cfg: DistilConfig, z: Sizes, s: ModelShape, plans: list[TeacherPlan],
                 here: list[TeacherPlan], target: Target) -> ph.Phase:  # fmt: skip
    """The student's forward/backward holding the micro-batch's targets (the largest form any
    teacher gives) and the weights of the live teachers on its device."""
    big = max(plans, key=_targets_bytes)
    p = ph.student_step(cfg, big.sizes, s, big.shape, target, teacher_here=False)
    weight_terms(here, p)
    return p


def writing(cfg: DistilConfig, z: Sizes, s: ModelShape, plans: list[TeacherPlan],
            target: Target, *, student_here: bool = True) -> ph.Phase | None:  # fmt: skip
    """`train.seq_kd` with the several live teachers of `plans` (one device's: on the
    student's, `weight_terms` adds their weights to each phase; on a teacher device, here).
    Routed: each teacher writes its own rows, planned as
    the teacher with the largest writing peak writing every row (an upper bound). Mixed: every
    teacher with a weight runs at once on every row (generation/mixture.py), each with its
    KV cache, prefill and sampling logits."""
    running = [tp for tp in plans if tp.shape is not None and (tp.weight is None or tp.weight > 0)]
    if not cfg.train.seq_kd or not running:
        return None
    alone = {}
    for tp in running:
        rows = tp.sizes.seq_kd_rows  # a mixture decodes MAX_BATCH rows at a time
        at_once = min(rows, MAX_BATCH) if mixed(cfg) else rows
        sizes = replace(tp.sizes, seq_kd_rows=at_once)
        q = ph.teacher_generation(tp.cfg, sizes, s, tp.shape, target, student_here=False)
        assert q is not None
        q.terms = [t for t in q.terms if t.name != "teacher weights"]
        q.flops *= rows / at_once  # every row is written, in -(-rows // at_once) calls
        q.bytes_moved *= -(-rows // at_once)
        alone[tp.name] = q
    base = ph.resident(cfg, z, s, target, grads=False) if student_here else []
    p = ph.Phase("teacher generation (seq-KD)", base)
    if not student_here:
        weight_terms(plans, p)
    together = running if mixed(cfg) else [max(running, key=lambda tp: alone[tp.name].peak)]
    for tp in together:
        for term in alone[tp.name].terms:
            p.add(f"{term.name} ({tp.name})", term.bytes, term.note)
        p.flops += alone[tp.name].flops
        p.bytes_moved += alone[tp.name].bytes_moved
    return p
