"""Real-size check: on-policy steps of a Qwen3-0.6B-shaped student against a Qwen3-1.7B-shaped
teacher at the real 151,936-row vocabulary, next to the same model calls made bare.

The models are built from tests/data/model_configs/{qwen3-0.6b,qwen3-1.7b}/config.json with
random weights (bf16, on the device; nothing is downloaded), with a byte-level BPE tokenizer
trained here (512 tokens: the embedding rows past it are never written by the tokenizer and
never sampled, by distil's generators or the bare `generate`, whose logits processor masks
them with the same one slice fill; from random weights a completion stops at EOS with probability 1/512 per token). The
prompts are Countdown problems rendered with the `countdown_plain` template.

distil's side: `distil.train.loop.train` with `generation.backend` = --backend, reverse KL,
--precision (default `train.bf16_weights`: bf16 student weights, fp32 master copies and fused
AdamW; `bf16`: autocast over fp32 weights, which distil refuses for hf_static), teacher in
bf16, lambda 1 (every slice on-policy), no checkpoint writes (monkeypatched away: they are not
step time).
Per step: seconds generating, in the teacher, in the student (forward, loss, backward), in the
optimizer (clip + AdamW; timed around `loop._update`), the whole step; and, around each
window's generation, torch._dynamo's counters: graph breaks, newly compiled graphs and CUDA
graph skips (after the warm-up step all three should stay 0 for hf_static).

The bare side (bench/realsize_bare.py): the same calls with no distil code: `generate` under
bf16 autocast (same sampling: temperature 1, no top-k/top-p), one teacher forward per
micro-batch under inference_mode, student forward + unchunked fp32 reverse KL (log-softmax on
the loss positions only, as distil) + backward per micro-batch, clip + fused AdamW
(bf16_weights: on fp32 master copies of the bf16 weights, copied back). The bare side runs
first and its figures are written to --json at once (a later backend's run reuses them
with --bare-json, also when this run is cut short in distil's side).

Ratio = distil / bare per phase; MFU = FLOPs / seconds / the device's dense bf16 peak, with
FLOPs train: 6 (N_body T + N_head T_loss), the work distil's step does: N_body the student's
parameters that multiply (the input embedding, a lookup, not counted; tied to the head, counted
once as the head), N_head = V H, applied at the T_loss loss positions only (the chunked loss
computes no logits elsewhere); T the step's input tokens, prompts included. The bare side's MFU
is the same FLOPs over its own student seconds (its forward also runs the head on the prompts):
the ceiling of this model at this size next to distil's. Step: (6 + 2) N_student T +
2 N_teacher T (generation counted as 2 N per token; attention not counted). The planned peak
(`distil plan`, logged as memory/planned_peak_bytes) is reported beside the measured one; the
run's `data.max_prompt_tokens` is its data's longest prompt, so that the plan's worst case is
one this run can reach.

    python bench/realsize.py --backend hf --json runs/gpu-check/realsize-hf.json      # CUDA
    python bench/realsize.py --backend hf --size tiny --device cpu --steps 2 --new 4  # rehearsal
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from realsize_bare import now, run_bare

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
MODELS = {"student": "qwen3-0.6b", "teacher": "qwen3-1.7b"}
# config.json overrides per size; "tiny" keeps the real vocabulary (a CPU rehearsal in seconds)
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "real": {"student": {}, "teacher": {}},
    "tiny": {
        "student": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "max_window_layers": 2},
        "teacher": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
                    "max_window_layers": 2},
    },
}  # fmt: skip
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16
PRECISIONS = {
    "bf16_weights": "bf16 student weights + fp32 masters (train.bf16_weights), bf16 teacher",
    "bf16": "bf16 autocast over fp32 student weights (train.bf16), bf16 teacher",
}
PHASES = ("generate", "teacher", "student", "optimizer", "step")
LR = 1e-6


def build(work: Path, size: str, device: str) -> dict[str, Path]:
    """Tokenizer, Countdown prompts and the two model dirs under `work` (reused when there)."""
    from distil.tasks.countdown import generate_dataset
    from distil.testing import default_corpus, load_tokenizer, save_tokenizer, train_tokenizer

    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        save_tokenizer(train_tokenizer("bpe", default_corpus(4000), 512), tok_dir)
    tok = load_tokenizer(tok_dir)
    if not (work / "data" / "train.jsonl").exists():
        generate_dataset(work / "data", n=2048, test_n=16, template="countdown_plain", seed=0)
    dirs = {"data": work / "data" / "train.jsonl", "tokenizer": tok_dir}
    for seed, (side, name) in enumerate(MODELS.items()):
        dirs[side] = work / f"{size}-{name}"
        if not (dirs[side] / "complete").exists():
            save_random_model(dirs[side], CONFIGS / name, SIZES[size][side], tok, device, seed)
    return dirs


def save_random_model(out: Path, config_dir: Path, overrides: dict, tok, device: str, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    ids = {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    raw = {**json.loads((config_dir / "config.json").read_text()), **overrides, **ids}
    config = AutoConfig.for_model(**raw)  # keys derived at init (layer_types) follow overrides
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "complete").write_text("saved\n")
    del model


def longest_prompt(data: dict[str, Any], student: Path) -> int:
    """Tokens of the longest prompt of the run's data as distil renders it for the student: the
    run's `data.max_prompt_tokens`, so that the plan (worst case: every prompt at that cap,
    docs/memory.md) is made for lengths this run reaches. At the default cap of 256 it planned
    16 x 384 tokens a micro-batch for prompts of about 15 tokens: 28.0 GiB against 20.7
    measured on an H100 (bench/RESULTS.md, 2026-11-28)."""
    from distil.config import build_config
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import encode_prompts, prompt_format
    from distil.tasks.prompts import config_examples

    d = build_config({"data": data, "student": {"path": str(student)}}).data
    tok = load_tokenizer(str(student))
    ids = encode_prompts(tok, [e.prompt for e in config_examples(d)], fmt=prompt_format(d))
    return max(len(x) for x in ids)


def distil_config(dirs: dict[str, Path], args, out: Path) -> dict[str, Any]:
    data = {"train": str(dirs["data"]), "template": "countdown_plain"}
    return {
        "data": {**data, "max_prompt_tokens": longest_prompt(data, dirs["student"])},
        "student": {"path": str(dirs["student"]), "dtype": "float32"},
        "teacher": {"path": str(dirs["teacher"]), "dtype": "bfloat16"},
        "generation": {"max_new_tokens": args.new, "backend": args.backend},
        "loss": {"name": "reverse_kl"},
        "train": {
            "output_dir": str(out), "max_steps": args.steps, "lr": LR, "lambda": 1.0,
            "per_device_batch_size": args.batch, "grad_accum_steps": args.accum,
            args.precision: True, "resume": "never", "save_every_minutes": None, "seed": 0,
        },
        "logging": {"progress": False, "print_example": False},
    }  # fmt: skip


def dynamo_counts() -> tuple[int, int, int]:
    """(graph breaks, graphs compiled, CUDA graph skips) so far in this process."""
    from torch._dynamo.utils import counters

    return (
        sum(counters["graph_break"].values()),
        counters["stats"]["unique_graphs"],
        counters["inductor"]["cudagraph_skips"],
    )


@contextlib.contextmanager
def instrumented(records: list[dict], device: str):
    """loop.train with: generation wrapped in dynamo counter snapshots, the optimizer update
    timed, and no checkpoint or final-model writes."""
    from distil.train import loop

    saved = (loop.build, loop._update, loop.save_checkpoint, loop._save_final)

    def build(cfg):
        c = saved[0](cfg)
        inner = c.buffer.next_window

        def next_window():
            before = dynamo_counts()
            window = inner()
            after = dynamo_counts()
            keys = ("graph_breaks", "new_graphs", "cudagraph_skips")
            records.append({k: a - b for k, a, b in zip(keys, after, before, strict=True)})
            return window

        c.buffer.next_window = next_window
        return c

    def update(c, cfg, sums):
        t0 = now(device)
        result = saved[1](c, cfg, sums)
        records[-1]["optimizer"] = now(device) - t0
        return result

    loop.build, loop._update = build, update
    loop.save_checkpoint = lambda acc, out, step, *a, **k: Path(out) / f"step-{step}"
    loop._save_final = lambda c, cfg, step: None
    try:
        yield
    finally:
        loop.build, loop._update, loop.save_checkpoint, loop._save_final = saved


def run_distil(dirs, args, out: Path) -> list[dict]:
    """distil's steps: per step, the phases' seconds, input tokens, loss tokens, decode
    counters and the planned peak (bytes)."""
    from distil.config import build_config
    from distil.train import loop

    records: list[dict] = []
    with instrumented(records, args.device):
        loop.train(build_config(distil_config(dirs, args, out)))
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for rec, m in zip(records, logged, strict=True):
        rec["planned_peak"] = m.get("memory/planned_peak_bytes")
    steps = []
    for rec, m in zip(records, logged, strict=True):
        steps.append({
            **rec,
            "generate": m["time/generate"], "teacher": m["time/teacher"],
            "student": m["time/train"] - rec["optimizer"], "step": m["time/step"],
            "tokens": m["tokens/input_local"], "loss_tokens": m["tokens/loss"],
        })  # fmt: skip
    return steps


def param_count(model_dir: Path) -> int:
    """Parameters of the saved model (tied embedding counted once), built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from distil.models.scratch import count_parameters

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return count_parameters(model)


