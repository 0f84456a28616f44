"""`distil eval`: the argparse wiring over `distil.api.evaluate` (a task's verdicts of models
and completions files, or lm-evaluation-harness with --lm-eval)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_eval(sub, positive_int) -> None:
    p = sub.add_parser(
        "eval", help="score a task's completions or a model (countdown, gsm8k, ...; or lm-eval)"
    )
    p.add_argument("--model", action="append", default=[], help="model directory (repeatable)")
    p.add_argument("--completions", action="append", default=[], help="JSONL of outputs")
    p.add_argument("--config", help="YAML whose eval section gives the defaults")
    p.add_argument(
        "--task",
        help="countdown, gsm8k, math, mmlu, or module:Class of your own (default: the "
        "--config's eval.task, else countdown)",
    )
    p.add_argument("--data", help="problems: a JSONL/parquet file or a hub dataset id")
    p.add_argument("--subset", help="hub dataset config name (gsm8k: main, mmlu: all)")
    p.add_argument("--split", help="hub dataset split (default: test)")
    p.add_argument("--n", type=positive_int, help="problems to evaluate")
    p.add_argument("--samples", type=positive_int, help="completions per problem (pass@k)")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--max-new-tokens", type=positive_int)
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--template", help="prompt template (default: recorded with the model)")
    p.add_argument("--number-usage", choices=["exact", "subset"])
    p.add_argument("--out", default=None, help="report directory (default: eval-report)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--lm-eval",
        metavar="TASKS",
        help="score --model with lm-evaluation-harness instead: its task names, comma-"
        "separated (mmlu,gsm8k,...; the lm-eval extra); --n limits the rows per task",
    )
    p.add_argument("--lm-eval-include", metavar="DIR", help="a folder of lm-eval task YAMLs")
    p.add_argument("--num-fewshot", type=int, help="examples shown before each question")
    p.add_argument("overrides", nargs="*", help="eval.key=value overrides")
    p.set_defaults(func=_eval)


def _eval(args) -> int:
    if args.lm_eval:
        return _lm_eval(args)
    from distil.api.evaluate import eval_config, run_evaluation
    from distil.eval.report import format_table

    keys = {
        "task": args.task,
        "data": args.data,
        "subset": args.subset,
        "split": args.split,
        "n": args.n,
        "samples": args.samples,
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "template": args.template,
        "number_usage": args.number_usage,
        "num_fewshot": args.num_fewshot,
    }
    cfg = eval_config(args.config, args.overrides, keys)
    results, paths = run_evaluation(
        cfg,
        models=[(m, None) for m in args.model],
        completions=args.completions,
        out=args.out or "eval-report",
        progress=not args.no_progress,
    )
    print(format_table(results))
    print(f"\nreport: {paths['markdown']}  {paths['json']}", file=sys.stderr)
    return 0


def _lm_eval(args) -> int:
    from distil.api.evaluate import evaluate_lm_eval
    from distil.errors import ConfigError
    from distil.eval.lm_eval import REPORT, refuse_unused, results_table

    flags = {
        "--config": args.config,
        "overrides": args.overrides,
        "--completions": args.completions,
        "--task": args.task,
        "--data": args.data,
        "--subset": args.subset,
        "--split": args.split,
        "--samples": args.samples,
        "--max-new-tokens": args.max_new_tokens,
        "--temperature": args.temperature,
        "--template": args.template,
        "--number-usage": args.number_usage,
    }
    takes = "--model, --n, --batch-size, --num-fewshot, --lm-eval-include and --out"
    refuse_unused([f for f, v in flags.items() if v not in (None, [])], takes)
    if len(args.model) != 1:
        raise ConfigError("--lm-eval scores one --model DIR (a directory or hub id)")
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    out = args.out or "eval-report"
    results = evaluate_lm_eval(
        args.model[0],
        tasks,
        out=out,
        num_fewshot=args.num_fewshot,
        limit=args.n,
        batch_size=args.batch_size or 8,
        include_path=args.lm_eval_include,
    )
    print(results_table(results))
    print(f"\nreport: {Path(out) / REPORT}", file=sys.stderr)
    return 0
