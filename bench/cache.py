"""Off-policy distillation from the teacher cache vs the live teacher, and what the format costs.

1. Training: the same 3-epoch off-policy run (lambda = 0, forward KL on the teacher's top-k +
   rest) twice at the CPU demo's model sizes (teacher 4.8M, student 1.3M, bpe tokenizer): once
   with the live teacher, once from `distil cache-teacher`'s output (`teacher.cache`). Prints
   both wall times, the ratio, the time to build the cache, and the largest per-step loss gap.
2. Format: bytes per token on disk and the KL (nats per token, over the K+1 buckets) between the
   decoded and the exact targets, for k = 16, 64, 256 on a synthetic 128k-vocabulary logits
   tensor, for each encoding trick.

3. Teacher cost at the users' ratio (`--part ratio`): a teacher 8x or more the student's
   parameters; the same off-policy steps with the live teacher, from the cache, through `distil
   serve-teacher` on this machine (`teacher.url`), and the student's bare step (loss `sft`: the
   same forward, a cross-entropy loss, backward and AdamW step through the same loop, no
   teacher) as the floor. Seconds per step are each run's fastest `time/step` after warm-up
   (the machine is shared); prints cached/live, remote/live and cached/bare.

    python bench/cache.py                 # demo sizes, 1024 rows x 3 epochs
    python bench/cache.py --preset tiny --rows 256
    python bench/cache.py --part ratio    # 8:1 and more, a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from step_breakdown import PRESETS, build


def train_config(root: Path, dirs, preset, rows: int, epochs: int, k: int, **teacher) -> dict:
    batch = preset["batch"]
    return {
        "data": {"train": str(root / "data" / "rows.jsonl"), "template": "countdown_plain"},
        "student": {"path": str(dirs["student"])},
        "teacher": {"path": str(dirs["teacher"]), "top_k": k, **teacher},
        "loss": {"name": "forward_kl"},
        "train": {
            "output_dir": str(root / ("cached" if teacher else "live")),
            "max_steps": epochs * rows // batch,
            "per_device_batch_size": batch,
            "grad_accum_steps": 1,
            "lambda": 0.0,
            "lr": 1e-3,
            "save_every_minutes": None,
            "eval_every": 0,
        },
        "logging": {"progress": False, "print_example": False},
    }


# (hidden, layers, heads, intermediate) of a student and a teacher >= 8x its parameters
RATIO = {"student": (96, 2, 4, 256), "teacher": (256, 4, 4, 704), "batch": 16}


def ratio_part(args) -> dict:
    """Seconds per off-policy step: live, cached, remote (serve-teacher), bare student."""
    from distil.config import build_config
    from distil.models.load import load_model
    from distil.models.scratch import count_parameters
    from distil.serve.process import teacher_server
    from distil.teacher.writer import cache_teacher

    preset = {**RATIO, "new": 16}
    root = Path(tempfile.mkdtemp(prefix="distil-bench-ratio-"))
    dirs = build(root, preset)
    params = {n: count_parameters(load_model(str(dirs[n]))) for n in ("teacher", "student")}
    src = (root / "data" / "train.jsonl").read_text().splitlines()
    (root / "data" / "rows.jsonl").write_text("\n".join(src[: args.rows]) + "\n")
    steps = args.ratio_steps
    live = train_config(root, dirs, preset, steps * preset["batch"], 1, args.k)
    # within the tiny teacher's 512 positions (serve-teacher's max_model_len)
    live["data"].update({"max_prompt_tokens": 192, "max_completion_tokens": 128})
    cache_teacher(build_config(live), root / "cache", shard_rows=args.shard_rows)
    cached = json.loads(json.dumps(live))
    cached["teacher"] = {"path": None, "cache": str(root / "cache"), "top_k": args.k}
    bare = json.loads(json.dumps(live))
    bare["teacher"] = {"path": None}
    bare["loss"] = {"name": "sft"}
    runs = {"live": live, "cached": cached, "bare": bare}
    for name, raw in runs.items():
        raw["train"]["output_dir"] = str(root / name)
    per_step: dict[str, list[float]] = {}
    env = {"OMP_NUM_THREADS": str(args.threads)}
    with teacher_server(dirs["teacher"], "--max-logprobs", str(args.k), env=env) as (url, _):
        remote = json.loads(json.dumps(runs["live"]))
        remote["teacher"].update({"url": url, "path": str(dirs["teacher"])})
        remote["train"]["output_dir"] = str(root / "remote")
        runs["remote"] = remote
        for _ in range(args.repeats):  # alternated; each side's fastest step, best run kept
            for name, raw in runs.items():
                per_step.setdefault(name, []).append(median_step(raw))
    best = {name: min(v) for name, v in per_step.items()}
    ratio = params["teacher"] / params["student"]
    print(
        f"\nteacher cost at {ratio:.1f}:1 (teacher {params['teacher'] / 1e6:.2f}M, student "
        f"{params['student'] / 1e6:.2f}M parameters; batch {preset['batch']}, k={args.k}, "
        f"{steps} steps a run, fastest time/step after the first 2, best of {args.repeats}, "
        f"{torch.get_num_threads()} threads):"
    )
    for name in ("live", "remote", "cached", "bare"):
        print(
            f"  {name:<7} {1000 * best[name]:8.1f} ms/step  (runs: "
            + ", ".join(f"{1000 * x:.1f}" for x in per_step[name])
            + ")"
        )
    out = {
        "cached_vs_live": best["cached"] / best["live"],
        "remote_vs_live": best["remote"] / best["live"],
        "cached_vs_bare": best["cached"] / best["bare"],
        "param_ratio": ratio,
    }
    print(
        f"  cached/live {out['cached_vs_live']:.2f}  remote/live {out['remote_vs_live']:.2f}  "
        f"cached/bare {out['cached_vs_bare']:.2f} (target <= 1.15)"
    )
    return out


def median_step(raw: dict) -> float:
    """The fastest `time/step` of one run after its first 2 (warm-up): on a shared machine
    other processes only ever add time, so the minimum is the closest to the step's cost."""
    _, _, _, steps = timed_train(raw, per_step=True)
    return min(steps[2:])