def head_and_body(model_dir: Path, params: int) -> tuple[int, int]:
    """(N_head = V H, N_body: the parameters that multiply, less the head): the input
    embedding is a lookup (tied: it is the head, counted once in `params`)."""
    config = json.loads((model_dir / "config.json").read_text())
    head = config["vocab_size"] * config["hidden_size"]
    embedding = 0 if config.get("tie_word_embeddings", True) else head
    return head, params - head - embedding


def train_flops(body: int, head: int, tokens: float, loss_tokens: float) -> float:
    """6 (N_body T + N_head T_loss): forward and backward of the body on every input token,
    of the head on the loss positions only."""
    return 6 * (body * tokens + head * loss_tokens)


def peak_flops(device: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)


def median(records: list[dict], key: str, warmup: int) -> float:
    kept = records[warmup:] or records[-1:]
    return statistics.median(r[key] for r in kept)


def summarize(args, dirs, ours: list[dict], bare: list[dict], peaks: dict) -> dict[str, Any]:
    n_s, n_t = param_count(dirs["student"]), param_count(dirs["teacher"])
    head, body = head_and_body(dirs["student"], n_s)
    keys = (*PHASES, "tokens", "loss_tokens")
    d = {k: median(ours, k, args.warmup) for k in keys}
    b = {k: median(bare, k, args.warmup) if k in bare[0] else None for k in keys}
    peak = peak_flops(args.device, args.peak_tflops)
    tokens = d["tokens"]
    after = ours[args.warmup :]
    planned = next((r["planned_peak"] for r in ours if r.get("planned_peak")), None)
    flops_d = train_flops(body, head, tokens, d["loss_tokens"])
    flops_b = train_flops(body, head, b["tokens"], b["loss_tokens"] or 0)
    return {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "backend": args.backend, "size": args.size,
        "student": MODELS["student"], "teacher": MODELS["teacher"],
        "student_params": n_s, "teacher_params": n_t,
        "vocab": json.loads((dirs["student"] / "config.json").read_text())["vocab_size"],
        **settings(args), "warmup": args.warmup,
        "precision": PRECISIONS[args.precision],
        "distil": {k: d[k] for k in PHASES}, "bare": {k: b[k] for k in PHASES},
        "ratio": {k: d[k] / b[k] if b[k] else float("nan") for k in PHASES},
        "tokens": {"input": tokens, "bare_input": b["tokens"], "loss": d["loss_tokens"],
                   "bare_loss": b["loss_tokens"]},
        "peak_gib": peaks,
        "planned_peak_gib": planned / 2**30 if planned else None,
        "decode": {
            "graph_breaks_warmup": sum(r["graph_breaks"] for r in ours[: args.warmup]),
            "graph_breaks_after": sum(r["graph_breaks"] for r in after),
            "new_graphs_after": sum(r["new_graphs"] for r in after),
            "cudagraph_skips_after": sum(r["cudagraph_skips"] for r in after),
        },
        "mfu": {
            "peak_tflops": peak / 1e12 if peak else None,
            "train": flops_d / d["student"] / peak if peak else None,
            "train_bare": flops_b / b["student"] / peak if peak and b["loss_tokens"] else None,
            "step": (8 * n_s + 2 * n_t) * tokens / d["step"] / peak if peak else None,
        },
        "per_step": {"distil": ours, "bare": bare},
    }  # fmt: skip


