"""Cross-tokenizer alignment and training-step speed, each next to what one would use instead.

Part `align`: student tokens per second aligned on a micro-batch of 64 completions, for
tokenizer pairs of different `train_tokenizer` families (256 student tokens a row, the issue's
size; `--tokens 100` for the earlier tables; mixed text: `distil.testing.default_corpus`
sentences, arithmetic, Countdown lines, numbers, joined)
and for the 6 ordered pairs of the real Qwen3, Llama 3 and Gemma 3 tokenizers in
../shared/tokenizers (256 tokens a row; the same text with code, whitespace runs, CJK and
emoji lines mixed in; skipped with a message where the folder is absent). The teacher side is
what distil's data path has: the student's bytes as text, tokenized by the teacher with
offsets. Compared on the same rows, in the same process, round-robin, fastest of repeats after
warm-up:
  naive            per row, in Python: each token's bytes from `convert_ids_to_tokens` and the
                   family's piece rule (GPT-2 byte table, '▁'/<0xNN>, '##'), then the two-pointer
                   walk closing a group wherever both sides end a token at the same byte
  per row          distil's `align_completion` per row, teacher byte ends given
  batch warm/cold  `build_alignment` for the micro-batch (groups + match and projection table
                   ids + group spans + in-group mask; the padded group tensors are expanded
                   from the spans on first read, timed apart as pad ms), given the ids as the
                   collator holds them (`PaddedRows`: its padded id arrays, completion starts
                   and lengths, byte ends as arrays, which rows' teacher text is a prefix of
                   the student's bytes: the collator's `bytes.startswith` per row, not timed);
                   warm: the table caches of a previous call (and the prefix memos they fill);
                   batch lists: warm, from per-row Python id lists; cold: fresh
                   `MatchTables` and `ProjectionTables` built inside the timed call (the byte
                   tables `vocab_bytes` and their sorted byte index stay warm, their one-off
                   cost is printed apart)
Batch cold is timed in a loop of its own after the others: interleaved, its table builds
(0.2-0.4 s a call for a real vocabulary) made every variant that ran after it slower, naive
included. The script asserts that naive, per-row and batch groups are identical on every row,
and prints the batch build's milliseconds per micro-batch; each variant's time is its fastest
repeat (the VM is shared), and the last line (RESULT) gives the batch-warm speed-up over naive
per pair.

Part `gold`: seconds per optimizer step of on-policy cross-tokenizer distillation (lambda = 1)
with distil's loop (`loss.name` gold, then aligned_kl) and with TRL 1.16's GOLDTrainer (extended
ULD + hybrid loss, "bayesian" merge), on the same two tiny Qwen2 models with different byte-level
BPE tokenizers (both given a short language-model warm start, so that samples are text), the
same chat prompts, batch, completion length, lr, fp32 and 1 thread. TRL runs in a child process
of the same Python, torch and transformers as distil's side (TRL itself from bench/.trl-site,
installed on first use, unless this Python imports it) through bench/trl_gold_step.py. `--rounds`
rounds of [TRL, distil gold, distil aligned_kl]; model loading and the first `--warmup` steps
of every run are excluded, the other steps are pooled per side (median).

Part `collate`: milliseconds per micro-batch of `CrossTokenizer.collate` (the data path of a
cross-tokenizer step: student batch, the teacher's tokens and byte ends, padding, alignment,
loss mask) and of its teacher side, per row (`teacher_inputs`) vs batched
(`teacher_inputs_batch`: one tokenizer call, one compiled pass for the byte ends; asserted
equal); the whole collate with either teacher side (the per-row one also makes the rows'
prefix flags, `PaddedRows.t_prefix_B`, as the batched one does); the alignment build's share;
whether the warm build took the one-call path (`fast.plain_batch`). Synthetic and real pairs, 64 rows of
at most 256 student tokens after a short plain-text prompt, every second one ending with EOS.

    OMP_NUM_THREADS=1 python bench/align.py --part align    # about 2 min
    OMP_NUM_THREADS=1 python bench/align.py --part collate  # about 1 min
    OMP_NUM_THREADS=1 python bench/align.py --part gold     # about 2 min (+ the venv, once)
    OMP_NUM_THREADS=1 python bench/align.py                 # both
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TRL_SITE = HERE / ".trl-site"  # TRL alone (--no-deps), on distil's own torch and transformers
TRL_VERSION = "1.16.0"
# name -> (family, vocabulary size, corpus seed): bpe-4k cuts the same text differently
TOKENIZERS = {
    "bpe": ("bpe", 1024, 0),
    "bpe-4k": ("bpe", 4096, 1),
    "unigram": ("unigram", 1024, 0),
    "wordpiece": ("wordpiece", 1024, 0),
    "char": ("char", 0, 0),
}
PAIRS = (("bpe", "unigram"), ("char", "bpe"), ("wordpiece", "bpe"), ("bpe", "bpe-4k"))
# real tokenizers (../shared/tokenizers, see its README) -> the naive piece rule's family
REAL = {"qwen3": "bpe", "llama3": "bpe", "gemma3": "unigram"}
REAL_DIR = Path(os.environ.get("DISTIL_REAL_TOKENIZERS", HERE.parents[1] / "shared" / "tokenizers"))


# ---------------------------------------------------------------------- part 1: alignment


@functools.cache
def load_tokenizer(name: str):
    """A `TOKENIZERS` entry (trained once per process) or a real tokenizer of `REAL`."""
    if name in REAL:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(REAL_DIR / name))
    from distil.testing import default_corpus, train_tokenizer

    family, size, seed = TOKENIZERS[name]
    return train_tokenizer(family, default_corpus(4000, seed=seed), size or 512)


def family(name: str) -> str:
    return REAL[name] if name in REAL else TOKENIZERS[name][0]


def naive_piece_rule(family: str) -> Callable[[str], bytes]:
    """The bytes of one vocabulary piece mid-text, written by hand per tokenizer family."""
    if family == "bpe":
        from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's table

        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        return lambda p: bytes(byte_of[c] for c in p)
    if family == "unigram":
        return lambda p: (
            bytes([int(p[3:5], 16)])
            if len(p) == 6 and p.startswith("<0x") and p.endswith(">")
            else p.replace("▁", " ").encode()
        )
    if family == "wordpiece":
        return lambda p: p[2:].encode() if p.startswith("##") else (" " + p).encode()
    return lambda p: p.encode()  # char


def naive_groups(s_tok, s_rule, s_ids, t_tok, t_rule, t_ids) -> list[tuple[int, int, int, int]]:
    """Per-token byte lengths in Python, then the two-pointer walk over the token end bytes."""
    s_end = list(accumulate(len(s_rule(p)) for p in s_tok.convert_ids_to_tokens(s_ids)))
    t_end = list(accumulate(len(t_rule(p)) for p in t_tok.convert_ids_to_tokens(t_ids)))
    groups, i, j, s0, t0 = [], 0, 0, 0, 0
    while i < len(s_end) and j < len(t_end):
        if s_end[i] == t_end[j]:  # both sides end a token here: close the group
            groups.append((s0, i + 1, t0, j + 1))
            i, j = i + 1, j + 1
            s0, t0 = i, j
        elif s_end[i] < t_end[j]:
            i += 1
        else:
            j += 1
    return groups


@dataclass
class Row:
    s_ids: list[int]
    t_ids: list[int]
    t_text: str
    t_offsets: list[tuple[int, int]]
    t_ends: np.ndarray
    t_bytes: bytes
    t_prefix: bool  # t_bytes a prefix of the student's bytes (as the collator finds it)


def corpus_lines(n: int, real: bool) -> list[str]:
    """Mixed text; for the real tokenizers also code, whitespace runs, CJK and emoji (all NFC,
    so that Qwen's normalizer leaves the teacher's text as the student wrote it)."""
    from distil.testing import default_corpus

    lines = default_corpus(n, seed=11)
    if not real:
        return lines
    extra = [
        'def f(x):\n    if x:\n\t\treturn {"a": [1, 2]}  # done\n\n',
        "and   spaces,\ttabs\t\t and\n\n\nnewlines   \n  end",
        "蒸馏模型：教师和学生。日本語のテキスト、한국어 문장.",
        "family 👨\u200d👩\u200d👧, skin 👍🏽, flags 🇫🇷 ✨ ∑ x² ≤ √y ⇒ α+β≠γ",
    ]
    return [extra[k // 5 % len(extra)] if k % 5 == 4 else line for k, line in enumerate(lines)]


def make_rows(s_tok, s_vb, t_tok, t_vb, n_rows: int, n_tokens: int, real: bool) -> list[Row]:
    """Completions of `n_tokens` student tokens; the teacher tokenizes their bytes as text."""
    from distil.align import completion_text, student_byte_spans, text_byte_ends

    lines, k, rows = corpus_lines(40 * n_rows, real), 0, []
    for _ in range(n_rows):
        text, ids = "", []
        while len(ids) < n_tokens:  # a completion continues a text: it starts with a space
            text, k = text + " " + lines[k], k + 1
            ids = s_tok(text, add_special_tokens=False)["input_ids"]
        s_ids = ids[:n_tokens]
        s_bytes = student_byte_spans(s_ids, s_vb)[0]
        t_text = completion_text(s_bytes)
        enc = t_tok(t_text, add_special_tokens=False, return_offsets_mapping=True)
        t_ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        table = [t_vb.token_bytes[i] for i in t_ids]
        t_ends = text_byte_ends(t_text, offsets, table)
        t_bytes = t_text.encode()
        rows.append(
            Row(s_ids, t_ids, t_text, offsets, t_ends, t_bytes, s_bytes.startswith(t_bytes))
        )
    return rows


def padded_rows(rows: list[Row]):
    """What `CrossTokenizer.collate` hands over: the padded id arrays of the two forwards (16
    prompt tokens, then the completion), where the completions start, their lengths."""
    from distil.align import PaddedRows
    from distil.models.tokenizers import right_pad

    n = len(rows)
    return PaddedRows(
        right_pad([[0] * 16 + r.s_ids for r in rows], 0)[0].numpy(), np.full(n, 16),
        np.array([len(r.s_ids) for r in rows]),
        right_pad([[0] * 16 + r.t_ids for r in rows], 0)[0].numpy(), np.full(n, 16),
        np.array([len(r.t_ids) for r in rows]), [r.t_ends for r in rows],
        [r.t_bytes for r in rows], np.array([r.t_prefix for r in rows]),
    )  # fmt: skip


def align_variants(s_name: str, t_name: str, rows: list[Row], s_vb, t_vb) -> dict[str, Callable]:
    """The ways to align the batch that are timed; each returns what it computed."""
    from distil.align import (
        MatchTables,
        ProjectionTables,
        RowInputs,
        align_completion,
        build_alignment,
    )

    s_tok, t_tok = load_tokenizer(s_name), load_tokenizer(t_name)
    s_rule, t_rule = naive_piece_rule(family(s_name)), naive_piece_rule(family(t_name))
    lists = [RowInputs(r.s_ids, 16, r.t_ids, 16, r.t_ends, r.t_bytes) for r in rows]
    inputs = padded_rows(rows)
    warm = (MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb))
    return {
        "naive": lambda: [
            naive_groups(s_tok, s_rule, r.s_ids, t_tok, t_rule, r.t_ids) for r in rows
        ],
        "per row": lambda: [
            align_completion(r.s_ids, s_vb, r.t_ids, r.t_ends, r.t_bytes, t_vb) for r in rows
        ],
        "batch warm": lambda: build_alignment(inputs, s_vb, t_vb, *warm),
        "batch lists": lambda: build_alignment(lists, s_vb, t_vb, *warm),
        "batch cold": lambda: build_alignment(
            inputs, s_vb, t_vb, MatchTables(s_vb, t_vb), ProjectionTables(s_vb, t_vb)
        ),
    }


def batch_groups(ag, n_rows: int, offset: int = 16) -> list[list[tuple[int, int, int, int]]]:
    """(s_start, s_stop, t_start, t_stop) per row from the padded AlignmentGroups tensors."""
    s_pos, t_pos = ag.student_pos_G_S, ag.teacher_pos_G_T
    s0 = (s_pos[:, 0] - offset + 1).tolist()
    t0 = (t_pos[:, 0] - offset + 1).tolist()
    s_n, t_n = (s_pos >= 0).sum(1).tolist(), (t_pos >= 0).sum(1).tolist()
    out: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n_rows)]
    for b, a, n, c, m in zip(ag.group_row_G.tolist(), s0, s_n, t0, t_n, strict=True):
        out[b].append((a, a + n, c, c + m))
    return out


def check_same_groups(variants: dict[str, Callable]) -> int:
    """Assert naive == distil per row == distil batch groups on every row (no DP fallback);
    returns the group count."""
    naive, ours = variants["naive"](), variants["per row"]()
    ag, _ = variants["batch warm"]()
    assert ag.metrics["dp_rows"] == 0, "byte strings differ: distil used the DP fallback"
    batch = batch_groups(ag, len(naive))
    for b, (groups, ra, bg) in enumerate(zip(naive, ours, batch, strict=True)):
        assert not ra.used_dp, f"row {b}: byte strings differ, distil used the DP fallback"
        assert [tuple(g) for g in ra.groups.tolist()] == groups, f"row {b}: groups differ"
        assert bg == groups, f"row {b}: batch groups differ"
    return sum(len(g) for g in naive)


def time_round_robin(variants: dict[str, Callable], repeats: int, warmup: int) -> dict[str, float]:
    """Fastest seconds per call of each variant (the VM is shared: the minimum is the time the
    code needs, the rest is other tenants); the variants take turns within each repeat."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def pad_ms(build: Callable, repeats: int) -> float:
    """ms to expand a warm build's group spans into the padded (G, width) tensors on the CPU
    (`GroupSpans.padded`: on first read, where the batch is; fastest of `repeats`)."""
    ag = build()[0]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ag.spans.padded(ag.group_row_G)
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def ends_ms(rows: list[Row], t_vb) -> float:
    """ms to compute the batch's teacher byte ends from offsets (`text_byte_ends`, one call per
    row, as `CrossTokenizer.teacher_inputs` does; not part of the alignment timed above)."""
    from distil.align import text_byte_ends

    t0 = time.perf_counter()
    for r in rows:
        text_byte_ends(r.t_text, r.t_offsets, [t_vb.token_bytes[i] for i in r.t_ids])
    return 1e3 * (time.perf_counter() - t0)


