"""The on-disk teacher cache: top-k ids, log-probs, rest mass and realised-token log-prob.

A cache directory holds `manifest.json` and shards `shard-00000.safetensors`, ... Each shard is a
run of consecutive data rows; per completion token it stores the teacher's top-k (ids sorted
ascending), and per row the offsets of its tokens. docs/teacher-cache.md describes every field.

Encoding of one shard (N tokens, K entries each), all flat arrays:
    ids_z      uint8  zlib of the byte planes of the uint32 gaps between sorted ids (lossless)
    values_z   uint8  zlib of the K values per token in id order, by `values` codec:
                      q8   uint8 steps of `logprob_step` (1/8) nats below the token's top-1
                      fp16 / fp32  the log-probs themselves
    top1       fp16/fp32 (N,)  the top-1 log-prob that q8 values count down from
    rest       fp16/fp32 (N,)  log(1 - sum top-k)
    token      fp16/fp32 (N,)  the teacher's log-prob of the realised completion token
    rows       int64 (R,)      data row index of each row
    offsets    int64 (R+1,)    token offsets of the rows
Gaps of sorted ids are small (a top-64 out of 128k has gaps of about 2k: 11-12 bits), so the
high byte planes are nearly all zero and zlib removes them; bench/cache.py measures each trick.

Files are written as `<name>.tmp`, fsynced and renamed; the manifest (rewritten after every
shard, the same way) lists complete shards with their sha256, so a killed writer resumes after
the last listed shard and a reader never sees a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distil.errors import DistilError
from distil.train.checkpoint import _fsync_dir, _fsync_file, _sha256

FORMAT = "distil-teacher-cache-1"
MANIFEST = "manifest.json"
# q8: rounding to steps of s nats costs KL ~ m s^2/24 per token, m = the top-k mass (errors
# uniform in +-s/2 on log-probs): at most 6.5e-4 nats for s = 1/8 (bench/cache.py measures it)
LOGPROB_STEP = 0.125
VALUE_CODECS = ("q8", "fp16", "fp32")
# manifest keys a training config must agree with, and how to say what differs
HEADER_KEYS = (
    "teacher_tokenizer_sha256",
    "student_tokenizer_sha256",
    "k",
    "temperature",
    "vocab_size",
    "data_fingerprint",
    "template",
    "cross_tokenizer",
    "teacher_template_sha256",
)
TEACHER_TOKENIZER = "teacher-tokenizer"  # cross caches: the teacher's tokenizer, saved alongside


class CacheError(DistilError):
    """A teacher cache is missing, incomplete, corrupt, or made for other data or settings."""


@dataclass
class Shard:
    """One decoded shard: for each of its rows, the slice of its tokens in the flat arrays."""

    rows: np.ndarray  # (R,) data row indices
    offsets: np.ndarray  # (R+1,)
    ids_N_K: torch.Tensor  # int64
    logprobs_N_K: torch.Tensor  # float32
    rest_N: torch.Tensor
    token_N: torch.Tensor
    teacher_ids_N: torch.Tensor | None = None  # cross caches: the teacher's completion tokens


# ----------------------------------------------------------------------------- codec


def encode_tokens(
    ids_N_K: torch.Tensor,
    logprobs_N_K: torch.Tensor,
    rest_N: torch.Tensor,
    token_N: torch.Tensor,
    values: str = "q8",
) -> dict[str, np.ndarray]:
    """The flat arrays of N tokens' targets (see the module docstring)."""
    ids = ids_N_K.detach().cpu().numpy().astype(np.int64)
    lps = logprobs_N_K.detach().cpu().float().numpy()
    order = np.argsort(ids, axis=-1, kind="stable")
    sid = np.take_along_axis(ids, order, -1)
    slp = np.take_along_axis(lps, order, -1)
    gaps = np.diff(sid, axis=-1, prepend=0).astype("<u4")
    planes = gaps.reshape(-1).view(np.uint8).reshape(-1, 4).T  # byte plane j = byte j of each gap
    side = np.float32 if values == "fp32" else np.float16
    out = {"ids_z": _z(planes.tobytes())}
    top1 = lps.max(axis=-1, initial=-np.inf) if lps.size else np.zeros(len(lps), np.float32)
    top1 = top1.astype(side)
    if values == "q8":
        steps = np.rint((top1.astype(np.float32)[:, None] - slp) / LOGPROB_STEP)
        out["values_z"] = _z(np.clip(steps, 0, 255).astype(np.uint8).tobytes())
    else:
        out["values_z"] = _z(slp.astype("<f4" if values == "fp32" else "<f2").tobytes())
    out["top1"] = top1
    out["rest"] = rest_N.detach().cpu().float().numpy().astype(side)
    out["token"] = token_N.detach().cpu().float().numpy().astype(side)
    return out


