"""`distil.evaluate` and `distil eval`: a model (a directory, a hub id or a loaded model) or a
file of completions scored on a task (countdown, gsm8k, math, mmlu, yours), or a model scored
by lm-evaluation-harness. The command line parses its flags into the same call.

    result = distil.evaluate("runs/x/final", task="gsm8k", n=200)
    result.summary["accuracy"]
    distil.evaluate(model, tokenizer=tok, task="mmlu", mmlu_scoring="loglik", data=rows)
    distil.evaluate("runs/x/final", lm_eval=["mmlu"])     # lm-eval's results dict

Everything that can be checked without a model is checked first (the config, the report
directory, the task name, the completions files, the problems), so a mistake never costs an
evaluation.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

from distil.api.inputs import ConfigLike, Overrides, is_path, make_config
from distil.config.loading import override_list
from distil.errors import ConfigError


def evaluate(
    model: Any = None,
    task: str | None = None,
    *,
    tokenizer: Any = None,
    config: ConfigLike = None,
    overrides: Overrides = (),
    data: Any = None,
    completions: str | None = None,
    out: str | None = None,
    progress: bool = False,
    lm_eval: str | Sequence[str] | None = None,
    **eval_keys: Any,
):
    """Score `model` (or the `completions` file) on `task` and return its `EvalResult`
    (`.summary`: accuracy, one count per outcome, pass@k; `.rows`: the verdicts).

    `config`/`overrides` give the eval section's defaults as for `Distiller`; `eval_keys` set
    any eval.* key (n=, samples=, num_fewshot=, mmlu_scoring=, ...); `data` (eval.data): a
    path or hub id, a Dataset or a list of dicts. `out`: also write the report there.
    `lm_eval`: lm-eval task names instead of `task`; returns lm-eval's results dict."""
    if lm_eval is not None:
        from distil.eval.lm_eval import refuse_unused

        other = {"task": task, "config": config, "overrides": overrides, "data": data}
        other.update(completions=completions, **eval_keys)
        given = [k for k, v in other.items() if _given(v) and k not in LM_EVAL_KEYS]
        refuse_unused(given, LM_EVAL_TAKES)
        names = [lm_eval] if isinstance(lm_eval, str) else list(lm_eval)
        keys = {k: v for k, v in eval_keys.items() if v is not None}
        return evaluate_lm_eval(model, names, tokenizer=tokenizer, out=out, **keys)
    keys = {**eval_keys, **({"task": task} if task else {})}
    with tempfile.TemporaryDirectory(prefix="distil-eval-") as tmp:
        cfg = eval_config(config, overrides, keys, data=data, root=tmp)
        models = [(model, tokenizer)] if model is not None else []
        files = [completions] if completions else []
        results, _ = run_evaluation(
            cfg, models=models, completions=files, out=out, progress=progress
        )
    return results[0]


def eval_config(
    config: ConfigLike, overrides: Overrides, keys: dict[str, Any], *, data=None, root=None
):
    """The config of an evaluation: `config` + `overrides`, then eval.<key> = value for each
    of `keys` that is not None; `data` (eval.data) may be an object (written under `root`)."""
    given = {f"eval.{k}": v for k, v in keys.items() if v is not None}
    both = [*override_list(overrides), *override_list(given)]
    cfg, _ = make_config(config, both, data={"eval.data": data}, root=root)
    return cfg


def run_evaluation(cfg, *, models=(), completions=(), out: str | None = None, progress=True):
    """(one `EvalResult` per completions file, then per (model, tokenizer); the report's
    paths): with `out`, the report (Markdown, JSON and the verdicts) is written there."""
    from distil.eval.report import check_out_dir, unique_names, write_report
    from distil.eval.runner import evaluate_model, load_problem_set, score_file
    from distil.preflight import check
    from distil.tasks import make_task

    if not models and not completions:
        raise ConfigError("give at least one --model DIR or --completions FILE to evaluate")
    check(cfg, "eval")  # an unknown task name stops here
    task = make_task(cfg.eval)  # a broken import path stops here
    if out is not None:
        check_out_dir(out)
    sources = [("completions", f) for f in completions]
    sources += [("model", _model_name(m)) for m, _ in models]
    names = unique_names(sources)
    for m, tok in models:  # a mistyped local path stops here, not after the first model ran
        if is_path(m):
            from distil.models.load import check_model_path

            check_model_path(str(m), "--model")
        elif tok is None:
            raise ConfigError("a loaded model was passed without its tokenizer. Fix: tokenizer=")
    tokenizers = [as_tokenizer(tok) for _, tok in models]  # a bad path stops here too
    results = [score_file(f, name=n, task=task) for f, n in zip(completions, names, strict=False)]
    if models:
        problems, data = load_problem_set(task)
        named = zip(models, tokenizers, names[len(completions) :], strict=True)
        for (m, _), tok, name in named:
            r = evaluate_model(
                str(m) if is_path(m) else _model_name(m),
                task,
                name=name,
                problems=problems,
                progress=progress,
                model=None if is_path(m) else m,
                tokenizer=tok,  # None: the model directory's own
                template_kwargs=cfg.data.chat_template_kwargs or None,  # None: the model's
            )
            r.data = data
            results.append(r)
    return results, (write_report(results, out) if out is not None else None)


def _given(value: Any) -> bool:
    """An argument set (0 and False are; None and empty overrides are not)."""
    return value is not None and not (isinstance(value, (list, tuple, dict)) and not value)


def as_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer given as a path or hub id, loaded as distil loads every tokenizer; an
    object (or None) as it is."""
    if tokenizer is None or not is_path(tokenizer):
        return tokenizer
    from distil.models.load import load_tokenizer

    return load_tokenizer(str(tokenizer), key="tokenizer")


def _model_name(model: Any) -> str:
    if is_path(model):
        return str(model)
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


LM_EVAL_KEYS = ("n", "limit", "num_fewshot", "batch_size", "include_path", "device", "log_samples")
LM_EVAL_TAKES = "model, tokenizer=, out=, " + ", ".join(f"{k}=" for k in LM_EVAL_KEYS)


def evaluate_lm_eval(
    model: Any, tasks: list[str], *, tokenizer: Any = None, out: str | None = None, **keys: Any
):
    """lm-evaluation-harness on `model` (`distil.eval.lm_eval.run_lm_eval`); `keys`:
    num_fewshot, limit (or n), batch_size, include_path, device, log_samples. `out`: also
    write lm-eval's results there (lm_eval.json), the directory checked before anything runs."""
    from distil.eval.lm_eval import refuse_unused, run_lm_eval, write_report
    from distil.eval.report import check_out_dir

    refuse_unused([k for k in keys if k not in LM_EVAL_KEYS], LM_EVAL_TAKES)
    if out is not None:
        check_out_dir(out)
    if model is None:
        raise ConfigError("lm-eval needs a model: pass --model DIR (a directory or hub id)")
    if not is_path(model) and tokenizer is None:
        raise ConfigError("a loaded model was passed without its tokenizer. Fix: tokenizer=")
    if "n" in keys:
        keys["limit"] = keys.pop("n")
    model = str(model) if is_path(model) else model
    results = run_lm_eval(model, tasks, tokenizer=as_tokenizer(tokenizer), **keys)
    if out is not None:
        write_report(results, out)
    return results