def align_table(pairs, n_rows: int, n_tokens: int, repeats: int, warmup: int, real: bool):
    """One table of pairs; returns the one-off build times of the byte tables (ms)."""
    from distil.align import vocab_bytes

    keys = ("naive", "per row", "batch warm", "batch lists", "batch cold")
    print("| student -> teacher | teacher tokens | groups | " + " | ".join(keys), end="")
    print(" | warm ms | cold ms | pad ms | ends ms |\n" + "|---" * (7 + len(keys)) + "|")
    built: dict[str, float] = {}
    speedups: list[float] = []
    for s_name, t_name in pairs:
        vbs = []
        for name in (s_name, t_name):
            t0 = time.perf_counter()
            vb = vocab_bytes(load_tokenizer(name))
            vb.index()  # the sorted byte index: built once per vocabulary, like the byte table
            built.setdefault(name, 1e3 * (time.perf_counter() - t0))
            vbs.append(vb)
        s_tok, t_tok = load_tokenizer(s_name), load_tokenizer(t_name)
        rows = make_rows(s_tok, vbs[0], t_tok, vbs[1], n_rows, n_tokens, real)
        variants = align_variants(s_name, t_name, rows, *vbs)
        n_groups = check_same_groups(variants)
        # batch cold in its own loop: interleaved, its table builds (0.2-0.4 s a call for a real
        # vocabulary) slowed every variant that ran after it, naive included
        cold = {"batch cold": variants.pop("batch cold")}
        med = time_round_robin(variants, repeats, warmup) | time_round_robin(cold, repeats, 1)
        n_s = sum(len(r.s_ids) for r in rows)
        n_t = sum(len(r.t_ids) for r in rows)
        cells = [f"{n_s / med[k] / 1e3:.0f}k ({med['naive'] / med[k]:.1f}x)" for k in keys]
        ms = f"{1e3 * med['batch warm']:.2f} | {1e3 * med['batch cold']:.0f} | "
        ms += f"{pad_ms(variants['batch warm'], repeats):.2f} | {ends_ms(rows, vbs[1]):.1f}"
        print(f"| {s_name} -> {t_name} | {n_t} | {n_groups} | " + " | ".join(cells) + f" | {ms} |")
        speedups.append(med["naive"] / med["batch warm"])
    return built, speedups


