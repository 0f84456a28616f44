"""Packed vs padded forwards: tokens/s and peak memory, student training and teacher scoring.

The data: sequence lengths spread like chat data (log-normal: many short, a long tail, capped at
`--max-len`), shuffled into micro-batches of `--batch` sequences. Each micro-batch runs once
padded (to its longest sequence) and once packed (`distil.data.packing.model_forward`, rows of at
most `--pack-length` tokens, best-fit decreasing). The student phase is `distil.train.step
.micro_step` (forward KL against fixed targets, chunked loss) + backward + AdamW; the teacher
phase is `LiveTeacher.score` (full log-probs). Real (non-padding) tokens per second, median of
`--repeats` passes over all micro-batches, padded and packed alternating micro-batch by
micro-batch in one process (so a busy machine slows both alike). Peak memory: one pass per
(phase, mode) in a fresh worker process; on CPU the peak RSS above the RSS after loading, on
CUDA `torch.cuda.max_memory_allocated` above the allocated memory after loading.

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

    torch.manual_seed(0)
    model = build(args, args.phase)
    data = [b.to(args.device) for b in batches(args, args.vocab)]
    if args.phase == "teacher":
        scorer = LiveTeacher(model, pack_length=args.pack_length)

        def run(i, packing):
            scorer.packing = packing
            scorer.score(data[i])

    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = get_loss("forward_kl")
        targets = [fixed_targets(b, args.device) for b in data]

        def run(i, packing):
            b = data[i]
            out = micro_step(
                model, model, b, targets[i], loss_fn, num_tokens=float(b.num_loss_tokens),
                loss_opts={"chunk_size": 1024}, packing=packing, pack_length=args.pack_length,
            )  # fmt: skip
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.mode in ("padded", "packed"):  # peak memory of one pass, this process alone
        base = _rss_now()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        for i in range(len(data)):
            run(i, args.mode == "packed")
        sync()
        if args.device == "cuda":
            return {"peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
        return {
            "peak_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 2**20
        }
    # timing: padded and packed alternate micro-batch by micro-batch (same load on both)
    run(0, False), run(0, True)  # warm-up
    spent = {False: [], True: []}
    for _ in range(args.repeats):
        total = {False: 0.0, True: 0.0}
        for i in range(len(data)):
            for packing in (False, True) if i % 2 == 0 else (True, False):
                sync()
                t0 = time.perf_counter()
                run(i, packing)
                sync()
                total[packing] += time.perf_counter() - t0
        for k in spent:
            spent[k].append(total[k])
    real = sum(int(b.attention_mask_B_L.sum()) for b in data)
    out = {}
    for packing, mode in ((False, "padded"), (True, "packed")):
        out[mode] = {
            "tok_s": real / statistics.median(spent[packing]),
            "fill": real / computed(data, args, packing),
        }
    return out


def fixed_targets(b, device):
    """Top-2 + rest targets that favour the label: cheap, and the same for both modes."""
    from distil.types import TeacherTargets

    t = torch.zeros((*b.labels_B_T.shape, 2), dtype=torch.long, device=device)
    t[..., 0] = b.labels_B_T
    lp = torch.tensor([-0.1, -2.4], device=device).expand(*t.shape).contiguous()
    rest = torch.full(b.labels_B_T.shape, -5.0, device=device)
    return TeacherTargets(topk_ids_B_T_K=t, topk_logprobs_B_T_K=lp, rest_logprob_B_T=rest)


def computed(data, args, packing: bool) -> int:
    """Tokens the transformer body computes: padded width, or packed rows (tails included)."""
    from distil.data.packing import plan_packing, sequence_lengths

    if not packing:
        return sum(b.input_ids_B_L.numel() for b in data)
    width = 0
    for b in data:
        n = sequence_lengths(b.attention_mask_B_L)
        cap = max(n) if args.pack_length is None else max(args.pack_length, max(n))
        r, p = plan_packing(n, b.input_ids_B_L.shape[1], cap).shape_R_P
        width += r * p
    return width


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


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
    for phase in ("student", "teacher"):
        for mode in ("time", "padded", "packed"):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", phase, mode]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            res[phase, mode] = json.loads(out.strip().splitlines()[-1])
        for mode in ("padded", "packed"):
            res[phase, mode].update(res[phase, "time"][mode])
    print("| phase | mode | real tokens/s | fill (real / computed) | peak MiB | packed / padded |")
    print("|---|---|---|---|---|---|")
    for phase in ("student", "teacher"):
        pad = res[phase, "padded"]
        for mode in ("padded", "packed"):
            r = res[phase, mode]
            print(
                f"| {phase} | {mode} | {r['tok_s']:.0f} | {r['fill']:.2f} | {r['peak_mib']:.0f} | "
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
