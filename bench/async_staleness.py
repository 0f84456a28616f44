"""How forward and reverse KL tolerate one-step-stale rollouts (`generation.async`).

Four short on-policy runs from the same student, teacher, prompts and seed: forward KL and
reverse KL, each with `generation.async` off and on. Prints the loss and held-out accuracy
along the way and the steps per second, side by side.

    python bench/async_staleness.py --teacher T --student S --data D   # D: prompts.jsonl, test.jsonl

T and S share a tokenizer (the demo's bpe teacher and bpe student, e.g. from `make demo-quick`:
runs/demo-quick/models/{teacher,student_bpe_start} and runs/demo-quick/data).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def run(args, loss: str, use_async: bool) -> list[dict]:
    from distil.config import build_config
    from distil.train.loop import train

    out = Path(args.out) / f"{loss}-{'async' if use_async else 'sync'}"
    data = Path(args.data)
    cfg = build_config(
        {
            "data": {"train": str(data / "prompts.jsonl"), "template": "countdown_plain"},
            "student": {"path": args.student},
            "teacher": {"path": args.teacher},
            "generation": {"max_new_tokens": 24, "temperature": 0.7, "async": use_async},
            "loss": {"name": loss},
            "train": {
                "output_dir": str(out),
                "max_steps": args.steps,
                "per_device_batch_size": args.batch,
                "lr": args.lr,
                "warmup_steps": 5,
                "schedule": "constant",
                "lambda": 1.0,
                "eval_every": args.eval_every,
                "num_threads": args.threads,
                "resume": "never",
                "save_every_minutes": None,
                "seed": args.seed,
            },
            "eval": {
                "data": str(data / "test.jsonl"),
                "n": args.eval_n,
                "max_new_tokens": 24,
                "numbers": "3",
            },
            "logging": {"progress": False, "print_example": False},
        }
    )
    train(cfg)
    return [json.loads(line) for line in (out / "metrics.jsonl").open()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", required=True)
    p.add_argument("--student", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="runs/async_staleness")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from distil.models.load import quiet_transformers

    quiet_transformers()
    results = {
        (loss, a): run(args, loss, a)
        for loss in ("forward_kl", "reverse_kl")
        for a in (False, True)
    }
    evals = [m["step"] for m in results["forward_kl", False] if "eval/accuracy" in m]
    print(f"{args.steps} steps, batch {args.batch}, lr {args.lr}, {args.threads} thread(s)")
    head = " | ".join(f"acc@{s}" for s in evals)
    print(f"| loss | async | loss first 5 | loss last 5 | {head} | steps/s |")
    print("|---|---|---|---|" + "---|" * len(evals) + "---|")
    acc = {}
    for (loss, a), m in results.items():
        first = statistics.mean(x["loss"] for x in m[:5])
        last = statistics.mean(x["loss"] for x in m[-5:])
        accs = [x["eval/accuracy"] for x in m if "eval/accuracy" in x]
        acc[loss, a] = accs[-1]
        speed = len(m) / sum(x["time/step"] for x in m)
        cells = " | ".join(f"{v:.3f}" for v in accs)
        print(
            f"| {loss} | {'on' if a else 'off'} | {first:.4f} | {last:.4f} | {cells} | {speed:.3f} |"
        )
    print(
        "RESULT async_staleness: final held-out accuracy async - sync: forward KL "
        f"{acc['forward_kl', True] - acc['forward_kl', False]:+.3f}, reverse KL "
        f"{acc['reverse_kl', True] - acc['reverse_kl', False]:+.3f} ({args.steps} steps)"
    )


if __name__ == "__main__":
    main()
