"""The student's and teachers' sections of the config tree (distil.config.schema holds the
whole tree)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from distil.config.section import Dtype, Section


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
