"""The rules that tie several values together, each returning the keys involved and a message
with the fix (the derived values are filled first: config/derived.py).

Values and their relations only: whether a name resolves to a plug-in (a task, a loss, a
backend), whether a path exists and what this machine has are asked by `distil.preflight`."""

from __future__ import annotations

import math
from collections.abc import Callable

from distil.config.contexts import has_context, teacher_contexts
from distil.config.output import flatten, to_dict
from distil.config.rules_backends import CHECKS as BACKEND_CHECKS
from distil.config.rules_reward import CHECKS as REWARD_CHECKS
from distil.config.schema import DistilConfig

Check = Callable[[DistilConfig], "tuple[tuple[str, ...], str] | None"]
# rules over generation and teacher backends, and over a task's reward in the loss
_CHECKS: list[Check] = [*BACKEND_CHECKS, *REWARD_CHECKS]


def check(fn: Check) -> Check:
    """Register a rule over several values; it returns (keys involved, message) or None."""
    _CHECKS.append(fn)
    return fn


def semantic_problems(cfg: DistilConfig) -> list[tuple[tuple[str, ...], str]]:
    return [p for fn in _CHECKS if (p := fn(cfg)) is not None]


@check
def _mixed_precision(cfg: DistilConfig):
    """train.bf16 and train.fp16 exclude each other."""
    if cfg.train.bf16 and cfg.train.fp16:
        return ("train.bf16", "train.fp16"), (
            "train.bf16 and train.fp16 are both true; pick one (set the other to false)"
        )
    return None


@check
def _bf16_weights(cfg: DistilConfig):
    """train.bf16_weights excludes train.fp16, LoRA and student.dtype=float16."""
    train, dtype = cfg.train, cfg.student.dtype
    if not train.bf16_weights:
        return None
    if train.fp16:
        return ("train.bf16_weights", "train.fp16"), (
            "train.bf16_weights=true holds the student in bf16 but train.fp16=true asks for "
            "fp16 autocast; pick one (train.fp16=false keeps bf16 weights)"
        )
    if cfg.student.lora.enabled:
        return ("train.bf16_weights", "student.lora.enabled"), (
            "train.bf16_weights=true with student.lora.enabled=true: LoRA already trains fp32 "
            "adapters (peft keeps them in fp32) over a frozen base, which bf16_weights would "
            "round to bf16 for good. Fix: train.bf16_weights=false; for a bf16 base load it "
            "with student.dtype=bfloat16 and set train.bf16=true"
        )
    if dtype == "float16":
        return ("train.bf16_weights", "student.dtype"), (
            "train.bf16_weights=true keeps fp32 master copies of the student's weights, but "
            "student.dtype = 'float16' loads them already rounded to fp16. Fix: "
            "student.dtype=float32 (or bfloat16, or auto for a bf16 checkpoint)"
        )
    return None


def precision_notices(cfg: DistilConfig) -> list[str]:
    """Warnings about a precision the run was asked for but probably did not mean (printed at
    the start of training; the run goes on as configured)."""
    dtype, train = cfg.student.dtype, cfg.train
    if dtype not in ("bfloat16", "float16") or train.bf16_weights or cfg.student.lora.enabled:
        return []
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    return [
        f"student.dtype = {dtype!r} with train.bf16_weights=false and no LoRA: AdamW updates "
        f"the {short} weights in place and keeps {short} moments, so an update smaller than "
        f"about 1/{256 if short == 'bf16' else 2048} of a weight rounds away (at lr 1e-6 most "
        "do). The run goes on as configured. Fix: train.bf16_weights=true (bf16 weights, fp32 "
        "master copies and moments), or student.dtype=auto (fp32 weights for full training)"
    ]


