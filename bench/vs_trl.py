"""distil's optimizer step against TRL's GOLDTrainer, same tokenizer, on- and off-policy.

Both sides train the same ~1M-parameter student against the same ~5M-parameter teacher (the
demo's sizes: Llama h128 L6 and h256 L6, built with distil's scratch builders on one byte-level
BPE tokenizer of <= 512 ids with a ChatML template, saved with `save_pretrained`), on the same
Countdown chat prompts (the demo's `countdown_plain` template; off-policy: their reference
completions), 64 sequences per optimizer step as 16 x 4 (micro-batch x gradient accumulation),
<= 32 new tokens sampled at temperature 1 (no top-p / top-k), reverse KL (TRL: generalized JSD
with beta 1, which TRL computes as KL(student || teacher); distil: `reverse_kl`), loss
temperature 1, AdamW lr 1e-4 constant, clip 1.0, fp32, one thread each.

TRL side (bench/trl_gold_step.py, a child process on distil's own Python, torch and
transformers; TRL from bench/.trl-site, installed on first use by bench/align.py's `ensure_trl`): GOLDTrainer 1.16 with `use_uld_loss=False`, its
same-tokenizer path (the generalized JSD of TRL's GKDTrainer, with GKD's lambda mix of on- and
off-policy micro-batches), which buffers one window of rollouts per optimizer step like distil
but, without vLLM, calls `generate` once per micro-batch; and, on-policy, TRL 1.16's stable
`DistillationTrainer` (on-policy only, one `generate` per window). distil side:
`distil.train.loop.train`. `--rounds` rounds of [GOLD on, DistillationTrainer on, distil on,
GOLD off, distil off] in one run; the first `--warmup` steps of every run are dropped and the
rest pooled per side (median). After every TRL run, the settings it reports (batch, GA, lr,
schedule, lambda, beta, sampling, EOS) are checked against distil's resolved config, and TRL's
tokenizer against distil's on a probe text and on the first prompt; the script stops if any
differ.

    OMP_NUM_THREADS=1 python bench/vs_trl.py   # CPU: ~5 min on a quiet 2-core VM (+ TRL, once)
    python bench/vs_trl.py --device cuda --threads 4          # on a GPU
    OMP_NUM_THREADS=1 python bench/vs_trl.py --modes on --rounds 1 --steps 6 --warmup 2  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

# align.py and step_breakdown.py are imported from bench/, the script's directory (sys.path[0])

MODES = {"on": 1.0, "off": 0.0}  # mode -> lambda (share of on-policy micro-batches)
PHASES = ("step", "generate", "teacher", "train")
LOSS = "reverse_kl"  # distil's loss; TRL: generalized JSD at beta = 1
# TRL trainer -> (name in the tables, the modes it runs): DistillationTrainer is on-policy only
TRAINERS = {
    "gold": ("TRL GOLDTrainer (GKD path)", ("on", "off")),
    "distillation": ("TRL DistillationTrainer", ("on",)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="on,off", help="comma-separated: on (lambda 1), off (0)")
    p.add_argument("--trl", default="gold,distillation", help="TRL trainers: gold, distillation")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=3, help="first steps of a run not timed (>= 1)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of [TRL, distil] per mode")
    p.add_argument("--batch", type=int, default=16, help="per-device micro-batch")
    p.add_argument("--ga", type=int, default=4, help="gradient accumulation steps")
    p.add_argument("--new-tokens", type=int, default=32, help="max new tokens per completion")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per side")
    p.add_argument("--prompts", type=int, default=2048, help="Countdown prompts in the data")
    p.add_argument("--backend", default=None, help="distil generation.backend (default: its own)")
    p.add_argument("--json", type=Path, default=None,
                   help="the distil / TRL ratios per mode, trainer and phase here")  # fmt: skip
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes {','.join(bad) or '(empty)'}: each must be one of {', '.join(MODES)}")
    args.trl = [t.strip() for t in args.trl.split(",") if t.strip()]
    bad = [t for t in args.trl if t not in TRAINERS]
    if bad or "gold" not in args.trl:
        p.error(f"--trl {','.join(args.trl)}: gold and optionally distillation")
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup {args.warmup} must be at least 1 and below --steps {args.steps}")
    return args


# ---------------------------------------------------------------------- models and data


def build_setup(root: Path, n_prompts: int):
    """Countdown chat prompts, one BPE tokenizer, the demo-sized teacher and student; returns
    align.py's GoldSetup (each model's tokenizer also in a directory of its own for TRL) and
    the parameter counts."""
    from align import GoldSetup
    from distil.models.scratch import init_model, make_tokenizer
    from distil.tasks.countdown import generate_dataset
    from distil.tasks.prompts import corpus_from_data, examples_from
    from distil.testing import save_tokenizer
    from step_breakdown import PRESETS

    generate_dataset(root / "countdown", n=n_prompts, test_n=16, template="countdown_plain")
    data = root / "chat.jsonl"
    with data.open("w") as fh:
        for ex in examples_from(
            str(root / "countdown" / "train.jsonl"), template="countdown_plain"
        ):
            fh.write(json.dumps({"prompt": ex.prompt, "completion": ex.completion}) + "\n")
    tok = make_tokenizer("bpe", corpus_from_data(str(data)), root / "tokenizer", vocab_size=512)
    params = {}
    for seed, name in enumerate(("teacher", "student")):
        hidden, layers, heads, inter = PRESETS["demo"][name]
        params[name] = init_model(
            root / "tokenizer",
            root / name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            intermediate_size=inter,
            seed=seed,
        )
    setup = GoldSetup(root, root / "student", root / "teacher", data, matched=len(tok))
    for path in (setup.student, setup.teacher):
        save_tokenizer(tok, setup.tokenizer_dir(path))
    return setup, params


# ---------------------------------------------------------------------- the two sides


def trl_flags(lmbda: float, args: argparse.Namespace, trainer: str = "gold") -> list[str]:
    """bench/trl_gold_step.py's flags beyond align.run_trl's for this comparison."""
    return [
        "--trainer", trainer,
        "--same-tokenizer",
        "--lmbda", str(lmbda),
        "--beta", "1.0",
        "--lr", str(args.lr),
        "--device", args.device,
    ]  # fmt: skip


def distil_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Config sections merged over align.run_distil's: the settings TRL also runs with."""
    generation: dict[str, Any] = {"top_k": 0}
    if args.backend:
        generation["backend"] = args.backend
    return {"generation": generation, "loss": {"temperature": 1.0}, "data": {"shuffle": True}}


