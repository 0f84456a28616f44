"""Build what the loop needs from a resolved config: accelerator, models, teacher, buffer, loss.

Kept apart from `loop.py` so the loop reads top to bottom without construction details. The
teacher scorer is chosen in `distil.teacher.select`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from distil.config import DistilConfig
from distil.data.collate import collate
from distil.data.lengths import check_lengths, uses_completions
from distil.errors import ConfigError, require
from distil.generation.base import SamplingParams
from distil.generation.select import build_generator, teacher_backend
from distil.losses import needs_teacher
from distil.losses.chunked import auto_chunk_size
from distil.models.load import (
    as_loaded,
    enable_tf32,
    load_model,
    load_tokenizer,
    place_model,
    resolve_dtype,
)
from distil.models.tokenizers import (
    EncodedPrompts,
    completion_rows,
    encode_prompts,
    id_rows,
    prompt_format,
    stop_token_ids,
)
from distil.teacher.select import Rows, build_scorer, loads_teacher_model
from distil.teacher.several import row_contexts
from distil.train.buffer import GenerationBuffer, PromptSide
from distil.train.fsdp import (
    GatheringGenerator,
    check_launch,
    enable_fsdp_on_cpu,
    fsdp_plugin,
    fsdp_requested,
    is_sharded,
    report_sharding,
    shard_teacher,
)
from distil.train.notices import memory_plan, print_completion_warnings, print_notices
from distil.train.optim import build_optimizer
from distil.train.reward import build_rewards, reward_loss, sampler_rows
from distil.train.several import several_teachers, several_write, writers_side
from distil.train.step import check_bypassed_logits
from distil.train.trackers import log_with


@dataclass
class Components:
    accelerator: Any
    model: Any  # prepared (possibly DDP-wrapped) student
    unwrapped: Any
    tokenizer: Any
    teacher: Any  # TeacherScorer
    optimizer: torch.optim.Optimizer
    buffer: GenerationBuffer
    loss_fn: Any
    loss_opts: dict[str, Any]
    vocab_size: int | None
    examples: list
    cross: Any = None  # CrossTokenizer for cross-tokenizer losses
    planned_peak: int | None = None  # bytes `distil plan` expects on this device (None: no plan)


def build_accelerator(cfg: DistilConfig):
    from accelerate import Accelerator

    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    bf16 = cfg.train.bf16 or cfg.train.bf16_weights  # bf16 weights run under bf16 autocast too
    precision = "bf16" if bf16 else "fp16" if cfg.train.fp16 else "no"
    if precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("train.fp16=true needs a CUDA GPU. Fix: use train.bf16=true on CPU")
    trackers = log_with(cfg)  # a missing extra stops here, named
    # accelerate keeps one process-wide state; a second run in the same process (the demo, a
    # notebook) may ask for another precision. The process group (PartialState) is kept.
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    check_launch(cfg)
    if cfg.train.bf16_weights and fsdp_requested():
        raise ConfigError(
            "train.bf16_weights=true under FSDP: FSDP keeps its own sharded parameters and "
            "mixed-precision policy, which distil's fp32 master copies would bypass. Fix: "
            "train.bf16_weights=false with train.bf16=true (FSDP casts the shards for compute)"
        )
    # cpu=True on a machine without CUDA: under torchrun, accelerate then sets up gloo across
    # the processes (without it every process trains alone on its shard)
    on_gpu = torch.cuda.is_available()
    accelerator = Accelerator(
        mixed_precision=precision,
        log_with=trackers,
        project_dir=cfg.train.output_dir,
        cpu=not on_gpu,
        # FSDP on GPUs: gradients reduced in fp32 (on CPU processes: enable_fsdp_on_cpu)
        fsdp_plugin=fsdp_plugin(precision) if fsdp_requested() and on_gpu else None,
    )
    if fsdp_requested():
        enable_fsdp_on_cpu(accelerator, precision)
    return accelerator


def _load(section, name: str, device=None, dtype: str | None = None, given=None):
    """(model, tokenizer) of the `student` or `teacher` config section; `dtype` overrides the
    section's (an `auto` already resolved). `given`: the side's model already loaded (the
    Python API), used in place of loading the weights, cast to the dtype and moved to `device`
    as a loaded one would be; its section's path holds its config.json and tokenizer."""
    # a tokenizer defaulted from the model path is reported under the key the user set
    key = f"{name}.path" if section.tokenizer == section.path else f"{name}.tokenizer"
    tok = load_tokenizer(section.tokenizer, key=key, trust_remote_code=section.trust_remote_code)
    if given is not None:
        given = as_loaded(given, section.attn_implementation, key=name)
        dtype = resolve_dtype(dtype or section.dtype, section.path, device)
        return place_model(given, dtype, device, key=name), tok
    model = load_model(
        section.path,
        key=f"{name}.path",
        dtype=dtype or section.dtype,
        attn_implementation=section.attn_implementation,
        device=device,
        trust_remote_code=section.trust_remote_code,
    )
    return model, tok


