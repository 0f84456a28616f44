"""The world checks, one place for every command: what a valid config (`distil.config`, values
and their relations only) cannot know.

- `check(cfg, command)`: what `train`, `eval`, `generate` and `cache-teacher` need before any
  weights load: names that must resolve to a plug-in (eval.task, the loss with a remote
  teacher), models and data to work on, local paths that exist with the right kind, an output
  directory that can be created, the generation backend's extra and device.
- `preflight(cfg)`: `distil config validate`, every check `distil train` makes before its first
  step that needs no model weights, so `ok` means training would start. Beyond `check`: the
  loss is registered, the needed extras are installed, the first rows of the data parse and fit
  the token limits, the tokenizers load, have an EOS token and render the prompts (with
  data.text_prompts and data.chat_template_kwargs), a same-tokenizer loss gets one vocabulary
  on both sides, and the evaluation problems file reads. `validation(cfg)` returns the same with
  the tokenizers and rows it read, for `distil config validate` to show the first row as each
  model sees it (inspect_prompts.first_row).

Models and data given as hub ids are not fetched (notes say so); their tokenizers are, as the
run loads them (a few files; from the local hub cache when offline).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from distil.config import DistilConfig
from distil.errors import ConfigError, DistilError
from distil.paths import looks_local, output_dir_problem, path_problem
from distil.preflight.tokenizers import several_tokenizers, side_tokenizers

ROWS_READ = 64  # rows of each data file parsed and measured


@dataclass
class Validation:
    """What `validation` found: problems stop `distil train`; notes say what was not checked
    or what a run will do; `tokenizers` ("student", "teacher") and `examples` (the first rows
    of data.train) are what it read (empty where it could not)."""

    problems: list[str]
    notes: list[str]
    tokenizers: dict[str, Any] = dataclass_field(default_factory=dict)
    examples: list | None = None


def preflight(cfg: DistilConfig) -> tuple[list[str], list[str]]:
    """(problems, notes): problems stop `distil train`; notes say what was not checked."""
    v = validation(cfg)
    return v.problems, v.notes


def validation(cfg: DistilConfig) -> Validation:
    """`preflight`, with the tokenizers and rows it read."""
    notes = source_problems(cfg)[1]
    from distil.config.rules import warmup_notice

    notes += filter(None, [cpu_precision_note(cfg), warmup_notice(cfg)])
    problems = command_problems(cfg, "train")
    if problems:  # the checks below read files: only once every path is there
        return Validation(problems, notes)
    found = _Problems()
    _settings(cfg, found)
    if cfg.teacher.cache:  # manifest only; shards and data rows are checked by `distil train`
        from distil.teacher.cached import check_settings

        found.attempt(check_settings, cfg)
    examples = _data(cfg, found)
    routes = None
    if cfg.teachers.models and cfg.teachers.column and examples:  # each row has a teacher
        from distil.teacher.several import row_teachers

        routes = found.attempt(row_teachers, examples, cfg.teachers, list(cfg.teachers.models))
    if examples and (routes is not None or not cfg.teachers.column):
        _context_fields(cfg, examples, routes, found)
    toks = side_tokenizers(cfg, examples, found, notes)
    from distil.losses import is_cross_tokenizer, needs_teacher
    from distil.models.load import vocab_mismatch

    same_tokenizer = needs_teacher(cfg.loss.name) and not is_cross_tokenizer(cfg.loss.name)
    if same_tokenizer and len(toks) == 2 and not found:
        found += filter(None, [vocab_mismatch(cfg.loss.name, toks["student"], toks["teacher"])])
    if cfg.teachers.models:
        several_tokenizers(cfg, toks.get("student"), found)
    return Validation(list(found), notes, toks, examples)


def _context_fields(cfg: DistilConfig, examples, routes, found: _Problems) -> None:
    """Each row's teacher prompt can be built: its teacher's template (teacher.context, or a
    routed teacher's own teachers.models.NAME.context) reads only columns the row has."""
    from distil.config.contexts import has_context, teacher_context
    from distil.data.context import context_prompt

    if not has_context(cfg):
        return
    names, failed = list(cfg.teachers.models), set()  # the first row failing, per template
    for i, e in enumerate(examples):
        name = names[routes[i]] if routes else names[0] if names else None
        own = name is not None and cfg.teachers.models[name].context is not None
        key = f"teachers.models.{name}.context" if own else "teacher.context"
        if (
            key not in failed
            and found.attempt(context_prompt, e, *teacher_context(cfg, name), key=key) is None
        ):
            failed.add(key)


COMMANDS = ("train", "eval", "generate", "cache-teacher")


def cpu_precision_note(cfg: DistilConfig, cuda: bool | None = None) -> str | None:
    """A note when bf16 compute or bf16 weights are asked for on a machine without CUDA: CPUs
    have no fast bf16 matmul path, so such a step usually takes several times as long as fp32.
    `cuda` defaults to what this machine has."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    asked = {
        "train.bf16": cfg.train.bf16,
        "train.bf16_weights": cfg.train.bf16_weights,
        "student.dtype": cfg.student.dtype == "bfloat16",
        "teacher.dtype": cfg.teacher.dtype == "bfloat16",
    }
    keys = [k for k, on in asked.items() if on]
    if cuda or not keys:
        return None
    fixes = {
        "train.bf16": "train.bf16=false",
        "train.bf16_weights": "train.bf16_weights=false",
        "student.dtype": "student.dtype=float32",
        "teacher.dtype": "teacher.dtype=float32",
    }
    return (
        f"{', '.join(keys)} ask for bfloat16 on a machine without CUDA: CPUs have no fast "
        "bfloat16 matmuls, so each step usually takes several times as long as in float32. "
        f"For a CPU run: {' '.join(fixes[k] for k in keys)}"
    )


def check(cfg: DistilConfig, command: str) -> None:
    """Raise one ConfigError listing what `command` needs and this config or machine lacks."""
    if problems := command_problems(cfg, command):
        raise ConfigError(problems)


def command_problems(cfg: DistilConfig, command: str) -> list[str]:
    """What `command` (one of COMMANDS) needs beyond a valid config, checked without loading
    anything; one line per problem, each with its fix."""
    if command == "train":
        found = [_student_needed(cfg), _teacher_needed(cfg)]
        if not cfg.data.train:
            found.append(
                "data.train is not set. Fix: point it to a JSONL/parquet "
                "file, a saved dataset directory or a hub id"
            )
        problems = [p for p in found if p is not None] + _names(cfg)
        return problems + _backend_problems(cfg) + source_problems(cfg)[0]
    if command == "eval":
        return _task_named(cfg)
    if command == "generate":
        return _task_named(cfg) + _backend_problems(cfg)
    if command == "cache-teacher":
        return _names(cfg)  # its own inputs (teacher, student, data, top_k): teacher/writer.py
    raise ValueError(f"unknown command {command!r} (valid: {', '.join(COMMANDS)})")


def _names(cfg: DistilConfig) -> list[str]:
    """The names a training run resolves: eval.task, a loss a remote teacher can feed, and the
    reward's task (with reward.values) or function."""
    from distil.config.rules_reward import scores_rewards
    from distil.losses import is_cross_tokenizer

    found = _task_named(cfg)
    if scores_rewards(cfg):
        from distil.tasks.reward import reward_scorer

        try:
            reward_scorer(cfg)
        except DistilError as exc:
            found += getattr(exc, "problems", None) or [str(exc)]
    name = cfg.loss.name
    if cfg.teacher.url and is_cross_tokenizer(name) and name != "sampled_chunk_reverse_kl":
        found.append(
            f"loss.name = {name!r} with teacher.url: this cross-tokenizer loss reads the "
            "teacher's full distribution, a server returns its top-k. Fix: "
            "loss.name=sampled_chunk_reverse_kl (needs only the teacher's log-prob of its own "
            "tokens), or a local teacher (teacher.url=null)"
        )
    return found


def _task_named(cfg: DistilConfig) -> list[str]:
    from distil.tasks.registry import name_problem

    problem = name_problem(cfg.eval.task)
    return [problem] if problem else []


def _teacher_needed(cfg: DistilConfig) -> str | None:
    from distil.losses import needs_teacher, teacher_runs

    t = cfg.teacher
    needs = teacher_runs(cfg.loss.name, cfg.train.seq_kd) and not t.cache
    needs = needs and not cfg.teachers.models
    needs = needs and not t.from_student
    why = f"loss.name = {cfg.loss.name!r}" if needs_teacher(cfg.loss.name) else "train.seq_kd=true"
    if needs and t.url and not t.tokenizer:  # resolve() copies teacher.path into it
        return (
            f"teacher.url = {t.url!r} with teacher.path and teacher.tokenizer null: distil "
            "sends the server token ids, so it needs the served model's tokenizer. Fix: set "
            "teacher.tokenizer to that tokenizer (a directory or hub id); teacher.path, with a "
            "URL, is the served model's name and may stay null when the server serves one model"
        )
    if needs and not t.path and not t.url:
        return (
            f"{why} needs a teacher but teacher.path is not set. Fix: set teacher.path to a "
            "model directory or hub id (or teacher.url to a teacher server, or teacher.cache "
            "to a cache written by `distil cache-teacher`)"
        )
    return None


def _student_needed(cfg: DistilConfig) -> str | None:
    if not cfg.student.path:
        return (
            "student.path is not set. Fix: set it to a model directory or hub id "
            "(`distil init-model` creates a small random one to train from scratch)"
        )
    return None


def _backend_problems(cfg: DistilConfig) -> list[str]:
    """The generation backend's needs on this machine (vllm: the extra and a CUDA GPU)."""
    if cfg.generation.backend != "vllm":
        return []
    from distil.generation.vllm import backend_problems

    return backend_problems(cfg)


def source_problems(cfg: DistilConfig) -> tuple[list[str], list[str]]:
    """(problems, notes) about the config's paths. Local paths must exist with the right kind
    (directory for models, file or dataset directory for data); hub ids are not checked over
    the network and get a note instead."""
    from distil.losses import teacher_runs

    problems: list[str] = []
    notes: list[str] = []
    models = [("student", cfg.student)]
    if cfg.teacher.path and teacher_runs(cfg.loss.name, cfg.train.seq_kd):
        models.append(("teacher", cfg.teacher))
    models += [(f"teachers.models.{name}", t) for name, t in cfg.teachers.models.items()]
    for name, section in models:
        if not section.path:
            continue
        keys = [("path", section.path)]
        if section.tokenizer and section.tokenizer != section.path:
            keys.append(("tokenizer", section.tokenizer))
        for field, value in keys:
            _check_source(f"{name}.{field}", value, "model", problems, notes)
    data = [("data.train", cfg.data.train), ("data.eval", cfg.data.eval)]
    if cfg.train.eval_every:
        data.append(("eval.data", cfg.eval.data))
    for key, value in data:
        if value:
            _check_source(key, value, "data", problems, notes)
    if problem := output_dir_problem(cfg.train.output_dir, "train.output_dir"):
        problems.append(problem)
    return problems, notes


def _check_source(key: str, value: str, kind: str, problems: list[str], notes: list[str]) -> None:
    if problem := path_problem(value, key):
        problems.append(problem)
        return
    path = Path(os.path.expanduser(value))
    if path.exists():
        if kind == "model" and not path.is_dir():
            problems.append(
                f"{key} = {value!r} is a file; a model or tokenizer is a directory written by "
                "save_pretrained. Fix: point it to that directory"
            )
        return
    if looks_local(value):
        what = "directory" if kind == "model" else "file or directory"
        fix = (
            "`distil init-model` creates a small model"
            if kind == "model"
            else "`distil countdown generate --out DIR` writes DIR/train.jsonl and DIR/test.jsonl"
        )
        problems.append(f"{key} = {value!r}: no such local {what}. Fix: check the path ({fix})")
    else:
        what = "not checked beyond its tokenizer" if kind == "model" else "not read here"
        notes.append(f"{key} = {value!r} is taken as a hub id; {what} (no weights or data rows)")


class _Problems(list):
    def attempt(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), or None with its DistilError's message recorded."""
        try:
            return fn(*args, **kwargs)
        except DistilError as exc:
            self.append(str(exc))
            return None


def _settings(cfg: DistilConfig, found: _Problems) -> None:
    from distil.losses import get_loss, is_cross_tokenizer

    found.attempt(get_loss, cfg.loss.name)
    if cfg.teacher.top_k is not None and is_cross_tokenizer(cfg.loss.name) and not cfg.teacher.url:
        found.append(
            f"teacher.top_k = {cfg.teacher.top_k} with loss.name = {cfg.loss.name!r}: the "
            "cross-tokenizer losses need the teacher's full distribution. Fix: set "
            "teacher.top_k=null"
        )
    extras = [(t, "trackers", f"logging.trackers={t}") for t in cfg.logging.trackers]
    if cfg.student.lora.enabled:
        extras.append(("peft", "peft", "student.lora.enabled=true"))
    for module, extra, feature in extras:
        if importlib.util.find_spec(module) is None:
            found.append(
                f"{feature} needs the optional package '{module}', which is not installed. "
                f"Install it with: pip install 'distil[{extra}]' (or pip install {module})."
            )
    if cfg.train.fp16:
        import torch

        if not torch.cuda.is_available():
            found.append("train.fp16=true needs a CUDA GPU. Fix: use train.bf16=true on CPU")


def _data(cfg: DistilConfig, found: _Problems):
    """The first rows of data.train (also parsed: data.eval and, with eval_every, eval.data)."""
    from distil.tasks.prompts import config_examples

    examples = None
    for source in (cfg.data.train, cfg.data.eval):
        if source and (looks_local(source) or Path(os.path.expanduser(source)).exists()):
            rows = found.attempt(config_examples, cfg.data, source, ROWS_READ)
            examples = rows if examples is None else examples
    if cfg.train.eval_every:  # the task imports; a local problems file reads as its rows
        from distil.tasks import make_task

        task = found.attempt(make_task, cfg.eval)
        if task is not None and cfg.eval.data and looks_local(cfg.eval.data):
            found.attempt(task.load)
    return examples
