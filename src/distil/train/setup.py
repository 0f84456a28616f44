"""Build what the loop needs from a resolved config: accelerator, models, teacher, buffer, loss.

Kept apart from `loop.py` so the loop reads top to bottom without construction details.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distil.config import DistilConfig
from distil.data.collate import collate
from distil.errors import ConfigError, require
from distil.generation.base import SamplingParams
from distil.generation.select import build_generator, teacher_backend
from distil.models.load import load_model, load_tokenizer
from distil.models.tokenizers import encode_prompts, stop_token_ids
from distil.train.buffer import GenerationBuffer, PromptSide
from distil.train.fsdp import (
    GatheringGenerator,
    check_launch,
    enable_fsdp_on_cpu,
    fsdp_requested,
    is_sharded,
    report_sharding,
    shard_teacher,
)

TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
# the teacher scorer, by what the config gives: a model (`teacher.path`), `teacher.cache` or a
# server (`teacher.url`)
SCORERS = {
    "live": "distil.teacher.live:LiveTeacher",
    "cache": "distil.teacher.cached:CachedTeacher",
    "remote": "distil.teacher.remote:RemoteTeacher",
}


def scorer_class(name: str):
    """The TeacherScorer class registered as `name`, imported on first use."""
    import importlib

    module, attr = SCORERS[name].split(":")
    return getattr(importlib.import_module(module), attr)


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


def build_accelerator(cfg: DistilConfig):
    from accelerate import Accelerator

    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    bf16 = cfg.train.bf16 or cfg.train.bf16_weights  # bf16 weights run under bf16 autocast too
    precision = "bf16" if bf16 else "fp16" if cfg.train.fp16 else "no"
    if precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("train.fp16=true needs a CUDA GPU. Fix: use train.bf16=true on CPU")
    for name in cfg.logging.trackers:
        require(TRACKER_MODULES[name], "trackers", f"logging.trackers={name}")
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
    accelerator = Accelerator(
        mixed_precision=precision,
        log_with=list(cfg.logging.trackers) or None,
        project_dir=cfg.train.output_dir,
        cpu=not torch.cuda.is_available(),
    )
    if fsdp_requested():
        enable_fsdp_on_cpu(accelerator, precision)
    return accelerator


def _load(section, name: str, device=None):
    """(model, tokenizer) of the `student` or `teacher` config section."""
    # a tokenizer defaulted from the model path is reported under the key the user set
    key = f"{name}.path" if section.tokenizer == section.path else f"{name}.tokenizer"
    tok = load_tokenizer(section.tokenizer, key=key, trust_remote_code=section.trust_remote_code)
    model = load_model(
        section.path,
        key=f"{name}.path",
        dtype=section.dtype,
        attn_implementation=section.attn_implementation,
        device=device,
        trust_remote_code=section.trust_remote_code,
    )
    return model, tok


def load_student(cfg: DistilConfig, accelerator):
    s = cfg.student
    model, tok = _load(s, "student")
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
    return model, tok


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in backward (non-reentrant), under either transformers name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_teacher(cfg: DistilConfig, accelerator):
    """The live teacher: whole on `teacher.device` (default: the rank's device), or sharded
    over the ranks with `teacher.placement=shard` under FSDP."""
    if cfg.teacher.placement == "shard":
        model, tok = _load(cfg.teacher, "teacher")
        shard_teacher(model, accelerator)
        return model, tok
    return _load(cfg.teacher, "teacher", device=cfg.teacher.device or accelerator.device)


def gathering(generator, model):
    """`generator` as is, or, for a sharded model, one that generates on gathered weights."""
    return GatheringGenerator(generator, model) if is_sharded(model) else generator


def _chunk_size(cfg: DistilConfig, vocab_size: int | None, student) -> int | None:
    """`loss.chunk_size`, with `auto` resolved from the student's (kept) vocabulary."""
    if cfg.loss.chunk_size != "auto":
        return cfg.loss.chunk_size
    from distil.losses.chunked import auto_chunk_size

    return auto_chunk_size(vocab_size or student.get_output_embeddings().weight.shape[0])


def shared_vocab_size(cfg: DistilConfig, s_tok, t_tok, s_model, t_model) -> int | None:
    """Same-tokenizer losses need one vocabulary; never resize embeddings silently.

    Returns the number of logits to keep when the two models pad their embedding matrices
    differently (same tokenizer, e.g. 151936 vs 152064 rows), else None.
    """
    if s_tok.get_vocab() != t_tok.get_vocab():
        only_s = len(set(s_tok.get_vocab()) - set(t_tok.get_vocab()))
        only_t = len(set(t_tok.get_vocab()) - set(s_tok.get_vocab()))
        raise ConfigError(
            f"loss.name = {cfg.loss.name!r} compares the two models token by token, but the "
            f"teacher's tokenizer differs from the student's ({len(t_tok)} vs {len(s_tok)} "
            f"tokens; {only_s} only in the student's, {only_t} only in the teacher's). distil "
            "never resizes embeddings to hide this. Fix: use a cross-tokenizer loss "
            "(loss.name=uld, gold or aligned_kl), or a teacher with the student's tokenizer"
        )
    vs = s_model.get_output_embeddings().weight.shape[0]
    vt = t_model.get_output_embeddings().weight.shape[0]
    if vs == vt:
        return None
    if len(s_tok) > min(vs, vt):
        raise ConfigError(
            f"the tokenizer has {len(s_tok)} tokens but a model has only "
            f"{min(vs, vt)} output rows; the checkpoints do not match it"
        )
    return min(vs, vt)


def build_buffer(
    cfg: DistilConfig,
    examples,
    tok,
    generator,
    teacher_model,
    teacher_tok,
    accelerator,
    cross=None,
    *,
    align: bool = True,
) -> GenerationBuffer:
    """The window source. `cross` (a `CrossTokenizer`) switches on the teacher's own inputs and
    the alignment of every micro-batch, and seq-KD completions written in teacher tokens."""
    stop = stop_token_ids(tok)
    prompt_ids = encode_prompts(
        tok,
        [e.prompt for e in examples],
        max_tokens=cfg.data.max_prompt_tokens,
        name="student tokenizer",
    )
    completions = [
        _reference_ids(tok, e.completion, cfg.data.max_completion_tokens, stop[0]) for e in examples
    ]
    g = cfg.generation
    params = SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, g.num_generations)
    teacher_side = None
    if cfg.train.seq_kd:
        t_gen = build_generator(
            cfg,
            teacher_model,
            pad_id=teacher_tok.pad_token_id,
            stop_ids=stop_token_ids(teacher_tok, teacher_model),
            backend=teacher_backend(cfg),
        )
        t_gen = gathering(t_gen, teacher_model)  # a sharded teacher: gathered too
        if cross is None:  # same tokenizer: the same prompt ids and completion ids
            teacher_side = PromptSide(prompt_ids, t_gen)
        else:  # the teacher writes in its own template and tokens; the student gets the text
            t_prompts = encode_prompts(
                teacher_tok,
                [e.prompt for e in examples],
                max_tokens=cfg.data.max_prompt_tokens,
                name="teacher tokenizer",
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
        collate_fn=cross.collate if cross is not None and align else collate,
        num_workers=cfg.data.num_workers,
    )


