"""`distil demo` arguments (added to the main parser by distil/cli.py)."""

from __future__ import annotations

import argparse

from distil.errors import ConfigError


def add_demo(sub, positive_int) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole pipeline on a CPU: data, teacher, students, table",
        description="Countdown data -> a teacher -> two students distilled (one across "
        "tokenizers) and equal-cost controls -> a table. Budgets are optimizer steps (presets "
        "in distil/demo/configs/demo.yaml); the same command on the same machine and thread "
        "count prints the same table.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller budgets (about 13 minutes on 2 cores, 9 with its teacher cached)",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="budget preset: full (default), quick, smoke (seconds, for tests), or any preset "
        "of demo.yaml",
    )
    p.add_argument(
        "--distill-scale",
        type=_positive_float,
        default=1.0,
        metavar="X",
        help="multiply the distillation runs' step budgets by X (the controls follow: they get "
        "the distillation's student compute); e.g. 3 to check that longer distillation does "
        "not collapse (default 1)",
    )
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the students' starts, distillation runs and controls on seeds 0..N-1 (data "
        "order, sampling, init; one teacher) and print mean ± sd per row and each distilled "
        "student's paired lead over each control with its 95%% interval (default 1; seed 0 is "
        "the single-seed demo; N times the students' time)",
    )
    p.add_argument(
        "--study",
        default=None,
        choices=["multi-teacher", "self-distill", "reward"],
        help="run a study instead of the demo: two teachers (3- and 4-number Countdown) routed "
        "per row, self-distillation with privileged context and context distillation, or a "
        "task's reward (GRPO) against and with on-policy distillation (presets full, smoke; "
        "docs/multi-teacher.md, docs/privileged-context.md, docs/reward.md)",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="choose each run's learning rate: every run of demo.yaml (or of --study reward's "
        "manifest) at each lr of its analysis.lr_grid on the tuning seed, scored on its dev "
        "split (never the test split); writes tune.md (docs/demo.md, docs/reward.md)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse the stages that an earlier or killed run of the same command finished in "
        "--out (each checked against its command and config text); without it every stage "
        "after the cached teacher runs anew",
    )
    p.add_argument(
        "--lanes",
        type=positive_int,
        default=None,
        metavar="N",
        help="run the students' stages in N processes side by side, the threads split among "
        "them (default 2 when --threads is 2 or more: on 2 cores two one-thread lanes train "
        "~1.4x faster than one two-thread process; 1: one after another, the smoke preset's "
        "default, whose stages take seconds). The table is the same either way",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="where trained teachers are cached (default ~/.cache/distil/demo)",
    )
    p.set_defaults(func=run)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def run(args) -> int:
    from distil.demo import run_demo
    from distil.demo.presets import default_lanes, manifest

    preset = args.preset or ("quick" if args.quick else "full")
    if args.study:
        from distil.demo.studies import study_manifest

        presets = study_manifest(args.study).presets
    else:
        presets = manifest().presets
    lanes = args.lanes or default_lanes(presets.get(preset), args.threads)
    if lanes > args.threads:
        raise ConfigError(
            f"--lanes {lanes} with --threads {args.threads}: each lane needs a thread. Fix: "
            f"--lanes {args.threads} or fewer, or more --threads"
        )
    if args.study:
        from distil.demo.studies import run_study

        command = f"distil demo --study {args.study} --preset {preset} --out {args.out}"
        command += f" --threads {args.threads}" + (
            f" --seeds {args.seeds}" if args.seeds != 1 else ""
        )
        command += " --tune" if args.tune else ""
        run_study(args.study, args.out, preset=preset, threads=args.threads,
                  cache_dir=args.cache_dir, command=command, seeds=args.seeds, lanes=lanes,
                  resume=args.resume, tune=args.tune)  # fmt: skip
        return 0
    if preset not in presets:
        raise ConfigError(
            f"--preset {preset!r} is not a demo preset. Fix: use one of {', '.join(presets)} "
            "(or add it to distil/demo/configs/demo.yaml)"
        )
    command = f"distil demo --preset {preset} --out {args.out} --threads {args.threads}"
    if args.distill_scale != 1:
        command += f" --distill-scale {args.distill_scale:g}"
    if args.seeds != 1:
        command += f" --seeds {args.seeds}"
    if args.lanes is not None:
        command += f" --lanes {lanes}"
    if args.tune:
        command += " --tune"
    run_demo(
        args.out,
        preset=preset,
        threads=args.threads,
        cache_dir=args.cache_dir,
        distill_scale=args.distill_scale,
        command=command,
        seeds=args.seeds,
        resume=args.resume,
        lanes=lanes,
        tune=args.tune,
    )
    return 0
