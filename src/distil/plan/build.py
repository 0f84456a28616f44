"""`make_plan(cfg, target)`: the models' shapes, every phase on every device, the peak, whether
it fits, and the time a step takes at the target's peak compute and bandwidth."""

from __future__ import annotations

from dataclasses import dataclass, field

from distil.config import DistilConfig
from distil.errors import ConfigError
from distil.plan import phases as ph
from distil.plan import several
from distil.plan.context import context_tokens as context_tokens_of
from distil.plan.shapes import ModelShape, model_shape
from distil.plan.sizes import Sizes, sizes
from distil.plan.target import Target

# phases that run once per micro-batch (the others once per optimizer step)
PER_MICRO = ("teacher scoring", "student fwd/bwd + loss")
SEQ_KD = "teacher generation (seq-KD)"


@dataclass
class DevicePlan:
    name: str
    usable: int
    phases: list[ph.Phase]

    @property
    def peak_phase(self) -> ph.Phase:
        return max(self.phases, key=lambda p: p.peak)

    @property
    def peak(self) -> int:
        return self.peak_phase.peak

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


@dataclass
class Plan:
    target: Target
    student: ModelShape
    teacher: ModelShape | None
    sizes: Sizes
    devices: list[DevicePlan]
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    teachers: list[several.TeacherPlan] = field(default_factory=list)  # teachers.models
    teacher_cache: str | None = None  # teacher.cache: the targets' directory

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    @property
    def worst(self) -> DevicePlan:
        return max(self.devices, key=lambda d: d.peak / max(d.usable, 1))

    @property
    def largest(self):
        """(device, phase, term) of the largest term of the worst device's peak phase."""
        d = self.worst
        phase = d.peak_phase
        return d, phase, max(phase.terms, key=lambda t: t.bytes)

    def step_phases(self) -> list[tuple[str, float]]:
        """(phase, seconds a step spends in it) on the student's device, eval excluded."""
        out = []
        for p in self.devices[0].phases:
            if p.name == "eval":
                continue
            out.append((p.name, p.seconds * (self.sizes.accum if p.name in PER_MICRO else 1)))
        return out

    @property
    def step_seconds(self) -> float:
        return sum(s for _, s in self.step_phases())

    @property
    def tokens_per_step(self) -> int:
        z = self.sizes
        return z.batch * z.seq * z.accum * self.target.gpus

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / max(self.step_seconds, 1e-12)

    @property
    def bound(self) -> str:
        return max(self.step_phases(), key=lambda x: x[1])[0]


def shapes(cfg: DistilConfig) -> tuple[ModelShape, ModelShape | None]:
    """The student's and (when a run loads it) the teacher's shapes, from config.json only: a
    teacher behind a server or a cache is never looked up (a cache's vocabulary comes from its
    manifest, `sizes.cached_vocab`)."""
    if not cfg.student.path:
        raise ConfigError(
            "student.path is not set. Fix: set it to a model directory, a config.json file or "
            "a hub id (distil plan reads only its config.json)"
        )
    s = model_shape(cfg.student.path, key="student.path",
                    trust_remote_code=cfg.student.trust_remote_code)  # fmt: skip
    t = None
    if cfg.teacher.from_student:  # self-distillation: the student's own shape
        return s, s
    if cfg.teacher.path and not cfg.teacher.url and not cfg.teacher.cache:
        t = model_shape(cfg.teacher.path, key="teacher.path",
                        trust_remote_code=cfg.teacher.trust_remote_code)  # fmt: skip
    return s, t


def make_plan(cfg: DistilConfig, target: Target, *, context_tokens: int | None = None) -> Plan:
    """The plan of `cfg` on `target`. `context_tokens`: what privileged context adds to each
    teacher sequence (None: measured on data.train, plan/context.py)."""
    s, t = shapes(cfg)
    ctx, ctx_note = context_tokens_of(cfg, context_tokens)
    teachers: list[several.TeacherPlan] = []
    if cfg.teachers.models:
        teachers = several.teacher_plans(cfg, sizes(cfg, s, None, target, ctx), target)
        t = several.largest(teachers)
    z = sizes(cfg, s, t, target, ctx)
    rank = "cpu" if not target.cuda else "cuda:0" + (" (each rank)" if target.gpus > 1 else "")
    if teachers:
        devices = _several_devices(cfg, z, s, teachers, target, rank)
    else:
        devices = _devices(cfg, z, s, t, target, rank)
    notes = _notes(cfg, s, t, z, target) + ([ctx_note] if ctx_note else [])
    notes += [f"teachers.models.{tp.name}.url: that teacher's memory is the server's, not "
              "planned here" for tp in teachers if tp.kind == "remote"]  # fmt: skip
    notes += several.host_notes(teachers)
    plan = Plan(target, s, t, z, devices, notes=notes, teachers=teachers)
    plan.teacher_cache = cfg.teacher.cache
    for d in devices:
        for p in d.phases:
            p.seconds = max(
                p.flops / (target.tflops * 1e12 or 1), p.bytes_moved / (target.bandwidth or 1)
            )
    return plan


