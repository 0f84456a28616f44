"""`teacher.cache: DIR`: a TeacherScorer that reads the teacher's top-k targets from disk.

It returns the same `TeacherTargets` (top-k ids and log-probs, rest bucket, realised-token
log-prob) as `LiveTeacher` with `teacher.top_k`, so every same-tokenizer loss works unchanged.
A cross-tokenizer cache holds the teacher's own completion tokens: for a cross-tokenizer batch it
returns targets in the teacher's positions, the top-k spread to full rows (`dense_from_topk`),
built on the student's device in the compute dtype (`dense_dtype`).
It scores only the dataset's reference completions (off-policy slices): a completion the student
or the teacher writes during training is new text that no cache holds.

`CachedTeacher.open` checks everything before the first step: the manifest is complete, it was
made for this config (tokenizers, the teacher's chat template, k, temperature, vocabulary, data
rows as tokenized), and every shard matches its size and sha256.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from distil.teacher import cache as fmt
from distil.teacher.cache import CacheError
from distil.types import Batch, TeacherTargets

# decoded shards kept in memory (least recently used out first): int32 ids + fp32 log-probs, 8
# bytes per top-k entry; 4 GiB holds 8M tokens at k = 64. Rows come in shuffled order, so a
# shard pushed out is decoded again each time one of its rows comes back.
DECODED_BYTES_IN_MEMORY = 4 << 30
PAD_LOGPROB = -30.0  # targets at prompt/padding positions: finite, masked out by every loss


class CachedTeacher:
    def __init__(
        self, cache_dir: str | Path, manifest: dict[str, Any], *, dense_dtype=torch.float32
    ):
        self.dir = Path(cache_dir)
        self.dense_dtype = dense_dtype  # full rows of a cross-tokenizer batch: compute dtype
        self.manifest = manifest
        self.temperature = float(manifest["temperature"])
        self.top_k = int(manifest["k"])
        self._starts = [e["rows"][0] for e in manifest["shards"]]
        self._shard = ShardCache(self._load, DECODED_BYTES_IN_MEMORY)
        routes = manifest.get("routes")
        self.route_names: list[str] | None = routes["names"] if routes else None
        # RoutedTeacher's contract (train/step.py logs loss/teacher/<name> from it): every
        # teacher's name, and the teacher of each row of the last micro-batch scored; both
        # empty unless the cache is routed (one teacher: no per-teacher logging)
        self.names: list[str] = list(self.route_names or [])
        self.last_routes: list[str] = []
        self._prompt_checked: set[int] = set()  # rows whose teacher prompt matched the cache's

    @classmethod
    def open(
        cls,
        cache_dir: str | Path,
        *,
        expect: dict[str, Any],
        row_fingerprints: list[str],
        dense_dtype=torch.float32,
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
        return cls(cache_dir, manifest, dense_dtype=dense_dtype)

    def _load(self, index: int) -> fmt.Shard:
        entry = self.manifest["shards"][index]
        m = self.manifest
        shard = fmt.read_shard(self.dir, entry, self.top_k, m["values"], fmt.value_step(m))
        shard.ids_N_K = shard.ids_N_K.to(torch.int32)  # ids < 2^31: half the memory
        return shard

    def _locate(self, example: int) -> tuple[fmt.Shard, int]:
        """The decoded shard holding data row `example`, and the row's index in it."""
        index = bisect.bisect_right(self._starts, example) - 1
        shard = self._shard(index)
        return shard, example - int(shard.rows[0])

    def route(self, example: int) -> str | None:
        """The name of the teacher whose targets the cache holds for data row `example`."""
        if self.route_names is None:
            return self.manifest.get("teacher_name")
        shard, r = self._locate(example)
        return self.route_names[int(shard.route_R[r])]

    def row(self, example: int, *, teacher_ids: bool = False):
        """(ids (C, K) int32, log-probs (C, K), rest (C,), token (C,)) of data row `example`
        (views into the decoded shard), and the teacher's own completion ids (C,) of a cross
        cache when `teacher_ids`."""
        shard, r = self._locate(example)
        lo, hi = int(shard.offsets[r]), int(shard.offsets[r + 1])
        out = (
            shard.ids_N_K[lo:hi],  # int32: copied into the batch's int64 ids
            shard.logprobs_N_K[lo:hi],
            shard.rest_N[lo:hi],
            shard.token_N[lo:hi],
        )
        return (*out, shard.teacher_ids_N[lo:hi]) if teacher_ids else out

    @torch.no_grad()
    def score(self, batch: Batch) -> TeacherTargets:
        if batch.teacher_input_ids_B_L is not None:
            return self._score_cross(batch)
        self._note_routes(batch)
        ids, lps, rest, token = _blank_targets(*batch.mask_B_T.shape, self.top_k)
        for b, sample in enumerate(batch.samples):
            _check_source(sample)
            prompt = _context_prompt(batch, b)
            self._check_prompt(sample.example_id, prompt, student=sample.prompt_ids)
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

    def _score_cross(self, batch: Batch) -> TeacherTargets:
        """Targets in the teacher's positions of a cross-tokenizer micro-batch (its inputs are
        the teacher's template + tokens, as the live teacher gets them): the cached top-k + rest
        spread over a full distribution (`dense_from_topk`) and the realised tokens' log-probs.
        The cached teacher ids of every row must be the batch's, else the tokenizer, template or
        data changed since the cache was written."""
        ids_B_L = batch.teacher_input_ids_B_L
        ids, lps, rest, token = _blank_targets(ids_B_L.shape[0], ids_B_L.shape[1] - 1, self.top_k)
        lengths = batch.teacher_attention_mask_B_L.sum(-1).tolist()
        self._note_routes(batch)
        for b, sample in enumerate(batch.samples):
            _check_source(sample)
            r_ids, r_lps, r_rest, r_tok, r_teacher = self.row(sample.example_id, teacher_ids=True)
            c = len(r_teacher)
            p = int(lengths[b]) - c
            if p >= 1:  # first: another context also moves the completion's tokens at the seam
                self._check_prompt(sample.example_id, ids_B_L[b, :p].tolist(), cross=True)
            if p < 1 or not torch.equal(ids_B_L[b, p : p + c].cpu(), r_teacher):
                raise CacheError(
                    f"data row {sample.example_id}: the teacher's tokens of its completion in "
                    f"this run differ from those in the teacher cache {self.dir} ({c} cached, "
                    f"{int(lengths[b])} teacher tokens in the row). The teacher's tokenizer, its "
                    "chat template or the data changed since the cache was written. Fix: "
                    "rebuild the cache with this config (`distil cache-teacher`)"
                )
            span = slice(p - 1, p - 1 + c)
            ids[b, span], lps[b, span], rest[b, span], token[b, span] = r_ids, r_lps, r_rest, r_tok
        # the (B, T, K) top-k go to the device; the (B, T, V) rows are built there, in the
        # compute dtype: no host allocation of V floats per position, no pageable copy of them
        device = batch.input_ids_B_L.device
        ids, lps, rest, token = (x.to(device) for x in (ids, lps, rest, token))
        V = int(self.manifest["vocab_size"])
        full = dense_from_topk(ids, lps, rest, V, dtype=self.dense_dtype)
        return TeacherTargets(logprobs_B_T_V=full, token_logprobs_B_T=token)

    def _note_routes(self, batch: Batch) -> None:
        if self.route_names is not None:
            self.last_routes = [self.route(s.example_id) for s in batch.samples]

    def _check_prompt(
        self, example: int, prompt: list[int] | None, *, cross: bool = False, student=None
    ):
        """The teacher's prompt of data row `example` in this run (None: the student's own,
        `student`, same tokenizer) is the one the cache was scored after: same privileged
        context (teacher.context/system and the row's fields it reads), same teacher template.
        A cache hashing every row's prompt (some of its rows' teachers had context) also
        holds the student's own prompt's hash for a row whose teacher had none."""
        if example in self._prompt_checked:
            return
        shard, r = self._locate(example)
        stored = None if shard.prompt_sha_R_32 is None else bytes(shard.prompt_sha_R_32[r])
        if stored is None and (cross or prompt is None):
            return  # no context on either side (or a cross cache written before the hashes)
        seen = prompt if prompt is not None else student
        if seen is not None and stored == fmt.prompt_sha256(list(seen)):
            self._prompt_checked.add(example)
            return
        m = self.manifest
        cached = f"teacher.context = {m.get('context')!r}, teacher.system = {m.get('system')!r}"
        if stored is None:
            run = "this run gives the teacher a privileged prompt (teacher.context/system)"
        elif prompt is None:
            run = "this run gives the teacher the student's own prompt (no teacher.context/system)"
        else:
            run = (
                "this run's teacher prompt for it differs (another teacher.context/system, or "
                "a column it reads, the data or the teacher's chat template changed)"
            )
        raise CacheError(
            f"data row {example}: the teacher cache {self.dir} holds targets scored after the "
            f"prompt of {cached}, but {run}. Fix: train with the context the cache was written "
            "with, or write a cache for this config (`distil cache-teacher CONFIG --out DIR`)"
        )