def run_mode(
    setup, mode: str, rnd: int, args: argparse.Namespace
) -> tuple[dict[str, dict], list[dict], dict]:
    """The TRL runs of `mode` (one per trainer of `--trl` that runs it), then one distil run
    (round `rnd`): TRL's results, distil's metrics and its resolved config."""
    import yaml

    from align import run_distil, run_trl

    lmbda = MODES[mode]
    trl = {
        t: run_trl(setup, args, trl_flags(lmbda, args, t))
        for t in args.trl
        if mode in TRAINERS[t][1]
    }
    ours = run_distil(
        setup, LOSS, args, beta=1.0, lmbda=lmbda, lr=args.lr, tag=f"-{mode}-{rnd}",
        overrides=distil_overrides(args),
    )  # fmt: skip
    cfg = yaml.safe_load((setup.root / f"distil-{LOSS}-{mode}-{rnd}" / "config.yaml").read_text())
    return trl, ours, cfg


# ---------------------------------------------------------------------- same settings


def distil_settings(cfg: dict, eos_token_id: int) -> dict[str, Any]:
    """distil's resolved config in the terms of trl_gold_step.py's `settings`."""
    loss = cfg["loss"]
    beta = {"reverse_kl": 1.0, "forward_kl": 0.0}.get(loss["name"], loss.get("beta"))
    t, g = cfg["train"], cfg["generation"]
    return {
        "per_device_batch_size": t["per_device_batch_size"],
        "grad_accum_steps": t["grad_accum_steps"],
        "lr": t["lr"],
        "schedule": t["schedule"] if not t.get("warmup_steps") else "warmup+" + t["schedule"],
        "weight_decay": t["weight_decay"],
        "max_grad_norm": t["max_grad_norm"],
        "lambda": t["lambda"],
        "beta": beta,
        "loss_temperature": loss["temperature"],
        "max_new_tokens": g["max_new_tokens"],
        "temperature": g["temperature"],
        "top_p": g["top_p"],
        "top_k": g["top_k"],
        "eos_token_id": eos_token_id,
    }