def timed_train(raw: dict, per_step: bool = False) -> tuple[float, list[float], dict[str, float]]:
    """(wall seconds, per-step losses, seconds per phase summed over steps) of one run; the
    phases also hold "cpu", the process's CPU seconds (on a shared machine, waits for a core
    inflate the wall time, not this)."""
    import shutil

    from distil.config import build_config
    from distil.train.loop import train

    cfg = build_config(raw)
    shutil.rmtree(cfg.train.output_dir, ignore_errors=True)
    start, cpu = time.perf_counter(), time.process_time()
    train(cfg)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    lines = (Path(cfg.train.output_dir) / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    phases = {k: sum(m[f"time/{k}"] for m in metrics) for k in ("teacher", "train")}
    phases["cpu"] = cpu
    if per_step:
        return seconds, [m["loss"] for m in metrics], phases, [m["time/step"] for m in metrics]
    return seconds, [m["loss"] for m in metrics], phases


def training_part(args) -> dict:
    from distil.config import build_config
    from distil.teacher.writer import cache_teacher

    preset = PRESETS[args.preset]
    root = Path(tempfile.mkdtemp(prefix="distil-bench-cache-"))
    dirs = build(root, preset)
    src = (root / "data" / "train.jsonl").read_text().splitlines()
    (root / "data" / "rows.jsonl").write_text("\n".join(src[: args.rows]) + "\n")
    live_raw = train_config(root, dirs, preset, args.rows, args.epochs, args.k)
    start = time.perf_counter()
    manifest = cache_teacher(build_config(live_raw), root / "cache", shard_rows=args.shard_rows)
    build_s = time.perf_counter() - start
    cached_raw = train_config(
        root, dirs, preset, args.rows, args.epochs, args.k, cache=str(root / "cache")
    )
    runs = {"live": [], "cached": []}
    for _ in range(args.repeats):  # alternate, keep each side's fastest (a shared machine)
        runs["live"].append(timed_train(live_raw))
        runs["cached"].append(timed_train(cached_raw))
    live_s, live_losses, live_ph = min(runs["live"], key=lambda r: r[0])
    cached_s, cached_losses, cached_ph = min(runs["cached"], key=lambda r: r[0])
    pairs = list(zip(live_losses, cached_losses, strict=True))
    gap = max(abs(a - b) for a, b in pairs)
    print(
        f"\ntraining, {args.epochs} epochs x {args.rows} rows ({len(live_losses)} steps, batch "
        f"{preset['batch']}, k={args.k}, {torch.get_num_threads()} threads, best of "
        f"{args.repeats}):"
    )
    for name, s, ph in (("live teacher", live_s, live_ph), ("from the cache", cached_s, cached_ph)):
        print(
            f"  {name:<15} {s:7.1f} s wall, {ph['cpu']:6.1f} s CPU  (teacher {ph['teacher']:.1f} "
            f"s, student {ph['train']:.1f} s)"
        )
    ceiling = live_s / live_ph["train"]
    cpu_live = min(r[2]["cpu"] for r in runs["live"])
    cpu_cached = min(r[2]["cpu"] for r in runs["cached"])
    print(f"  speedup {live_s / cached_s:.2f}x wall, {cpu_live / cpu_cached:.2f}x CPU time")
    print(
        f"  ceiling {ceiling:.2f}x: the live run's wall time over its own student phase (forward, "
        "loss, backward, optimizer), the speedup if the cache and everything but the student's "
        "step cost nothing"
    )
    print(
        f"  building the cache {build_s:.1f} s ({manifest['tokens']} tokens, "
        f"{manifest['bytes'] / manifest['tokens']:.1f} B/token at a {manifest['vocab_size']}-token "
        "vocabulary, model loading included)"
    )
    print(
        f"  largest per-step loss gap {gap:.2e} ({manifest['values']} targets; first losses "
        f"{live_losses[0]:.4f} live, {cached_losses[0]:.4f} cached; last "
        f"{live_losses[-1]:.4f}, {cached_losses[-1]:.4f})"
    )
    if args.profile:
        profile_part(cached_raw)
    return {
        "live_s": live_s,
        "cached_s": cached_s,
        "ceiling": ceiling,
        "cpu_speedup": cpu_live / cpu_cached,
        "build_s": build_s,
        "loss_gap": gap,
        **writer_part(args, root, live_raw),
    }


def profile_part(raw: dict) -> dict[str, float]:
    """Where the cached run's time goes: one more run under cProfile, seconds per phase (each a
    function's cumulative time; the loss = micro_step - student forward)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    seconds = timed_train(raw)[0]
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, ncalls, tottime, cumtime, _)}

    def cum(name: str, file_part: str) -> float:
        def named(fn: str) -> bool:  # torch's C methods are "<method 'name' of ...>"
            return fn == name or fn.startswith(f"<method '{name}'")

        return sum(v[3] for k, v in stats.items() if file_part in k[0] and named(k[2]))

    forward = cum("student_forward", "train/step.py")
    phases = {
        "student forward": forward,
        "loss": cum("micro_step", "train/step.py") - forward,
        "backward": cum("run_backward", ""),
        "optimizer + clip": cum("_update", "train/loop.py"),
        "cache reads + targets": cum("score", "teacher/cached.py"),
        "setup (models, data, cache checks)": cum("build", "train/setup.py"),
    }
    phases["other"] = seconds - sum(phases.values())
    print(f"  the cached run under cProfile ({seconds:.1f} s):")
    for name, s in phases.items():
        print(f"    {name:<36} {s:6.2f} s  {100 * s / seconds:5.1f}%")
    return phases


def writer_part(args, root: Path, live_raw: dict) -> dict:
    """Throughput of `cache-teacher`, padded vs packed teacher forwards (`train.packing`),
    alternated, the faster of each kept; model loading included in both."""
    import shutil

    from distil.config import build_config
    from distil.teacher.writer import cache_teacher

    best: dict[bool, float] = {}
    tokens = 0
    for _ in range(args.repeats):
        for packed in (False, True):
            raw = json.loads(json.dumps(live_raw))
            raw["train"]["packing"] = packed
            out = root / f"writer-{packed}"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            tokens = cache_teacher(build_config(raw), out)["tokens"]
            seconds = time.perf_counter() - start
            best[packed] = min(best.get(packed, seconds), seconds)
    print(f"  cache-teacher, {tokens} tokens, best of {args.repeats}, alternated:")
    for packed, name in ((False, "padded"), (True, "packed")):
        print(f"    {name:<7} {best[packed]:6.2f} s  {tokens / best[packed]:9,.0f} tokens/s")
    print(f"    packed vs padded {best[False] / best[True]:.2f}x")
    return {"writer_packed_speedup": best[False] / best[True]}


def synthetic(n: int, v: int, kind: str, seed: int = 0) -> torch.Tensor:
    """(n, v) log-probs. "random": Gaussian logits (sd 2) with one token lifted by 12 nats, so
    the top-k ids are spread at random over the vocabulary (the worst case for the ids).
    "zipf": logits -log(id + 1) + Gaussian noise (sd 2): frequent tokens have small ids, as in
    BPE vocabularies ordered by merge frequency, and the top-k holds about half the mass."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, v, generator=g) * 2.0
    if kind == "random":
        noise[torch.arange(n), torch.randint(0, v, (n,), generator=g)] += 12.0
    else:
        noise -= torch.log(torch.arange(1, v + 1, dtype=torch.float32))
    return torch.log_softmax(noise, dim=-1)


def kl_buckets(vals, rest, d_vals, d_rest) -> float:
    """Mean KL(exact || decoded) over the K+1 buckets (decoded renormalised), nats per token."""
    p = torch.cat([vals, rest[:, None]], -1).double()
    q = torch.cat([d_vals, d_rest[:, None]], -1).double()
    q = q - torch.logsumexp(q, -1, keepdim=True)
    p = p - torch.logsumexp(p, -1, keepdim=True)
    return float((p.exp() * (p - q)).sum(-1).mean())


def format_part(args) -> dict:
    """Bytes per token and KL of format 1 (zlib'd byte planes of the id gaps + q8 values) and
    format 2 (Rice-coded gaps + sqrt-quantised probabilities, lzma), and of each trick alone."""
    import lzma
    import zlib

    from distil.teacher import cache_codec as codec
    from distil.teacher.base import sparse_topk

    n, v = args.tokens, 131072
    out, tricks = {}, []
    print(f"format: {n} tokens of a synthetic {v}-token vocabulary, bytes per token on disk")
    print(
        "| logits | k | top-k mass | u32 ids + fp32 | u32 ids + fp16 | format 1: zlib(gap planes)"
        " + q8 | format 2: Rice + sqrt (default) | KL q8 | KL sqrt |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in ("random", "zipf"):
        logprobs = synthetic(n, v, kind)
        token = logprobs[:, 0]
        for k in (16, 64, 256):
            ids, vals, rest = sparse_topk(logprobs, k)
            order = ids.argsort(-1)  # decoded rows are in id order
            enc, kls = {}, {}
            for name in ("q8", "sqrt"):
                enc[name] = codec.encode_tokens(ids, vals, rest, token, name)
                d_ids, d_vals, d_rest, _ = codec.decode_tokens(enc[name], k, name)
                assert torch.equal(d_ids, ids.gather(-1, order))
                kls[name] = kl_buckets(vals.gather(-1, order), rest, d_vals, d_rest)
            # format 1: the uint32 gaps (first id, then differences) as 4 byte planes, zlib
            sid = ids.gather(-1, order).numpy().astype(np.int64)
            gaps = np.diff(sid, axis=-1, prepend=0).astype("<u4").reshape(-1)
            planes = gaps.view(np.uint8).reshape(-1, 4).T.tobytes()
            ids_ = {"zlib": len(zlib.compress(planes, 6)), "lzma": len(lzma.compress(planes))}
            ids_["rice"] = sum(enc["sqrt"][a].nbytes for a in ("ids_r", "ids_hi", "ids_lo"))
            payload = {c: lzma.decompress(enc[c]["values_x"].tobytes()) for c in ("q8", "sqrt")}
            vals_ = {}
            for c in ("q8", "sqrt"):
                vals_[f"{c} zlib"] = len(zlib.compress(payload[c], 6))
                vals_[f"{c} lzma"] = enc[c]["values_x"].nbytes
            vals_["sqrt absolute"] = len(
                lzma.compress(sqrt_levels(payload["sqrt"], n, k).tobytes())
            )
            vals_["sqrt value order"] = value_order_bytes(payload["sqrt"], n, k)
            v1 = (ids_["zlib"] + vals_["q8 zlib"]) / n + 6  # + fp16 top-1, rest, token
            v2 = sum(a.nbytes for a in enc["sqrt"].values()) / n
            mass = float(vals.exp().sum(-1).mean())
            print(
                f"| {kind} | {k} | {mass:.2f} | {8 * k + 12} | {6 * k + 6} | {v1:.1f} | "
                f"{v2:.1f} | {kls['q8']:.1e} | {kls['sqrt']:.1e} |"
            )
            tricks.append((kind, k, {f"ids {a}": b / n for a, b in ids_.items()}, vals_))
            out[kind, k] = {"bytes": v2, "kl": kls["sqrt"], "bytes_v1": v1}
    print("\neach trick alone, bytes per token (ids: sorted-id gaps; values in id order):")
    print(
        "| logits | k | ids zlib(planes) | ids lzma(planes) | ids Rice | q8 zlib | q8 lzma "
        "| sqrt zlib | sqrt lzma | sqrt lzma, levels not above the token's lowest | sqrt in "
        "value order + permutation, lzma |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, k, ids_, vals_ in tricks:
        cells = [f"{b:.1f}" for b in ids_.values()] + [f"{b / n:.1f}" for b in vals_.values()]
        print(f"| {kind} | {k} | " + " | ".join(cells) + " |")
    return out


def sqrt_levels(sqrt_payload: bytes, n: int, k: int) -> np.ndarray:
    """(N, K) uint8 sqrt levels in id order from the codec's payload (lowest, then the rest)."""
    low = np.frombuffer(sqrt_payload, np.uint8, count=n)
    return np.frombuffer(sqrt_payload, np.uint8, offset=n).reshape(n, k) + low[:, None]


def value_order_bytes(sqrt_payload: bytes, n: int, k: int) -> int:
    """The sqrt levels stored in value order instead: each token's levels sorted descending as
    differences (small, lzma), plus the permutation back to id order (uint8 ranks, lzma)."""
    import lzma

    levels = sqrt_levels(sqrt_payload, n, k).astype(np.int64)
    perm = np.argsort(-levels, axis=-1, kind="stable")  # ties keep id order
    desc = np.take_along_axis(levels, perm, -1)
    diffs = np.concatenate([desc[:, :1], -np.diff(desc, axis=-1)], -1).astype(np.uint8)
    ranks = perm.astype(np.uint16 if k > 256 else np.uint8)
    return sum(len(lzma.compress(a.tobytes(), check=lzma.CHECK_NONE)) for a in (diffs, ranks))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=["demo", "tiny"], default="demo")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--tokens", type=int, default=512, help="synthetic tokens for the format table")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shard-rows", type=int, default=1024, help="rows per shard of the cache")
    p.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--profile", action="store_true", help="phase breakdown of the cached run")
    p.add_argument("--part", choices=["all", "ratio"], default="all")
    p.add_argument("--ratio-steps", type=int, default=12, help="steps of each --part ratio run")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    np.random.seed(0)
    if args.part == "ratio":
        r = ratio_part(args)
        print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in r.items()))
        return
    fmt_out = format_part(args)
    if args.skip_training:
        print(f"RESULT {_format_result(fmt_out)}")
        return
    tr = training_part(args)
    print(
        f"RESULT cached_vs_live_speedup={tr['live_s'] / tr['cached_s']:.2f}x "
        f"cpu_time_speedup={tr['cpu_speedup']:.2f}x ceiling={tr['ceiling']:.2f}x "
        f"{_format_result(fmt_out)} loss_gap={tr['loss_gap']:.1e} "
        f"writer_packed_vs_padded={tr['writer_packed_speedup']:.2f}x"
    )


def _format_result(out: dict) -> str:
    return " ".join(
        f"bytes_per_token_k64_{kind}={out[kind, 64]['bytes']:.1f} "
        f"kl_k64_{kind}={out[kind, 64]['kl']:.1e}"
        for kind in ("random", "zipf")
    )


if __name__ == "__main__":
    main()