def _devices(cfg: DistilConfig, z: Sizes, s: ModelShape, t: ModelShape | None, target: Target,
             rank: str) -> list[DevicePlan]:  # fmt: skip
    """One teacher (or none): the student's device, and the teacher's when it has its own."""
    apart = _teacher_apart(cfg) and z.teacher_kind == "live"
    main = [
        ph.generation(cfg, z, s, target),
        None if apart else ph.teacher_generation(cfg, z, s, t, target, student_here=True),
        ph.teacher_scoring(cfg, z, s, t, target, model_here=not apart),
        ph.student_step(cfg, z, s, t, target, teacher_here=not apart),
        ph.optimizer_step(cfg, z, s, target),
        ph.evaluation(cfg, z, s, target),
    ]
    main = [p for p in main if p is not None]
    if not apart and z.teacher_kind == "live" and t is not None:
        for p in main:  # the teacher stays on the student's device through every phase
            if p.name not in ("teacher scoring", "student fwd/bwd + loss", SEQ_KD):
                p.add("teacher weights", ph.teacher_weights(cfg, z, t))
    devices = [DevicePlan(rank, target.usable, main)]
    if apart:
        scoring = ph.teacher_scoring(cfg, z, s, t, target, student_here=False)
        writing = ph.teacher_generation(cfg, z, s, t, target, student_here=False)
        phases = [p for p in (writing, scoring) if p is not None]
        devices.append(DevicePlan(f"{cfg.teacher.device} (teacher)", target.usable, phases))
    return devices


def _several_devices(cfg: DistilConfig, z: Sizes, s: ModelShape,
                     teachers: list[several.TeacherPlan], target: Target,
                     rank: str) -> list[DevicePlan]:  # fmt: skip
    """teachers.models: the live teachers on the student's device hold their weights through
    every phase; a teacher with its own `device` gets that device's column."""
    here = [tp for tp in teachers if tp.device is None]
    main = [
        ph.generation(cfg, z, s, target),
        several.writing(cfg, z, s, here, target),
        several.scoring(cfg, z, s, here, target),
        several.student_step(cfg, z, s, teachers, here, target),
        ph.optimizer_step(cfg, z, s, target),
        ph.evaluation(cfg, z, s, target),
    ]
    main = [p for p in main if p is not None]
    for p in main:
        if p.name not in ("teacher scoring", "student fwd/bwd + loss"):
            several.weight_terms(here, p)
    devices = [DevicePlan(rank, target.usable, main)]
    for dev in dict.fromkeys(tp.device for tp in teachers if tp.device is not None):
        on = [tp for tp in teachers if tp.device == dev]
        writing = several.writing(cfg, z, s, on, target, student_here=False)
        scoring = several.scoring(cfg, z, s, on, target, student_here=False)
        phases = [p for p in (writing, scoring) if p is not None]
        if phases:
            names = ", ".join(tp.name for tp in on)
            devices.append(DevicePlan(f"{dev} (teachers {names})", target.usable, phases))
    return devices


def _teacher_apart(cfg: DistilConfig) -> bool:
    dev = cfg.teacher.device
    return bool(dev) and dev not in ("cuda", "cuda:0", "cpu")


def _notes(
    cfg: DistilConfig, s: ModelShape, t: ModelShape | None, z: Sizes, target: Target
) -> list[str]:
    out = []
    for name, shape in (("student", s), ("teacher", t)):
        if shape is not None and not shape.act_traced:
            out.append(
                f"{name} ({shape.model_type}): its decoder layer does not run on the meta device; "
                "activations use a Llama-style count (with the active experts' width for MoE)"
            )
    if cfg.teachers.models and not several.mixed(cfg):
        out.append(
            f"teachers.models ({len(cfg.teachers.models)} teachers, routed): a micro-batch is "
            "planned as if the teacher with the largest scoring peak held all its rows (an "
            "upper bound, as is its time)"
        )
    if z.teacher_kind == "remote":
        out.append("teacher.url: the teacher's memory is the server's, not planned here")
    if z.teacher_kind == "cache" and z.cross and not z.teacher_vocab:
        out.append(
            f"teacher.cache = {cfg.teacher.cache!r} has no readable manifest yet: the "
            "cross-tokenizer loss's teacher vocabulary is not counted (write the cache first)"
        )
    if cfg.loss.compile is True or (cfg.loss.compile == "auto" and target.cuda):
        out.append(
            "loss.compile: a fused chunk holds fewer fp32 copies than the eager count planned "
            "here (an upper bound; measured on CPU, eager)"
        )
    if cfg.generation.backend == "vllm":
        out.append("vLLM reserves gpu_memory_utilization x the device's memory while it samples")
    return out