def part_align(args: argparse.Namespace) -> None:
    print(
        f"## alignment, fastest of {args.repeats}; student tokens/s (speed-up over naive Python "
        "in brackets)\n"
    )
    print(f"synthetic tokenizers, {args.rows} rows x {args.tokens} student tokens:\n")
    built, synthetic = align_table(PAIRS, args.rows, args.tokens, args.repeats, 2, real=False)
    real: list[float] = []
    missing = [n for n in REAL if not (REAL_DIR / n / "tokenizer.json").exists()]
    if missing:
        print(f"\nreal tokenizers skipped: {', '.join(missing)} not found under {REAL_DIR}")
    else:
        print(f"\nreal tokenizers ({REAL_DIR}), {args.rows} rows x {args.real_tokens} tokens:\n")
        real_pairs = [(s, t) for s in REAL for t in REAL if s != t]
        more, real = align_table(real_pairs, args.rows, args.real_tokens, args.repeats, 1, True)
        built |= more
    sizes = ", ".join(f"{n}: {ms:.0f} ms" for n, ms in built.items())
    print(f"\nbyte tables + sorted byte index (once per tokenizer, not timed above): {sizes}")
    print(
        "groups: identical for naive, distil per row and distil batch on every row (asserted). "
        "Tokenization is outside every timing (both sides start from ids); naive has no "
        "specials and no DP fallback. warm/cold ms: the batch build per micro-batch; ends ms: "
        "the teacher byte ends from offsets for the batch (`text_byte_ends` per row, as the "
        "data path calls it; not part of the alignment timed above). batch warm/cold take the "
        "ids as the collator holds them (its padded id arrays); batch lists: the same warm "
        "build from per-row Python id lists (the conversion to arrays included). The padded "
        "(G, width) group tensors are expanded from the groups' spans on first read, on the "
        "device the batch is on (`GroupSpans`): pad ms is that expansion on the CPU, not part "
        "of warm/cold."
    )
    result = {"synthetic_min_x": min(synthetic, default=0.0), "real_min_x": min(real, default=0.0)}
    result |= {
        "synthetic_x": [round(x, 1) for x in synthetic],
        "real_x": [round(x, 1) for x in real],
    }
    print(
        "RESULT "
        + json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()})
    )