def measured(fn, device: str):
    """fn()'s result and the peak GiB allocated while it ran (CUDA; 0 on CPU)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    result = fn()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result, peak


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("hf", "hf_static"), default="hf")
    p.add_argument("--size", choices=sorted(SIZES), default="real")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16_weights")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per side")
    p.add_argument("--warmup", type=int, default=1, help="first steps not in the medians")
    p.add_argument("--batch", type=int, default=16, help="sequences per micro-batch")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per step")
    p.add_argument("--new", type=int, default=128, help="new tokens per completion")
    p.add_argument("--work", type=Path, default=Path("/tmp/distil-realsize"), help="models here")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--bare-json", type=Path, default=None,
                   help="reuse the bare side of an earlier run's --json (same sizes)")  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: H100/H200 989)")  # fmt: skip
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if args.backend == "hf_static" and args.precision == "bf16":
        p.error(
            "--backend hf_static needs --precision bf16_weights (distil refuses autocast over "
            "fp32 weights with a static KV cache)"
        )
    return args


def settings(args) -> dict[str, Any]:
    """What a bare side depends on: an earlier run's bare side is reused only if all equal."""
    return {"batch": args.batch, "grad_accum": args.accum, "new_tokens": args.new,
            "steps": args.steps, "size": args.size, "precision_flag": args.precision}  # fmt: skip


