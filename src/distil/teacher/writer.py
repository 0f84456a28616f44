"""`distil cache-teacher`: score a dataset's prompt + reference completion rows with the live
teacher once and store its top-k targets on disk (format: `cache.py`, docs/teacher-cache.md).

Rows are tokenized and collated exactly as the trainer's off-policy slices are (the student's
tokenizer, `data.*` limits, the same `collate`), scored by `LiveTeacher` (log-softmax at
`loss.temperature` over the full vocabulary, then top-k; padding-free forwards with
`train.packing`), and written shard by shard; a killed run continues after the last complete
shard. A teacher with another tokenizer scores its own rows (its chat template, its tokens of the
completion's bytes, as `data/crosstok.py` makes them for the live teacher); the cache then also
holds those tokens and their byte ends, and the teacher's tokenizer.

Several teachers (`teachers.models`; `cache_sources.py`): one routed cache with each row's teacher
recorded, one named teacher's cache (`teacher=`), or the top-k of a mixture. Privileged context
(`teacher.context` / `teacher.system`): the teacher scores after the context prompt, its targets
in the student's positions (`data/context.py`'s shift), each row's teacher prompt hashed.
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
from distil.teacher.cached import prompt_format_header
from distil.types import Sample


def prepare_rows(cfg: DistilConfig, tok):
    """(examples, prompt ids, completion ids) of the config's data, as the trainer builds them."""
    from distil.data.lengths import check_lengths
    from distil.models.tokenizers import completion_rows, encode_prompts, prompt_format
    from distil.tasks.prompts import config_examples

    examples = config_examples(cfg.data)
    check_lengths(examples, tok, cfg.data, completions_used=True)
    style = prompt_format(cfg.data)  # (`fmt` is the cache format module here)
    prompts = encode_prompts(
        tok,
        [e.prompt for e in examples],
        max_tokens=cfg.data.max_prompt_tokens,
        name="student",
        fmt=style,
    )
    completions = completion_rows(tok, examples, cfg.data.max_completion_tokens, style)
    missing = [i for i, c in enumerate(completions) if c is None]
    if missing:
        raise ConfigError(
            f"cache-teacher scores reference completions, but {len(missing)} of "
            f"{len(examples)} rows of {cfg.data.train} have none (first: row {missing[0]}). "
            f"Fix: give data with a completion column (data.completion_field = "
            f"{cfg.data.completion_field!r} now), or write one with `distil generate`"
        )
    return examples, prompts, completions


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
    teacher: str | None = None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """Write (or finish) the cache of `cfg`'s data in `out`; returns the manifest. `teacher`:
    the name of one of `teachers.models` to cache alone; `top_k`: the cache's k where the
    config gives none (a mixture's full teachers)."""
    from distil.models.load import load_tokenizer
    from distil.teacher.cache_sources import cache_k, one_teacher_config, open_source, problems

    if teacher is not None:
        cfg = one_teacher_config(cfg, teacher)
    k = cache_k(cfg, top_k)
    if found := problems(cfg, k):
        raise ConfigError(found)
    if values not in fmt.VALUE_CODECS:
        raise ConfigError(f"--values {values!r}: choose one of {', '.join(fmt.VALUE_CODECS)}")
    assert k is not None
    out = Path(out)
    s = cfg.student
    tok = load_tokenizer(s.tokenizer or s.path, key="student.tokenizer")
    examples, prompts, completions = prepare_rows(cfg, tok)
    row_fps = fmt.row_fingerprints(prompts, completions)
    source = open_source(cfg, tok, examples, k, student_vocab_rows(cfg))
    header = _header(cfg, tok, source, values, row_fps=row_fps)
    header["shard_rows"] = shard_rows
    if teacher is not None:
        header["teacher_name"] = teacher
    manifest = _start_or_resume(out, header)
    if source.cross is not None:
        fmt.save_teacher_tokenizer(out, source.teacher_tok)
    rows = _Rows(
        examples, prompts, completions, tok, source.cross, routes=source.routes, data=cfg.data
    )
    if cfg.teacher.context or cfg.teacher.system:
        rows.give_context(cfg.teacher.context, cfg.teacher.system)
    batch_size = batch_size or cfg.train.per_device_batch_size
    with progress_bar(
        "cache-teacher", len(examples), enabled=cfg.logging.progress, unit="rows"
    ) as bar:
        _write_shards(
            out, manifest, source, rows, row_fps, values, shard_rows, batch_size, bar, after_shard
        )
    manifest["tokens"] = sum(e["tokens"] for e in manifest["shards"])
    manifest["bytes"] = sum(e["bytes"] for e in manifest["shards"])
    manifest["complete"] = True
    fmt.write_manifest(out, manifest)
    return manifest


