"""Packed vs padded forwards: tokens/s and peak memory, student training and teacher scoring.

The data: sequence lengths spread like chat data (log-normal: many short, a long tail, capped at
`--max-len`), shuffled into micro-batches of `--batch` sequences. Each micro-batch runs once
padded (to its longest sequence) and once packed (`distil.data.packing.model_forward`, rows of at
most `--pack-length` tokens, best-fit decreasing). The student phase is `distil.train.step
.micro_step` (forward KL against fixed targets, chunked loss) + backward + AdamW; the teacher
phase is `LiveTeacher.score` (full log-probs). Real (non-padding) tokens per second, median of
`--repeats` passes over all micro-batches, padded and packed interleaved. Peak memory: each
(phase, mode) runs in a fresh worker process; on CPU the process's peak RSS above its baseline
after loading, on CUDA `torch.cuda.max_memory_allocated`.

    OMP_NUM_THREADS=2 python bench/packing.py            # CPU, about 2 minutes
    python bench/packing.py --device cuda --hidden 1024 --layers 16 --batch 32 --max-len 2048
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


def lengths_like_chat(n: int, max_len: int, seed: int) -> list[int]:
    """Log-normal lengths (median ~ max_len/8, a long tail), clipped to [8, max_len]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.randn(n, generator=g) * 0.9) * (max_len / 8)
    return [int(v) for v in x.clamp(8, max_len)]


def batches(args, vocab: int):
    from distil.data.collate import collate
    from distil.types import Sample

    g = torch.Generator().manual_seed(args.seed)
    lengths = lengths_like_chat(args.batch * args.micro_batches, args.max_len, args.seed)
    out = []
    for s in range(0, len(lengths), args.batch):
        samples = []
        for n in lengths[s : s + args.batch]:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            p = max(1, n // 3)  # prompt a third, completion the rest
            samples.append(Sample(0, ids[:p], ids[p:], "off_policy"))
        out.append(collate(samples, pad_id=0))
    return out


def build(args, role: str):
    from distil.testing import tiny_llama

    scale = 2 if role == "teacher" else 1
    model = tiny_llama(
        args.vocab,
        hidden_size=args.hidden * scale,
        num_layers=args.layers,
        num_heads=max(4, args.hidden * scale // 64),
        max_position_embeddings=max(args.max_len, args.pack_length or 0) + 8,
        seed=1 if role == "teacher" else 0,
    )
    if args.attn:
        model.config._attn_implementation = args.attn
    if args.device == "cuda":
        model = model.to(device="cuda", dtype=torch.bfloat16)
    return model


def worker(args) -> dict:
    """One (phase, mode): times every micro-batch `repeats` times; returns tokens/s and peak."""
    from distil.losses import get_loss
    from distil.teacher.live import LiveTeacher
    from distil.train.step import micro_step
    from distil.types import TeacherTargets

    torch.manual_seed(0)
    packing = args.mode == "packed"
    model = build(args, args.phase)
    data = [b.to(args.device) for b in batches(args, args.vocab)]
    real = sum(int(b.attention_mask_B_L.sum()) for b in data)
    if args.phase == "teacher":
        scorer = LiveTeacher(model, packing=packing, pack_length=args.pack_length)

        def run(b):
            scorer.score(b)

    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = get_loss("forward_kl")
        targets = {}
        for i, b in enumerate(data):  # fixed targets: a one-hot-ish teacher, cheap to build
            t = torch.full((*b.labels_B_T.shape, 2), 0, dtype=torch.long, device=args.device)
            t[..., 0] = b.labels_B_T
            lp = torch.tensor([-0.1, -2.4], device=args.device).expand(*t.shape).contiguous()
            targets[i] = TeacherTargets(
                topk_ids_B_T_K=t,
                topk_logprobs_B_T_K=lp,
                rest_logprob_B_T=torch.full(b.labels_B_T.shape, -5.0, device=args.device),
            )

        def run(b):
            i = next(k for k, x in enumerate(data) if x is b)
            out = micro_step(
                model, model, b, targets[i], loss_fn, num_tokens=float(b.num_loss_tokens),
                loss_opts={"chunk_size": 1024}, packing=packing, pack_length=args.pack_length,
            )  # fmt: skip
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    run(data[0])  # warm-up
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        for b in data:
            run(b)
        sync()
        times.append(time.perf_counter() - t0)
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    width = sum(b.input_ids_B_L.numel() for b in data)
    if packing:  # computed tokens = the packed rows, their tails included
        from distil.data.packing import plan_packing, sequence_lengths

        width = 0
        for b in data:
            n = sequence_lengths(b.attention_mask_B_L)
            cap = max(n) if args.pack_length is None else max(args.pack_length, max(n))
            r, p = plan_packing(n, b.input_ids_B_L.shape[1], cap).shape_R_P
            width += r * p
    return {"tok_s": real / statistics.median(times), "peak_mib": peak, "fill": real / width}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--pack-length", type=int, default=None, help="null: the longest sequence")
    ap.add_argument("--attn", default=None, help="attention implementation (default: sdpa)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", nargs=2, metavar=("PHASE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.phase, args.mode = args.worker
        print(json.dumps(worker(args)))
        return
    lengths = lengths_like_chat(args.batch * args.micro_batches, args.max_len, args.seed)
    q = statistics.quantiles(lengths, n=10)
    print(
        f"lengths: {len(lengths)} sequences, median {statistics.median(lengths):.0f}, "
        f"p10 {q[0]:.0f}, p90 {q[-1]:.0f}, max {max(lengths)}; micro-batch {args.batch}, "
        f"pack_length {args.pack_length or 'longest'}, {args.device}"
    )
    res = {}
    passthrough = [a for a in sys.argv[1:]]
    for phase in ("student", "teacher"):
        for mode in ("padded", "packed"):
            cmd = [sys.executable, __file__, *passthrough, "--worker", phase, mode]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            res[phase, mode] = json.loads(out.strip().splitlines()[-1])
    print("| phase | mode | real tokens/s | fill (real / computed) | peak MiB | packed / padded |")
    print("|---|---|---|---|---|---|")
    for phase in ("student", "teacher"):
        pad = res[phase, "padded"]
        for mode in ("padded", "packed"):
            r = res[phase, mode]
            fill = r["fill"]
            print(
                f"| {phase} | {mode} | {r['tok_s']:.0f} | {fill:.2f} | {r['peak_mib']:.0f} | "
                f"{r['tok_s'] / pad['tok_s']:.2f}x |"
            )
    s = res["student", "packed"]["tok_s"] / res["student", "padded"]["tok_s"]
    t = res["teacher", "packed"]["tok_s"] / res["teacher", "padded"]["tok_s"]
    print(
        f"RESULT packing: packed {s:.2f}x padded tokens/s (student training, {args.device}), "
        f"{t:.2f}x (teacher scoring)"
    )


if __name__ == "__main__":
    main()