def decode_tokens(arrays: dict[str, np.ndarray], k: int, values: str, step: float = LOGPROB_STEP):
    """(ids (N, K) int64, log-probs (N, K) fp32, rest (N,), token (N,)) from `encode_tokens`."""
    n = len(arrays["top1"])
    planes = np.frombuffer(zlib.decompress(arrays["ids_z"].tobytes()), np.uint8).reshape(4, -1)
    gaps = np.ascontiguousarray(planes.T).view("<u4").reshape(n, k)
    ids = np.cumsum(gaps.astype(np.int64), axis=-1)
    raw = zlib.decompress(arrays["values_z"].tobytes())
    if values == "q8":
        steps = np.frombuffer(raw, np.uint8).reshape(n, k).astype(np.float32)
        lps = arrays["top1"].astype(np.float32)[:, None] - steps * step
    else:
        lps = np.frombuffer(raw, "<f4" if values == "fp32" else "<f2").reshape(n, k)
    lps_N_K = torch.from_numpy(lps.astype(np.float32))
    rest_N = torch.from_numpy(arrays["rest"].astype(np.float32))
    if values != "fp32":
        # rounded values no longer sum to 1 with the rest; a KL against such targets has a
        # floor above 0, so the K+1 buckets are renormalised (bench/cache.py measures the KL)
        z_N = torch.logsumexp(torch.cat([lps_N_K, rest_N[:, None]], -1), -1)
        lps_N_K, rest_N = lps_N_K - z_N[:, None], rest_N - z_N
    return (
        torch.from_numpy(ids),
        lps_N_K,
        rest_N,
        torch.from_numpy(arrays["token"].astype(np.float32)),
    )


def _z(data: bytes) -> np.ndarray:
    return np.frombuffer(zlib.compress(data, 6), np.uint8).copy()


# ----------------------------------------------------------------------------- hashes


def tokenizer_sha256(tok) -> str:
    """A hash of what a tokenizer does: its vocabulary, added tokens and (fast) pipeline."""
    h = hashlib.sha256()
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
    return h.hexdigest()


def template_sha256(tok) -> str:
    """A hash of a tokenizer's chat template (the cross teacher renders prompts with it)."""
    return hashlib.sha256(str(getattr(tok, "chat_template", None)).encode()).hexdigest()


def save_teacher_tokenizer(out_dir: Path, tok) -> None:
    """Cross caches keep the teacher's tokenizer, so training needs no teacher.path."""
    if not (out_dir / TEACHER_TOKENIZER).is_dir():
        tmp = out_dir / (TEACHER_TOKENIZER + ".tmp")
        tok.save_pretrained(str(tmp))
        os.replace(tmp, out_dir / TEACHER_TOKENIZER)


def weights_sha256(path: str | Path) -> str | None:
    """sha256 over a local model directory's weight files (names and contents); None for a hub id."""
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        h.update(f.name.encode())
        h.update(_sha256(f).encode())
    return h.hexdigest()


def row_fingerprints(prompt_ids: list[list[int]], completion_ids: list[list[int] | None]):
    """One sha256 per data row over its prompt and completion token ids (the student's, as the
    trainer tokenizes them): a changed row, template, truncation or tokenizer changes it."""
    out = []
    for p, c in zip(prompt_ids, completion_ids, strict=True):
        out.append(hashlib.sha256(json.dumps([p, c]).encode()).hexdigest())
    return out


def combine(hashes: list[str]) -> str:
    return hashlib.sha256("".join(hashes).encode()).hexdigest()


