"""The `distil` command line. Each sub-command parses its arguments and calls the library.

A `DistilError` (bad config, data, tokenizer pair, missing extra) is printed as one paragraph
and exits with code 2, never as a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from distil.demo.cli import add_demo
from distil.env import add_env
from distil.errors import ConfigError, DistilError
from distil.eval.cli import add_eval
from distil.hub import add_push
from distil.plan.cli import add_plan
from distil.ranks import is_first_rank
from distil.serve.cli import add_serve_teacher
from distil.teacher.cli import add_cache_teacher, add_generate


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        _close_process_group()
        return code
    except DistilError as exc:
        # backslashreplace: a message may quote a lone surrogate from the input
        text = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
        print(f"distil: {exc.label}: {text}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("distil: interrupted", file=sys.stderr)
        return 130


def _close_process_group() -> None:
    """After a command that ran on several processes ended well: every rank takes its
    process group down here. Left to the interpreter's exit, gloo's worker threads can outlive
    it and a rank aborts (SIGABRT) after its work is done. Not after an error: a rank still
    in a collective would keep the others waiting."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def build_parser() -> argparse.ArgumentParser:
    from distil import __version__

    p = argparse.ArgumentParser(prog="distil", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"distil {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")
    add_demo(sub, _positive_int)
    _add_train(sub)
    add_eval(sub, _positive_int)
    _add_config(sub)
    _add_countdown(sub)
    _add_losses(sub)
    _add_scratch(sub)
    _add_inspect(sub)
    add_cache_teacher(sub, _positive_int)
    add_generate(sub, _positive_int)
    add_serve_teacher(sub, _positive_int)
    add_plan(sub, _positive_int)
    add_push(sub)
    add_env(sub)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# ----------------------------------------------------------------------------- train


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="distil a student from a teacher")
    p.add_argument("config", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.max_steps=200")
    p.set_defaults(func=_train)


def _train(args) -> int:
    from distil.api import Distiller

    result = Distiller(args.config, args.overrides).train()
    if is_first_rank():  # torchrun / accelerate: once, not per rank
        print(f"final model: {result.final_model}")
        if result.hub_url:
            print(f"pushed to: {result.hub_url}")
    return 0


def _add_losses(sub) -> None:
    p = sub.add_parser("losses", help="list the registered losses")
    p.set_defaults(func=_losses)


def _losses(args) -> int:
    from distil.losses import describe, list_losses

    for name in list_losses():
        print(f"{name:<22} {describe(name)}")
    return 0


# ----------------------------------------------------------------------------- from scratch


def _add_scratch(sub) -> None:
    p = sub.add_parser("tokenizer", help="train a tokenizer on a dataset")
    tsub = p.add_subparsers(metavar="ACTION", required=True)
    t = tsub.add_parser("train", help="train a bpe/unigram/wordpiece/char tokenizer")
    t.add_argument("--family", required=True, help="bpe, unigram, wordpiece or char")
    t.add_argument("--data", required=True, help="JSONL/parquet with prompts and completions")
    t.add_argument("--template", default=None, help="Countdown template to render rows with")
    t.add_argument("--vocab-size", type=_positive_int, default=512)
    t.add_argument("--chat-template", default="family", help="family (its own markers) or compact")
    t.add_argument("--out", required=True)
    t.set_defaults(func=_tokenizer_train)
    m = sub.add_parser("init-model", help="a random-init causal LM sized to a tokenizer")
    m.add_argument("--tokenizer", required=True, help="tokenizer directory")
    m.add_argument("--arch", default="llama", help="llama or qwen2")
    m.add_argument("--hidden-size", type=_positive_int, default=128)
    m.add_argument("--layers", type=_positive_int, default=6)
    m.add_argument("--heads", type=_positive_int, default=4)
    m.add_argument("--intermediate-size", type=_positive_int, default=None)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", required=True)
    m.set_defaults(func=_init_model)


def _check_out(path: str, flag: str = "--out") -> None:
    """Refuse an output path that is (or sits under) a file before any work is done."""
    from distil.paths import output_dir_problem

    if problem := output_dir_problem(path, flag):
        raise ConfigError(problem)


def _tokenizer_train(args) -> int:
    from distil.models.scratch import make_tokenizer
    from distil.tasks.prompts import corpus_from_data

    _check_out(args.out)

    tok = make_tokenizer(
        args.family,
        corpus_from_data(args.data, template=args.template),
        args.out,
        vocab_size=args.vocab_size,
        chat_template=args.chat_template,
    )
    print(f"{args.family} tokenizer with {len(tok)} tokens: {args.out}")
    return 0


def _init_model(args) -> int:
    from distil.models.scratch import init_model

    _check_out(args.out)

    n = init_model(
        args.tokenizer,
        args.out,
        arch=args.arch,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=args.intermediate_size,
        seed=args.seed,
    )
    print(f"{args.arch} with {n / 1e6:.2f}M parameters: {args.out}")
    return 0


# ----------------------------------------------------------------------------- inspect

# a generic sentence: words, digits, an operator, accents, CJK, an emoji and a run of spaces
EXAMPLE_TEXT = "The student learns from 3 teachers: 12 × 7 = 84. Ünïcödé 数字 🙂, and   spaces."


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="look at a tokenizer pair before training")
    isub = p.add_subparsers(metavar="WHAT", required=True)
    pair = isub.add_parser(
        "pair", help="vocabulary overlap, specials, an aligned example; a config's prompts"
    )
    pair.add_argument("--teacher", help="teacher model or tokenizer directory (or --config)")
    pair.add_argument("--student", help="student model or tokenizer directory (or --config)")
    pair.add_argument(
        "--config", help="a training config: its tokenizers, and its rows' prompts side by side"
    )
    pair.add_argument("overrides", nargs="*", help="key.sub=value overrides of --config")
    pair.add_argument("--rows", type=int, default=1, help="--config: data rows shown")
    pair.add_argument("--text", default=EXAMPLE_TEXT, help="text to align (a completion)")
    pair.add_argument(
        "--all-specials", action="store_true", help="list every special token by name"
    )
    pair.set_defaults(func=_inspect_pair)


