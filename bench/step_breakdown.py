"""Where an on-policy distillation step spends its time, next to the bare model calls.

distil's loop (`distil.train.loop.train`) runs N optimizer steps and logs, per step, the seconds
spent generating, scoring with the teacher and training the student. The same model calls are
then made directly, with no distil code in between: one `generate` call on the same prompts,
one teacher forward per micro-batch under inference_mode, and a student forward + reverse-KL +
backward + AdamW step. The ratio distil / bare is distil's overhead per phase (1.00 = none).

    python bench/step_breakdown.py                      # demo-sized models (teacher 4.8M, student 1.3M)
    python bench/step_breakdown.py --preset tiny        # 2-layer models, seconds
    python bench/step_breakdown.py --async --threads 1  # + distil with generation.async

With `--async` distil also runs with `generation.async: true` (the next window sampled in a
background thread while the current one trains) and the two runs are printed side by side: the
phases, the time the training thread waited for its window, and the wall time per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

PRESETS = {
    # teacher and student sizes of the CPU demo (feasibility study), bpe tokenizer
    "demo": {"teacher": (256, 6, 4, 672), "student": (128, 6, 4, 352), "batch": 64, "new": 24},
    "tiny": {"teacher": (96, 2, 4, 256), "student": (64, 2, 4, 176), "batch": 16, "new": 16},
    # GPU: a ~0.5B teacher and ~0.1B student with a 32k vocabulary (embedding rows past the
    # tokenizer's 512 tokens are padding, as in real checkpoints), 128 new tokens, bf16
    "gpu": {
        "teacher": (1536, 16, 12, 4096),
        "student": (768, 12, 12, 2048),
        "batch": 64,
        "new": 128,
        "vocab": 32768,
    },
}


def build(root: Path, preset: dict, seed: int = 0):
    from distil.tasks.countdown import generate_dataset
    from distil.testing import default_corpus, tiny_model, train_tokenizer

    tok = train_tokenizer("bpe", default_corpus(4000), 512)
    dirs = {}
    for name, (hidden, layers, heads, inter) in (
        ("teacher", preset["teacher"]),
        ("student", preset["student"]),
    ):
        model = tiny_model(
            "llama",
            preset.get("vocab", len(tok)),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            intermediate_size=inter,
            seed=seed + len(name),
            tokenizer=tok,
        )
        dirs[name] = root / name
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    generate_dataset(root / "data", n=4096, test_n=16, template="countdown_plain", seed=seed)
    return dirs


def run_distil(
    root: Path, dirs, preset, steps: int, threads: int, bf16: bool, use_async: bool = False
) -> list[dict]:
    from distil.config import build_config
    from distil.train.loop import train

    cfg = build_config(
        {
            "data": {"train": str(root / "data" / "train.jsonl"), "template": "countdown_plain"},
            "student": {"path": str(dirs["student"])},
            "teacher": {"path": str(dirs["teacher"]), "dtype": "bfloat16" if bf16 else "float32"},
            "generation": {"max_new_tokens": preset["new"], "async": use_async},
            "loss": {"name": "reverse_kl"},
            "train": {
                "output_dir": str(root / ("run_async" if use_async else "run")),
                "max_steps": steps,
                "lr": 1e-4,
                "per_device_batch_size": preset["batch"],
                "lambda": 1.0,
                "num_threads": threads,
                "resume": "never",
                "bf16": bf16,
            },
            "logging": {"progress": False, "print_example": False},
        }
    )
    train(cfg)
    return [json.loads(x) for x in (Path(cfg.train.output_dir) / "metrics.jsonl").open()]


def _now(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def run_bare(root: Path, dirs, preset, steps: int, device: str, bf16: bool) -> list[dict]:
    """The same calls, made directly: generate, teacher forward, student fwd/bwd/AdamW, at the
    precision distil runs them (`--bf16`: autocast over the generate and training forwards, TF32
    on CUDA) and with the AdamW implementation distil picks (fused on CUDA)."""
    import contextlib

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distil.config.schema import TrainConfig
    from distil.models.load import enable_tf32
    from distil.tasks.countdown import get_template, read_rows
    from distil.train.optim import use_fused

    tok = AutoTokenizer.from_pretrained(dirs["student"])
    student = AutoModelForCausalLM.from_pretrained(dirs["student"]).to(device)
    teacher_dtype = torch.bfloat16 if bf16 else torch.float32
    teacher = AutoModelForCausalLM.from_pretrained(dirs["teacher"], dtype=teacher_dtype)
    teacher = teacher.to(device).eval()
    enable_tf32(device)  # as distil's training start does
    fused = use_fused(TrainConfig(), torch.device(device))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4, fused=fused)

    def autocast():
        on = torch.autocast(device, dtype=torch.bfloat16)
        return on if bf16 else contextlib.nullcontext()

    template = get_template("countdown_plain")
    rows = read_rows(root / "data" / "train.jsonl")
    texts = [
        tok.apply_chat_template(
            template.messages(r["nums"], r["target"]), tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]
    tok.padding_side = "left"
    out, b = [], preset["batch"]
    for step in range(steps):
        enc = tok(
            texts[step * b : (step + 1) * b],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        ).to(device)
        t0 = _now(device)
        student.eval()
        with torch.no_grad(), autocast():  # distil generates through the autocast forward
            seqs = student.generate(
                **enc,
                max_new_tokens=preset["new"],
                do_sample=True,
                top_k=0,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        student.train()
        t1 = _now(device)
        attn = (seqs != tok.pad_token_id).long()
        attn[:, : enc["input_ids"].shape[1]] = enc["attention_mask"]
        with torch.inference_mode():
            t_logits = teacher(input_ids=seqs, attention_mask=attn, use_cache=False).logits
        t_logp = torch.log_softmax(t_logits[:, :-1].float(), -1).clone()
        t2 = _now(device)
        with autocast():
            s_logits = student(input_ids=seqs, attention_mask=attn, use_cache=False).logits
        s_logp = torch.log_softmax(s_logits[:, :-1].float(), -1)
        mask = attn[:, 1:].bool().clone()
        mask[:, : enc["input_ids"].shape[1] - 1] = False
        kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1)  # reverse KL per position
        loss = (kl * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = _now(device)
        out.append(
            {
                "time/generate": t1 - t0,
                "time/teacher": t2 - t1,
                "time/train": t3 - t2,
                "tokens": int(attn.sum()),
            }
        )
    return out


PHASES = ("time/generate", "time/teacher", "time/train")


def summarize(records: list[dict], warmup: int, keys=PHASES) -> dict[str, float]:
    kept = records[warmup:]
    return {k: statistics.median(r.get(k, 0.0) for r in kept) for k in keys}


def print_async(sync: list[dict], asyn: list[dict], warmup: int, label: str) -> None:
    """generation.async off and on, side by side (median seconds per step)."""
    keys = (*PHASES, "time/generate_wait", "time/step")
    off, on = summarize(sync, warmup, keys), summarize(asyn, warmup, keys)
    names = {"time/generate": "generate (on: in the background)", "time/step": "step (wall)"}
    print("| phase | async off | async on |")
    print("|---|---|---|")
    for k in keys:
        print(f"| {names.get(k, k[5:])} | {off[k]:.4f} | {on[k]:.4f} |")
    print(f"| steps/s | {1 / off['time/step']:.3f} | {1 / on['time/step']:.3f} |")
    print(
        f"RESULT step_breakdown: generation.async {off['time/step'] / on['time/step']:.2f}x the "
        f"steps/s of the synchronous loop ({label})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="bf16 student autocast + bf16 teacher")
    p.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="also run distil with generation.async and print both side by side",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from distil.models.load import quiet_transformers

    quiet_transformers()
    preset = PRESETS[args.preset]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = build(root, preset)
        torch.manual_seed(0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        bare_a = summarize(run_bare(root, dirs, preset, args.steps, device, args.bf16), args.warmup)
        records = run_distil(root, dirs, preset, args.steps, args.threads, args.bf16)
        ours = summarize(records, args.warmup)
        if args.use_async:
            async_records = run_distil(
                root, dirs, preset, args.steps, args.threads, args.bf16, use_async=True
            )
        torch.manual_seed(0)
        bare_b = summarize(run_bare(root, dirs, preset, args.steps, device, args.bf16), args.warmup)
    bare = {k: (bare_a[k] + bare_b[k]) / 2 for k in bare_a}
    print(
        f"preset {args.preset}: batch {preset['batch']}, {preset['new']} new tokens, "
        f"{args.steps} steps ({args.warmup} warm-up), {args.threads} threads; median s/step"
    )
    print("| phase | distil | bare calls | distil / bare |")
    print("|---|---|---|---|")
    for key in ("time/generate", "time/teacher", "time/train"):
        print(f"| {key[5:]} | {ours[key]:.4f} | {bare[key]:.4f} | {ours[key] / bare[key]:.2f} |")
    total_o, total_b = sum(ours.values()), sum(bare.values())
    print(f"| step | {total_o:.4f} | {total_b:.4f} | {total_o / total_b:.2f} |")
    if args.use_async:
        label = f"preset {args.preset}, {device}, {args.threads} thread(s) per thread pool"
        print_async(records, async_records, args.warmup, label)


if __name__ == "__main__":
    main()