def reused_bare(args) -> tuple[list[dict], float] | None:
    path = args.bare_json
    if path is None or not path.exists():
        return None
    old = json.loads(path.read_text())
    same = all(old.get(k) == v for k, v in settings(args).items())
    return (old["per_step"]["bare"], old["peak_gib"]["bare"]) if same else None


def write_json(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
        return
    from distil.models.load import quiet_transformers

    quiet_transformers()
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = build(args.work, args.size, args.device)  # before any timer: saving, not stepping
    out = args.work / f"run-{args.backend}"
    # the bare side first, its figures written at once: what a later backend reuses, also
    # when this run is stopped in distil's side
    bare, peak_bare = reused_bare(args) or measured(lambda: run_bare(dirs, args, LR), args.device)
    partial = {**settings(args), "backend": args.backend, "partial": "the bare side only",
               "per_step": {"bare": bare}, "peak_gib": {"bare": peak_bare}}  # fmt: skip
    write_json(args.json, partial)
    ours, peak_distil = measured(lambda: run_distil(dirs, args, out), args.device)
    report = summarize(args, dirs, ours, bare, {"distil": peak_distil, "bare": peak_bare})
    write_json(args.json, report)
    print_report(report)


def print_report(r: dict[str, Any]) -> None:
    print(f"{r['device']}, backend {r['backend']}: median s/step after {r['warmup']} warm-up")
    print("| phase | distil | bare | distil / bare |")
    print("|---|---|---|---|")
    for k in PHASES:
        print(f"| {k} | {r['distil'][k]:.4f} | {r['bare'][k]:.4f} | {r['ratio'][k]:.2f} |")
    mfu = r["mfu"]
    fmt = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    dec = r["decode"]
    planned = r["planned_peak_gib"]
    plan = f", planned {planned:.1f}" if planned else ""
    print(
        f"RESULT realsize {r['backend']}: step {r['ratio']['step']:.2f}x bare, MFU train "
        f"{fmt(mfu['train'])} (bare {fmt(mfu['train_bare'])}) step {fmt(mfu['step'])}, peak "
        f"{r['peak_gib']['distil']:.1f} GiB{plan} (bare {r['peak_gib']['bare']:.1f}), decode "
        f"graph breaks after warm-up {dec['graph_breaks_after']}, new graphs "
        f"{dec['new_graphs_after']} ({r['device']})"
    )


if __name__ == "__main__":
    sys.exit(main())
