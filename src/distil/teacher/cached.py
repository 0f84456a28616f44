"""`teacher.cache: DIR`: a TeacherScorer that reads the teacher's top-k targets from disk.

It returns the same `TeacherTargets` (top-k ids and log-probs, rest bucket, realised-token
log-prob) as `LiveTeacher` with `teacher.top_k`, so every same-tokenizer loss works unchanged.
It scores only the dataset's reference completions (off-policy slices): a completion the student
or the teacher writes during training is new text that no cache holds.

`CachedTeacher.open` checks everything before the first step: the manifest is complete, it was
made for this config (tokenizers, k, temperature, vocabulary, data rows as tokenized), and every
shard matches its size and sha256.
"""

from __future__ import annotations

import bisect
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from distil.teacher import cache as fmt
from distil.teacher.cache import CacheError
from distil.types import Batch, TeacherTargets

SHARDS_IN_MEMORY = 16  # decoded shards kept (LRU): ids int64 + fp32 values, 12 bytes per entry
PAD_LOGPROB = -30.0  # targets at prompt/padding positions: finite, masked out by every loss


class CachedTeacher:
    def __init__(self, cache_dir: str | Path, manifest: dict[str, Any]):
        self.dir = Path(cache_dir)
        self.manifest = manifest
        self.temperature = float(manifest["temperature"])
        self.top_k = int(manifest["k"])
        self._starts = [e["rows"][0] for e in manifest["shards"]]
        self._shard = lru_cache(maxsize=SHARDS_IN_MEMORY)(self._load)

    @classmethod
    def open(
        cls,
        cache_dir: str | Path,
        *,
        expect: dict[str, Any],
        row_fingerprints: list[str],
    ) -> CachedTeacher:
        """Open and verify a cache against what this run expects (see `fmt.HEADER_KEYS`)."""
        cache_dir = Path(cache_dir)
        manifest = fmt.read_manifest(cache_dir)
        if not manifest.get("complete"):
            done = sum(e["rows"][1] - e["rows"][0] for e in manifest.get("shards", []))
            raise CacheError(
                f"the teacher cache {cache_dir} is incomplete ({done} of {manifest.get('rows')} "
                "rows; its writer was stopped). Fix: run the same `distil cache-teacher CONFIG "
                f"--out {cache_dir}` again: it continues after the last complete shard"
            )
        fmt.compare_header(cache_dir, manifest, expect)
        if manifest["data_fingerprint"] != fmt.combine(row_fingerprints):
            raise CacheError(_data_difference(cache_dir, manifest, row_fingerprints))
        fmt.verify_shards(cache_dir, manifest)
        return cls(cache_dir, manifest)

    def _load(self, index: int) -> fmt.Shard:
        entry = self.manifest["shards"][index]
        m = self.manifest
        return fmt.read_shard(self.dir, entry, self.top_k, m["values"], m.get("logprob_step"))

    def row(self, example: int):
        """(ids (C, K), log-probs (C, K), rest (C,), token (C,)) of data row `example`."""
        index = bisect.bisect_right(self._starts, example) - 1
        shard = self._shard(index)
        r = example - int(shard.rows[0])
        lo, hi = int(shard.offsets[r]), int(shard.offsets[r + 1])
        return (
            shard.ids_N_K[lo:hi],
            shard.logprobs_N_K[lo:hi],
            shard.rest_N[lo:hi],
            shard.token_N[lo:hi],
        )

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        B, T = batch.mask_B_T.shape
        K = self.top_k
        ids = torch.arange(K).expand(B, T, K).clone()
        lps = torch.full((B, T, K), PAD_LOGPROB)
        rest = torch.zeros(B, T)
        token = torch.zeros(B, T)
        for b, sample in enumerate(batch.samples):
            if sample.source != "off_policy":
                raise CacheError(
                    f"teacher.cache holds the teacher's targets for the dataset's completions "
                    f"only, but this micro-batch has a {sample.source} completion. Fix: "
                    "train.lambda=0 and train.seq_kd=false with teacher.cache"
                )
            r_ids, r_lps, r_rest, r_tok = self.row(sample.example_id)
            c = len(sample.completion_ids)
            if len(r_ids) != c:
                raise CacheError(
                    f"data row {sample.example_id} has {c} completion tokens in this run but "
                    f"{len(r_ids)} in the teacher cache {self.dir}. Fix: rebuild the cache "
                    "with this config's data and tokenizer settings"
                )
            p = len(sample.prompt_ids)
            span = slice(p - 1, p - 1 + c)  # shifted positions predicting the completion
            ids[b, span], lps[b, span], rest[b, span], token[b, span] = r_ids, r_lps, r_rest, r_tok
        targets = TeacherTargets(
            topk_ids_B_T_K=ids,
            topk_logprobs_B_T_K=lps,
            rest_logprob_B_T=rest,
            token_logprobs_B_T=token,
        )
        return targets.to(batch.input_ids_B_L.device)


def _data_difference(cache_dir: Path, manifest: dict, fps: list[str]) -> str:
    """Name the first shard whose rows differ from this config's data."""
    if len(fps) != manifest.get("rows"):
        what = f"the data has {len(fps)} rows, the cache {manifest.get('rows')}"
    else:
        what = "the data rows differ"
        for e in manifest["shards"]:
            lo, hi = e["rows"]
            if fmt.combine(fps[lo:hi]) != e.get("data_sha256"):
                what = (
                    f"{e['file']} (rows {lo}-{hi - 1}) was made from other rows than this "
                    "config's (data file, template, field names, token limits or tokenizer "
                    "changed)"
                )
                break
    return (
        f"the teacher cache {cache_dir} was made for other data: {what} (cache: data "
        f"{manifest.get('data')!r}, template {manifest.get('template')!r}). Fix: build a "
        "cache for this data with `distil cache-teacher CONFIG --out DIR`"
    )


def check_settings(cfg) -> None:
    """The checks `distil config validate` can make without the data or the student: the
    manifest reads and is complete, and its k, temperature and template are this config's."""
    manifest = fmt.read_manifest(cfg.teacher.cache)
    if not manifest.get("complete"):
        raise CacheError(
            f"the teacher cache {cfg.teacher.cache} is incomplete (its writer was stopped). "
            f"Fix: run the same `distil cache-teacher CONFIG --out {cfg.teacher.cache}` again"
        )
    want = {"temperature": cfg.loss.temperature, "template": cfg.data.template}
    if cfg.teacher.top_k is not None:
        want["k"] = cfg.teacher.top_k
    fmt.compare_header(cfg.teacher.cache, manifest, want)