def _reference_ids(tok, text: str | None, max_tokens: int, eos: int) -> list[int] | None:
    if text is None:
        return None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[:max_tokens] if len(ids) >= max_tokens else [*ids, eos]


def cached_cross_setup(cfg: DistilConfig, tok, model):
    """(CrossTokenizer, student logits to keep) for a cross-tokenizer loss from a cache: the
    teacher's tokenizer is `teacher.tokenizer` / `teacher.path` when set, else the one the
    cache saved; its hash is checked against the manifest in `open_cache`."""
    from pathlib import Path

    from distil.data.crosstok import CrossTokenizer
    from distil.models.load import load_tokenizer
    from distil.teacher.cache import TEACHER_TOKENIZER

    t = cfg.teacher
    source = t.tokenizer or t.path or str(Path(cfg.teacher.cache) / TEACHER_TOKENIZER)
    teacher_tok = load_tokenizer(source, key="teacher.tokenizer")
    cross = CrossTokenizer(tok, teacher_tok, max_prompt_tokens=cfg.data.max_prompt_tokens)
    vs = model.get_output_embeddings().weight.shape[0]
    return cross, (len(tok) if vs > len(tok) else None)


def open_cache(cfg: DistilConfig, tok, model, buffer: GenerationBuffer, cross=None):
    """(CachedTeacher, student logits to keep) for `teacher.cache`, verified against this run:
    tokenizers (and the teacher's chat template for a cross cache), k, temperature, vocabulary
    and the data rows exactly as the buffer tokenized them; every shard's checksum is checked
    before the first step."""
    from distil.teacher.cache import (
        CacheError,
        read_manifest,
        row_fingerprints,
        template_sha256,
        tokenizer_sha256,
    )

    manifest = read_manifest(cfg.teacher.cache)
    k = cfg.teacher.top_k if cfg.teacher.top_k is not None else manifest.get("k")
    rows = model.get_output_embeddings().weight.shape[0]
    cache_vocab = manifest.get("vocab_size")
    if cross is None and isinstance(cache_vocab, int) and rows < cache_vocab:
        raise CacheError(
            f"the student has {rows} output rows but the teacher cache {cfg.teacher.cache} "
            f"holds ids up to {cache_vocab}; they do not share a vocabulary. Fix: a cache made "
            "for this student (cache-teacher reads the student from the config)"
        )
    expect = {
        "student_tokenizer_sha256": tokenizer_sha256(tok),
        "k": k,
        "temperature": cfg.loss.temperature,
        "template": cfg.data.template,
        "cross_tokenizer": True if cross is not None else None,
    }
    if cross is not None:
        expect["teacher_tokenizer_sha256"] = tokenizer_sha256(cross.teacher_tok)
        expect["teacher_template_sha256"] = template_sha256(cross.teacher_tok)
    teacher = scorer_class("cache").open(
        cfg.teacher.cache,
        expect=expect,
        row_fingerprints=row_fingerprints(buffer.student.prompt_ids, buffer.completion_ids),
    )
    return teacher, (cache_vocab if rows != cache_vocab else None)


