"""The chunked jsd loss, eager against compiled chunks, and with the logging-only metrics off.

One forward + backward of `jsd` over N loss rows through the student's head
(`StudentHidden`, chunk size `auto_chunk_size(V)`), full teacher log-probs, at vocabulary V:

    python bench/chunk_fusion.py                       # CPU: V 32768, N 2048, H 256
    python bench/chunk_fusion.py --vocab 151936 --rows 4096 --hidden 1024 --device cuda --bf16

Rows: eager / compiled (inductor) x diagnostics on / off; median of --repeat timed calls after
two warm-up calls (the first compiled call compiles and is not timed). On CPU the time is the
process's CPU time (one thread: robust to other processes sharing the cores), on CUDA wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distil.losses import StudentHidden, get_loss
from distil.losses.chunked import auto_chunk_size
from distil.types import TeacherTargets


def one_call(case, backend, diagnostics, device, bf16, chunk) -> float:
    hidden, weight, targets, mask = case
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    now = time.perf_counter if device.type == "cuda" else time.process_time  # CPU: own CPU time
    t0 = now()
    with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
        out = get_loss("jsd")(
            StudentHidden(h, w), targets, mask, num_tokens=int(mask.sum()),
            chunk_size=chunk, beta=0.5,
            diagnostics=diagnostics, compile_backend=backend,
        )  # fmt: skip
    out.loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return now() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--chunk", type=int, default=None, help="rows per chunk (default: auto)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 head and autocast")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    hidden = torch.randn(1, a.rows, a.hidden, generator=g).to(device, dtype)
    weight = (torch.randn(a.vocab, a.hidden, generator=g) / a.hidden**0.5).to(device, dtype)
    logp = torch.log_softmax(torch.randn(1, a.rows, a.vocab, generator=g) * 2, -1).to(device)
    case = (hidden, weight, TeacherTargets(logprobs_B_T_V=logp.to(dtype)), None)
    case = (*case[:3], torch.ones(1, a.rows, dtype=torch.bool, device=device))
    chunk = a.chunk or auto_chunk_size(a.vocab)
    print(f"V={a.vocab} N={a.rows} H={a.hidden} chunk={chunk} device={device} bf16={a.bf16}")
    base = None
    for backend in (None, "inductor"):
        for diagnostics in (True, False):
            t0 = time.perf_counter()
            for _ in range(2):
                one_call(case, backend, diagnostics, device, a.bf16, chunk)
            warm = time.perf_counter() - t0
            times = [
                one_call(case, backend, diagnostics, device, a.bf16, chunk) for _ in range(a.repeat)
            ]
            ms = 1000 * statistics.median(times)
            base = base or ms
            name = f"{backend or 'eager'}, diagnostics {'on' if diagnostics else 'off'}"
            print(f"{name:28s} {ms:9.1f} ms  ({base / ms:4.2f}x)  warm-up {warm:6.1f} s")


if __name__ == "__main__":
    main()