# ---------------------------------------------------------------------- part 1b: collate


def collate_samples(s_tok, n_rows: int, n_tokens: int, real: bool):
    """Micro-batch samples as on-policy rollouts: a plain-text prompt, a completion of at most
    `n_tokens` student tokens, every second one ending with the student's EOS."""
    from distil.models.tokenizers import stop_token_ids
    from distil.types import Sample

    lines, eos = corpus_lines(40 * n_rows, real), stop_token_ids(s_tok)[0]
    samples, k = [], 0
    for r in range(n_rows):
        text, ids = "", []
        while len(ids) < n_tokens:
            text, k = text + " " + lines[k], k + 1
            ids = s_tok(text, add_special_tokens=False)["input_ids"]
        ids = [*ids[: n_tokens - 1], eos] if r % 2 == 0 else ids[:n_tokens]
        prompt = f"Question {r}: " + lines[k][:60]
        p_ids = s_tok(prompt, add_special_tokens=False)["input_ids"]
        samples.append(Sample(r, p_ids, ids, "on_policy", prompt=prompt))
    return samples


def collate_table(pairs, n_rows: int, n_tokens: int, repeats: int, real: bool):
    """ms per micro-batch of the cross-tokenizer collate and of its teacher side, per row vs
    batched (asserted equal); returns the teacher-side and the whole-collate speed-ups."""
    from distil.data.crosstok import CrossTokenizer

    print("| student -> teacher | teacher side per row ms | batched ms | speed-up | collate "
          "with per-row teacher side ms | collate ms | speed-up | of it: alignment build ms "
          "| fast path |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    ratios, collates = [], []
    for s_name, t_name in pairs:
        s_tok, t_tok = load_tokenizer(s_name), load_tokenizer(t_name)
        for tok in (s_tok, t_tok):  # the real tokenizers ship without a pad token
            if tok.pad_token_id is None:
                tok.pad_token = tok.eos_token
        cross = CrossTokenizer(s_tok, t_tok)
        samples = collate_samples(s_tok, n_rows, n_tokens, real)
        per_row = [cross.teacher_inputs(s) for s in samples]
        for a, b in zip(per_row, cross.teacher_inputs_batch(samples), strict=True):
            assert list(a[1]) == list(b[1]) and list(a[2]) == list(b[2]) and a[3] == b[3]
        cross.collate(samples, s_tok.pad_token_id)  # warms the table caches
        import distil.align.batch as align_batch

        plain = align_batch._plain
        took: list[bool] = []  # whether the warm build took the one-call path

        def spy(*a, _plain=plain, _took=took):
            out = _plain(*a)
            _took.append(out is not None)
            return out

        align_batch._plain = spy
        try:
            batch = cross.collate(samples, s_tok.pad_token_id)
        finally:
            align_batch._plain = plain
        fast = took[-1]
        build = align_batch.build_alignment
        spent: list[float] = []

        def timed_build(*a, _build=build, _spent=spent):
            t0 = time.perf_counter()
            out = _build(*a)
            _spent.append(time.perf_counter() - t0)
            return out

        import distil.data.crosstok as crosstok

        crosstok.build_alignment = timed_build
        try:
            best = time_round_robin(
                collate_variants(cross, samples, s_tok.pad_token_id), repeats, 1
            )
        finally:
            crosstok.build_alignment = build
        assert batch.alignment is not None
        ratios.append(best["per row"] / best["batched"])
        collates.append(best["collate per row"] / best["collate"])
        print(
            f"| {s_name} -> {t_name} | {1e3 * best['per row']:.2f} | {1e3 * best['batched']:.2f} "
            f"| {ratios[-1]:.2f}x | {1e3 * best['collate per row']:.2f} "
            f"| {1e3 * best['collate']:.2f} | {best['collate per row'] / best['collate']:.2f}x "
            f"| {1e3 * min(spent):.2f} "
            f"| {'yes' if fast else 'no'} |"
        )
    return ratios, collates


def collate_variants(cross, samples, pad_id: int) -> dict[str, Callable]:
    def one_by_one(rows):  # the teacher side a row at a time, and the same prefix flags
        out = [cross.teacher_inputs(s) for s in rows]
        raw = [cross.student_bytes(s.completion_ids) for s in rows]
        return out, np.asarray([r.startswith(o[3]) for r, o in zip(raw, out, strict=True)])

    def collate_per_row():  # the collate with the teacher side one row at a time
        cross._teacher_rows = one_by_one
        try:
            return cross.collate(samples, pad_id)
        finally:
            del cross._teacher_rows  # the class's method again

    return {
        "per row": lambda: [cross.teacher_inputs(s) for s in samples],
        "batched": lambda: cross.teacher_inputs_batch(samples),
        "collate per row": collate_per_row,
        "collate": lambda: cross.collate(samples, pad_id),
    }


def part_collate(args: argparse.Namespace) -> None:
    print(
        f"\n## cross-tokenizer collate, {args.rows} rows x <= {args.tokens} student tokens, "
        f"fastest of {args.repeats}\n"
    )
    ratios, collates = collate_table(PAIRS, args.rows, args.tokens, args.repeats, real=False)
    missing = [n for n in REAL if not (REAL_DIR / n / "tokenizer.json").exists()]
    if missing:
        print(f"\nreal tokenizers skipped: {', '.join(missing)} not found under {REAL_DIR}")
    else:
        print()
        real_pairs = [(s, t) for s in REAL for t in REAL if s != t]
        more = collate_table(real_pairs, args.rows, args.tokens, args.repeats, real=True)
        ratios, collates = ratios + more[0], collates + more[1]
    print(
        "teacher side: the teacher's prompt and completion ids, byte ends and bytes for every "
        "row (`CrossTokenizer.teacher_inputs` per row vs `teacher_inputs_batch`, asserted "
        "equal); collate: the whole `CrossTokenizer.collate` (student batch, teacher side, "
        "padding, alignment build, loss mask); alignment build: `build_alignment` inside it; "
        "fast path: the warm batch took `fast.plain_batch`."
    )
    result = {"teacher_side_x": [round(x, 2) for x in ratios]}
    print("RESULT " + json.dumps(result | {"collate_x": [round(x, 2) for x in collates]}))


# ---------------------------------------------------------------------- part 2: GOLD step


@dataclass
class GoldSetup:
    root: Path
    student: Path
    teacher: Path
    data: Path
    matched: int

    def tokenizer_dir(self, model_dir: Path) -> Path:
        """The model's tokenizer alone: next to a qwen2 config.json, transformers 5's
        AutoTokenizer rebuilds it as a Qwen2Tokenizer (NFC, Qwen's split regex: other ids);
        distil keeps tokenizer.json (`models.load._respect_tokenizer_json`), TRL does not."""
        return model_dir.parent / f"{model_dir.name}-tokenizer"


def build_gold_setup(root: Path, n_prompts: int, warm_steps: int) -> GoldSetup:
    """Two tiny Qwen2 models with different byte-level BPE tokenizers, and chat prompts."""
    from distil.align import matched_vocab, vocab_bytes
    from distil.testing import default_corpus, save_tokenizer, tiny_model, train_tokenizer

    s_tok = train_tokenizer("bpe", default_corpus(4000), 512)
    t_tok = train_tokenizer("bpe", default_corpus(4000, seed=1), 1024)
    dirs = {}
    for name, tok, hidden, layers, seed in (
        ("student", s_tok, 64, 2, 1),
        ("teacher", t_tok, 128, 4, 2),
    ):
        model = tiny_model(
            "qwen2",
            len(tok),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=4,
            num_kv_heads=2,
            seed=seed,
            tokenizer=tok,
        )
        warm_start(model, tok, warm_steps)
        dirs[name] = save_tokenizer(tok, root / name)
        model.save_pretrained(dirs[name])
    lines = default_corpus(2 * n_prompts, seed=5)
    data = root / "chat.jsonl"
    with data.open("w") as fh:
        for k in range(n_prompts):
            user = {"role": "user", "content": f"Continue: {lines[2 * k]}"}
            fh.write(json.dumps({"prompt": [user], "completion": lines[2 * k + 1]}) + "\n")
    matched = len(matched_vocab(vocab_bytes(s_tok), vocab_bytes(t_tok))[0])
    setup = GoldSetup(root, dirs["student"], dirs["teacher"], data, matched)
    save_tokenizer(s_tok, setup.tokenizer_dir(dirs["student"]))
    save_tokenizer(t_tok, setup.tokenizer_dir(dirs["teacher"]))
    return setup


def warm_start(model, tok, steps: int, batch: int = 16, length: int = 64) -> None:
    """A few hundred steps of next-token training on corpus text, so that the student samples
    text-like bytes and the teacher does not pull it back to noise (a random-init byte-level
    model writes invalid UTF-8 in almost every row, which sends every row of distil's alignment
    to the DP fallback)."""
    import torch

    from distil.testing import default_corpus

    lines = [" " + line for line in default_corpus(3000, seed=3)]
    ids = torch.tensor(
        [i for row in tok(lines, add_special_tokens=False)["input_ids"] for i in row]
    )
    rows = ids[: len(ids) // length * length].view(-1, length)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        pick = rows[torch.randint(len(rows), (batch,), generator=gen)]
        model(input_ids=pick, labels=pick).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def distil_sections(
    setup: GoldSetup, loss: str, args: argparse.Namespace, **opts: Any
) -> dict[str, dict[str, Any]]:
    """The config sections of `run_distil`. `opts`: `beta` (0.5), `lmbda` (1.0, on-policy),
    `lr` (1e-4), `tag` (the run directory's suffix) and `overrides` (sections merged over
    these)."""
    sections: dict[str, dict[str, Any]] = {
        "data": {"train": str(setup.data)},
        "student": {"path": str(setup.student)},
        "teacher": {"path": str(setup.teacher)},
        "generation": {"max_new_tokens": args.new_tokens, "temperature": 1.0, "top_p": 1.0},
        "loss": {"name": loss, "beta": opts.get("beta", 0.5)},
        "train": {
            "output_dir": str(setup.root / f"distil-{loss}{opts.get('tag', '')}"),
            "max_steps": args.steps,
            "lr": opts.get("lr", 1e-4),
            "schedule": "constant",
            "per_device_batch_size": args.batch,
            "grad_accum_steps": args.ga,
            "lambda": opts.get("lmbda", 1.0),
            "num_threads": args.threads,
            "resume": "never",
        },
        "logging": {"progress": False, "print_example": False},
    }
    for section, values in opts.get("overrides", {}).items():
        sections.setdefault(section, {}).update(values)
    return sections


def run_distil(setup: GoldSetup, loss: str, args: argparse.Namespace, **opts: Any) -> list[dict]:
    """distil's loop for `args.steps` steps (config: `distil_sections`); the per-step metrics
    it logged."""
    from distil.config import build_config
    from distil.train.loop import train

    sections = distil_sections(setup, loss, args, **opts)
    train(build_config(sections))
    out = Path(sections["train"]["output_dir"])
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def ensure_trl() -> tuple[str, dict[str, str]]:
    """(python, extra environment) importing TRL 1.16.0 on the very torch and transformers that
    distil's side runs on (a GPU image's CUDA torch included): this interpreter when it already
    imports TRL 1.16.0 (`make gpu-check` installs the wheel), else this interpreter with TRL
    alone installed once (pip --no-deps) into bench/.trl-site, first on PYTHONPATH. TRL's
    own needs (accelerate, datasets, transformers) are distil's."""
    probe = [sys.executable, "-c", f"import sys, trl; sys.exit(trl.__version__ != {TRL_VERSION!r})"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return sys.executable, {}
    paths = [str(TRL_SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
    extra = {"PYTHONPATH": os.pathsep.join(paths)}
    if subprocess.run(probe, capture_output=True, env={**os.environ, **extra}).returncode != 0:
        print(f"installing TRL {TRL_VERSION} into {TRL_SITE} (once) ...", flush=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade"]
        subprocess.run([*pip, "--target", str(TRL_SITE), f"trl=={TRL_VERSION}"], check=True)
    return sys.executable, extra


def run_trl(setup: GoldSetup, args: argparse.Namespace, extra: Sequence[str] = ()) -> dict:
    """bench/trl_gold_step.py in the TRL virtualenv (`extra`: more of its flags); its RESULT
    line as a dict."""
    python, trl_env = ensure_trl()
    cmd = [python, str(HERE / "trl_gold_step.py"), "--data", str(setup.data)]
    for side, path in (("student", setup.student), ("teacher", setup.teacher)):
        cmd += [f"--{side}", str(path), f"--{side}-tokenizer", str(setup.tokenizer_dir(path))]
    cmd += ["--steps", str(args.steps), "--batch", str(args.batch), "--ga", str(args.ga)]
    cmd += ["--new-tokens", str(args.new_tokens), "--threads", str(args.threads), *extra]
    env = {**os.environ, **trl_env, "OMP_NUM_THREADS": str(args.threads)}
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = result_line(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"TRL run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return result


def result_line(stdout: str) -> dict | None:
    """The JSON of the last line of `stdout` that starts with "RESULT " (None if none)."""
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else None


TIMED_PHASES = ("step", "generate", "teacher", "train")
LOSSES = ("gold", "aligned_kl")


def summarize_distil(runs: list[list[dict]], warmup: int) -> dict[str, float]:
    """Median seconds per phase over the steps after warm-up of all runs (pooled); collate =
    the step's remainder (collation, teacher tokenization, alignment, metrics)."""
    kept = [r for records in runs for r in records[warmup:]]
    every = [r for records in runs for r in records]
    out = {k: statistics.median(r[f"time/{k}"] for r in kept) for k in TIMED_PHASES}
    out["collate"] = statistics.median(
        r["time/step"] - sum(r[f"time/{k}"] for k in TIMED_PHASES[1:]) for r in kept
    )
    out["loss_first"], out["loss_last"] = runs[0][0]["loss"], runs[0][-1]["loss"]
    out["tokens"] = statistics.mean(r["completion/mean_tokens"] for r in kept)
    out["dp_rows"] = sum(r.get("align/dp_rows", 0) for r in every)
    unalignable = sum(r.get("align/unalignable_tokens", 0) for r in every)
    in_groups = sum(r.get("align/student_tokens_in_groups", 0) for r in every)
    out["unalignable"] = unalignable / max(unalignable + in_groups, 1)
    return out


def summarize_trl(runs: list[dict], warmup: int) -> dict[str, float]:
    """Median step (begin -> end), step-to-step interval and phases after warm-up, runs pooled;
    rest = the step less generation and teacher forwards (loss with alignment, backward, AdamW,
    the teacher's tokenization); rest_interval = the interval less the same (adds the
    dataloader's collation). `warmup` >= 1."""
    kept = [
        (step, gen, teacher)
        for r in runs
        for step, gen, teacher in list(zip(r["step_s"], r["generate_s"], r["teacher_s"]))[warmup:]
    ]
    # interval k spans the end of step k to the end of step k + 1 (0-based)
    interval = statistics.median(t for r in runs for t in r["interval_s"][warmup - 1 :])
    # the same span less step k + 1's generation and teacher forwards
    rest_interval = statistics.median(
        t - gen - teacher
        for r in runs
        for t, gen, teacher in zip(
            r["interval_s"][warmup - 1 :],
            r["generate_s"][warmup:],
            r["teacher_s"][warmup:],
            strict=True,
        )
    )
    loss = runs[0]["loss"]
    return {
        "interval": interval,
        "step": statistics.median(k[0] for k in kept),
        "generate": statistics.median(k[1] for k in kept),
        "teacher": statistics.median(k[2] for k in kept),
        "rest": statistics.median(k[0] - k[1] - k[2] for k in kept),
        "rest_interval": rest_interval,
        "loss_first": loss[0],
        "loss_last": loss[-1],
        "tokens": statistics.mean(r["completion_tokens"] for r in runs),
        "matched": runs[0]["matched_vocab"],
        "runs": len(runs),
    }


def print_gold(setup: GoldSetup, args, trl: dict | None, ours: dict[str, dict], error) -> None:
    print(
        f"\n## on-policy cross-tokenizer step: batch {args.batch} x GA {args.ga}, "
        f"{args.new_tokens} new tokens, {args.rounds} rounds of {args.steps} steps "
        f"({args.warmup} warm-up), {args.threads} thread(s), fp32; median s/step\n"
    )
    head = "| run | s/step | / TRL | generate | teacher | train | collate+align | tokens | loss |"
    print(head + "\n" + "|---" * 9 + "|")
    ref = trl["interval"] if trl else float("nan")
    if trl:
        loss = f"{trl['loss_first']:.3f} -> {trl['loss_last']:.3f}"
        phases = " | ".join(f"{trl[k]:.4f}" for k in ("generate", "teacher", "rest"))
        row = f"{trl['interval']:.4f} | 1.00 | {phases} | (in train) | {trl['tokens']:.1f} | {loss}"
        print(f"| TRL GOLDTrainer (ULD hybrid, bayesian) | {row} |")
    for name, s in ours.items():
        phases = " | ".join(f"{s[k]:.4f}" for k in ("generate", "teacher", "train", "collate"))
        loss = f"{s['loss_first']:.3f} -> {s['loss_last']:.3f}"
        ratio = f"{s['step'] / ref:.2f}"
        print(
            f"| distil {name} | {s['step']:.4f} | {ratio} | {phases} | {s['tokens']:.1f} | {loss} |"
        )
    if trl:
        print(
            f"\nTRL s/step: step end to step end (its dataloader included); on_step_begin to "
            f"on_step_end: {trl['step']:.4f}; TRL train: that step less generation and teacher "
            "forwards (its alignment and loss, backward, AdamW, the teacher's tokenization). "
            f"The steps after warm-up of {trl['runs']} runs are "
            "pooled on each side (rounds of TRL, distil gold, distil aligned_kl). tokens: mean "
            f"completion length. Matched vocabulary: distil {setup.matched} byte strings, TRL "
            f"{trl['matched']} token strings."
        )
    rows = args.rounds * args.steps * args.batch * args.ga
    for name, s in ours.items():
        print(
            f"distil {name}: {s['dp_rows']:.0f} of {rows} rows aligned by the DP fallback "
            f"(invalid UTF-8 in the sampled bytes), {100 * s['unalignable']:.2f}% of student "
            "tokens unalignable."
        )
    if error is not None:
        print(f"\nTRL failed{'' if trl else ', only distil is reported'}:\n{error}")
    print(GOLD_NOTES.format(batch=args.batch))


GOLD_NOTES = """
Same: student Qwen2 h64 L2 (bpe 512), teacher Qwen2 h128 L4 (bpe 1024 from another corpus), the
same 64 ChatML prompts (both tokenizers have the ChatML specials, so the teacher reads the same
prompt text on both sides), sampling at temperature 1 without top-p/top-k, the full teacher
distribution, AdamW lr 1e-4 constant, clip 1.0, fp32, one torch thread.
Differs: TRL generates once per micro-batch (GA calls of {batch} prompts), distil once per window;
TRL appends the teacher EOS to every completion, distil only when the student stopped. The losses
are different functions (their values do not compare): TRL's hybrid takes the JSD of unnormalised
matched sub-vectors, weight |matched vocab| / V_teacher, L1 on the sorted rest, a mean over groups
then examples, and drops each side's last position; distil `gold` is the JSD over matched
candidates + a rest bucket with per-group mass weights, summed over groups / tokens; `aligned_kl`
compares every student position through the projection tables."""


def check_same_tokenizers(setup: GoldSetup, result: dict) -> None:
    """Assert that TRL tokenized the probe text as distil's tokenizers do."""
    from distil.models.load import load_tokenizer as distil_tokenizer

    for side, path in (("student", setup.student), ("teacher", setup.teacher)):
        ids = distil_tokenizer(str(path))(result["probe"], add_special_tokens=False)["input_ids"]
        assert result["probe_ids"][side] == ids, f"TRL's {side} tokenizer differs from distil's"


def try_trl(setup: GoldSetup, args: argparse.Namespace, runs: list[dict]) -> Exception | None:
    """Append one TRL run to `runs`; the error instead when TRL cannot run."""
    try:
        runs.append(run_trl(setup, args))
        check_same_tokenizers(setup, runs[-1])
    except (RuntimeError, OSError, subprocess.CalledProcessError, AssertionError) as exc:
        return exc
    return None


def part_gold(args: argparse.Namespace) -> None:
    """`--rounds` rounds of [TRL, distil gold, distil aligned_kl]; steps pooled per side."""
    import torch

    from distil.models.load import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    trl_runs: list[dict] = []
    ours: dict[str, list[list[dict]]] = {loss: [] for loss in LOSSES}
    error = None
    with tempfile.TemporaryDirectory() as tmp:
        setup = build_gold_setup(Path(tmp), n_prompts=64, warm_steps=args.warm_start)
        for _ in range(args.rounds):
            if error is None:
                error = try_trl(setup, args, trl_runs)
            for loss in LOSSES:
                ours[loss].append(run_distil(setup, loss, args))
    trl = summarize_trl(trl_runs, args.warmup) if trl_runs else None
    summaries = {loss: summarize_distil(runs, args.warmup) for loss, runs in ours.items()}
    print_gold(setup, args, trl, summaries, error)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("align", "collate", "gold", "all"), default="all")
    p.add_argument("--rows", type=int, default=64, help="align: completions in the batch")
    p.add_argument("--tokens", type=int, default=256, help="align: student tokens per row")
    p.add_argument("--real-tokens", type=int, default=256, help="align: tokens per real row")
    p.add_argument("--repeats", type=int, default=9, help="align: timed calls per variant")
    p.add_argument("--steps", type=int, default=30, help="gold: optimizer steps per run")
    p.add_argument("--warmup", type=int, default=4, help="gold: first steps of a run not timed")
    p.add_argument("--rounds", type=int, default=3, help="gold: rounds of TRL, gold, aligned_kl")
    p.add_argument("--batch", type=int, default=8, help="gold: per-device batch")
    p.add_argument("--ga", type=int, default=2, help="gold: gradient accumulation steps")
    p.add_argument("--new-tokens", type=int, default=32, help="gold: completion length")
    p.add_argument("--threads", type=int, default=1, help="gold: torch threads per side")
    p.add_argument("--warm-start", type=int, default=300, help="gold: student LM steps (0: random)")
    args = p.parse_args()
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    if args.part in ("align", "all"):
        part_align(args)
    if args.part in ("collate", "all"):
        part_collate(args)
    if args.part in ("gold", "all"):
        part_gold(args)


if __name__ == "__main__":
    sys.exit(main())