def _inspect_pair(args) -> int:
    from rich.console import Console

    from distil.align.inspect import pair_report, render_pair, specials_summary
    from distil.inspect_prompts import inspect_config
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import generation_defaults, stops_summary
    from distil.progress import console as err_console

    cfg = inspect_config(args)  # --config: the tokenizers default to its own
    s_tok = load_tokenizer(args.student, key="--student")
    t_tok = load_tokenizer(args.teacher, key="--teacher")
    report = pair_report(s_tok, t_tok)
    out = Console(highlight=False, soft_wrap=True)
    paired = {name for pair in report["special_pairs"] for name in pair}
    for side, tok, path in (("student", s_tok, args.student), ("teacher", t_tok, args.teacher)):
        r = report[side]
        template = "yes" if r["chat_template"] else "NO (chat prompts cannot be rendered)"
        out.print(
            f"[bold]{side}[/]: {r['vocab_size']:,} tokens, {r['convention']} convention, "
            f"{len(r['specials'])} specials, chat template: {template}"
        )
        out.print(specials_summary(r, paired, show_all=args.all_specials), markup=False)
        out.print(f"  {stops_summary(tok, generation_defaults(path))}", markup=False)
    pairs = ", ".join(f"{s} = {t}" for s, t in report["special_pairs"]) or "none"
    out.print(f"specials paired (student = teacher): {pairs}", markup=False)
    ov = report["overlap"]
    out.print(
        f"shared by bytes: {ov['shared_bytes']:,} tokens ({ov['bytes_over_student']:.1%} of the "
        f"student's, {ov['bytes_over_teacher']:.1%} of the teacher's; Jaccard "
        f"{ov['bytes_jaccard']:.3f}); by token strings: {ov['shared_strings']:,} (Jaccard "
        f"{ov['string_jaccard']:.3f})"
    )
    if ov["shared_bytes"] == 0:
        err_console.print(
            "[yellow]no token spells the same bytes on both sides: the gold loss "
            "cannot be used; uld, aligned_kl and sampled_chunk_reverse_kl can[/]"
        )
    out.print(render_pair(args.text, s_tok, t_tok))
    if cfg is not None:  # what each model reads of the first rows: privileged context shows
        from distil.inspect_prompts import prompt_pairs, prompts_table

        given = t_tok if args.teacher_given else None  # else each row's teacher's own
        out.print(prompts_table(prompt_pairs(cfg, args.rows, s_tok, given)))
    return 0