def student_dtype(cfg: DistilConfig, device) -> str:
    """student.dtype as loaded for a run on `device`. auto: the checkpoint's dtype on CUDA
    where AdamW never updates those weights in it (train.bf16_weights: fp32 master copies;
    LoRA: a frozen base), float32 otherwise: plain AdamW on bf16 weights and moments loses
    the small updates (rules.precision_notices)."""
    s = cfg.student
    if s.dtype == "auto" and not (cfg.train.bf16_weights or s.lora.enabled):
        return "float32"
    return resolve_dtype(s.dtype, s.path, device)


def load_student(cfg: DistilConfig, accelerator, given=None):
    s = cfg.student
    model, tok = _load(s, "student", dtype=student_dtype(cfg, accelerator.device), given=given)
    model.config.use_cache = False  # packed/training forwards must not build a KV cache
    if s.liger:
        from distil.models.liger import apply_liger

        apply_liger(model, accelerator.device)
    if s.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if s.lora.enabled:
        peft = require("peft", "peft", "student.lora.enabled=true")
        lora = peft.LoraConfig(
            r=s.lora.r,
            lora_alpha=s.lora.alpha,
            lora_dropout=s.lora.dropout,
            target_modules=s.lora.target_modules,
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, lora)
    if cfg.loss.chunk_size is not None:  # the chunked loss applies the head and what follows
        check_bypassed_logits(model)  # before accelerate wraps the forward in autocast
    return model, tok


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in backward (non-reentrant), under either transformers name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_teacher(cfg: DistilConfig, accelerator, given=None):
    """The live teacher: whole on `teacher.device` (default: the rank's device), or sharded
    over the ranks with `teacher.placement=shard` under FSDP; `given`: already loaded."""
    if cfg.teacher.placement == "shard":
        dtype = resolve_dtype(cfg.teacher.dtype, cfg.teacher.path, accelerator.device)
        model, tok = _load(cfg.teacher, "teacher", dtype=dtype, given=given)
        shard_teacher(model, accelerator)
        return model, tok
    device = cfg.teacher.device or accelerator.device
    if cfg.teacher.offload:  # loaded in host memory, in its device's dtype (teacher/offload.py)
        if given is not None:  # a teachers.models entry is never given; refuse, not ignore
            raise ConfigError(
                "teacher.offload=true with a teacher passed loaded: offload applies to the "
                "teachers of teachers.models, loaded from their paths. Fix: teacher.offload="
                "false, or name the teachers under teachers.models with their paths"
            )
        dtype = resolve_dtype(cfg.teacher.dtype, cfg.teacher.path, device)
        return _load(cfg.teacher, "teacher", dtype=dtype, given=given)
    return _load(cfg.teacher, "teacher", device=device, given=given)


def _live_models(cfg: DistilConfig, teacher) -> dict | None:
    """teachers.models' live models by name (a cache or a server has none); None: one teacher."""
    if not cfg.teachers.models:
        return None
    scorers = zip(cfg.teachers.models, teacher.teachers, strict=True)
    return {n: s.model for n, s in scorers if getattr(s, "model", None) is not None}


def gathering(generator, model):
    """`generator` as is, or, for a sharded model, one that generates on gathered weights."""
    return GatheringGenerator(generator, model) if is_sharded(model) else generator


def _chunk_size(cfg: DistilConfig, vocab_size: int | None, student) -> int | None:
    """`loss.chunk_size`, with `auto` resolved from the student's (kept) vocabulary."""
    if cfg.loss.chunk_size != "auto":
        return cfg.loss.chunk_size
    return auto_chunk_size(vocab_size or student.get_output_embeddings().weight.shape[0])


def _loss_opts(cfg: DistilConfig, vocab_size: int | None, student, device) -> dict[str, Any]:
    """The loss function's options of the run (besides ce_weight, set per micro-batch)."""
    return {
        "temperature": cfg.loss.temperature,
        "targets_temperature": cfg.loss.temperature,
        "beta": cfg.loss.beta,
        "chunk_size": _chunk_size(cfg, vocab_size, student),
        "compile_backend": _compile_backend(cfg, device),
        "matched_weight": cfg.loss.matched_weight,
        "unmatched_weight": cfg.loss.unmatched_weight,
    }