def mismatches(ours: dict[str, Any], trl: dict[str, Any]) -> list[str]:
    """'key: distil X, TRL Y' for every setting of `ours` that TRL runs differently."""
    out = []
    for key, value in ours.items():
        theirs = trl.get(key)
        if isinstance(theirs, list) and len(theirs) == 1:  # an EOS list of one id
            theirs = theirs[0]
        same = (
            abs(float(value) - float(theirs)) <= 1e-12 * max(1.0, abs(float(value)))
            if isinstance(value, (int, float)) and isinstance(theirs, (int, float))
            else value == theirs
        )
        if not same:
            out.append(f"{key}: distil {value!r}, TRL {theirs!r}")
    return out


def check_same_run(setup, trl: dict, cfg: dict) -> None:
    """Raise if TRL tokenizes or trains differently from distil (settings, probe, prompt)."""
    from align import check_same_tokenizers
    from distil.data.datasets import load_examples
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import encode_prompts

    check_same_tokenizers(setup, trl)
    tok = load_tokenizer(str(setup.student))
    prompt = load_examples(str(setup.data), limit=1)[0].prompt
    if encode_prompts(tok, [prompt])[0] != trl["prompt_ids"]:
        raise AssertionError("TRL renders the first prompt to other token ids than distil")
    wrong = mismatches(distil_settings(cfg, tok.eos_token_id), trl["settings"])
    if wrong:
        raise AssertionError("TRL and distil run different settings: " + "; ".join(wrong))


# ---------------------------------------------------------------------- summary


def distil_summary(runs: list[list[dict]], warmup: int) -> dict[str, float]:
    """align.summarize_distil plus `rest`: the step less generation and teacher (train,
    collation, metrics), the counterpart of TRL's step-to-step interval less the same."""
    from align import summarize_distil

    out = summarize_distil(runs, warmup)
    kept = [r for records in runs for r in records[warmup:]]
    out["rest"] = statistics.median(
        r["time/step"] - r["time/generate"] - r["time/teacher"] for r in kept
    )
    return out


def side_phases(summary: dict[str, float], side: str) -> dict[str, float]:
    """Seconds per step, generate, teacher, train of one side's summary (TRL: the interval
    from step end to step end, so its dataloader counts as distil's data path does)."""
    if side == "trl":
        keys = ("interval", "generate", "teacher", "rest_interval")
    else:
        keys = ("step", "generate", "teacher", "rest")
    return dict(zip(PHASES, (summary[k] for k in keys), strict=True))


def ratios(ours: dict[str, float], trl: dict[str, float]) -> dict[str, float | None]:
    """ours / TRL per phase; None where TRL spent (next to) nothing (off-policy generation)."""
    return {k: ours[k] / trl[k] if trl[k] > 1e-6 else None for k in PHASES}


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def print_mode(mode: str, trl: dict[str, dict], ours: dict, args: argparse.Namespace) -> dict:
    """One table; returns the ratios distil / TRL per TRL trainer."""
    o = side_phases(ours, "distil")
    t = {name: side_phases(s, "trl") for name, s in trl.items()}
    r = {name: ratios(o, ph) for name, ph in t.items()}
    print(
        f"\n## same tokenizer, {mode}-policy (lambda {MODES[mode]:g}): {args.batch} x GA "
        f"{args.ga}, <= {args.new_tokens} new tokens, reverse KL, {args.rounds} round(s) of "
        f"{args.steps} steps ({args.warmup} warm-up), {args.threads} thread(s), {args.device}; "
        "median s/step\n"
    )
    print("| side | s/step | generate | teacher | train | tokens | loss first -> last |")
    print("|---" * 7 + "|")
    sides = [(TRAINERS[n][0], trl[n], t[n]) for n in trl] + [("distil", ours, o)]
    for name, s, ph in sides:
        cells = " | ".join(f"{ph[k]:.4f}" for k in PHASES)
        loss = f"{s['loss_first']:.4f} -> {s['loss_last']:.4f}"
        print(f"| {name} | {cells} | {s['tokens']:.1f} | {loss} |")
    for n in trl:
        label = f"distil / {TRAINERS[n][0].removeprefix('TRL ').split(' ')[0]}"
        print(f"| {label} | " + " | ".join(fmt_ratio(r[n][k]) for k in PHASES) + " | | |")
    ga, gold = args.ga, trl["gold"]
    print(
        f"\nGOLDTrainer's logged loss x GA {ga}: {ga * gold['loss_first']:.4f} -> "
        f"{ga * gold['loss_last']:.4f}"
    )
    return r


