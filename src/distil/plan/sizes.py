"""The numbers a plan is made of, read once from a config, the model shapes and the target.

Lengths are the worst case the config allows: every prompt at `data.max_prompt_tokens`, every
completion at `generation.max_new_tokens` (on-policy) or `data.max_completion_tokens`
(dataset / teacher completions), so a micro-batch has no padding and packing changes only the
rounding to `train.pack_length` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from distil.config import DistilConfig
from distil.losses import is_cross_tokenizer, teacher_runs
from distil.losses.chunked import auto_chunk_size
from distil.plan.memory import nbytes
from distil.plan.shapes import ModelShape
from distil.plan.target import Target


@dataclass(frozen=True)
class Sizes:
    batch: int  # sequences per micro-batch
    accum: int  # micro-batches per optimizer step
    prompt: int
    completion: int
    seq: int  # prompt + completion
    tokens: int  # student tokens per micro-batch (packed rows rounded up)
    loss_rows: int  # loss positions per micro-batch
    gen_rows: int  # sequences sampled per window (0: no on-policy generation)
    seq_kd_rows: int  # sequences the teacher writes per window (seq-KD; worst case: all)
    student_bytes: int  # student weights' element size on the device
    act_bytes: int  # activations' element size
    teacher_bytes: int
    trainable: int  # student parameters AdamW steps
    lora: bool
    master: bool  # train.bf16_weights: fp32 master copies in the optimizer
    chunk_rows: int | None  # loss positions per logits chunk (None: unchunked)
    teacher_rows: int  # teacher scoring positions per fp32 chunk
    teacher_kind: str  # live | cache | remote | none
    cross: bool
    top_k: int | None
    shards: int  # FSDP shards of the student
    context: int = 0  # tokens privileged context adds to each teacher sequence (plan/context.py)
    teacher_vocab: int = 0  # the teacher's vocabulary rows (a cache's, from its manifest)


def resolve_dtype(name: str, shape: ModelShape, target: Target) -> str:
    """`auto`: the checkpoint's dtype on a GPU, fp32 on CPU (as `distil train` loads it)."""
    if name != "auto":
        return name
    return shape.dtype if target.cuda and shape.dtype in ("bfloat16", "float16") else "float32"


def load_dtype(cfg: DistilConfig, shape: ModelShape, target: Target) -> str:
    """The student's dtype as `distil train` loads it (train.setup.student_dtype): `auto` is
    float32 unless AdamW never steps the weights in it (bf16_weights: fp32 masters; LoRA)."""
    s = cfg.student
    if s.dtype == "auto" and not (cfg.train.bf16_weights or s.lora.enabled):
        return "float32"
    return resolve_dtype(s.dtype, shape, target)


def teacher_kind(cfg: DistilConfig) -> str:
    if not teacher_runs(cfg.loss.name, cfg.train.seq_kd):
        return "none"
    if cfg.teacher.cache:
        return "cache"
    if cfg.teacher.url:
        return "remote"
    return "live" if cfg.teacher.path or cfg.teacher.from_student else "none"


def sizes(
    cfg: DistilConfig,
    student: ModelShape,
    teacher: ModelShape | None,
    target: Target,
    context: int = 0,
) -> Sizes:
    t, g = cfg.train, cfg.generation
    on_policy = t.lambda_ > 0
    sampled = on_policy or (t.seq_kd and t.lambda_ < 1)  # the teacher samples seq-KD slices
    dataset = t.lambda_ < 1 and not t.seq_kd
    completion = max(
        g.max_new_tokens if sampled else 0, cfg.data.max_completion_tokens if dataset else 0
    )
    seq = cfg.data.max_prompt_tokens + completion
    tokens = t.per_device_batch_size * seq
    if t.packing and t.pack_length:
        tokens = -(-tokens // t.pack_length) * t.pack_length
    s_dtype = "bfloat16" if t.bf16_weights else load_dtype(cfg, student, target)
    s_bytes = nbytes(s_dtype)
    autocast = t.bf16 or t.bf16_weights or t.fp16
    lora = cfg.student.lora
    trainable = student.lora_params(lora.r, lora.target_modules) if lora.enabled else student.params
    kind = teacher_kind(cfg)
    t_dtype = resolve_dtype(cfg.teacher.dtype, teacher, target) if teacher else "float32"
    if cfg.teacher.from_student:  # a copy of the student as loaded (before bf16_weights casts)
        t_dtype = load_dtype(cfg, student, target)
    chunk = cfg.loss.chunk_size
    if chunk == "auto":
        chunk = auto_chunk_size(student.vocab)
    return Sizes(
        batch=t.per_device_batch_size,
        accum=t.grad_accum_steps,
        prompt=cfg.data.max_prompt_tokens,
        completion=completion,
        seq=seq,
        tokens=tokens,
        loss_rows=t.per_device_batch_size * completion,
        gen_rows=t.per_device_batch_size * t.grad_accum_steps if on_policy else 0,
        seq_kd_rows=t.per_device_batch_size * t.grad_accum_steps
        if t.seq_kd and t.lambda_ < 1
        else 0,
        student_bytes=s_bytes,
        act_bytes=2 if autocast or s_bytes == 2 else 4,
        teacher_bytes=nbytes(t_dtype),
        trainable=trainable,
        lora=lora.enabled,
        master=t.bf16_weights,
        chunk_rows=chunk,
        teacher_rows=auto_chunk_size(teacher.vocab) if teacher else 0,
        teacher_kind=kind,
        cross=is_cross_tokenizer(cfg.loss.name),
        top_k=cfg.teacher.top_k,
        shards=target.gpus if target.fsdp else 1,
        context=context,
        teacher_vocab=teacher.vocab if teacher else cached_vocab(cfg),
    )


def cached_vocab(cfg: DistilConfig) -> int:
    """The vocabulary rows of `teacher.cache`'s targets, from its manifest (0: no readable
    manifest yet); the teacher itself is never looked up."""
    if not cfg.teacher.cache:
        return 0
    from distil.teacher.cache import CacheError, read_manifest

    try:
        return int(read_manifest(cfg.teacher.cache).get("vocab_size") or 0)
    except (CacheError, ValueError, TypeError):
        return 0
