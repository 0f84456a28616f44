"""Training-step throughput (MFU) with packing and the chunked loss on and off, and the loss's
extra peak memory at a large vocabulary.

Part `step`: a Llama-style student (~0.50B non-embedding) and teacher (~1.30B, bf16 weights),
32k vocabulary, off-policy forward KL, micro-batches of 8 sequences of ~273 tokens (ragged,
64-482), grad accumulation 2; each optimizer step is what `distil.train.loop` runs per window:
`LiveTeacher.score`, `distil.train.step.micro_step` under bf16 autocast + backward per
micro-batch, clipping, AdamW from `distil.train.optim.build_optimizer`. Rows: the student's
precision (`bf16_autocast`: fp32 weights as `train.bf16`; `bf16_weights`: bf16 weights with
fp32 masters as `train.bf16_weights`) x fused AdamW (`train.fused_adamw`) x packing, chunked
loss (1024), plus the unchunked padded autocast row of the issue. Seconds per phase (median of
the measured steps), tokens/s of the whole step, MFU = 6·N_student·tokens (train phase) and
+ 2·N_teacher·tokens (whole step) / time / peak FLOP/s (CUDA only); `tokens` counts every
input token (prompt tokens too, which the forward and backward also process), not only the
loss tokens. Models are initialized on the target device. `--device cpu` runs the
same rows with ~3M/7M-parameter models and an 8k vocabulary (`--size cpu`).

Part `generate`: the student's HF generate calls on fp32 weights under bf16 autocast against
bf16 weights (what `train.bf16_weights` saves at every decoded token).

Part `memory`: the extra peak memory of one jsd loss forward + backward over N tokens at a V
vocabulary (hidden H), full teacher targets and top-64 targets, unchunked vs `chunk_size` rows.
On CUDA `max_memory_allocated` above the inputs; on CPU each case runs in a fresh process and
reports its peak RSS above the inputs.

    python bench/train_throughput.py --part step                 # GPU: the step table
    OMP_NUM_THREADS=1 python bench/train_throughput.py --part step --device cpu --steps 3
    OMP_NUM_THREADS=1 python bench/train_throughput.py --part generate --device cpu
    python bench/train_throughput.py --part memory --vocab 131072 --tokens 4096 --hidden 2048
    OMP_NUM_THREADS=2 python bench/train_throughput.py --part memory --device cpu \\
        --vocab 32768 --tokens 1024 --hidden 512                  # the CPU-sized table
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def peak_flops() -> float:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return 1e12 * next((v for k, v in PEAK_TFLOPS.items() if k in name), 989.0)


def llama(hidden, layers, heads, inter, vocab, seed, device="cpu"):
    """A seeded Llama built on `device` (weights initialized there: no ~0.5B CPU init + copy per
    row on the GPU)."""
    from distil.testing import tiny_llama

    with torch.device(device):
        return tiny_llama(
            vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
            intermediate_size=inter, max_position_embeddings=1024, seed=seed,
            tie_word_embeddings=False,
        )  # fmt: skip


def non_embedding(model) -> int:
    emb = model.get_input_embeddings().weight.numel() + model.get_output_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - emb


def ragged_batches(n_micro, batch, vocab, seed, device):
    from distil.data.collate import collate
    from distil.types import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_micro):
        lengths = (torch.exp(torch.randn(batch, generator=g) * 0.4) * 260).clamp(64, 482)
        samples = []
        for n in lengths.int().tolist():
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            samples.append(Sample(0, ids[: n // 3], ids[n // 3 :], "off_policy"))
        out.append(collate(samples, pad_id=0).to(device))
    return out


# (hidden, layers, heads, intermediate) of student and teacher, and the vocabulary
SIZES = {
    "gpu": ((1024, 24, 16, 4096), (2048, 16, 16, 8192), 32768),  # ~0.50B / ~1.30B
    "cpu": ((256, 4, 4, 1024), (384, 4, 6, 1536), 8192),  # ~3M / ~7M: minutes on 2 CPU cores
    "tiny": ((64, 2, 4, 128), (96, 2, 4, 192), 2048),  # a smoke test of the code path
}
# (precision, fused AdamW, loss.chunk_size, packing): the first row, then every mix
ROWS = [
    ("bf16_autocast", False, None, False),
    *(
        (precision, fused, 1024, packing)
        for precision in ("bf16_autocast", "bf16_weights")
        for fused in (False, True)
        for packing in (False, True)
    ),
]


def step_table(args) -> list[dict]:
    from distil.teacher.live import LiveTeacher

    s_dims, t_dims, vocab = SIZES[args.size]
    teacher = llama(*t_dims, vocab, 1, args.device).to(torch.bfloat16)
    if args.attn:
        teacher.config._attn_implementation = args.attn
    n_t = non_embedding(teacher)
    rows = []
    for precision, fused, chunk, packing in ROWS:
        student = llama(*s_dims, vocab, 0, args.device).train()  # fp32, as loaded
        if args.attn:
            student.config._attn_implementation = args.attn
        n_s = non_embedding(student)
        scorer = LiveTeacher(teacher, packing=packing)
        med = time_steps(args, student, scorer, vocab, precision, fused, chunk, packing)
        tokens = med["tokens"]  # every step draws other lengths; the same draws per row
        rows.append(
            {
                "precision": precision,
                "fused": fused,
                "chunk_size": chunk,
                "packing": packing,
                **med,
                "tokens_per_s": tokens / med["step"],
                "mfu_train": 6 * n_s * tokens / med["train"] / peak_flops(),
                "mfu_step": (6 * n_s + 2 * n_t) * tokens / med["step"] / peak_flops(),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda(args) else 0.0,
            }
        )
        del student, scorer
        if cuda(args):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    print_step_table(args, rows, n_s, n_t)
    return rows


def cuda(args) -> bool:
    return args.device == "cuda"


def time_steps(args, student, scorer, vocab, precision, fused, chunk, packing) -> dict:
    """Median seconds per phase of what `distil.train.loop` runs per optimizer window: teacher
    scoring, micro_step + backward under bf16 autocast per micro-batch (bf16 weights: the
    gradients folded into the fp32 masters), clipping, AdamW."""
    from distil.config import TrainConfig
    from distil.losses import get_loss
    from distil.train.optim import build_optimizer, fold_grads, grad_params
    from distil.train.step import micro_step

    cfg = TrainConfig(lr=1e-5, bf16_weights=precision == "bf16_weights", fused_adamw=fused)
    opt = build_optimizer(student, cfg, device=args.device)
    loss_fn = get_loss("forward_kl")
    times = {"teacher": [], "train": [], "step": [], "tokens": []}
    # CPU: this process's CPU seconds (one torch thread), which other processes on a shared
    # machine do not inflate; CUDA: wall-clock seconds after a synchronize
    now = time.perf_counter if cuda(args) else time.process_time
    for step in range(args.warmup + args.steps):
        window = ragged_batches(2, args.rows, vocab, step, args.device)
        n_tok = sum(float(b.num_loss_tokens) for b in window)
        sync()
        t0 = now()
        t_teacher = t_train = 0.0
        for b in window:
            ta = now()
            targets = scorer.score(b)
            sync()
            tb = now()
            with torch.autocast(args.device, dtype=torch.bfloat16):
                out = micro_step(
                    student, student, b, targets, loss_fn, num_tokens=n_tok,
                    loss_opts={"chunk_size": chunk}, packing=packing,
                )  # fmt: skip
            out.loss.backward()
            fold_grads(opt)
            sync()
            t_teacher, t_train = t_teacher + tb - ta, t_train + now() - tb
        tc = now()
        torch.nn.utils.clip_grad_norm_(grad_params(opt, student), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t_train += now() - tc
        if step >= args.warmup:
            times["teacher"].append(t_teacher)
            times["train"].append(t_train)
            times["step"].append(now() - t0)
            times["tokens"].append(sum(int(b.attention_mask_B_L.sum()) for b in window))
    return {k: statistics.median(v) for k, v in times.items()}


def print_step_table(args, rows, n_s, n_t) -> None:
    print(f"student {n_s / 1e9:.3f}B, teacher {n_t / 1e9:.3f}B non-embedding, {args.device}")
    print(
        "| precision | fused AdamW | chunk_size | packing | teacher s | train s | step s | "
        "tokens/s | MFU train | MFU step | peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{100 * r['mfu_train']:.1f}% | {100 * r['mfu_step']:.1f}%" if cuda(args) else "- | -"
        print(
            f"| {r['precision']} | {r['fused']} | {r['chunk_size']} | {r['packing']} | "
            f"{r['teacher']:.3f} | {r['train']:.3f} | {r['step']:.3f} | "
            f"{r['tokens_per_s']:.0f} | {mfu} | {r['peak_gib']:.1f} |"
        )


def step_headline(args, rows) -> str:
    """The fastest mode against the issue's baseline mode (bf16 autocast, unfused, padded)."""
    key = {(r["precision"], r["fused"], r["chunk_size"], r["packing"]): r for r in rows}
    base = key["bf16_autocast", False, 1024, False]
    new = key["bf16_weights", True, 1024, True]
    speed = new["tokens_per_s"] / base["tokens_per_s"]
    text = f"bf16 weights + fused AdamW + packed {speed:.2f}x the step tokens/s of bf16 autocast"
    text += " + unfused + padded"
    if cuda(args):
        text += f"; step MFU {100 * new['mfu_step']:.1f}% vs {100 * base['mfu_step']:.1f}%"
    return text