def result_line(all_ratios: dict[str, dict[str, dict]], args: argparse.Namespace) -> str:
    """The headline: distil / GOLDTrainer seconds per step per mode, with the phases in
    brackets; then distil / DistillationTrainer (on-policy) where it ran."""
    parts = []
    for mode, by_trainer in all_ratios.items():
        r = by_trainer["gold"]
        phases = ", ".join(f"{k} {fmt_ratio(r[k])}" for k in PHASES[1:] if r[k] is not None)
        parts.append(f"{mode}-policy {fmt_ratio(r['step'])} ({phases})")
    extra = [
        f"{mode}-policy {fmt_ratio(by_trainer['distillation']['step'])}"
        for mode, by_trainer in all_ratios.items()
        if "distillation" in by_trainer
    ]
    where = f"{args.device}, {args.threads} thread(s)"
    tail = f"; vs DistillationTrainer {', '.join(extra)}" if extra else ""
    return (
        "RESULT vs_trl: distil/TRL GOLDTrainer s/step " + ", ".join(parts) + tail + " (same "
        f"tokenizer, {args.batch * args.ga} seqs as {args.batch} x {args.ga}, <= "
        f"{args.new_tokens} new tokens, reverse KL, {where})"
    )


NOTES = """
TRL s/step: from one step's end to the next (its dataloader's collation included, as distil's
data path is in its step); TRL train: that less the step's generation and teacher forwards
(student forward, loss, backward, AdamW); distil train: its step less generation and teacher
(collation, student forward, loss, backward, AdamW, metrics). tokens: mean completion tokens
trained on per row (TRL's off-policy rows end with the template's "<|im_end|>\\n", distil's with
"<|im_end|>"). Settings, tokenizer (probe text) and the first prompt's ids were checked equal on
both sides. Differs: GOLDTrainer generates once per micro-batch ({ga} calls of {batch}),
DistillationTrainer and distil once per window ({window} rows); DistillationTrainer's teacher
column is its backbone (its head runs in the chunked loss, in train); the sides sample different
completions (different RNG streams), so on-policy losses do not compare exactly.
Loss scale: GOLDTrainer's logged loss (and gradient) is the per-token loss / GA, and
on-policy also x (dataset completion tokens / sampled tokens): GOLD's RepeatSampler hands the
Trainer GA copies of each window, so `num_items_in_batch` counts GA x the window's tokens, taken
from the dataset's labels, not the rollouts'. Off-policy, its loss x GA is the per-token reverse
KL distil logs; DistillationTrainer counts the rollouts' tokens and logs distil's scale. AdamW is
nearly blind to the scale; clipping at 1.0 is not."""


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # both sides, even on a GPU machine
    import torch

    from distil.models.load import quiet_transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --device cpu")
    quiet_transformers()
    torch.set_num_threads(args.threads)
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    trl_runs: dict[str, dict[str, list[dict]]] = {m: {} for m in args.modes}
    ours: dict[str, list[list[dict]]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        setup, params = build_setup(Path(tmp), args.prompts)
        print(f"models: teacher {params['teacher'] / 1e6:.2f}M, student "
              f"{params['student'] / 1e6:.2f}M parameters, vocabulary {setup.matched}")  # fmt: skip
        for rnd in range(args.rounds):
            for mode in args.modes:
                trl, metrics, cfg = run_mode(setup, mode, rnd, args)
                for name, result in trl.items():
                    check_same_run(setup, result, cfg)
                    trl_runs[mode].setdefault(name, []).append(result)
                ours[mode].append(metrics)
    from align import summarize_trl

    versions = trl_runs[args.modes[0]]["gold"][0]["versions"]
    print(f"TRL {versions['trl']}, transformers {versions['transformers']} (TRL's process)")
    all_ratios = {
        mode: print_mode(
            mode,
            {name: summarize_trl(runs, args.warmup) for name, runs in trl_runs[mode].items()},
            distil_summary(ours[mode], args.warmup),
            args,
        )
        for mode in args.modes
    }
    print(NOTES.format(ga=args.ga, batch=args.batch, window=args.batch * args.ga))
    print(result_line(all_ratios, args))
    if args.json:  # ratio < 1: distil faster; the goal: on-policy step <= 1/3 of GOLDTrainer's
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": args.device, "ratios": all_ratios}, indent=1))


if __name__ == "__main__":
    main()