# ----------------------------------------------------------------------------- files


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def write_shard(out_dir: Path, index: int, rows, offsets, arrays: dict[str, np.ndarray]) -> dict:
    """Write one shard atomically; returns its manifest entry."""
    from safetensors.numpy import save_file

    tensors = dict(arrays)
    tensors["rows"] = np.asarray(rows, dtype=np.int64)
    tensors["offsets"] = np.asarray(offsets, dtype=np.int64)
    path = out_dir / shard_name(index)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp))
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(out_dir)
    return {
        "file": path.name,
        "rows": [int(tensors["rows"][0]), int(tensors["rows"][-1]) + 1],
        "tokens": int(tensors["offsets"][-1]),
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    path = out_dir / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    with tmp.open("w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(out_dir)


def read_manifest(cache_dir: str | Path) -> dict[str, Any]:
    """The manifest, checked for shape; a missing or unreadable one is a CacheError."""
    path = Path(cache_dir) / MANIFEST
    if not path.is_file():
        raise CacheError(
            f"teacher.cache = {str(cache_dir)!r} has no {MANIFEST}: it is not a teacher cache "
            "(or its writer was killed before the first shard). Fix: run `distil cache-teacher "
            "CONFIG --out DIR` and point teacher.cache at DIR"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CacheError(
            f"{path} is not readable JSON ({exc}); the cache is damaged. Fix: run `distil "
            "cache-teacher` again into a new directory"
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        seen = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CacheError(
            f"{path} is not a {FORMAT} manifest (format: {seen!r}). Fix: build the cache again "
            "with this version's `distil cache-teacher`"
        )
    if problem := _shape_problem(manifest):
        raise CacheError(
            f"{path} is damaged: {problem}. Fix: build the cache again with `distil "
            "cache-teacher` into a new directory"
        )
    return manifest


_SHARD_FILE = re.compile(r"^shard-\d{5}\.safetensors$")


def _shape_problem(m: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's structure (keys, types, shard entries), or None."""
    for key, kind in (("k", int), ("rows", int), ("data_fingerprint", str), ("values", str)):
        if type(m.get(key)) is not kind:
            return f"{key!r} should be a {kind.__name__}, got {m.get(key)!r:.60}"
    if m["values"] not in VALUE_CODECS or m["k"] <= 0:
        return f"values {m['values']!r:.40} / k {m['k']} is not a known encoding"
    if not isinstance(m.get("temperature"), (int, float)) or isinstance(m["temperature"], bool):
        return f"'temperature' should be a number, got {m.get('temperature')!r:.60}"
    if not isinstance(m.get("shards"), list):
        return "'shards' should be a list"
    end = 0
    for i, e in enumerate(m["shards"]):
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and _SHARD_FILE.match(e["file"])
            and isinstance(e.get("rows"), list)
            and len(e["rows"]) == 2
            and all(type(r) is int for r in e["rows"])
            and e["rows"][0] == end < e["rows"][1]
            and type(e.get("bytes")) is int
            and type(e.get("tokens")) is int
            and isinstance(e.get("sha256"), str)
        )
        if not ok:
            return f"shard entry {i} ({e!r:.80}) is not a shard of consecutive rows"
        end = e["rows"][1]
    if end > m["rows"]:
        return f"its shards cover {end} rows but it says the data has {m['rows']}"
    return None


def read_shard(cache_dir: Path, entry: dict, k: int, values: str, step: float | None) -> Shard:
    from safetensors.numpy import load_file

    arrays = load_file(str(cache_dir / entry["file"]))
    ids, lps, rest, token = decode_tokens(arrays, k, values, step or LOGPROB_STEP)
    teacher_ids = arrays.get("teacher_ids")
    if teacher_ids is not None:
        teacher_ids = torch.from_numpy(teacher_ids.astype(np.int64))
    return Shard(arrays["rows"], arrays["offsets"], ids, lps, rest, token, teacher_ids)


def verify_shards(cache_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Every listed shard exists with its size and sha256; raises naming the first bad one."""
    cache_dir = Path(cache_dir)
    for entry in manifest.get("shards", []):
        path = cache_dir / entry["file"]
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != entry["bytes"]:
            problem = (
                f"has {path.stat().st_size} bytes, the manifest says {entry['bytes']} (truncated?)"
            )
        elif _sha256(path) != entry["sha256"]:
            problem = "does not match its sha256 in the manifest (the file was altered or damaged)"
        else:
            continue
        raise CacheError(
            f"teacher cache shard {path} {problem}. Fix: delete that shard and the ones after "
            "it from the manifest's list by running `distil cache-teacher` again with the same "
            "config and --out (it rewrites what is missing), or build the cache anew"
        )


def compare_header(cache_dir: str | Path, manifest: dict, want: dict[str, Any]) -> None:
    """Raise a CacheError listing every key where the cache was made for something else."""
    diffs = []
    for key in HEADER_KEYS:
        if key in want and manifest.get(key) != want[key]:
            diffs.append(
                f"{key}: cache {_short(manifest.get(key))}, this config {_short(want[key])}"
            )
    if diffs:
        raise CacheError(
            f"the teacher cache {cache_dir} was made for other settings than this config: "
            + "; ".join(diffs)
            + ". Fix: build a cache for this config (`distil cache-teacher CONFIG --out DIR`), "
            "or train with the settings the cache was made with"
        )


def _short(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64:
        return v[:12] + "..."
    return repr(v)
