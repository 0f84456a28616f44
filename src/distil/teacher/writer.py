"""`distil cache-teacher`: score a dataset's prompt + reference completion rows with the live
teacher once and store its top-k targets on disk (format: `cache.py`, docs/teacher-cache.md).

Rows are tokenized and collated exactly as the trainer's off-policy slices are (the student's
tokenizer, `data.*` limits, the same `collate`), scored by `LiveTeacher` (log-softmax at
`loss.temperature` over the full vocabulary, then top-k; padding-free forwards with
`train.packing`), and written shard by shard; a killed run continues after the last complete
shard. A teacher with another tokenizer scores its own rows (its chat template, its tokens of the
completion's bytes, as `data/crosstok.py` makes them for the live teacher); the cache then also
holds those tokens and their byte ends, and the teacher's tokenizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distil.config import DistilConfig
from distil.data.collate import collate
from distil.errors import ConfigError
from distil.progress import progress_bar
from distil.teacher import cache as fmt
from distil.teacher.cache import CacheError
from distil.types import Sample


def prepare_rows(cfg: DistilConfig, tok):
    """(examples, prompt ids, completion ids) of the config's data, as the trainer builds them."""
    from distil.data.lengths import check_lengths
    from distil.models.tokenizers import completion_rows, encode_prompts
    from distil.tasks.prompts import config_examples

    examples = config_examples(cfg.data)
    check_lengths(examples, tok, cfg.data, completions_used=True)
    prompts = encode_prompts(
        tok, [e.prompt for e in examples], max_tokens=cfg.data.max_prompt_tokens, name="student"
    )
    completions = completion_rows(tok, examples, cfg.data.max_completion_tokens)
    missing = [i for i, c in enumerate(completions) if c is None]
    if missing:
        raise ConfigError(
            f"cache-teacher scores reference completions, but {len(missing)} of "
            f"{len(examples)} rows of {cfg.data.train} have none (first: row {missing[0]}). "
            f"Fix: give data with a completion column (data.completion_field = "
            f"{cfg.data.completion_field!r} now), or write one with `distil generate`"
        )
    return examples, prompts, completions


def _problems(cfg: DistilConfig) -> list[str]:
    out = []
    for key, value in (
        ("teacher.path", cfg.teacher.path),
        ("student.path", cfg.student.path),
        ("data.train", cfg.data.train),
    ):
        if not value:
            out.append(f"{key} is not set; cache-teacher needs it. Fix: set {key}")
    if cfg.teacher.top_k is None:
        out.append(
            "teacher.top_k is not set: the cache stores the teacher's top-k. Fix: set "
            "teacher.top_k (e.g. teacher.top_k=64)"
        )
    return out


def student_vocab_rows(cfg: DistilConfig) -> int | None:
    """The student's output rows from its config.json alone (no weights loaded)."""
    from transformers import AutoConfig

    try:
        conf = AutoConfig.from_pretrained(
            cfg.student.path, trust_remote_code=cfg.student.trust_remote_code
        )
    except Exception:  # a model without a readable config: no slicing
        return None
    return getattr(conf, "vocab_size", None)