def run_dir(cfg: DistilConfig) -> Path:
    return Path(cfg.train.output_dir)


class NullTeacher:
    """The `sft` loss needs no teacher targets: scoring is free."""

    temperature = 1.0

    def score(self, batch):
        from distil.types import TeacherTargets

        return TeacherTargets()


def cross_tokenizer_setup(cfg: DistilConfig, tok, teacher_tok, model, teacher_model):
    """(CrossTokenizer, student logits to keep, teacher logits to keep) for cross losses.

    Logits beyond each tokenizer's length (padded embedding rows) are dropped on both sides.
    """
    from distil.align import matched_vocab
    from distil.data.crosstok import CrossTokenizer

    if cfg.teacher.top_k is not None:
        raise ConfigError(
            f"teacher.top_k = {cfg.teacher.top_k} with loss.name = {cfg.loss.name!r}: the "
            "cross-tokenizer losses need the teacher's full distribution. Fix: set "
            "teacher.top_k=null"
        )
    cross = CrossTokenizer(tok, teacher_tok, max_prompt_tokens=cfg.data.max_prompt_tokens)
    if cfg.loss.name == "gold":
        matched_vocab(cross.student_vb, cross.teacher_vb)  # raises when nothing is shared
    vs = model.get_output_embeddings().weight.shape[0]
    vt = teacher_model.get_output_embeddings().weight.shape[0]
    keep_s = len(tok) if vs > len(tok) else None
    keep_t = len(teacher_tok) if vt > len(teacher_tok) else None
    return cross, keep_s, keep_t