# ----------------------------------------------------------------------------- config


def _add_config(sub) -> None:
    p = sub.add_parser("config", help="show, validate or compare configs")
    csub = p.add_subparsers(metavar="ACTION", required=True)
    show = csub.add_parser("show", help="print the resolved config (every value)")
    show.add_argument("file", help="YAML file or run directory")
    show.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    show.set_defaults(func=_config_show)
    val = csub.add_parser("validate", help="check a config; exit 2 listing every problem")
    val.add_argument("file")
    val.add_argument("overrides", nargs="*")
    val.set_defaults(func=_config_validate)
    sch = csub.add_parser(
        "schema", help="the config's JSON Schema (for editors), or --markdown: docs/config.md"
    )
    sch.add_argument("--markdown", action="store_true", help="the reference page instead")
    sch.set_defaults(func=_config_schema)
    d = csub.add_parser("diff", help="keys whose resolved values differ between two configs")
    d.add_argument("a", help="YAML file or run directory")
    d.add_argument("b", help="YAML file or run directory")
    d.add_argument("--all", action="store_true", help="also compare output_dir and run_name")
    d.set_defaults(func=_config_diff)


def _config_show(args) -> int:
    from distil.config import load_config, to_yaml

    print(to_yaml(load_config(args.file, args.overrides)), end="")
    return 0


def _config_validate(args) -> int:
    from distil.api.distiller import validate
    from distil.config import load_config
    from distil.inspect_prompts import first_row

    cfg = load_config(args.file, args.overrides)
    v = validate(cfg, name=args.file, notes=lambda note: print(f"note: {note}"))
    shown = first_row(cfg, v.tokenizers, v.examples)
    if shown:
        print(shown)
    print(f"{args.file}: ok")
    return 0


def _config_schema(args) -> int:
    from distil.config.reference import json_schema, reference_markdown

    if args.markdown:
        print(reference_markdown(), end="")
    else:
        import json

        print(json.dumps(json_schema(), indent=2))
    return 0


def _config_diff(args) -> int:
    from distil.config import diff, load_config

    rows = diff(load_config(args.a), load_config(args.b), include_location=args.all)
    if not rows:
        print("no differences")
        return 0
    shown = [(k, _show(a), _show(b)) for k, a, b in rows]
    wk = max(len(r[0]) for r in shown)
    wa = max(len(r[1]) for r in shown)
    for key, a, b in shown:
        print(f"{key:<{wk}}  {a:<{wa}}  {b}")
    return 0


def _show(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


# ----------------------------------------------------------------------------- countdown


def _add_countdown(sub) -> None:
    p = sub.add_parser("countdown", help="the Countdown task: generate problems")
    csub = p.add_subparsers(metavar="ACTION", required=True)
    g = csub.add_parser("generate", help="solvable problems, disjoint train/test splits")
    g.add_argument("--n", type=_positive_int, required=True, help="training problems")
    g.add_argument("--test-n", type=int, default=500, help="test problems (default 500)")
    g.add_argument(
        "--dev-n", type=int, default=0, help="dev problems, a second held-out split (default 0)"
    )
    g.add_argument("--numbers", default="3", help="numbers per problem: 3, 4 or 3-4")
    g.add_argument("--max-number", type=_positive_int, default=99, help="largest number")
    g.add_argument("--max-target", type=_positive_int, default=None, help="largest target")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--template", default="countdown_chat", help="prompt template name")
    g.add_argument("--out", required=True, help="output directory")
    g.set_defaults(func=_countdown_generate)


def _countdown_generate(args) -> int:
    from distil.tasks.countdown import generate_dataset, parse_numbers

    if args.test_n < 0 or args.dev_n < 0:
        raise ConfigError(f"--test-n and --dev-n must be >= 0, got {args.test_n}, {args.dev_n}")
    _check_out(args.out)
    summary = generate_dataset(
        args.out,
        n=args.n,
        test_n=args.test_n,
        dev_n=args.dev_n,
        numbers=parse_numbers(args.numbers),
        max_number=args.max_number,
        max_target=args.max_target,
        seed=args.seed,
        template=args.template,
    )
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