def fp32_on_cuda_note(cfg: DistilConfig, *, cuda: bool) -> str | None:
    """The default precision on a GPU, said once at the start: fp32 weights and no autocast
    (a deliberate default: the same numbers as on a CPU, and what plain AdamW needs; a GPU
    user asks for bf16). None when the run asks for bf16 or fp16, or loads low-precision
    weights (LoRA's frozen base, student.dtype), or is not on CUDA."""
    train, s = cfg.train, cfg.student
    if not cuda or train.bf16 or train.bf16_weights or train.fp16 or s.lora.enabled:
        return None
    if s.dtype not in ("auto", "float32"):
        return None
    return (
        "the student trains with fp32 weights and no autocast (train.bf16 and "
        "train.bf16_weights are false, the defaults): its matmuls run in TF32, at about half "
        "the bf16 rate, and each decoded token reads twice the weight bytes. For speed: "
        "train.bf16_weights=true (bf16 weights and compute, fp32 master copies and AdamW), "
        "or train.bf16=true (bf16 autocast over fp32 weights)"
    )


@check
def _static_cache_under_autocast(cfg: DistilConfig):
    """generation.backend=hf_static with train.bf16 needs bf16 weights (train.bf16_weights), not
    fp32 ones."""
    train = cfg.train
    if not (cfg.generation.backend == "hf_static" and train.bf16 and not train.bf16_weights):
        return None
    if cfg.student.dtype not in ("float32", "auto") or cfg.student.lora.enabled:
        return None  # auto without bf16_weights or LoRA loads fp32 (models/load.py)
    # fp32 weights under autocast: RoPE keeps the keys in fp32 while the values come out of
    # v_proj in bf16, and the static cache holds one dtype for both
    return ("generation.backend", "train.bf16"), (
        "generation.backend = 'hf_static' with train.bf16=true on fp32 weights: under autocast "
        "the keys and values of the student's KV cache come out in different dtypes (fp32 and "
        "bf16), which a static cache cannot hold. Fix: train.bf16_weights=true (bf16 weights, "
        "fp32 master copies; also no weight casts per decoded token), or generation.backend=hf"
    )


@check
def _window_invariant(cfg: DistilConfig):
    """generation.generation_batch_size * generation.num_generations =
    train.per_device_batch_size * train.grad_accum_steps."""
    gen, train = cfg.generation, cfg.train
    window = train.per_device_batch_size * train.grad_accum_steps
    g, n = gen.generation_batch_size, gen.num_generations
    if g is not None and g * n == window:
        return None
    shown = g if g is not None else "unset"
    return (
        ("generation.generation_batch_size", "generation.num_generations"),
        f"generation.generation_batch_size * generation.num_generations must equal "
        f"train.per_device_batch_size * train.grad_accum_steps: {shown} * {n} != "
        f"{train.per_device_batch_size} * {train.grad_accum_steps} = {window}. Fix: set "
        f"generation.num_generations to a divisor of {window}{_divisors(window)} "
        f"and generation.generation_batch_size to {window} / num_generations, or leave "
        f"generation_batch_size null to derive it",
    )