def cache_teacher(
    cfg: DistilConfig,
    out: str | Path,
    *,
    values: str = "sqrt",
    shard_rows: int = 1024,
    batch_size: int | None = None,
    after_shard: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write (or finish) the cache of `cfg`'s data in `out`; returns the manifest."""
    from distil.models.load import load_model, load_tokenizer
    from distil.teacher.live import LiveTeacher

    if problems := _problems(cfg):
        raise ConfigError(problems)
    if values not in fmt.VALUE_CODECS:
        raise ConfigError(f"--values {values!r}: choose one of {', '.join(fmt.VALUE_CODECS)}")
    out = Path(out)
    s, t = cfg.student, cfg.teacher
    tok = load_tokenizer(s.tokenizer or s.path, key="student.tokenizer")
    t_tok = load_tokenizer(t.tokenizer or t.path, key="teacher.tokenizer")
    cross = None
    if t_tok.get_vocab() != tok.get_vocab():  # the teacher's own template and tokens
        from distil.data.crosstok import CrossTokenizer

        cross = CrossTokenizer(tok, t_tok, max_prompt_tokens=cfg.data.max_prompt_tokens)
    examples, prompts, completions = prepare_rows(cfg, tok)
    row_fps = fmt.row_fingerprints(prompts, completions)
    device = t.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(
        t.path,
        key="teacher.path",
        dtype=t.dtype,
        attn_implementation=t.attn_implementation,
        device=device,
        trust_remote_code=t.trust_remote_code,
    )
    t_rows = model.get_output_embeddings().weight.shape[0]
    s_rows = student_vocab_rows(cfg)
    keep = min(t_rows, s_rows) if s_rows and s_rows != t_rows else None
    if cross is not None:  # logits past the teacher's tokenizer are padded embedding rows
        keep = len(t_tok) if t_rows > len(t_tok) else None
    header = _header(cfg, tok, t_tok, values, vocab_size=keep or t_rows, row_fps=row_fps)
    header["shard_rows"] = shard_rows
    if cross is not None:  # keys only cross caches have: same-tokenizer manifests are unchanged
        header["cross_tokenizer"] = True
        header["teacher_template_sha256"] = fmt.template_sha256(t_tok)
    manifest = _start_or_resume(out, header)
    if cross is not None:
        fmt.save_teacher_tokenizer(out, t_tok)
    scorer = LiveTeacher(
        model,
        temperature=cfg.loss.temperature,
        top_k=t.top_k,
        vocab_size=keep,
        packing=cfg.train.packing,  # padding-free forwards (data/packing.py), same values
        pack_length=cfg.train.pack_length,
    )
    rows = _Rows(examples, prompts, completions, tok, cross)
    batch_size = batch_size or cfg.train.per_device_batch_size
    with progress_bar("cache-teacher", len(examples), enabled=cfg.logging.progress) as bar:
        _write_shards(
            out, manifest, scorer, rows, row_fps, values, shard_rows, batch_size, bar, after_shard
        )
    manifest["tokens"] = sum(e["tokens"] for e in manifest["shards"])
    manifest["bytes"] = sum(e["bytes"] for e in manifest["shards"])
    manifest["complete"] = True
    fmt.write_manifest(out, manifest)
    return manifest


def _header(cfg: DistilConfig, tok, t_tok, values: str, *, vocab_size: int, row_fps) -> dict:
    """The manifest's description of what the cache holds, checked again on resume."""
    t = cfg.teacher
    return {
        "format": fmt.FORMAT,
        "teacher_path": str(t.path),
        "teacher_weights_sha256": fmt.weights_sha256(t.path),
        "teacher_tokenizer_sha256": fmt.tokenizer_sha256(t_tok),
        "student_tokenizer_sha256": fmt.tokenizer_sha256(tok),
        "k": cfg.teacher.top_k,
        "temperature": cfg.loss.temperature,
        "dtype": t.dtype,
        "vocab_size": vocab_size,
        **fmt.value_header(values, cfg.teacher.top_k),
        "data": cfg.data.train,
        "template": cfg.data.template,
        "data_fingerprint": fmt.combine(row_fps),
        "rows": len(row_fps),
    }


def _write_shards(
    out, manifest, scorer, rows, row_fps, values, shard_rows, batch_size, bar, after_shard
) -> None:
    """Score and write the shards after the last complete one, updating the manifest after
    each (a killed writer resumes after the last shard it listed)."""
    n = len(row_fps)
    start = manifest["shards"][-1]["rows"][1] if manifest["shards"] else 0
    rate = _Rate()
    bar.advance(start)
    for lo in range(start, n, shard_rows):
        hi = min(lo + shard_rows, n)
        cols, offsets = [], [0]
        for b in range(lo, hi, batch_size):
            idx = range(b, min(b + batch_size, hi))
            cols.append(_score(scorer, [rows.scored(i) for i in idx], rows.pad))
            for i in idx:
                offsets.append(offsets[-1] + len(rows.scored(i)[2]))
            bar.advance(len(idx))
            bar.update(info=f"shard {len(manifest['shards'])} | {rate(offsets):,.0f} tok/s")
        arrays = fmt.encode_tokens(*[torch.cat(c) for c in zip(*cols, strict=True)], values=values)
        arrays.update(rows.teacher_arrays(range(lo, hi)))
        entry = fmt.write_shard(out, len(manifest["shards"]), range(lo, hi), offsets, arrays)
        entry["data_sha256"] = fmt.combine(row_fps[lo:hi])
        manifest["shards"].append(entry)
        fmt.write_manifest(out, manifest)
        rate.shard_done(offsets)
        if after_shard is not None:
            after_shard(len(manifest["shards"]) - 1)


class _Rows:
    """The token rows the teacher scores: the student's (same tokenizer), or the teacher's own
    template + tokenization of each row with the byte ends of its completion tokens (cross)."""

    def __init__(self, examples, prompts, completions, tok, cross):
        self.examples, self.prompts, self.completions = examples, prompts, completions
        self.cross = cross
        pad_tok = tok if cross is None else cross.teacher_tok
        self.pad = pad_tok.pad_token_id if pad_tok.pad_token_id is not None else 0
        self._teacher: dict[int, tuple[list[int], list[int], list[int]]] = {}

    def scored(self, i: int) -> tuple[int, list[int], list[int]]:
        if self.cross is None:
            return i, self.prompts[i], self.completions[i]
        return (i, *self._teacher_row(i)[:2])

    def _teacher_row(self, i: int):
        if i not in self._teacher:
            sample = Sample(
                i, self.prompts[i], self.completions[i], "off_policy", self.examples[i].prompt
            )
            t_prompt, t_ids, t_ends, _ = self.cross.teacher_inputs(sample)
            self._teacher[i] = (t_prompt, t_ids, t_ends)  # until its shard is written
        return self._teacher[i]

    def teacher_arrays(self, idx: range) -> dict[str, np.ndarray]:
        """Cross caches: the teacher's completion ids and byte ends of the rows, flat."""
        if self.cross is None:
            return {}
        done = [self._teacher_row(i) for i in idx]
        self._teacher.clear()
        ids = [t for row in done for t in row[1]]
        ends = [e for row in done for e in row[2]]
        return {
            "teacher_ids": np.asarray(ids, dtype=np.int32),
            "teacher_ends": np.asarray(ends, dtype=np.int32),
        }


def _score(scorer, rows: list[tuple[int, list[int], list[int]]], pad: int):
    """(ids, log-probs, rest, token log-prob) of every completion token of `rows`, in order."""
    batch = collate([Sample(i, p, c, "off_policy") for i, p, c in rows], pad)
    t = scorer.score(batch)
    m = batch.mask_B_T  # completion positions, row by row: the rows' tokens in order
    return (
        t.topk_ids_B_T_K[m],
        t.topk_logprobs_B_T_K[m],
        t.rest_logprob_B_T[m],
        t.token_logprobs_B_T[m],
    )


class _Rate:
    """Tokens scored per second since the start (for the progress bar)."""

    def __init__(self):
        self.began, self.before = time.perf_counter(), 0

    def __call__(self, offsets: list[int]) -> float:
        return (self.before + offsets[-1]) / max(time.perf_counter() - self.began, 1e-9)

    def shard_done(self, offsets: list[int]) -> None:
        self.before += offsets[-1]


def _start_or_resume(out: Path, header: dict[str, Any]) -> dict[str, Any]:
    """A fresh manifest, or the one of a cache of the same settings cut short (or finished)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the cache")
    if (out / fmt.MANIFEST).is_file():
        old = fmt.read_manifest(out)
        diffs = [k for k in header if k != "teacher_path" and old.get(k) != header[k]]
        if diffs:
            raise CacheError(
                f"--out {out} holds a teacher cache made with other settings ("
                + "; ".join(
                    f"{k}: {fmt._short(old.get(k))} vs {fmt._short(header[k])}" for k in diffs
                )
                + "). Fix: give another --out, or delete that directory to rebuild it"
            )
        fmt.verify_shards(out, old)
        return old
    if out.is_dir() and any(p for p in out.iterdir() if not p.name.endswith(".tmp")):
        raise ConfigError(
            f"--out {out} is a directory with files but no teacher cache manifest. Fix: give "
            "an empty or new directory"
        )
    out.mkdir(parents=True, exist_ok=True)
    manifest = {**header, "shards": [], "complete": False}
    # written before the first shard: a run killed at any point leaves a resumable directory
    fmt.write_manifest(out, manifest)
    return manifest