def _context_prompt(batch: Batch, b: int) -> list[int] | None:
    """Row b's teacher prompt ids under privileged context (same tokenizer), else None."""
    if batch.context_input_ids_B_L is None:
        return None
    n = int(batch.context_shift_B[b]) + len(batch.samples[b].prompt_ids)
    ids = batch.context_input_ids_B_L[b, :n].tolist()
    return None if ids == list(batch.samples[b].prompt_ids) else ids  # its teacher has none


class ShardCache:
    """Decoded shards by index, least recently used evicted past `budget` bytes. Decoding a
    shard a second time means the budget is too small for the shuffled row order: warned once,
    with the sizes."""

    def __init__(self, load, budget: int):
        self._load, self._budget = load, budget
        self._shards: OrderedDict[int, fmt.Shard] = OrderedDict()
        self._bytes = 0
        self._decoded: set[int] = set()
        self._warned = False

    def __call__(self, index: int) -> fmt.Shard:
        if index in self._shards:
            self._shards.move_to_end(index)
            return self._shards[index]
        shard = self._load(index)
        size = _nbytes(shard)
        while self._shards and self._bytes + size > self._budget:
            self._bytes -= _nbytes(self._shards.popitem(last=False)[1])
        self._shards[index] = shard
        self._bytes += size
        if index not in self._decoded:
            self._decoded.add(index)
        elif not self._warned:
            self._warned = True
            print(
                f"warning: teacher cache shard {index} decoded again: its decoded shards "
                f"({size / 2**20:.0f} MiB each) do not all fit the {self._budget / 2**30:.1f} GiB "
                "kept in memory (cached.DECODED_BYTES_IN_MEMORY), so shuffled rows decode shards "
                "again and again, which slows every step",
                file=sys.stderr,
            )
        return shard


