"""The config tree: ten sections, every default and its description in one place (the
student's and teachers' sections in schema_models.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from distil.config.schema_models import LoraConfig, ModelConfig, TeacherConfig, TeachersConfig
from distil.config.section import Dtype, Section


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
        "prompt",
        description="column with the prompt: text, chat messages, or a whole conversation "
        "(messages ending in an assistant turn: the turns before it are the prompt, that turn "
        "the completion); a row without a 'prompt' column but with 'messages' reads that one "
        "(docs/data.md)",
    )
    completion_field: str = Field(
        "completion",
        description="column with the reference completion, text or chat messages (their last "
        "assistant turn); used by off-policy slices",
    )
    text_prompts: Literal["auto", "chat", "verbatim"] = Field(
        "auto",
        description="plain-text prompts: one user turn of each model's chat template (chat), "
        "the text as it is (verbatim), or chat for a model whose tokenizer has a chat template "
        "and verbatim for one without (auto); chat-message prompts always use the template",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="arguments of every chat template call, both models' (e.g. "
        "{enable_thinking: false} for Qwen3); a template that refuses one is an error",
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
    reward_weight: float = Field(
        0.0,
        ge=0.0,
        description="weight of a task's reward (the `reward` section's group-relative policy "
        "gradient, GRPO) added to this on-policy distillation loss (0: distillation alone, "
        "bit-identical to no reward; loss.name=grpo is the reward alone; docs/reward.md)",
    )


class RewardConfig(Section):
    """A verifiable reward on each on-policy completion (loss.name=grpo, loss.reward_weight > 0
    or reward.log); docs/reward.md."""

    task: str | None = Field(
        None,
        description="the task whose checker judges each completion (countdown, gsm8k, math, "
        "mmlu, mypkg.tasks:MyTask), built with the eval section's settings (null: eval.task)",
    )
    function: str | None = Field(
        None,
        description="instead of a task's checker: a function by import path "
        "(mypkg.rewards:score) called with the data row (dict) and the completion (str), "
        "returning a finite number or (number, category name)",
    )
    values: dict[str, float] = Field(
        default_factory=lambda: {"correct": 1.0},
        description="the reward of each outcome category of the task's checker (Countdown: "
        "correct, missing_answer_tags, wrong_value, ...; `distil eval` lists them)",
    )
    default: float = Field(
        0.0, description="the reward of an outcome that reward.values does not list"
    )
    normalize_std: bool = Field(
        True,
        description="divide each group's centred rewards by its standard deviation (GRPO); "
        "false: centred only (Dr. GRPO)",
    )
    truncated: float | None = Field(
        None,
        description="the reward of a completion that reached generation.max_new_tokens "
        "without its end token (outcome `truncated`), whatever the checker says of its text "
        "(DAPO's overlong penalty; 0: as no answer); null: the checker scores it as it is",
    )
    skip_flat: bool = Field(
        True,
        description="loss.name=grpo: a window whose groups all have equal rewards, on every "
        "rank, has no gradient, so its forward, backward and optimizer step are skipped "
        "(stepping would let AdamW's moments move the weights on no signal) and only its "
        "generation is charged to the student compute; false: stepped like any window",
    )
    clip: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="generation.async: the importance ratio to the lagging sampler is clipped "
        "to [1 - clip, 1 + clip] (PPO's epsilon)",
    )
    log: bool = Field(
        False,
        description="score every on-policy completion and log the reward metrics even when "
        "the loss does not use them (a distillation run's reward curve)",
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
    push_to_hub: bool = Field(
        False,
        description="upload output_dir/final with its model card to the Hub repo "
        "train.hub_model_id when training ends (main process; needs a Hub token: HF_TOKEN or "
        "`hf auth login`)",
    )
    hub_model_id: str | None = Field(
        None, description="the Hub repo the final model goes to (org/name or name)"
    )
    hub_private: bool = Field(False, description="create the Hub repo private")
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
    mmlu_scoring: Literal["generate", "loglik"] = Field(
        "generate",
        description="mmlu: read the letter the model writes (generate), or pick the choice "
        "letter of highest log-likelihood after the k-shot prompt as plain text, no chat "
        "template, as lm-evaluation-harness scores MMLU (loglik; comparable with its numbers)",
    )
    number_usage: Literal["exact", "subset"] = Field(
        "exact", description="numbers used must equal nums (exact) or be a sub-multiset"
    )
    numbers: str = Field("3", description="numbers per generated problem: 3, 4 or 3-4")
    seed: int = Field(1234, description="seed of generated test problems and sampling")


class LoggingConfig(Section):
    trackers: list[Literal["tensorboard", "wandb", "trackio", "mlflow"]] = Field(
        default_factory=list,
        description="experiment trackers through accelerate (the trackers extra); a resumed "
        "run continues the same tracker run (ids kept in output_dir/trackers.json)",
    )
    project: str = Field(
        "distil", description="tracker project (W&B, trackio) or experiment (MLflow) name"
    )
    run_name: str | None = Field(
        None,
        description="the run's name in every tracker, TensorBoard's directory "
        "(output_dir/tensorboard/<run_name>) and the model card's title (default: the output "
        "dir's name)",
    )
    progress: bool = Field(True, description="show a progress bar")
    print_example: bool = Field(True, description="print one rendered training example")


class DistilConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    student: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    teachers: TeachersConfig = Field(default_factory=TeachersConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


# Keys that say where a run lives rather than what it does; `config diff` skips them by default.
LOCATION_KEYS = ("train.output_dir", "logging.run_name")


__all__ = [
    "LOCATION_KEYS",
    "DataConfig",
    "DistilConfig",
    "Dtype",
    "EvalConfig",
    "GenerationConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "RewardConfig",
    "Section",
    "TeacherConfig",
    "TeachersConfig",
    "TrainConfig",
    "VLLMConfig",
]
