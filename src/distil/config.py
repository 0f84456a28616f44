"""The typed config tree: one home for every default, YAML + `key.sub=value` overrides.

    cfg = load_config("configs/countdown_onpolicy.yaml", ["train.max_steps=200", "loss.beta=0.5"])

Loading collects every problem before raising one `ConfigError`: unknown keys (with the nearest
valid key), values of the wrong type or out of range (with the fix), and rules that tie several
values together (checked after `resolve()` fills the derived values). The resolved config, every
value included, is written to the run directory as `config.yaml`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from distil.errors import ConfigError
from distil.paths import path_problem, source_problems

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
    dtype: Dtype = Field("float32", description="weights dtype")
    attn_implementation: str = Field("sdpa", description="sdpa, eager, flash_attention_2, ...")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory")
    trust_remote_code: bool = Field(False, description="allow model code from the checkpoint")
    lora: LoraConfig = Field(default_factory=LoraConfig)


class TeacherConfig(Section):
    path: str | None = Field(None, description="teacher model: a local directory or a hub id")
    tokenizer: str | None = Field(None, description="tokenizer path (default: teacher.path)")
    dtype: Dtype = Field("float32", description="weights dtype")
    attn_implementation: str = Field("sdpa", description="sdpa, eager, flash_attention_2, ...")
    device: str | None = Field(None, description="device of the teacher (default: the student's)")
    trust_remote_code: bool = Field(False, description="allow model code from the checkpoint")
    top_k: int | None = Field(
        None, gt=0, description="keep the teacher's top-k log-probs + a rest bucket (null: full)"
    )
    cache: str | None = Field(
        None,
        description="a `distil cache-teacher` directory: read the teacher's top-k from disk "
        "instead of running it (off-policy slices only; docs/teacher-cache.md)",
    )


class GenerationConfig(Section):
    max_new_tokens: int = Field(128, gt=0, description="tokens sampled per completion")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold")
    top_k: int = Field(0, ge=0, description="top-k sampling (0: off)")
    num_generations: int = Field(1, gt=0, description="samples per prompt")
    generation_batch_size: int | None = Field(
        None,
        gt=0,
        description="unique prompts per window (default: per_device_batch_size * "
        "grad_accum_steps / num_generations)",
    )


class LossConfig(Section):
    name: str = Field("jsd", description="loss from the registry (`distil losses` lists them)")
    beta: float = Field(0.5, ge=0.0, le=1.0, description="JSD mix: 0 forward KL, 1 reverse KL")
    temperature: float = Field(1.0, gt=0.0, description="softmax temperature on both models")
    chunk_size: int | None = Field(
        None, gt=0, description="tokens per chunk of the memory-lean loss (null: unchunked)"
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
    bf16: bool = Field(False, description="bf16 mixed precision")
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


class DistilConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    student: ModelConfig = Field(default_factory=ModelConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


# Keys that say where a run lives rather than what it does; `config diff` skips them by default.
LOCATION_KEYS = ("train.output_dir", "logging.run_name")


# ----------------------------------------------------------------------------- loading


def read_yaml(path: str | Path) -> dict[str, Any]:
    if problem := path_problem(path, "config file"):
        raise ConfigError(problem)
    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"config file {path} {what}; pass a YAML file or a run directory")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})"
            "; save the config as UTF-8"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    raw = parse_yaml(text, str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


# A config is a few sections deep and holds a few hundred values; YAML anchors can expand a
# short file into a huge (or cyclic) tree, which pydantic would walk forever.
MAX_DEPTH, MAX_VALUES = 32, 100_000


def parse_yaml(text: str, where: str) -> Any:
    """yaml.safe_load that turns every failure into a ConfigError naming `where`.

    PyYAML's constructors raise arbitrary exceptions for values they cannot build (`!!bool
    maybe` a KeyError, `2001-13-45` a ValueError, `!!timestamp x` an AttributeError), hence
    the broad except. The result is checked for size, depth and non-string keys.
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {_one_line(exc)}") from exc
    except RecursionError as exc:
        raise ConfigError(
            f"{where}: YAML nested too deeply; a config is a few levels deep"
        ) from exc
    except Exception as exc:  # see the docstring
        raise ConfigError(
            f"{where}: PyYAML cannot build a value ({type(exc).__name__}: {_one_line(exc)}); "
            "quote the value to keep it as a string, or fix its tag (e.g. !!float 1e-4)"
        ) from exc
    _check_tree(value, where)
    return value


def _check_tree(value: Any, where: str) -> None:
    """Reject trees too deep, too large (anchors expanded) or with keys that are not strings."""
    stack, seen = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            raise ConfigError(
                f"{where}: the YAML holds more than {MAX_VALUES} values or nests deeper than "
                f"{MAX_DEPTH} levels (a cyclic or repeatedly expanded anchor?); a config is a "
                "few sections of plain values"
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise ConfigError(
                        f"{where}: key {_short(key)} ({type(key).__name__}) is not a name; "
                        "config keys are names like train or lr"
                    )
                stack.append((child, depth + 1))
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend((child, depth + 1) for child in node)


def _one_line(exc: BaseException) -> str:
    return " ".join(_short(str(exc), 300).split())


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # an int over Python's 4,300-digit str limit
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> list[str]:
    """Set `a.b=value` overrides into `raw` in place (values parsed as YAML); return problems."""
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or not all(p.strip() for p in parts):
            problems.append(f"override {_short(item)!r} is not key=value; write e.g. train.lr=1e-4")
            continue
        try:
            value = parse_yaml(text, f"override {_short(item)!r}") if text.strip() else None
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        node = raw
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                problems.append(f"override {_short(item)!r}: '{where}' is a value, not a section")
                break
            node = child
        else:
            node[parts[-1]] = value
    return problems


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DistilConfig:
    """Read YAML (or a run directory's config.yaml), apply overrides, validate and resolve."""
    raw = read_yaml(path) if path is not None else {}
    problems = apply_overrides(raw, overrides)
    return build_config(raw, problems)


def _loc_key(loc: tuple) -> str:
    """The config key of a pydantic error location: list indices and the member names a union
    field adds (`target_modules.str`) dropped."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    leaves = leaf_fields()
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in leaves:
            return ".".join(parts[:end])
    return ".".join(parts)


def build_config(raw: dict[str, Any], problems: list[str] | None = None) -> DistilConfig:
    problems = list(problems or [])
    problems += unknown_key_problems(raw, DistilConfig)
    bad_keys: set[str] = set()
    try:
        cfg = DistilConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "extra_forbidden":
                continue  # reported above with a suggestion
            key = _loc_key(err["loc"])
            if key not in bad_keys:  # a union field fails once per member: report it once
                bad_keys.add(key)
                problems.append(_type_problem(key, err))
        try:
            cfg = DistilConfig.model_validate(_without(raw, bad_keys | _unknown_keys(raw)))
        except ValidationError:  # defaults for the bad keys should always validate
            raise ConfigError(problems) from exc
    cfg = resolve(cfg)
    for keys, message in semantic_problems(cfg):
        if not (set(keys) & bad_keys):
            problems.append(message)
    if problems:
        raise ConfigError(problems)
    return cfg


# ----------------------------------------------------------------------------- messages


def leaf_fields(model: type[BaseModel] = DistilConfig, prefix: str = "") -> dict[str, Any]:
    """Map every dotted leaf key (by alias) to its pydantic FieldInfo."""
    out = {}
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(leaf_fields(ann, key + "."))
        else:
            out[key] = info
    return out


def _unknown_keys(raw: Any, model: type[BaseModel] = DistilConfig, prefix: str = "") -> set[str]:
    if not isinstance(raw, dict):
        return set()
    fields = {(info.alias or name): info for name, info in model.model_fields.items()}
    found = set()
    for key, value in raw.items():
        info = fields.get(str(key))
        if info is None:
            found.add(prefix + str(key))
        elif isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found |= _unknown_keys(value, info.annotation, f"{prefix}{key}.")
    return found


def unknown_key_problems(raw: dict[str, Any], model: type[BaseModel]) -> list[str]:
    problems = []
    all_keys = list(leaf_fields(model))
    sections = sorted({k.split(".")[0] for k in all_keys})
    for key in sorted(_unknown_keys(raw, model)):
        parent, _, last = key.rpartition(".")
        siblings = [k for k in all_keys if k.rpartition(".")[0] == parent]
        if not parent:
            siblings = sections
        same_name = [k for k in all_keys if k.rpartition(".")[2] == last]
        close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
        close = close or difflib.get_close_matches(key, all_keys, n=1, cutoff=0.6)
        hint = same_name[0] if same_name else (close[0] if close else None)
        fix = f"did you mean '{hint}'?" if hint else "remove it"
        where = f"section '{parent}'" if parent else "the top level"
        problems.append(f"unknown key '{key}' in {where}: {fix}")
    return problems


def _type_problem(key: str, err: dict[str, Any]) -> str:
    info = leaf_fields().get(key)
    seen = err.get("input")
    value = repr(_short(seen, 200)) if isinstance(seen, str) else _short(seen, 200)
    msg = err["msg"]
    if info is None:
        return f"'{key}' = {value}: {msg}"
    return f"'{key}' = {value}: {msg}. Fix: {_fix_hint(key, info)}"


def _fix_hint(key: str, info: Any) -> str:
    ann = info.annotation
    choices = _literal_choices(ann)
    desc = f" ({info.description})" if info.description else ""
    if choices:
        return f"set {key} to one of {', '.join(repr(c) for c in choices)}{desc}"
    default = info.get_default(call_default_factory=True)
    return f"set {key} to a value like {default!r}{desc}"


def _literal_choices(ann: Any) -> list[Any]:
    if get_origin(ann) is Literal:
        return list(get_args(ann))
    for arg in get_args(ann):
        choices = _literal_choices(arg)
        if choices:
            return choices
    return []


def _without(raw: Any, keys: set[str], prefix: str = "") -> Any:
    if not isinstance(raw, dict):
        return raw
    out = {}
    for k, v in raw.items():
        key = prefix + str(k)
        if key in keys or any(b.startswith(key + ".") and not isinstance(v, dict) for b in keys):
            continue
        out[k] = _without(v, keys, key + ".")
    return out


# ----------------------------------------------------------------------------- resolve/validate


def resolve(cfg: DistilConfig) -> DistilConfig:
    """Fill the derived values (one place for them); returns a new config."""
    cfg = cfg.model_copy(deep=True)
    if cfg.student.tokenizer is None:
        cfg.student.tokenizer = cfg.student.path
    if cfg.teacher.tokenizer is None:
        cfg.teacher.tokenizer = cfg.teacher.path
    gen, train = cfg.generation, cfg.train
    window = train.per_device_batch_size * train.grad_accum_steps
    if gen.generation_batch_size is None and window % gen.num_generations == 0:
        gen.generation_batch_size = window // gen.num_generations
    if cfg.logging.run_name is None:
        cfg.logging.run_name = Path(train.output_dir).name
    return cfg


Check = Callable[[DistilConfig], "tuple[tuple[str, ...], str] | None"]
_CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a rule over several values; it returns (keys involved, message) or None."""
    _CHECKS.append(fn)
    return fn


def semantic_problems(cfg: DistilConfig) -> list[tuple[tuple[str, ...], str]]:
    return [p for fn in _CHECKS if (p := fn(cfg)) is not None]


@check
def _mixed_precision(cfg: DistilConfig):
    if cfg.train.bf16 and cfg.train.fp16:
        return ("train.bf16", "train.fp16"), (
            "train.bf16 and train.fp16 are both true; pick one (set the other to false)"
        )
    return None


@check
def _window_invariant(cfg: DistilConfig):
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


@check
def _eval_task_named(cfg: DistilConfig):
    from distil.tasks.registry import name_problem

    problem = name_problem(cfg.eval.task)
    return (("eval.task",), problem) if problem else None


@check
def _warmup_within_run(cfg: DistilConfig):
    t = cfg.train
    if t.warmup_steps > t.max_steps:
        return ("train.warmup_steps", "train.max_steps"), (
            f"train.warmup_steps ({t.warmup_steps}) > train.max_steps ({t.max_steps}): the "
            f"learning rate would never reach train.lr ({t.lr}). Fix: set train.warmup_steps "
            f"to at most {t.max_steps} (e.g. {max(t.max_steps // 10, 0)}), or raise "
            "train.max_steps"
        )
    return None


@check
def _seq_kd_has_slices(cfg: DistilConfig):
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
    if cfg.loss.name == "sft" and cfg.train.lambda_ > 0:
        return ("loss.name", "train.lambda"), (
            f"loss.name = 'sft' trains on completions the student did not write, but "
            f"train.lambda = {cfg.train.lambda_} asks for on-policy slices. Fix: set "
            "train.lambda=0 (dataset completions, or the teacher's with train.seq_kd=true)"
        )
    return None


@check
def _resume_changed_keys(cfg: DistilConfig):
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
def _hybrid_weights(cfg: DistilConfig):
    m, u = cfg.loss.matched_weight, cfg.loss.unmatched_weight
    if (m is None) != (u is None):
        return ("loss.matched_weight", "loss.unmatched_weight"), (
            f"loss.matched_weight ({m}) and loss.unmatched_weight ({u}) must both be set "
            "(fixed weights) or both be null (weights from the matched probability mass)"
        )
    return None


@check
def _teacher_cache_scores_data_only(cfg: DistilConfig):
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
    from distil.losses import is_cross_tokenizer

    if is_cross_tokenizer(cfg.loss.name):
        return ("teacher.cache", "loss.name"), (
            f"teacher.cache with loss.name = {cfg.loss.name!r}: caches hold same-tokenizer "
            "top-k targets only for now. Fix: a same-tokenizer loss (forward_kl, reverse_kl, "
            "jsd, sampled_reverse_kl), or drop teacher.cache"
        )
    return None


def _teacher_needed(cfg: DistilConfig):
    needs = (cfg.loss.name != "sft" or cfg.train.seq_kd) and not cfg.teacher.cache
    if needs and not cfg.teacher.path:
        why = "train.seq_kd=true" if cfg.loss.name == "sft" else f"loss.name = {cfg.loss.name!r}"
        return ("teacher.path",), (
            f"{why} needs a teacher but teacher.path is not set. Fix: set teacher.path to a "
            "model directory or hub id"
        )
    return None


def _student_needed(cfg: DistilConfig):
    if not cfg.student.path:
        return ("student.path",), (
            "student.path is not set. Fix: set it to a model directory or hub id "
            "(`distil init-model` creates a small random one to train from scratch)"
        )
    return None


def training_problems(cfg: DistilConfig) -> list[str]:
    """What `distil train` needs beyond a valid config, checked without loading anything:
    models to train and to learn from, data, and paths that exist (local ones) or can be
    created (the output directory)."""
    found = [_student_needed(cfg), _teacher_needed(cfg)]
    if not cfg.data.train:
        found.append(
            (
                ("data.train",),
                "data.train is not set. Fix: point it to a JSONL/parquet "
                "file, a saved dataset directory or a hub id",
            )
        )
    problems = [message for p in found if p is not None for message in [p[1]]]
    return problems + source_problems(cfg)[0]


# ----------------------------------------------------------------------------- output


def to_dict(cfg: DistilConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)


def to_yaml(cfg: DistilConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_resolved(cfg: DistilConfig, run_dir: str | Path) -> Path:
    """Write the resolved config (every value, defaults included) to run_dir/config.yaml."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(to_yaml(cfg))
    tmp.replace(path)
    return path


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def diff(a: DistilConfig, b: DistilConfig, *, include_location: bool = False):
    """Keys whose resolved values differ, as (key, value_a, value_b), in config order."""
    fa, fb = flatten(to_dict(a)), flatten(to_dict(b))
    rows = []
    for key in fa:
        if not include_location and key in LOCATION_KEYS:
            continue
        if fa[key] != fb[key]:
            rows.append((key, fa[key], fb[key]))
    return rows