def _compile_backend(cfg: DistilConfig, device) -> str | None:
    """`loss.compile` as the chunked loss's torch.compile backend (None: eager)."""
    on = cfg.loss.compile if cfg.loss.compile != "auto" else torch.device(device).type == "cuda"
    return "inductor" if on else None


def tokenize_examples(cfg: DistilConfig, examples, tok) -> Rows:
    """(prompt ids, completion ids) of every example in student tokens: each prompt's last
    `data.max_prompt_tokens`, each dataset completion by `reference_ids` (None when absent)."""
    fmt = prompt_format(cfg.data)
    prompt_ids = EncodedPrompts(
        tok,
        [e.prompt for e in examples],
        max_tokens=cfg.data.max_prompt_tokens,
        name="student tokenizer",
        fmt=fmt,
        where=[e.meta.get("_where") for e in examples],
    )
    return prompt_ids, completion_rows(tok, examples, cfg.data.max_completion_tokens, fmt)


def build_buffer(
    cfg: DistilConfig,
    examples,
    rows: Rows,
    tok,
    generator,
    teacher_model,
    teacher_tok,
    accelerator,
    cross=None,
    *,
    align: bool = True,
    writers=None,
) -> GenerationBuffer:
    """The window source over `rows` (`tokenize_examples`). `cross` (a `CrossTokenizer`)
    switches on the teacher's own inputs and the alignment of every micro-batch, and seq-KD
    completions written in teacher tokens. `writers`: several routed teachers' models, each
    writing its rows' seq-KD completions (train/several.py)."""
    prompt_ids, completions = rows
    g = cfg.generation
    params = SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, g.num_generations)
    teacher_side = None
    if cfg.train.seq_kd and writers is not None:
        teacher_side = writers_side(cfg, examples, prompt_ids, tok, writers, cross)
    elif cfg.train.seq_kd:
        t_gen = build_generator(
            cfg,
            teacher_model,
            pad_id=teacher_tok.pad_token_id,
            stop_ids=stop_token_ids(teacher_tok, teacher_model),
            vocab_limit=id_rows(teacher_tok),
            backend=teacher_backend(cfg),
        )
        t_gen = gathering(t_gen, teacher_model)  # a sharded teacher: gathered too
        from distil.data.context import teacher_prompts

        context = teacher_prompts(cfg.teacher, examples)  # privileged: it writes after them
        if cross is None:  # same tokenizer: the same prompt ids and completion ids
            fmt = prompt_format(cfg.data)
            ids = context and EncodedPrompts(tok, context, name="teacher context", fmt=fmt)
            teacher_side = PromptSide(ids or prompt_ids, t_gen)
        else:  # the teacher writes in its own template and tokens; the student gets the text
            t_prompts = EncodedPrompts(
                teacher_tok,
                context or [e.prompt for e in examples],
                max_tokens=cfg.data.max_prompt_tokens,
                name="teacher tokenizer",
                fmt=prompt_format(cfg.data),
                where=[e.meta.get("_where") for e in examples],
            )
            teacher_side = PromptSide(t_prompts, t_gen, to_student=cross.to_student)
    return GenerationBuffer(
        examples,
        PromptSide(prompt_ids, generator),
        completion_ids=completions,
        params=params,
        per_device_batch_size=cfg.train.per_device_batch_size,
        grad_accum_steps=cfg.train.grad_accum_steps,
        lambda_=cfg.train.lambda_,
        pad_id=tok.pad_token_id,
        seed=cfg.train.seed,
        seq_kd=cfg.train.seq_kd,
        teacher=teacher_side,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        shuffle=cfg.data.shuffle,
        collate_fn=_collate_fn(cfg, examples, rows, tok, cross if align else None),
        num_workers=cfg.data.num_workers,
        teacher_windows=g.teacher_windows,
        vocab_limit=id_rows(tok),
        reward=build_rewards(cfg, examples, tok),
    )


def self_teacher(cfg: DistilConfig, student):
    """teacher.from_student: the student module itself (its current weights, scored without
    gradient) or a frozen copy of its starting weights."""
    if cfg.teacher.from_student == "current":
        return student
    if cfg.teacher.from_student == "ema" and fsdp_requested():
        raise ConfigError(
            "teacher.from_student=ema under FSDP: the average is a whole copy on every rank "
            "while the student's parameters are shards. Fix: teacher.from_student=initial or "
            "current, or DDP"
        )
    import copy

    return copy.deepcopy(student)


