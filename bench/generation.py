"""Tokens per second of each generation backend on the same prompts and weights, side by side.

Backends: plain `model.generate` (dynamic cache, no distil code), distil's `hf` (HFGenerator),
`hf_static` without and with the compiled decode step, and `vllm` when it is importable. Each
is timed greedy and sampled (temperature 1, no top-k/top-p; `--modes`) at every batch size and
completion length of the preset, after one warm-up call (which compiles), as the median of
`--repeats` calls. Tokens are the completion tokens kept (up to and including the first stop
token). The RESULT line (greedy) is printed as soon as the greedy rows are measured, before any
sampled call, and with `--json` written with every row measured so far.

    python bench/generation.py --preset cpu             # small model, this machine's CPU
    python bench/generation.py --preset gpu             # step_breakdown's gpu student, bf16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

PRESETS = {
    # a demo-sized student (hidden, layers, heads, intermediate) over a 512-token vocabulary
    "cpu": {"model": (128, 4, 4, 352), "batches": (16, 64), "new": (32, 128), "bf16": False},
    # bench/step_breakdown.py's gpu student: ~0.1B, 32k vocabulary rows, bf16
    "gpu": {
        "model": (768, 12, 12, 2048),
        "vocab": 32768,
        "batches": (64, 256),
        "new": (128, 512),
        "bf16": True,
    },
    # the issue-28 decode goal: 64 x 128 tokens from a SmolLM2-135M-shaped model (hidden 576,
    # 30 layers, 9 heads / 3 KV heads, 49,152 vocabulary rows), bf16
    "gpu135m": {
        "model": (576, 30, 9, 1536),
        "kv_heads": 3,
        "vocab": 49152,
        "batches": (64,),
        "new": (128,),
        "bf16": True,
    },
}
# generate_static: transformers' own static KV cache (`cache_implementation="static"`), whose
# forward transformers compiles itself on CUDA: the reference of the decode goal
BACKENDS = ("hf", "generate", "generate_static", "hf_static", "hf_static+compile", "vllm")


def build_model(root: Path, preset: dict, device: str):
    """(model, tokenizer, saved model dir): a seeded llama-style student."""
    from distil.testing import default_corpus, tiny_model, train_tokenizer

    tok = train_tokenizer("bpe", default_corpus(4000), 512)
    hidden, layers, heads, inter = preset["model"]
    model = tiny_model(
        "llama",
        preset.get("vocab", len(tok)),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=inter,
        num_kv_heads=preset.get("kv_heads"),
        max_position_embeddings=2048,
        tokenizer=tok,
    )
    model.save_pretrained(root / "student")
    tok.save_pretrained(root / "student")
    dtype = torch.bfloat16 if preset["bf16"] else torch.float32
    return model.to(device=device, dtype=dtype).eval(), tok, root / "student"


def prompts_of(tok, count: int) -> list[list[int]]:
    """`count` prompts of mixed lengths (8-48 tokens) from the test corpus."""
    from distil.testing import default_corpus

    lines = default_corpus(count * 4, seed=1)
    out = []
    for i in range(count):
        ids = tok(" ".join(lines[4 * i : 4 * i + 4]), add_special_tokens=False)["input_ids"]
        out.append(ids[: 8 + (i * 5) % 41])
    return out


def plain_generate(model, pad_id, stop_ids, **extra):
    """`model.generate` with no distil code around it (`extra`: more generate arguments);
    returns the kept completion tokens."""
    from distil.generation.base import mask_after_eos
    from distil.models.tokenizers import left_pad

    def run(prompts, params) -> int:
        ids, attn = left_pad(prompts, pad_id)
        device = next(model.parameters()).device
        sampling = {} if params.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            **sampling,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
            **extra,
        )
        return int(mask_after_eos(out[:, ids.shape[1] :], stop_ids).sum())

    return run


def distil_backend(gen):
    def run(prompts, params) -> int:
        return int(gen.generate(prompts, params).completion_mask_B_C.sum())

    return run


def backends(model, tok, model_dir: Path, wanted: list[str], max_new: int) -> dict:
    from distil.generation.hf import HFGenerator
    from distil.generation.static import StaticCacheGenerator

    # every backend samples only ids the tokenizer decodes (the model's rows past it: -inf),
    # transformers' own through its suppress_tokens processor
    ends = {"pad_id": tok.pad_token_id, "stop_ids": [tok.eos_token_id]}
    kw = {**ends, "vocab_limit": len(tok)}
    rows = model.get_output_embeddings().weight.shape[0]
    plain = {**ends, "suppress_tokens": list(range(len(tok), rows)) or None}
    made = {
        "generate": lambda: plain_generate(model, **plain),
        "generate_static": lambda: plain_generate(model, **plain, cache_implementation="static"),
        "hf": lambda: distil_backend(HFGenerator(model, **kw)),
        "hf_static": lambda: distil_backend(StaticCacheGenerator(model, **kw)),
        "hf_static+compile": lambda: distil_backend(
            StaticCacheGenerator(model, compile=True, **kw)
        ),
        "vllm": lambda: vllm_backend(model, model_dir, kw, max_new),
    }
    out = {}
    for name in wanted:
        try:
            out[name] = made[name]()
        except Exception as e:  # e.g. vllm not installed: say so and go on
            print(f"# {name}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:150]})")
    return out


def vllm_backend(model, model_dir: Path, kw: dict, max_new: int):
    """distil's vllm generator; the engine's max_model_len covers the longest completion asked
    for (data.max_prompt_tokens 256 + max_new: the prompts here are at most 48 tokens)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError("vllm is not installed (pip install 'distil[vllm]')")
    from distil.config import build_config
    from distil.generation.select import build_generator

    cfg = build_config(
        {
            "student": {"path": str(model_dir)},
            "generation": {"backend": "vllm", "max_new_tokens": max_new},
        }
    )
    return distil_backend(build_generator(cfg, model, **kw))