def generate_table(args) -> dict:
    """Seconds of the student's HF generate calls (8 prompts of 24 tokens, 48 greedy tokens)
    with fp32 weights under accelerate's bf16 autocast (`train.bf16`: every decoded token
    re-casts the weights) and with bf16 weights (`train.bf16_weights`); median of 3 calls
    (CPU: process CPU seconds)."""
    from accelerate import Accelerator

    from distil.config import TrainConfig
    from distil.generation.base import SamplingParams
    from distil.generation.hf import HFGenerator
    from distil.train.optim import build_optimizer

    s_dims, _, vocab = SIZES[args.size]
    acc = Accelerator(mixed_precision="bf16", cpu=not cuda(args))
    now = time.perf_counter if cuda(args) else time.process_time
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, vocab, (24,), generator=g).tolist() for _ in range(8)]
    params = SamplingParams(48, temperature=0.0)
    res = {}
    for mode in ("bf16_autocast", "bf16_weights"):
        model = llama(*s_dims, vocab, 0, args.device)
        if mode == "bf16_weights":
            build_optimizer(model, TrainConfig(bf16_weights=True), device=args.device)
        model = acc.unwrap_model(acc.prepare(model))
        gen = HFGenerator(model, pad_id=0, stop_ids=[vocab + 1])  # no stop: 48 tokens each
        gen.generate(prompts, params)
        times = []
        for _ in range(3):
            sync()
            t0 = now()
            gen.generate(prompts, params)
            sync()
            times.append(now() - t0)
        res[mode] = statistics.median(times)
    print(f"student generate, 8 x 48 tokens, {args.device}")
    print("| weights | s per call | tokens/s |\n|---|---|---|")
    for mode, t in res.items():
        print(f"| {mode} | {t:.3f} | {8 * 48 / t:.0f} |")
    return res


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def memory_case(args, chunk: int | None, top_k: int | None) -> float:
    """Extra peak MiB of one jsd forward + backward (the inputs excluded)."""
    from distil.losses import StudentHidden, get_loss
    from distil.teacher.base import sparse_topk
    from distil.types import TeacherTargets

    dev, dt = args.device, torch.bfloat16 if args.device == "cuda" else torch.float32
    n, v, h = args.tokens, args.vocab, args.hidden
    g = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(1, n, h, device=dev, dtype=dt, generator=g).requires_grad_()
    weight = (torch.randn(v, h, device=dev, dtype=dt, generator=g) / h**0.5).requires_grad_()
    with torch.no_grad():  # teacher targets built chunk by chunk: no setup peak above them
        lp = torch.randn(n, v, device=dev, dtype=dt, generator=g)
        parts = []
        for i in range(0, n, 256):
            lp[i : i + 256] = torch.log_softmax(lp[i : i + 256].float(), -1).to(dt)
            if top_k is not None:
                parts.append(sparse_topk(lp[i : i + 256].float(), top_k))
        if top_k is None:
            targets = TeacherTargets(logprobs_B_T_V=lp[None])
        else:
            ids, vals, rest = (torch.cat(x)[None] for x in zip(*parts, strict=True))
            targets = TeacherTargets(
                topk_ids_B_T_K=ids, topk_logprobs_B_T_K=vals, rest_logprob_B_T=rest
            )
        del lp
    mask = torch.ones(1, n, dtype=torch.bool, device=dev)
    if dev == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_now()
    # the student's logits are part of what the unchunked loss costs
    student = StudentHidden(hidden, weight) if chunk else hidden @ weight.T
    out = get_loss("jsd")(student, targets, mask, num_tokens=float(n), chunk_size=chunk)
    out.loss.backward()
    if dev == "cuda":
        sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 2**20