def _collate_fn(cfg: DistilConfig, examples, rows: Rows, tok, cross):
    """The micro-batch collation: padding (+ alignment across tokenizers), and with privileged
    context each row's teacher prompt (data/context.py; kept whole): the one every teacher
    shares, or a routed row's own teacher's; a row whose teacher has none gets the student's."""
    fn = cross.collate if cross is not None else collate
    contexts = row_contexts(cfg, examples)
    if contexts is None:
        return fn
    from distil.data.context import ContextCollate, row_prompts

    prompts = row_prompts(examples, contexts)
    fmt = prompt_format(cfg.data)
    if cross is not None:  # the teacher renders them with its own template
        own = [e.prompt if p is None else p for e, p in zip(examples, prompts, strict=True)]
        return ContextCollate(fn, context_prompts=own)
    if all(p is not None for p in prompts):  # one context for every row: encoded when read
        ids = EncodedPrompts(tok, prompts, name="teacher context", fmt=fmt)
        return ContextCollate(fn, context_ids=ids)
    given = [p for p in prompts if p is not None]
    given = encode_prompts(tok, given, name="teacher context", fmt=fmt)
    it = iter(given)
    ids = [list(rows[0][i]) if p is None else next(it) for i, p in enumerate(prompts)]
    return ContextCollate(fn, context_ids=ids)


def build(cfg: DistilConfig, models: dict[str, Any] | None = None) -> Components:
    """Everything the loop needs, prepared with accelerate, before any resume; `models`:
    already-loaded "student"/"teacher" models used in place of loading their weights."""
    from accelerate.utils import set_seed

    from distil.preflight import check
    from distil.tasks.prompts import config_examples

    check(cfg, "train")  # names, paths, extras: before any weights load
    accelerator = build_accelerator(cfg)
    planned_peak = memory_plan(cfg, accelerator)  # before any weights load, too
    enable_tf32(accelerator.device)  # the matmuls autocast leaves in fp32 (and fp32 runs)
    if accelerator.is_main_process:
        print_notices(cfg, accelerator)
    set_seed(cfg.train.seed, device_specific=True)
    loss_fn, reward_opts = reward_loss(cfg)  # loss.name, + the task's reward (reward_weight)
    examples = config_examples(cfg.data)
    models = models or {}
    model, tok = load_student(cfg, accelerator, given=models.get("student"))
    if reward_opts:  # the reward term: log S over the rows the sampler draws from
        reward_opts.update(sampler_rows(model, tok))
    check_lengths(examples, tok, cfg.data, completions_used=uses_completions(cfg))
    rows = tokenize_examples(cfg, examples, tok)
    print_completion_warnings(cfg, examples, tok, accelerator)
    teacher_model, teacher_tok = None, None
    if loads_teacher_model(cfg):
        teacher_model, teacher_tok = load_teacher(cfg, accelerator, models.get("teacher"))
    elif cfg.teacher.from_student:  # self-distillation: no second load
        teacher_model, teacher_tok = self_teacher(cfg, model), tok
    if cfg.teachers.models:
        teacher, teacher_tok, cross, vocab_size = several_teachers(
            cfg, partial(load_teacher, accelerator=accelerator), model, tok, examples, rows,
            device=accelerator.device)  # fmt: skip
    else:
        teacher, teacher_tok, cross, vocab_size = build_scorer(
            cfg, model, tok, teacher_model, teacher_tok, rows=rows
        )
        if cfg.teacher.from_student == "ema":
            from distil.teacher.ema import EmaTeacher

            teacher = EmaTeacher(teacher, model, cfg.teacher.ema_decay)
    optimizer = build_optimizer(model, cfg.train, device=accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    report_sharding(accelerator, unwrapped, teacher_model, _live_models(cfg, teacher))
    stops = stop_token_ids(tok, unwrapped)
    generator = build_generator(cfg, unwrapped, pad_id=tok.pad_token_id, stop_ids=stops,
                                vocab_limit=id_rows(tok))  # fmt: skip
    buffer = build_buffer(
        cfg,
        examples,
        rows,
        tok,
        gathering(generator, unwrapped),
        teacher_model,
        teacher_tok,
        accelerator,
        cross,
        align=needs_teacher(cfg.loss.name),
        writers=[t.model for t in teacher.teachers] if several_write(cfg) else None,
    )
    loss_opts = {**_loss_opts(cfg, vocab_size, unwrapped, accelerator.device), **reward_opts}
    return Components(
        accelerator,
        model,
        unwrapped,
        tok,
        teacher,
        optimizer,
        buffer,
        loss_fn,
        loss_opts,
        vocab_size,
        examples,
        cross,
        planned_peak,
    )