def clock(device: str) -> float:
    """Seconds: wall time on CUDA (synchronized); on CPU this process's CPU time, which other
    processes on a shared machine do not inflate (torch runs on one thread here)."""
    if device == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def measure(runs: dict, prompts, params, repeats: int, device: str) -> dict[str, tuple]:
    """{backend: (median seconds, tokens, first call's seconds)}: one warm-up call each (it
    compiles), then the backends take turns, so that a slower or faster moment of the machine
    hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for i in range(repeats + 1):
        for name, run in runs.items():
            torch.manual_seed(i)
            start = clock(device)
            tokens[name] = run(prompts, params)
            times[name].append(clock(device) - start)
    return {name: (statistics.median(t[1:]), tokens[name], t[0]) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated subset of {','.join(BACKENDS)} (default: all; on CPU all but "
        "hf_static+compile, whose inductor build takes minutes per shape there)",
    )
    p.add_argument("--batches", help="comma-separated batch sizes (default: the preset's)")
    p.add_argument("--new", help="comma-separated completion lengths (default: the preset's)")
    p.add_argument("--modes", default="greedy,sampled", help="greedy and/or sampled")
    p.add_argument("--json", type=Path, default=None, help="the rows and RESULT figures here")
    args = p.parse_args()
    modes = [m for m in ("greedy", "sampled") if m in args.modes.split(",")]
    torch.set_num_threads(args.threads)
    from distil.generation.base import SamplingParams
    from distil.models.load import quiet_transformers

    quiet_transformers()
    preset = dict(PRESETS[args.preset])
    for key in ("batches", "new"):
        if getattr(args, key):
            preset[key] = tuple(int(x) for x in getattr(args, key).split(","))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, model_dir = build_model(Path(tmp), preset, device)
        wanted = args.backends.split(",") if args.backends else list(BACKENDS)
        if args.backends is None and device == "cpu":
            for name in ("hf_static+compile", "generate_static"):
                wanted.remove(name)
                print(f"# {name}: not run on CPU by default (--backends to ask for it)")
        runs = backends(model, tok, model_dir, wanted, max(preset["new"]))
        what = "wall" if device == "cuda" else "CPU (process)"
        print(
            f"preset {args.preset} on {device}, {args.threads} threads; median {what} seconds "
            f"of {args.repeats} calls, backends in turn"
        )
        print(
            "| mode | batch | new | backend | s/call | tokens/s | x hf | x generate | 1st call s |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for mode in modes:
            temperature = 0.0 if mode == "greedy" else 1.0
            for batch in preset["batches"]:
                prompts = prompts_of(tok, batch)
                for new in preset["new"]:
                    params = SamplingParams(new, temperature)
                    measured = measure(runs, prompts, params, args.repeats, device)
                    speed = {name: m[1] / m[0] for name, m in measured.items()}
                    for name, (sec, _, first) in measured.items():
                        rows.append((mode, batch, new, name, speed[name]))
                        print(
                            f"| {mode} | {batch} | {new} | {name} | {sec:.3f} | "
                            f"{speed[name]:.0f} | {_ratio(speed, name, 'hf')} | "
                            f"{_ratio(speed, name, 'generate')} | {first:.1f} |",
                            flush=True,
                        )
            if mode == "greedy":  # the decode goal's figure, before the sampled calls
                print(headline(rows, preset, device), flush=True)
            write_json(args.json, rows, device)


def write_json(path: Path | None, rows: list, device: str) -> None:
    """The rows measured so far and the greedy headline's figures (`goal_ratio`: the best
    hf_static variant's tokens/s over transformers' compiled static cache, at least 0.5 to
    meet the decode goal)."""
    if path is None:
        return
    import json

    figures = headline_figures(rows)
    keys = ("mode", "batch", "new", "backend", "tokens_per_s")
    out = {"device": device, "rows": [dict(zip(keys, r, strict=True)) for r in rows], **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


def _ratio(speed: dict, name: str, ref: str) -> str:
    return f"{speed[name] / speed[ref]:.2f}" if ref in speed else "-"


def headline_figures(rows) -> dict:
    """Greedy, at batch 64 and 128 tokens (else the largest greedy setting measured): the
    best hf_static variant, its tokens/s over hf's and over transformers' compiled static
    cache's (`goal_ratio`, None where one side was not measured)."""
    greedy = [r for r in rows if r[0] == "greedy"]
    if not greedy:
        return {"static": None, "vs_hf": None, "goal_ratio": None}
    batch, new = (64, 128) if any(r[1:3] == (64, 128) for r in greedy) else greedy[-1][1:3]
    at = {r[3]: r[4] for r in greedy if r[1:3] == (batch, new)}
    static = max((n for n in at if n.startswith("hf_static")), key=at.get, default=None)
    ratio = lambda ref: at[static] / at[ref] if static and ref in at else None  # noqa: E731
    return {"static": static, "batch": batch, "new": new, "at": at, "vs_hf": ratio("hf"),
            "goal_ratio": ratio("generate_static")}  # fmt: skip


def headline(rows, preset, device: str) -> str:
    """The RESULT line of `headline_figures`."""
    f = headline_figures(rows)
    if f["static"] is None:
        return "RESULT generation: no hf_static variant was measured"
    at, parts = f["at"], []
    if f["vs_hf"] is not None:
        parts.append(f"{f['static']} {f['vs_hf']:.2f}x the tokens/s of hf")
    if "generate" in at and "hf" in at:
        parts.append(f"plain generate {at['generate'] / at['hf']:.2f}x")
    if f["goal_ratio"] is not None:  # the goal: at least 0.5x
        parts.append(f"{f['static']} {f['goal_ratio']:.2f}x transformers' static cache")
    return (
        f"RESULT generation: {', '.join(parts)} (greedy, batch {f['batch']}, {f['new']} "
        f"tokens, {device})"
    )


if __name__ == "__main__":
    main()