def build(cfg: DistilConfig) -> Components:
    """Everything the loop needs, prepared with accelerate, before any resume."""
    from accelerate.utils import set_seed

    from distil.config import training_problems
    from distil.data.datasets import config_examples
    from distil.data.lengths import check_lengths, uses_completions
    from distil.losses import get_loss, is_cross_tokenizer
    from distil.train.optim import build_optimizer

    if problems := training_problems(cfg):
        raise ConfigError(problems)
    accelerator = build_accelerator(cfg)
    set_seed(cfg.train.seed, device_specific=True)
    loss_fn = get_loss(cfg.loss.name)
    examples = config_examples(cfg.data)
    model, tok = load_student(cfg, accelerator)
    check_lengths(examples, tok, cfg.data, completions_used=uses_completions(cfg))
    cross, teacher_model, teacher_tok, vocab_size = None, None, None, None
    cached = bool(cfg.teacher.cache) and cfg.loss.name != "sft"
    remote = bool(cfg.teacher.url) and cfg.loss.name != "sft"
    if cfg.teacher.path and (cfg.loss.name != "sft" or cfg.train.seq_kd) and not (cached or remote):
        teacher_model, teacher_tok = load_teacher(cfg, accelerator)
    if cfg.loss.name == "sft":  # supervised: the teacher (if any) only writes completions
        teacher = NullTeacher()
        if teacher_tok is not None and teacher_tok.get_vocab() != tok.get_vocab():
            from distil.data.crosstok import CrossTokenizer

            cross = CrossTokenizer(tok, teacher_tok, max_prompt_tokens=cfg.data.max_prompt_tokens)
    elif remote:  # only the teacher's tokenizer is loaded; the server is checked once
        teacher, teacher_tok, cross, vocab_size = scorer_class("remote").from_config(
            cfg, tok, model
        )
    elif cached and is_cross_tokenizer(cfg.loss.name):
        cross, vocab_size = cached_cross_setup(cfg, tok, model)
        teacher = None  # opened below, once the buffer has tokenized the data
    elif is_cross_tokenizer(cfg.loss.name):
        cross, vocab_size, teacher_vocab = cross_tokenizer_setup(
            cfg, tok, teacher_tok, model, teacher_model
        )
        teacher = scorer_class("live")(
            teacher_model,
            temperature=cfg.loss.temperature,
            top_k=None,
            vocab_size=teacher_vocab,
            packing=cfg.train.packing,
            pack_length=cfg.train.pack_length,
        )
    elif cached:
        teacher = None  # opened below, once the buffer has tokenized the data
    else:
        vocab_size = shared_vocab_size(cfg, tok, teacher_tok, model, teacher_model)
        teacher = scorer_class("live")(
            teacher_model,
            temperature=cfg.loss.temperature,
            top_k=cfg.teacher.top_k,
            vocab_size=vocab_size,
            packing=cfg.train.packing,
            pack_length=cfg.train.pack_length,
        )
    optimizer = build_optimizer(model, cfg.train, device=accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    report_sharding(accelerator, unwrapped, teacher_model)
    generator = build_generator(
        cfg, unwrapped, pad_id=tok.pad_token_id, stop_ids=stop_token_ids(tok, unwrapped)
    )
    generator = gathering(generator, unwrapped)
    buffer = build_buffer(
        cfg,
        examples,
        tok,
        generator,
        teacher_model,
        teacher_tok,
        accelerator,
        cross,
        align=cfg.loss.name != "sft",
    )
    if cached:
        teacher, keep = open_cache(cfg, tok, unwrapped, buffer, cross)
        vocab_size = vocab_size if cross is not None else keep
    loss_opts = {
        "temperature": cfg.loss.temperature,
        "targets_temperature": cfg.loss.temperature,
        "beta": cfg.loss.beta,
        "chunk_size": _chunk_size(cfg, vocab_size, unwrapped),
        "matched_weight": cfg.loss.matched_weight,
        "unmatched_weight": cfg.loss.unmatched_weight,
    }
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
    )