def _nbytes(shard: fmt.Shard) -> int:
    tensors = (shard.ids_N_K, shard.logprobs_N_K, shard.rest_N, shard.token_N, shard.teacher_ids_N)
    arrays = (shard.route_R, shard.prompt_sha_R_32)
    return sum(t.nbytes for t in (*tensors, *arrays) if t is not None)


def dense_from_topk(
    ids_B_T_K, logprobs_B_T_K, rest_B_T, vocab_size: int, *, dtype=torch.float32
) -> torch.Tensor:
    """Full log-probs (B, T, V) in `dtype` on the inputs' device, from top-k + rest, the rest
    mass spread evenly over the V - K other ids: log p(v) = rest - log(V - K) off the top-k.
    Cross-tokenizer losses merge and project every teacher token, so they need a full row; this
    is the least-informative one that keeps the top-k exact and the rest's total mass. The one
    (B, T, V) allocation is the result (filled, then the top-k scattered in)."""
    K = ids_B_T_K.shape[-1]
    spread = rest_B_T.float() - math.log(max(vocab_size - K, 1))
    full = torch.empty((*rest_B_T.shape, vocab_size), dtype=dtype, device=rest_B_T.device)
    full.copy_(spread[..., None].expand_as(full))
    return full.scatter_(-1, ids_B_T_K.long(), logprobs_B_T_K.to(dtype))


def _blank_targets(B: int, T: int, K: int):
    """(ids, log-probs, rest, token) of (B, T) positions no cached row fills: prompt and
    padding positions, masked out by every loss."""
    ids = torch.arange(K).expand(B, T, K).clone()
    return ids, torch.full((B, T, K), PAD_LOGPROB), torch.zeros(B, T), torch.zeros(B, T)


def _check_source(sample) -> None:
    if sample.source != "off_policy":
        raise CacheError(
            f"teacher.cache holds the teacher's targets for the dataset's completions "
            f"only, but this micro-batch has a {sample.source} completion. Fix: "
            "train.lambda=0 and train.seq_kd=false with teacher.cache"
        )


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
    manifest reads and is complete, and its k, temperature, template and privileged context
    (teacher.context / teacher.system) are this config's."""
    manifest = fmt.read_manifest(cfg.teacher.cache)
    if not manifest.get("complete"):
        raise CacheError(
            f"the teacher cache {cfg.teacher.cache} is incomplete (its writer was stopped). "
            f"Fix: run the same `distil cache-teacher CONFIG --out {cfg.teacher.cache}` again"
        )
    want = {
        "temperature": cfg.loss.temperature,
        "template": cfg.data.template,
        **context_expect(cfg),
    }
    if cfg.teacher.top_k is not None:
        want["k"] = cfg.teacher.top_k
    fmt.compare_header(cfg.teacher.cache, manifest, want)


def context_expect(cfg) -> dict[str, Any]:
    """The manifest keys of the teacher's prompts a run must agree with: privileged context,
    and how plain text and chat template arguments render them (a cache written before they
    were recorded holds none, as a run without context and with the default format)."""
    return {
        "context": cfg.teacher.context,
        "system": cfg.teacher.system,
        "prompt_format": prompt_format_header(cfg),
    }


def prompt_format_header(cfg) -> dict[str, Any] | None:
    """data.text_prompts and data.chat_template_kwargs as a cache manifest records them; None
    for the defaults (auto, none), as a cache written before they were recorded."""
    d = cfg.data
    if d.text_prompts == "auto" and not d.chat_template_kwargs:
        return None
    return {"text_prompts": d.text_prompts, "chat_template_kwargs": dict(d.chat_template_kwargs)}
