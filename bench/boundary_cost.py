"""What aligned_kl's token-boundary mix costs: the aligner's extra pass and the loss's extra
projection, each timed side by side with the same code without it, in one run.

At a token boundary `aligned_kl` also reads the teacher one position earlier (its odds of having
written a longer token than the one it ended: docs/cross-tokenizer.md, "Token boundaries").
For the tokenizer pairs of `bench/align.py` (its synthetic pairs, and the 6 ordered pairs of the
real Qwen3, Llama 3 and Gemma 3 tokenizers where ../shared/tokenizers has them; 64 completions
of 256 student tokens, the same text):
  align     `build_alignment` with warm table caches, as the collator calls it, against the
            same call with `align.batch._boundaries` replaced by one that marks no boundary
  loss      `aligned_kl` forward + backward on random student logits and teacher log-probs
            (fp32, full vocabularies, one chunk) with the alignment's boundary fields, against
            the same alignment with them removed (the loss then mixes nothing); for the real
            tokenizers on the first 4 rows (their full logits would not fit otherwise)
Fastest of `--repeats` calls after a warm-up, the two variants alternating. Run:
    OMP_NUM_THREADS=1 python bench/boundary_cost.py
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from align import PAIRS, REAL, REAL_DIR, load_tokenizer, make_rows, padded_rows


def _no_boundaries(arrays, teacher, t_offset, teacher_vb, proj_tables, dp_B):
    row, p_row, proj_ids, proj_used = arrays[0], arrays[8], arrays[11], arrays[12]
    none = lambda n: (np.full(n, -1, np.int64), np.full(n, -1, np.int64))  # noqa: E731
    return proj_ids, none(len(p_row)), none(len(row)), proj_used


def fastest(fns: dict, repeats: int) -> dict[str, float]:
    best = {k: float("inf") for k in fns}
    for _ in range(2):  # warm-up
        for fn in fns.values():
            fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def pair_costs(s_name, t_name, rows_n: int, tokens: int, repeats: int, real: bool, loss_rows=4):
    import distil.align.batch as batch
    from distil.align import MatchTables, ProjectionTables, build_alignment
    from distil.align.vocab_map import vocab_bytes
    from distil.losses import get_loss
    from distil.types import TeacherTargets

    s_tok, t_tok = load_tokenizer(s_name), load_tokenizer(t_name)
    s_vb, t_vb = vocab_bytes(s_tok), vocab_bytes(t_tok)
    rows = make_rows(s_tok, s_vb, t_tok, t_vb, rows_n, tokens, real=real)
    n = len(rows)
    inputs = padded_rows(rows)
    warm = (MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb))
    original = batch._boundaries

    def without():
        batch._boundaries = _no_boundaries
        try:
            return build_alignment(inputs, s_vb, t_vb, *warm)
        finally:
            batch._boundaries = original

    align = fastest(
        {"with": lambda: build_alignment(inputs, s_vb, t_vb, *warm), "without": without}, repeats
    )
    if real:  # a real vocabulary's full logits: 64 rows would not fit in memory
        rows = rows[:loss_rows]
        n, inputs = len(rows), padded_rows(rows)
    alignment, in_group = build_alignment(inputs, s_vb, t_vb, *warm)
    plain = replace(alignment, proj_prev_tok_N=None, proj_prev_table_N=None,
                    group_prev_tok_G=None, group_prev_table_G=None)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    s_len = inputs.s_ids_B_L.shape[1] - 1
    t_len = inputs.t_ids_B_L.shape[1] - 1
    logits = torch.randn(n, s_len, len(s_vb.token_bytes), generator=g).requires_grad_()
    teacher = torch.log_softmax(torch.randn(n, t_len, len(t_vb.token_bytes), generator=g), -1)
    mask = torch.zeros(n, s_len, dtype=torch.bool)
    mask[:, 15 : 15 + in_group.shape[1]] = in_group
    loss = get_loss("aligned_kl")
    targets = TeacherTargets(logprobs_B_T_V=teacher)

    def step(a):
        def run():
            out = loss(logits, targets, mask, alignment=a, num_tokens=int(mask.sum()), beta=1.0)
            out.loss.backward()
            return out

        return run

    losses = fastest({"with": step(alignment), "without": step(plain)}, repeats)
    marked = int((alignment.proj_prev_table_N >= 0).sum())
    return {
        "pair": f"{s_name} -> {t_name}",
        "entries": int(alignment.proj_row_N.numel()),
        "boundary entries": marked,
        "align ms": (align["with"] * 1e3, align["without"] * 1e3),
        "loss ms": (losses["with"] * 1e3, losses["without"] * 1e3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--synthetic-only", action="store_true", help="skip the real tokenizers")
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| pair | entries | at a boundary | align ms with / without | ratio "
          "| loss fwd+bwd ms with / without | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    pairs = [(s, t, False) for s, t in PAIRS]
    if REAL_DIR.exists() and not args.synthetic_only:  # the real tokenizers, where present
        pairs += [(s, t, True) for s in REAL for t in REAL if s != t]
    for s_name, t_name, real in pairs:
        r = pair_costs(s_name, t_name, args.rows, args.tokens, args.repeats, real)
        (aw, ao), (lw, lo) = r["align ms"], r["loss ms"]
        print(f"| {r['pair']} | {r['entries']} | {r['boundary entries']} | {aw:.2f} / {ao:.2f} "
              f"| {aw / ao:.2f}x | {lw:.1f} / {lo:.1f} | {lw / lo:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