def _divisors(n: int, limit: int = 10**6) -> str:
    """' (1, 2, 4, ...)' for a small n; '' when listing them would take long (n is a product
    of user-given sizes, e.g. 10**11)."""
    if n > limit:
        return ""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    found = sorted({*small, *(n // d for d in small)})
    return f" ({', '.join(map(str, found))})"


def effective_warmup(t) -> int:
    """The warmup the schedule uses: train.warmup_steps, or a tenth of the run (at least one
    step) when it is longer than train.max_steps (a preset shortened by an override), so the
    run still reaches train.lr and has its decay; `warmup_notice` says so."""
    return t.warmup_steps if t.warmup_steps <= t.max_steps else max(1, t.max_steps // 10)


def warmup_notice(cfg: DistilConfig) -> str | None:
    t = cfg.train
    if t.warmup_steps <= t.max_steps:
        return None
    n = effective_warmup(t)
    return (
        f"train.warmup_steps ({t.warmup_steps}) > train.max_steps ({t.max_steps}): the "
        f"learning rate warms up over {n} step{'s' * (n != 1)} (a tenth of the run) instead, "
        "so it reaches train.lr. Set train.warmup_steps to at most train.max_steps to choose"
    )


@check
def _seq_kd_has_slices(cfg: DistilConfig):
    """train.seq_kd needs off-policy slices: train.lambda below 1."""
    t = cfg.train
    if t.seq_kd and t.lambda_ >= 1.0:
        return ("train.seq_kd", "train.lambda"), (
            f"train.seq_kd=true makes the off-policy slices teacher-written, but train.lambda = "
            f"{t.lambda_} draws every slice on-policy, so seq_kd would be ignored. Fix: set "
            "train.lambda below 1 (0 for pure sequence-level KD), or train.seq_kd=false"
        )
    return None


@check
def _slices_hold_whole_groups(cfg: DistilConfig):
    """with 0 < train.lambda < 1, train.per_device_batch_size is a multiple of
    generation.num_generations."""
    # Copies of one prompt must not straddle a micro-batch whose policy may differ.
    n, b = cfg.generation.num_generations, cfg.train.per_device_batch_size
    if 0.0 < cfg.train.lambda_ < 1.0 and b % n != 0:
        return (
            ("train.per_device_batch_size", "generation.num_generations"),
            f"with 0 < train.lambda < 1 each micro-batch is drawn on- or off-policy, so "
            f"train.per_device_batch_size ({b}) must be a multiple of generation.num_generations "
            f"({n}). Fix: set per_device_batch_size to a multiple of {n}, or lambda to 0 or 1",
        )
    return None


@check
def _sft_trains_on_data(cfg: DistilConfig):
    """loss.name=sft trains on data, not on the student's samples: train.lambda=0."""
    if cfg.loss.name == "sft" and cfg.train.lambda_ > 0:
        return ("loss.name", "train.lambda"), (
            f"loss.name = 'sft' trains on completions the student did not write, but "
            f"train.lambda = {cfg.train.lambda_} asks for on-policy slices. Fix: set "
            "train.lambda=0 (dataset completions, or the teacher's with train.seq_kd=true)"
        )
    return None


@check
def _resume_changed_keys(cfg: DistilConfig):
    """train.resume_changed names config keys (or patterns) that exist."""
    import fnmatch

    keys = flatten(to_dict(cfg))
    unknown = [p for p in cfg.train.resume_changed if not fnmatch.filter(keys, p)]
    if unknown:
        return ("train.resume_changed",), (
            f"train.resume_changed names no config key: {', '.join(unknown)}. Fix: list full "
            "keys such as train.lr or loss.beta, or patterns such as teacher.*"
        )
    return None


@check
def _hub_repo_named(cfg: DistilConfig):
    """train.push_to_hub needs train.hub_model_id, the repo it uploads to."""
    if cfg.train.push_to_hub and not cfg.train.hub_model_id:
        return ("train.push_to_hub", "train.hub_model_id"), (
            "train.push_to_hub=true but train.hub_model_id is not set. Fix: set "
            "train.hub_model_id to the Hub repo, e.g. my-org/qwen3-0.6b-distilled"
        )
    return None


@check
def _hybrid_weights(cfg: DistilConfig):
    """loss.matched_weight and loss.unmatched_weight are both set or both null."""
    m, u = cfg.loss.matched_weight, cfg.loss.unmatched_weight
    if (m is None) != (u is None):
        return ("loss.matched_weight", "loss.unmatched_weight"), (
            f"loss.matched_weight ({m}) and loss.unmatched_weight ({u}) must both be set "
            "(fixed weights) or both be null (weights from the matched probability mass)"
        )
    return None


@check
def _teacher_cache_scores_data_only(cfg: DistilConfig):
    """teacher.cache scores dataset completions only: train.lambda=0 and train.seq_kd=false."""
    if not cfg.teacher.cache:
        return None
    if cfg.train.lambda_ > 0 or cfg.train.seq_kd:
        return ("teacher.cache", "train.lambda", "train.seq_kd"), (
            f"teacher.cache = {cfg.teacher.cache!r} holds the teacher's targets for the "
            f"dataset's completions only, but train.lambda = {cfg.train.lambda_} / "
            f"train.seq_kd = {cfg.train.seq_kd} asks for completions written during training, "
            "which the teacher must score live. Fix: train.lambda=0 and train.seq_kd=false, or "
            "drop teacher.cache to use the live teacher"
        )
    return None


@check
def _several_teachers(cfg: DistilConfig):
    """teachers.models replaces teacher.path/cache/url and needs exactly one of
    teachers.column (route rows) and teachers.weights (a mixture of live, full-vocabulary
    teachers, weights >= 0); each teacher is a path, a cache or a url, and a distillation loss
    scores with them (docs/multi-teacher.md)."""
    names, r = list(cfg.teachers.models), cfg.teachers
    if not names:
        if r.column or r.weights or r.map:
            return ("teachers",), (
                "teachers.column/map/weights are set but teachers.models names no teacher. "
                "Fix: add teachers.models"
            )
        return None
    keys = ("teachers",)
    if cfg.teacher.path or cfg.teacher.cache or cfg.teacher.url:
        return keys, (
            "teacher.path/cache/url and teachers.models are both set. Fix: name every teacher "
            "under teachers.models (teacher.path=null)"
        )
    if bool(r.column) == bool(r.weights):
        return keys, (
            f"teachers.models ({', '.join(names)}) need exactly one of teachers.column (each row to "
            "one teacher, by a data column) and teachers.weights (a mixture of all). Fix: set one"
        )
    named = set(r.map.values()) | set(r.weights or {})
    if unknown := sorted(named - set(names)):
        return keys, (
            f"teachers.map/weights name {unknown}, which teachers.models does not define ({', '.join(names)}). "
            "Fix: use those names"
        )
    weights = list((r.weights or {}).values())
    if r.weights is not None and (min(weights, default=0) < 0 or not sum(weights) > 0):
        return keys, f"teachers.weights = {r.weights}: weights are >= 0 with a positive sum"
    for name, t in cfg.teachers.models.items():
        key = f"teachers.models.{name}"
        if t.from_student:
            return keys, (
                f"{key}.from_student = {t.from_student!r}: self-distillation is for one teacher "
                f"(teacher.from_student). Fix: {key}.from_student=null"
            )
        if not (t.path or t.cache or t.url):
            return keys, (
                f"{key}: each teacher is a model (path), a cache or a url. Fix: set {key}.path, "
                f"{key}.cache or {key}.url"
            )
        if t.placement == "shard" and (t.cache or t.url or cfg.train.seq_kd):
            what = (
                "a cache or a server, with no weights here"
                if t.cache or t.url
                else (
                    "train.seq_kd = true: a teacher that writes seq-KD completions is whole "
                    "on each rank's device"
                )
            )
            return (f"{key}.placement",), (
                f"{key}.placement = 'shard' on {what}. Fix: {key}.placement=replicate"
            )
        if r.weights is not None and (t.top_k is not None or t.cache or t.url):
            return keys, (
                f"{key} in a mixture (teachers.weights) with "
                f"{'a cache' if t.cache else 'a url' if t.url else f'top_k = {t.top_k}'}: mixing "
                "adds each teacher's full distribution, and caches, servers and top-k give "
                f"only their top-k (whose supports differ from teacher to teacher). Fix: {key} "
                "a live model with top_k=null, or route rows (teachers.column)"
            )
    if cfg.loss.name == "sft":
        return keys, (
            "loss.name = 'sft' with several teachers: they score rows (distillation losses; "
            "with train.seq_kd each routed row's teacher also writes its completion). Fix: a "
            "distillation loss such as jsd, or one teacher"
        )
    writers = [n for n, t in cfg.teachers.models.items() if t.cache or t.url or not t.path]
    if cfg.train.seq_kd and writers:  # a mixture's are live models (above)
        return ("teachers", "train.seq_kd"), (
            f"train.seq_kd = true with teachers.models.{writers[0]}, a cache or a server: with "
            "seq-KD each routed row's completion is written by its own teacher, a live model. "
            "Fix: route rows (teachers.column) to teachers with a path, or train.seq_kd=false"
        )
    return None


@check
def _offloaded_teachers(cfg: DistilConfig):
    """offload is for a live, replicated teacher of teachers.models that does not write seq-KD
    completions (not for the one `teacher`)."""
    if cfg.teacher.offload:
        return ("teacher.offload",), (
            "teacher.offload = true: offload moves each of several teachers to its device only "
            "while it scores, so that one GPU holds one teacher at a time; one teacher stays "
            "on its device. Fix: teacher.offload=false, or name the teachers under "
            "teachers.models with teachers.models.NAME.offload=true"
        )
    for name, t in cfg.teachers.models.items():
        key = f"teachers.models.{name}.offload"
        if not t.offload:
            continue
        if t.cache or t.url:
            what = f"a cache ({t.cache})" if t.cache else f"a server ({t.url})"
            return (key,), (
                f"{key} = true on {what}: it holds no weights here to offload. Fix: "
                f"{key}=false, or a live teacher (teachers.models.{name}.path)"
            )
        if t.placement != "replicate":
            return (key,), (
                f"{key} = true with teachers.models.{name}.placement = {t.placement!r}: an "
                "offloaded teacher is copied whole to its device. Fix: placement=replicate, "
                f"or {key}=false"
            )
        if cfg.train.seq_kd:
            return (key, "train.seq_kd"), (
                f"{key} = true with train.seq_kd = true: a teacher that writes seq-KD "
                f"completions stays whole on its device. Fix: {key}=false, or "
                "train.seq_kd=false"
            )
    return None


@check
def _self_distillation(cfg: DistilConfig):
    """teacher.from_student leaves teacher.path, cache, url and teachers.models null; current
    and ema need teacher.context or teacher.system."""
    t = cfg.teacher
    if t.from_student is None:
        return None
    keys = ("teacher.from_student",)
    if t.path or t.cache or t.url or cfg.teachers.models:
        return keys, (
            f"teacher.from_student = {t.from_student!r}: the student is the teacher, so "
            "teacher.path, cache, url and teachers.models stay null. Fix: drop them, or "
            "teacher.from_student=null"
        )
    if t.from_student in ("current", "ema") and not (t.context or t.system):
        return keys, (
            f"teacher.from_student = {t.from_student!r} without teacher.context or "
            "teacher.system: the teacher would start as the student on the same prompt, so "
            "every divergence (and gradient) is 0 and it never moves. Fix: give the teacher "
            "privileged context, or teacher.from_student=initial"
        )
    if cfg.loss.name == "sft" and (not cfg.train.seq_kd or t.from_student == "ema"):
        return keys, (
            f"teacher.from_student = {t.from_student!r} with loss.name='sft' and train.seq_kd="
            f"{cfg.train.seq_kd}: with sft the student-teacher only writes (train.seq_kd=true), "
            "and an ema average is kept by a scoring teacher, which sft does not build. Fix: a "
            "distillation loss, or train.seq_kd=true with teacher.from_student=initial or current"
        )
    return None


@check
def _privileged_context(cfg: DistilConfig):
    """teacher.context / teacher.system: a live, remote or cached teacher scores (and with
    seq-KD a live one writes) after the privileged prompt. Several teachers share it, or each
    routed teacher has its own (teachers.models.NAME.context/system, else the shared one); a
    mixture scores every row with every teacher, after one prompt."""
    keys = ("teacher.context", "teacher.system")
    own = teacher_contexts(cfg)
    if cfg.teachers.weights is not None and len(set(own.values())) > 1:
        each = "; ".join(f"{n}: context {c!r}, system {s!r}" for n, (c, s) in own.items())
        return ("teachers",), (
            f"teachers.weights mixes teachers with different privileged contexts ({each}): a "
            "mixture scores every row with every teacher after one teacher prompt. Fix: one "
            "teacher.context/system for all (teachers.models.NAME.context/system null), or "
            "route rows (teachers.column)"
        )
    if not has_context(cfg):
        return None
    if cfg.loss.name == "sft" and not cfg.train.seq_kd:
        return keys, (
            "teacher.context/system with loss.name='sft' and train.seq_kd=false: no teacher "
            "scores or writes. Fix: drop it, or train.seq_kd=true (it writes after the context)"
        )
    return None