def _header(cfg: DistilConfig, tok, source, values: str, *, row_fps) -> dict:
    """The manifest's description of what the cache holds, checked again on resume."""
    t = cfg.teacher
    return {
        "format": fmt.FORMAT,
        **source.header,  # the teacher(s): path, weights and tokenizer hashes, dtype, routes
        "student_tokenizer_sha256": fmt.tokenizer_sha256(tok),
        "k": source.k,
        "temperature": cfg.loss.temperature,
        "vocab_size": source.vocab_size,
        **fmt.value_header(values, source.k),
        "data": cfg.data.train,
        "template": cfg.data.template,
        "data_fingerprint": fmt.combine(row_fps),
        "rows": len(row_fps),
        # privileged context (data/context.py): the targets were scored after this prompt
        "context": t.context,
        "system": t.system,
        "prompt_format": prompt_format_header(cfg),
    }


def _write_shards(
    out, manifest, source, rows, row_fps, values, shard_rows, batch_size, bar, after_shard
) -> None:
    """Score and write the shards after the last complete one, updating the manifest after
    each (a killed writer resumes after the last shard it listed)."""
    from distil.teacher.cache_sources import topk_targets

    n = len(row_fps)
    start = manifest["shards"][-1]["rows"][1] if manifest["shards"] else 0
    rate = _Rate()
    bar.skip(start)
    for lo in range(start, n, shard_rows):
        hi = min(lo + shard_rows, n)
        cols, offsets = [], [0]
        for b in range(lo, hi, batch_size):
            idx = range(b, min(b + batch_size, hi))
            batch = rows.batch(idx)
            cols.append(topk_targets(source.scorer.score(batch), batch, source.k))
            for i in idx:
                offsets.append(offsets[-1] + len(rows.scored(i)[2]))
            bar.advance(len(idx))
            bar.update(info=f"shard {len(manifest['shards'])} | {rate(offsets):,.0f} tok/s")
        arrays = fmt.encode_tokens(*[torch.cat(c) for c in zip(*cols, strict=True)], values=values)
        arrays.update(rows.row_arrays(range(lo, hi)))
        entry = fmt.write_shard(out, len(manifest["shards"]), range(lo, hi), offsets, arrays)
        entry["data_sha256"] = fmt.combine(row_fps[lo:hi])
        manifest["shards"].append(entry)
        fmt.write_manifest(out, manifest)
        rate.shard_done(offsets)
        if after_shard is not None:
            after_shard(len(manifest["shards"]) - 1)


