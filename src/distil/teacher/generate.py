"""`distil generate`: a model (by default the config's teacher) writes completions for the
config's prompts, `n` per prompt, into a JSONL file that `data.train` reads.

Each output row is the input row's other columns (Countdown's `nums`, `target`, ...) plus the
rendered `prompt` (chat messages, as the model saw them) and the model's `completion`; train from
it with `data.template=null` (the prompt is already rendered). `keep="correct"` keeps only
completions the config's task (eval.task: countdown, gsm8k, math, mmlu or a user's task) judges
correct, each row read as that task's problem. The file is written to `<out>.tmp` and renamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from distil.config import DistilConfig
from distil.data.datasets import source_row
from distil.errors import ConfigError, DataError
from distil.generation.base import SamplingParams
from distil.progress import progress_bar
from distil.tasks import Task, make_task
from distil.tasks.prompts import config_examples

KEEP = ("all", "correct")


def generate_completions(
    cfg: DistilConfig,
    out: str | Path,
    *,
    model_path: str | None = None,
    model=None,
    tokenizer=None,
    n: int | None = None,
    keep: str = "all",
    batch_size: int = 16,
) -> dict[str, int]:
    """Write the completions; returns counts {"prompts", "completions", "kept"}. `model`: the
    model already loaded (the Python API), its config.json at `model_path`. `tokenizer`: an
    object or a path (default: `model_path`'s, else teacher.tokenizer)."""
    from distil.generation.select import build_generator, teacher_backend
    from distil.models.load import load_model, load_tokenizer, place_model, resolve_dtype
    from distil.models.tokenizers import encode_prompts, id_rows, prompt_format, stop_token_ids

    path = model_path or cfg.teacher.path
    if not path:
        raise ConfigError("generate needs a model: pass --model PATH or set teacher.path")
    if not cfg.data.train:
        raise ConfigError("data.train is not set: generate writes completions for its prompts")
    if keep not in KEEP:
        raise ConfigError(f"--keep {keep!r}: choose one of {', '.join(KEEP)}")
    out = Path(out)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: give a file path in an existing directory")
    examples = config_examples(cfg.data)
    task, problems = _judged(cfg, examples) if keep == "correct" else (None, None)
    key = "--model" if model_path else "teacher.path"
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        where = str(tokenizer or (model_path or cfg.teacher.tokenizer or path))
        tok = load_tokenizer(where, key="tokenizer" if tokenizer else key)
    else:
        tok = tokenizer
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" else cfg.teacher.dtype
    if model is not None:
        model = place_model(model, resolve_dtype(dtype, path, device), device, key=key).eval()
    else:
        model = load_model(path, key=key, dtype=dtype, device=device).eval()
    prompts = encode_prompts(
        tok,
        [e.prompt for e in examples],
        max_tokens=cfg.data.max_prompt_tokens,
        name=key,
        fmt=prompt_format(cfg.data),
    )
    g = cfg.generation
    params = SamplingParams(
        g.max_new_tokens, g.temperature, g.top_p, g.top_k, n or g.num_generations
    )
    gen = build_generator(
        cfg,
        model,
        pad_id=tok.pad_token_id,
        stop_ids=stop_token_ids(tok, model),
        vocab_limit=id_rows(tok),
        backend=teacher_backend(cfg),
    )
    torch.manual_seed(cfg.train.seed)
    counts = {"prompts": len(examples), "completions": 0, "kept": 0}
    tmp = out.with_name(out.name + ".tmp")
    try:
        with tmp.open("w") as fh:
            _write(
                fh, examples, prompts, gen, params, tok, (task, problems), batch_size, counts, cfg
            )
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written is left behind
        raise
    os.replace(tmp, out)
    return counts


def _judged(cfg: DistilConfig, examples) -> tuple[Task, list[dict[str, Any]]]:
    """The config's task and each example's problem as that task reads it; a row it cannot read
    is a DataError naming the file and line, raised before any model loads."""
    task = make_task(cfg.eval)
    problems = []
    for e in examples:
        path, _, line = e.meta.get("_where", "").rpartition(":")
        where = {"path": path or None, "line": int(line) if line.isdigit() else None}
        row = source_row(e)  # every column; the completion column holds a task's gold answer
        if e.completion is not None:
            row.setdefault(cfg.data.completion_field, e.completion)
        try:
            problems.append(task.problem(row, where))
        except DataError as exc:
            raise DataError(
                f"--keep correct judges completions with the task {task.name!r} (eval.task), but "
                f"this row is not one of its problems ({exc.message}). Fix: --keep all, or set eval.task "
                "to the data's task",
                **where,
            ) from exc
    return task, problems


def _write(fh, examples, prompts, gen, params, tok, judge, batch_size, counts, cfg) -> None:
    """Generate batch by batch and write the kept rows (judge: (task, problems) or (None, _),
    keeping every row) to `fh`."""
    task, problems = judge
    with progress_bar("generate", len(examples), enabled=cfg.logging.progress, unit="rows") as bar:
        for lo in range(0, len(examples), batch_size):
            chunk = examples[lo : lo + batch_size]
            rollout = gen.generate(prompts[lo : lo + len(chunk)], params)
            for j, ids in zip(rollout.prompt_index, rollout.completion_lists(), strict=True):
                ex = chunk[j]
                text = tok.decode(ids, skip_special_tokens=True)
                counts["completions"] += 1
                if task is not None and not task.check(text, problems[lo + j]).correct:
                    continue
                counts["kept"] += 1
                fh.write(json.dumps(_row(ex, text), ensure_ascii=False) + "\n")
            bar.advance(len(chunk))


def _row(example, completion: str) -> dict[str, Any]:
    """The source row's columns (GSM8K's question and answer, Countdown's nums and target: what
    `distil eval --completions` reads as the problem), then the rendered prompt and the
    completion, which take the names `prompt` and `completion`."""
    row = source_row(example)
    row["prompt"] = example.prompt
    row["completion"] = completion
    return row
