"""The per-model lock that scoring and generate hold (distil/models/inuse.py), against the
scoring step it guards: `head_bypassed` + a teacher forward with and without the lock taken,
side by side in one run. Prints microseconds per lock round trip and the forward's share.

    OMP_NUM_THREADS=1 python bench/bench_module_lock.py
"""

from __future__ import annotations

import time

import torch

from distil.data.packing import head_bypassed, model_forward
from distil.models.inuse import module_lock
from distil.testing import tiny_llama


def per_call(fn, n: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    torch.set_num_threads(1)
    model = tiny_llama(512, hidden_size=128).eval()
    ids = torch.randint(3, 512, (64, 24))
    attn = torch.ones_like(ids)

    def lock():
        with module_lock(model):
            pass

    def score():
        with torch.inference_mode(), head_bypassed(model):
            model_forward(model, ids, attn, packing=False)

    lock_s, score_s = per_call(lock, 100_000), per_call(score, 30)
    print(
        f"lock round trip {lock_s * 1e6:.2f} us; scoring forward {score_s * 1e3:.1f} ms "
        f"(64 x 24 tokens, lock included); lock share {lock_s / score_s:.2e}"
    )


if __name__ == "__main__":
    main()
