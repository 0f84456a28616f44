"""`distil eval --lm-eval TASKS --model DIR`: a model scored by lm-evaluation-harness, the
numbers everyone reports (the `lm-eval` extra: pip install 'distil[lm-eval]').

The model runs through lm-eval's own `HFLM` (its prompts, its few-shot sampling, its
log-likelihood and generation requests); distil only loads the tokenizer the way it loads
every tokenizer (a directory's own tokenizer.json kept) and hands over a model object when the
Python API has one. Tasks are lm-eval's names (`mmlu`, `gsm8k`, `arc_easy`, ...) or those of
YAML task files in `include_path` (a task reads local JSON data files with
`dataset_path: json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distil.errors import ConfigError, require
from distil.files import atomic_write

REPORT = "lm_eval.json"  # lm-eval's results, versions, n-shot and config, under --out


def run_lm_eval(
    model: Any,
    tasks: list[str],
    *,
    tokenizer: Any = None,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    include_path: str | None = None,
    device: str | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` results ({"results": {task: {metric: value}}, ...}) of
    `model` (a directory or hub id, or a loaded model with its `tokenizer`) on `tasks`."""
    lm_eval = require("lm_eval", "lm-eval", "distil eval --lm-eval")
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = None
    if include_path:  # only tasks of their own: lm-eval's thousands of task files not indexed
        manager = TaskManager(include_path=include_path, include_defaults=False)
        manager = manager if all(manager.match_tasks([t]) for t in tasks) else None
    manager = manager or TaskManager(include_path=include_path)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        where = f" or in {include_path}" if include_path else ""
        raise ConfigError(
            f"--lm-eval: no lm-eval task named {', '.join(map(repr, unknown))}{where}. Fix: use "
            "lm-eval's task names (`lm_eval ls tasks` lists them), or --lm-eval-include DIR "
            "with YAML task files"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(model, str):
        from distil.models.load import load_tokenizer

        tokenizer = tokenizer or load_tokenizer(model, key="--model")
        lm = HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=batch_size)
    else:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=manager,
        log_samples=log_samples,
    )


def refuse_unused(given: list[str], takes: str) -> None:
    """ConfigError naming the options `given` that an lm-eval run would silently ignore
    (lm-eval's tasks bring their own data, prompts and generation settings); `takes`: the
    options that do apply."""
    if not given:
        return
    one = len(given) == 1
    raise ConfigError(
        f"--lm-eval: {', '.join(given)} {'does' if one else 'do'} not apply to an lm-eval run "
        f"(its tasks bring their own data, prompts and settings). Fix: drop "
        f"{'it' if one else 'them'}; lm-eval takes {takes}"
    )


def write_report(results: dict[str, Any], out: str | Path) -> Path:
    """lm-eval's results (with versions, n-shot and task configs) as out/lm_eval.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shown = {k: results[k] for k in ("results", "versions", "n-shot", "config") if k in results}
    text = json.dumps(shown, indent=2, default=str) + "\n"
    atomic_write(out / REPORT, lambda tmp: Path(tmp).write_text(text))
    return out / REPORT


def results_table(results: dict[str, Any]) -> str:
    """lm-eval's own Markdown table of the results (as its command line prints it)."""
    from lm_eval.utils import make_table

    return make_table(results)