def _rss_now() -> int:
    """This process's resident memory now, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory_table(args) -> dict:
    res = {}
    for top_k in (None, 64):
        for chunk in (None, args.chunk_size):
            if args.device == "cuda":
                res[top_k, chunk] = memory_case(args, chunk, top_k)
                torch.cuda.empty_cache()
            else:  # a fresh process per case: RSS peaks only grow
                cmd = [sys.executable, __file__, *sys.argv[1:], "--case", f"{chunk},{top_k}"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                res[top_k, chunk] = json.loads(out.strip().splitlines()[-1])
    print(
        f"jsd loss, {args.tokens} tokens, vocab {args.vocab}, hidden {args.hidden}, {args.device}"
    )
    print("| targets | unchunked MiB | chunk_size MiB | ratio |")
    print("|---|---|---|---|")
    for top_k in (None, 64):
        full, ch = res[top_k, None], res[top_k, args.chunk_size]
        name = "full" if top_k is None else f"top-{top_k}"
        print(f"| {name} | {full:.0f} | {ch:.0f} ({args.chunk_size}) | {ch / full:.2f} |")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=["step", "generate", "memory", "all"], default="all")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attn", default=None, help="attention implementation (default: sdpa)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--rows", type=int, default=8, help="step part: rows per micro-batch (2 micro-batches)"
    )
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument(
        "--size",
        choices=sorted(SIZES),
        default=None,
        help="step part: model sizes (default: gpu on CUDA, cpu on CPU; tiny: a smoke test)",
    )
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.size = args.size or ("gpu" if args.device == "cuda" else "cpu")
    if args.case:
        chunk, top_k = (None if x == "None" else int(x) for x in args.case.split(","))
        print(json.dumps(memory_case(args, chunk, top_k)))
        return
    headline = []
    if args.part in ("step", "all"):
        headline.append(step_headline(args, step_table(args)))
    if args.part in ("generate", "all"):
        gen = generate_table(args)
        speed = gen["bf16_autocast"] / gen["bf16_weights"]
        headline.append(f"generate on bf16 weights {speed:.2f}x fp32 weights under autocast")
    if args.part in ("memory", "all"):
        m = memory_table(args)
        c = args.chunk_size
        headline.append(
            f"loss peak chunked/unchunked {m[None, c] / m[None, None]:.2f} (full), "
            f"{m[64, c] / m[64, None]:.2f} (top-64) at vocab {args.vocab}"
        )
    print(f"RESULT train_throughput: {'; '.join(headline)} ({args.device})")


if __name__ == "__main__":
    main()
