"""The `distil cache-teacher` and `distil generate` commands: the teacher's work written to
disk once (top-k log-probs, or completions), for off-policy and sequence-level training."""

from __future__ import annotations


def add_cache_teacher(sub, positive_int) -> None:
    p = sub.add_parser(
        "cache-teacher", help="score the data's completions with the teacher once: top-k on disk"
    )
    p.add_argument("config", help="YAML config: its data, student tokenizer, teacher, top_k")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    p.add_argument("--out", required=True, help="cache directory (resumed if it exists)")
    p.add_argument(
        "--values",
        choices=["sqrt", "q8", "fp16", "fp32"],
        default="sqrt",
        help="probability storage: sqrt (quantised square roots, KL ~5e-4 nats per token, "
        "default), q8 (1/8-nat log-prob steps), fp16, fp32 (lossless)",
    )
    p.add_argument("--shard-rows", type=positive_int, default=1024, help="rows per shard")
    p.add_argument("--batch-size", type=positive_int, default=None, help="rows per teacher forward")
    p.add_argument(
        "--teacher",
        metavar="NAME",
        default=None,
        help="with teachers.models: cache this teacher alone, over every row (default: one "
        "cache of all of them, each row's targets from its routed teacher, its name recorded; "
        "or the top-k of a teachers.weights mixture)",
    )
    p.add_argument(
        "--top-k",
        type=positive_int,
        default=None,
        help="the cache's k where the config sets no top_k (a mixture's teachers are full)",
    )
    p.set_defaults(func=_cache_teacher)


def _cache_teacher(args) -> int:
    from distil.config import load_config
    from distil.preflight import check
    from distil.teacher.writer import cache_teacher

    cfg = load_config(args.config, args.overrides)
    check(cfg, "cache-teacher")
    m = cache_teacher(
        cfg,
        args.out,
        values=args.values,
        shard_rows=args.shard_rows,
        batch_size=args.batch_size,
        teacher=args.teacher,
        top_k=args.top_k,
    )
    per_token = m["bytes"] / max(m["tokens"], 1)
    print(
        f"{m['tokens']} tokens in {len(m['shards'])} shards, {m['bytes']} bytes "
        f"({per_token:.1f} bytes per token, k={m['k']}, values={m['values']}): {args.out}"
    )
    if routes := m.get("routes"):
        rows = ", ".join(f"{n}: {c}" for n, c in routes["rows"].items())
        print(f"rows per teacher (by {routes['column']}): {rows}")
    return 0


def add_generate(sub, positive_int) -> None:
    p = sub.add_parser(
        "generate", help="a model (default: the teacher) writes completions for the data's prompts"
    )
    p.add_argument("config", help="YAML config: its data, generation settings and teacher")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    p.add_argument("--out", required=True, help="JSONL file to write (prompt, completion, ...)")
    p.add_argument("--model", default=None, help="model directory (default: teacher.path)")
    p.add_argument(
        "--n",
        type=positive_int,
        default=None,
        help="completions per prompt (default: generation.num_generations)",
    )
    p.add_argument(
        "--keep",
        choices=["all", "correct"],
        default="all",
        help="correct: only completions the config's task (eval.task) judges correct",
    )
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts per call")
    p.set_defaults(func=_generate)


def _generate(args) -> int:
    from distil.api.generate import generate

    c = generate(
        args.config,
        args.overrides,
        out=args.out,
        model=args.model,
        n=args.n,
        keep=args.keep,
        batch_size=args.batch_size,
    )
    print(
        f"{c['kept']} of {c['completions']} completions kept ({c['prompts']} prompts): {args.out}"
    )
    return 0
