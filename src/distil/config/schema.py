"""The config tree: eight sections, every default and its description in one place."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Dtype = Literal["float32", "bfloat16", "float16", "auto"]


class Section(BaseModel):
    # inf/nan are never meant (train.lr=.inf passes gt=0); null says "no limit" where one exists
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False
    )


class DataConfig(Section):
    train: str | None = Field(
        None, description="training data: a JSONL/parquet file, a saved dataset dir or a hub id"
    )
    eval: str | None = Field(None, description="held-out data in the same formats as data.train")
    split: str = Field("train", description="split to read from a hub dataset or DatasetDict")
    subset: str | None = Field(
        None, description="hub dataset config name (e.g. main for openai/gsm8k)"
    )
    prompt_field: str = Field(
        "prompt", description="column with the prompt (chat messages or text)"
    )
    completion_field: str = Field(
        "completion", description="column with the reference completion (off-policy slices)"
    )
    template: str | None = Field(
        None,
        description="re-render prompts: a Countdown template (countdown_chat, countdown_plain) "
        "from nums/target, or a task (gsm8k, math, mmlu, module:Class) with the task's prompt; "
        "null keeps the data's prompt column",
    )
    max_prompt_tokens: int = Field(256, gt=0, description="prompts are truncated from the left")
    max_completion_tokens: int = Field(
        256, gt=0, description="dataset completions are truncated to this many tokens"
    )
    overlong: Literal["error", "truncate"] = Field(
        "error",
        description="a prompt or reference completion over its max_*_tokens: stop naming the "
        "row (error), or cut it and count the cut rows in a warning (truncate)",
    )
    shuffle: bool = Field(True, description="shuffle prompts every epoch (seeded)")
    num_workers: int = Field(
        0, ge=0, description="processes preparing micro-batches (cross-tokenizer alignment)"
    )


class LoraConfig(Section):
    enabled: bool = Field(False, description="train LoRA adapters instead of all weights")
    r: int = Field(16, gt=0, description="LoRA rank")
    alpha: int = Field(32, gt=0, description="LoRA scaling alpha")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout")
    target_modules: str | list[str] = Field("all-linear", description="modules given adapters")


class ModelConfig(Section):
    path: str | None = Field(None, description="student model: a local directory or a hub id")
    tokenizer: str | None = Field(None, description="tokenizer path (default: student.path)")
    dtype: Dtype = Field(
        "auto",
        description="weights dtype; auto: float32 on CPU; on CUDA the checkpoint's own dtype "
        "when the weights are not trained in it (train.bf16_weights keeps fp32 master copies; "
        "LoRA freezes them), else float32 with TF32 matmuls (docs/training.md)",
    )
    attn_implementation: str = Field("sdpa", description="sdpa, eager, flash_attention_2, ...")
    gradient_checkpointing: bool = Field(
        False,
        description="recompute activations in backward: about 1/3 more student compute for much "
        "less activation memory; pays only when it lets a larger micro-batch or pack_length fit "
        "(docs/training.md, precision and speed)",
    )
    liger: bool = Field(
        False,
        description="patch the student with Liger kernels (RMSNorm, SwiGLU, RoPE; the liger "
        "extra, CUDA) where its model type has them",
    )
    trust_remote_code: bool = Field(False, description="allow model code from the checkpoint")
    lora: LoraConfig = Field(default_factory=LoraConfig)


class TeacherConfig(Section):
    path: str | None = Field(None, description="teacher model: a local directory or a hub id")
    tokenizer: str | None = Field(None, description="tokenizer path (default: teacher.path)")
    dtype: Dtype = Field(
        "auto",
        description="weights dtype; auto: the checkpoint's own dtype on CUDA (bf16 for most "
        "current models), float32 on CPU",
    )
    attn_implementation: str = Field("sdpa", description="sdpa, eager, flash_attention_2, ...")
    device: str | None = Field(None, description="device of the teacher (default: the student's)")
    placement: Literal["replicate", "shard"] = Field(
        "replicate",
        description="under FSDP: a whole teacher on every rank (replicate) or sharded over the "
        "ranks like the student (shard; docs/scaling-out.md)",
    )
    trust_remote_code: bool = Field(False, description="allow model code from the checkpoint")
    offload: bool = Field(
        False,
        description="teachers.models.NAME only: keep this live teacher's weights in host memory "
        "(pinned with CUDA) and copy them to its device only while it scores a micro-batch "
        "with rows for it (or takes its turn in a mixture), so a GPU holds the student and one "
        "teacher at a time; costs one host-to-device copy of its weights per such micro-batch "
        "(docs/multi-teacher.md, Memory)",
    )
    top_k: int | None = Field(
        None, gt=0, description="keep the teacher's top-k log-probs + a rest bucket (null: full)"
    )
    cache: str | None = Field(
        None,
        description="a `distil cache-teacher` directory: read the teacher's top-k from disk "
        "instead of running it (off-policy slices only; docs/teacher-cache.md)",
    )
    url: str | None = Field(
        None,
        description="an OpenAI-compatible server scoring the teacher (vllm serve, distil "
        "serve-teacher), e.g. http://host:8000/v1; teacher.path is then the served model name "
        "and only the tokenizer is loaded here (docs/scaling-out.md)",
    )
    api_key_env: str | None = Field(
        None, description="environment variable holding the teacher server's API key"
    )
    context: str | None = Field(
        None,
        description="privileged context: the teacher's prompt as a template over the row's "
        "columns, {prompt} being the student's (e.g. '{prompt}\\n\\nA correct solution: "
        "{solution}'); both score the same completion (docs/privileged-context.md)",
    )
    system: str | None = Field(
        None,
        description="text only the teacher sees before the prompt (a system message for chat "
        "prompts): context distillation",
    )
    from_student: Literal["current", "initial", "ema"] | None = Field(
        None,
        description="self-distillation: the teacher is the student itself, its current weights "
        "(no second copy; needs teacher.context or teacher.system), a frozen copy of its "
        "starting weights, or an exponential moving average of it; teacher.path stays null",
    )
    ema_decay: float = Field(
        0.99, gt=0, lt=1, description="teacher.from_student=ema: ema <- d * ema + (1-d) * student"
    )


class VLLMConfig(Section):
    """generation.backend=vllm: the colocated engine (docs/training.md, "vLLM")."""

    gpu_memory_utilization: float = Field(
        0.3,
        gt=0.0,
        le=1.0,
        description="share of the GPU's memory the engine may take for its weights, activations "
        "and KV cache while it generates (training keeps the rest)",
    )
    sleep_level: Literal[0, 1, 2] = Field(
        2,
        description="between generations: 0 keeps the engine's memory; 1 frees the KV cache and "
        "copies the weights to CPU memory and back (wasted: the student's weights are pushed "
        "after every step anyway); 2 frees both, and the weights are pushed again before the "
        "next generation (least memory, no CPU copy)",
    )
    max_model_len: int | None = Field(
        None,
        gt=0,
        description="longest prompt + completion the engine serves (null: "
        "data.max_prompt_tokens + the larger of generation.max_new_tokens and, with "
        "train.eval_every, eval.max_new_tokens: the in-training eval samples with the engine)",
    )
    max_num_seqs: int | None = Field(
        None, gt=0, description="sequences the engine decodes at once (null: vLLM's default)"
    )
    max_num_batched_tokens: int = Field(
        4096,
        gt=0,
        description="tokens the engine schedules per step (chunked prefill); vLLM's own default "
        "is larger, and its start-up profiling then leaves less room for the KV cache inside "
        "gpu_memory_utilization (TRL's colocate mode pins 4096 too)",
    )
    enforce_eager: bool = Field(
        False, description="no CUDA graphs: less memory and start-up time, slower decoding"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="engine weights dtype (auto: bfloat16, float16 for a float16 student, "
        "whatever dtype the student trains in; float32 runs only on vLLM's slower attention "
        "backends, so only when set)",
    )
    seeded: bool = Field(
        False,
        description="per-request seeds derived from train.seed: the same samples whatever the "
        "engine's batching, at some cost in sampling speed (off: one engine seed, train.seed + "
        "rank)",
    )


class GenerationConfig(Section):
    max_new_tokens: int = Field(128, gt=0, description="tokens sampled per completion")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold")
    top_k: int = Field(0, ge=0, description="top-k sampling (0: off)")
    num_generations: int = Field(1, gt=0, description="samples per prompt")
    async_: bool = Field(
        False,
        alias="async",
        description="sample the next window while the current one trains (one optimizer step "
        "stale, logged as policy/staleness; docs/training.md says when it pays)",
    )
    generation_batch_size: int | None = Field(
        None,
        gt=0,
        description="unique prompts per window (default: per_device_batch_size * "
        "grad_accum_steps / num_generations)",
    )
    teacher_windows: int = Field(
        1,
        gt=0,
        description="train.seq_kd: the teacher writes the completions of this many optimizer "
        "windows in one generate call (it does not train, so what it writes ahead is what it "
        "would write later; larger calls keep the sampler busier). Sampling is then seeded per "
        "block of windows, so a resumed run writes the same completions",
    )
    backend: Literal["hf", "hf_static", "vllm"] = Field(
        "hf",
        description="sampler: hf (transformers generate, dynamic KV cache), hf_static (distil's "
        "own decode loop over a fixed-shape KV cache, decode step compiled on CUDA) or vllm (the "
        "vllm extra, CUDA)",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="hf_static: torch.compile the one-token decode step (CUDA graphs on CUDA); "
        "auto: on for CUDA, off on CPU",
    )
    static_batch_buckets: list[Annotated[int, Field(gt=0)]] = Field(
        min_length=1,
        default_factory=lambda: [8, 16, 32, 64, 128, 256],
        description="hf_static: rows of a generate call are padded up to the smallest of these "
        "(larger calls are split at the largest) so that the compiled shapes repeat",
    )
    static_length_buckets: list[Annotated[int, Field(gt=0)]] = Field(
        min_length=1,
        default_factory=lambda: [64, 128, 256, 512, 1024],
        description="hf_static: prompts are left-padded to the smallest of these widths that "
        "fits (longer prompts: the next multiple of the largest)",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


class LossConfig(Section):
    name: str = Field("jsd", description="loss from the registry (`distil losses` lists them)")
    beta: float = Field(0.5, ge=0.0, le=1.0, description="JSD mix: 0 forward KL, 1 reverse KL")
    temperature: float = Field(1.0, gt=0.0, description="softmax temperature on both models")
    chunk_size: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        "auto",
        description="loss positions per chunk of the memory-lean loss: the student's head and "
        "fp32 log-softmax run chunk by chunk, checkpointed (auto: 2^25 / vocabulary rows, "
        "64-1024, i.e. 1024 up to a 32k vocabulary; null: unchunked, (B, T, V) fp32 logits)",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="fuse each chunk of forward_kl/reverse_kl/jsd with torch.compile (inductor; "
        "one chunk shape, the last chunk padded): auto: on CUDA, off on CPU, where compiling "
        "takes longer than it saves (docs/training.md)",
    )
    ce_weight: float = Field(0.0, ge=0.0, description="weight of cross-entropy on data tokens")
    matched_weight: float | None = Field(
        None, ge=0.0, description="hybrid loss: weight of the matched-vocabulary term"
    )
    unmatched_weight: float | None = Field(
        None, ge=0.0, description="hybrid loss: weight of the unmatched (sorted L1) term"
    )


class TrainConfig(Section):
    output_dir: str = Field("runs/default", description="run directory")
    seed: int = Field(0, description="seed of data order, sampling and the lambda draws")
    max_steps: int = Field(100, gt=0, description="optimizer steps")
    max_minutes: float | None = Field(
        None, gt=0.0, description="stop after this many minutes of training (eval excluded)"
    )
    max_student_flops: float | None = Field(
        None,
        gt=0.0,
        description="stop once the student has spent this many FLOPs, cost/student_flops = "
        "2 N (3 train + prefill + generated tokens) (null: no limit); equal-cost comparisons",
    )
    per_device_batch_size: int = Field(8, gt=0, description="sequences per micro-batch")
    grad_accum_steps: int = Field(1, gt=0, description="micro-batches per optimizer step")
    lr: float = Field(1e-5, gt=0.0, description="peak learning rate of AdamW")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="linear warmup steps")
    schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(
        "cosine", description="learning-rate schedule after warmup (wsd: constant, then decay)"
    )
    decay_fraction: float = Field(
        0.2, gt=0.0, le=1.0, description="wsd: share of the run spent decaying the lr"
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="final lr / peak lr")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="clip norm (null: no clipping)")
    bf16: bool = Field(
        False, description="bf16 autocast over fp32 weights (fp32 weights, gradients and AdamW)"
    )
    bf16_weights: bool = Field(
        False,
        description="student weights held in bf16 on the device, AdamW keeping fp32 master "
        "copies and moments; gradients add up in fp32, clipping on the fp32 gradients, bf16 "
        "autocast on (implies train.bf16); the final model is saved from the master copies in "
        "student.dtype (docs/training.md)",
    )
    fused_adamw: bool | Literal["auto"] = Field(
        "auto",
        description="torch's fused AdamW kernel (auto: on CUDA; off on CPU, where it is faster "
        "but rounds differently from the default implementation the demo's numbers come from)",
    )
    fp16: bool = Field(False, description="fp16 mixed precision")
    lambda_: float = Field(
        1.0, alias="lambda", ge=0.0, le=1.0, description="share of on-policy slices"
    )
    seq_kd: bool = Field(False, description="off-policy slices use teacher-written completions")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    save_every_minutes: float | None = Field(
        10.0, gt=0.0, description="also checkpoint after this many minutes (null: off)"
    )
    keep_last: int = Field(2, gt=0, description="checkpoints kept")
    resume: str = Field(
        "auto", description="auto (newest complete checkpoint), never, or a checkpoint dir"
    )
    resume_changed: list[str] = Field(
        default_factory=list,
        description="keys (or patterns like teacher.*) allowed to differ from the checkpoint's",
    )
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: never)")
    log_every: int = Field(1, gt=0, description="print metrics every N steps")
    max_consecutive_skips: int = Field(
        5, gt=0, description="non-finite steps skipped in a row before the run stops"
    )
    max_zero_grad_steps: int = Field(
        10, ge=0, description="steps in a row with a grad norm of exactly 0 before the run stops"
    )
    num_threads: int | None = Field(None, gt=0, description="torch CPU threads (null: default)")
    packing: bool = Field(
        False,
        description="padding-free forwards: a micro-batch's sequences packed into rows "
        "(position_ids restart per sequence, block-diagonal attention); student and live teacher",
    )
    pack_length: int | None = Field(
        None,
        gt=0,
        description="tokens per packed row (null: the micro-batch's longest sequence; flash "
        "attention packs one row)",
    )


class EvalConfig(Section):
    task: str = Field(
        "countdown",
        description="task: countdown, gsm8k, math, mmlu, or a class by import path "
        "(mypkg.tasks:MyTask)",
    )
    data: str | None = Field(
        None,
        description="problems: a JSONL/parquet file, a saved dataset dir or a hub id (null: "
        "the task's hub dataset; Countdown generates test problems)",
    )
    subset: str | None = Field(None, description="hub dataset config name (e.g. main, all)")
    split: str = Field("test", description="split of a hub dataset or saved DatasetDict")
    num_fewshot: int = Field(5, ge=0, description="mmlu: examples shown before each question")
    fewshot_data: str | None = Field(
        None, description="mmlu: file or hub id of the shots (null: eval.data's hub dataset)"
    )
    fewshot_split: str = Field("dev", description="mmlu: split the shots come from")
    n: int = Field(500, gt=0, description="problems evaluated")
    samples: int = Field(1, gt=0, description="completions per problem (pass@k)")
    batch_size: int = Field(64, gt=0, description="prompts per generate call")
    max_new_tokens: int = Field(64, gt=0, description="tokens generated per completion")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold")
    template: str | None = Field(
        None, description="prompt template (null: the one recorded with the model)"
    )
    number_usage: Literal["exact", "subset"] = Field(
        "exact", description="numbers used must equal nums (exact) or be a sub-multiset"
    )
    numbers: str = Field("3", description="numbers per generated problem: 3, 4 or 3-4")
    seed: int = Field(1234, description="seed of generated test problems and sampling")


class LoggingConfig(Section):
    trackers: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list, description="trackers through accelerate (installed extras)"
    )
    project: str = Field("distil", description="tracker project name")
    run_name: str | None = Field(None, description="run name (default: output dir name)")
    progress: bool = Field(True, description="show a progress bar")
    print_example: bool = Field(True, description="print one rendered training example")


class TeachersConfig(Section):
    """Several teachers: `models` by name, and which one scores each training row
    (docs/multi-teacher.md). Either `column` (each row to one teacher, by a data column) or
    `weights` (every row scored by every teacher named, their distributions mixed)."""

    models: dict[str, TeacherConfig] = Field(
        default_factory=dict,
        description="teachers by name, each with the keys of `teacher` (teacher.path stays null)",
    )
    column: str | None = Field(
        None,
        description="data column naming each row's teacher: its value is a teacher's name, or "
        "a key of teachers.map",
    )
    map: dict[str, str] = Field(
        default_factory=dict, description="column value -> teacher name (default: the value)"
    )
    weights: dict[str, float] | None = Field(
        None,
        description="a mixture: teacher name -> weight (normalized to sum to 1); the targets are "
        "log sum_i w_i T_i(v), fed to the configured divergence",
    )


class DistilConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    student: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    teachers: TeachersConfig = Field(default_factory=TeachersConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


# Keys that say where a run lives rather than what it does; `config diff` skips them by default.
LOCATION_KEYS = ("train.output_dir", "logging.run_name")