class _Rows:
    """The token rows the teacher scores: the student's (same tokenizer), or the teacher's own
    template + tokenization of each row with the byte ends of its completion tokens (cross);
    with privileged context the teacher's prompt is the context prompt (data/context.py), as
    the trainer's `ContextCollate` builds it."""

    def __init__(self, examples, prompts, completions, tok, cross, *, routes=None, data=None):
        from distil.models.tokenizers import prompt_format

        self.examples, self.prompts, self.completions = examples, prompts, completions
        self.tok, self.cross, self.routes = tok, cross, routes
        self.style = prompt_format(data)
        pad_tok = tok if cross is None else cross.teacher_tok
        self.pad = pad_tok.pad_token_id if pad_tok.pad_token_id is not None else 0
        self._teacher: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self.context_prompts: list | None = None  # the teacher's prompt of each row
        self.context_ids: list[list[int]] | None = None  # ... in student tokens (same tokenizer)

    def give_context(self, context: str | None, system: str | None) -> None:
        from distil.data.context import context_prompt
        from distil.models.tokenizers import encode_prompts

        self.context_prompts = [context_prompt(e, context, system) for e in self.examples]
        if self.cross is None:  # as train/setup.py's collate: the whole prompt, not cut
            self.context_ids = encode_prompts(
                self.tok, self.context_prompts, name="teacher context", fmt=self.style
            )

    def scored(self, i: int) -> tuple[int, list[int], list[int]]:
        if self.cross is None:
            return i, self.prompts[i], self.completions[i]
        return (i, *self._teacher_row(i)[:2])

    def batch(self, idx: range):
        """The collated rows `idx`, with the teacher's context inputs (same tokenizer)."""
        from distil.data.context import with_context_inputs

        batch = collate([Sample(*self.scored(i), "off_policy") for i in idx], self.pad)
        if self.context_ids is not None:  # teacher position t + shift predicts student t's
            batch = with_context_inputs(batch, [self.context_ids[i] for i in idx], self.pad)
        return batch

    def _teacher_row(self, i: int):
        if i not in self._teacher:
            prompt = self.examples[i].prompt
            if self.context_prompts is not None:
                prompt = self.context_prompts[i]
            sample = Sample(i, self.prompts[i], self.completions[i], "off_policy", prompt)
            t_prompt, t_ids, t_ends, _ = self.cross.teacher_inputs(sample)
            self._teacher[i] = (t_prompt, t_ids, t_ends)  # until its shard is written
        return self._teacher[i]

    def row_arrays(self, idx: range) -> dict[str, np.ndarray]:
        """Per-row arrays of a shard: each row's teacher (routed caches), the sha256 of its
        teacher prompt (context and cross caches), and for cross caches the teacher's
        completion ids and byte ends, flat."""
        out = {}
        if self.routes is not None:
            out["route"] = np.asarray([self.routes[i] for i in idx], dtype=np.int32)
        if self.context_ids is not None:
            out["prompt_sha256"] = _hashes(self.context_ids[i] for i in idx)
        if self.cross is None:
            return out
        done = [self._teacher_row(i) for i in idx]
        self._teacher.clear()
        ids = [t for row in done for t in row[1]]
        ends = [e for row in done for e in row[2]]
        out["prompt_sha256"] = _hashes(row[0] for row in done)
        out["teacher_ids"] = np.asarray(ids, dtype=np.int32)
        out["teacher_ends"] = np.asarray(ends, dtype=np.int32)
        return out


def _hashes(prompts) -> np.ndarray:
    """(R, 32) uint8: `cache.prompt_sha256` of each row's teacher prompt ids."""
    return np.stack([np.frombuffer(fmt.prompt_sha256(p), dtype=np.uint8) for p in prompts])


class _Rate:
    """Tokens scored per second since the start (for the progress bar)."""

    def __init__(self):
        self.began, self.before = time.perf_counter(), 0

    def __call__(self, offsets: list[int]) -> float:
        return (self.before + offsets[-1]) / max(time.perf_counter() - self.began, 1e-9)

    def shard_done(self, offsets: list[int]) -> None:
        self.before += offsets[-1]


def _differs(key: str, old: Any, new: Any) -> bool:
    """A header value the resumed cache was not made with. A manifest written before the
    resolved dtype was recorded says `auto` (the config's value): it matches what `auto`
    resolves to now, at the top and per teacher (`teachers`)."""
    if key == "dtype" and old == "auto":
        return False
    if key == "teachers" and isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            return True
        return any(_differs(k, old[n].get(k), v) for n in new for k, v in new[n].items())
    return old != new


def _start_or_resume(out: Path, header: dict[str, Any]) -> dict[str, Any]:
    """A fresh manifest, or the one of a cache of the same settings cut short (or finished)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the cache")
    if (out / fmt.MANIFEST).is_file():
        old = fmt.read_manifest(out)
        diffs = [k for k in header if k != "teacher_path" and _differs(k, old.get(k), header[k])]
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
