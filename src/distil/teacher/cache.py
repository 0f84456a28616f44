"""The on-disk teacher cache: top-k ids, log-probs, rest mass and realised-token log-prob.

A cache directory holds `manifest.json` and shards `shard-00000.safetensors`, ... Each shard is a
run of consecutive data rows; per completion token it stores the teacher's top-k (ids sorted
ascending), and per row the offsets of its tokens. docs/teacher-cache.md describes every field.

A shard holds, per token, the arrays of `cache_codec.encode_tokens` (Rice-coded sorted-id
gaps, lzma-compressed values, fp16 rest and realised-token log-probs), and per row
    rows       int64 (R,)      data row index of each row
    offsets    int64 (R+1,)    token offsets of the rows
    route      int32 (R,)      several teachers: each row's teacher, an index into the
                               manifest's `routes.names` (routed and `--teacher` caches)
    prompt_sha256  uint8 (R, 32)  privileged-context and cross caches: a sha256 of the teacher's
                               prompt ids of each row (what it saw before the completion)
bench/cache.py measures what each encoding trick saves and what it costs in KL.

Files are written as `<name>.tmp`, fsynced and renamed; the manifest (rewritten after every
shard, the same way) lists complete shards with their sha256, so a killed writer resumes after
the last listed shard and a reader never sees a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distil.errors import DistilError
from distil.files import fsync_dir, fsync_file, sha256
from distil.teacher.cache_codec import (  # noqa: F401 (the codec's names, for callers)
    LOGPROB_STEP,
    VALUE_CODECS,
    decode_tokens,
    encode_tokens,
    sqrt_step,
)

FORMAT = "distil-teacher-cache-2"  # 1: zlib'd byte planes of the id gaps, q8 values
MANIFEST = "manifest.json"
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
    "context",
    "system",
    "prompt_format",
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
    route_R: np.ndarray | None = None  # routed caches: each row's teacher (index into names)
    prompt_sha_R_32: np.ndarray | None = None  # context/cross caches: the teacher prompt's sha256


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
        h.update(sha256(f).encode())
    return h.hexdigest()


def row_fingerprints(prompt_ids: list[list[int]], completion_ids: list[list[int] | None]):
    """One sha256 per data row over its prompt and completion token ids (the student's, as the
    trainer tokenizes them): a changed row, template, truncation or tokenizer changes it."""
    out = []
    for p, c in zip(prompt_ids, completion_ids, strict=True):
        out.append(hashlib.sha256(json.dumps([p, c]).encode()).hexdigest())
    return out


def prompt_sha256(ids) -> bytes:
    """The 32-byte sha256 of a row's teacher prompt ids (privileged context, cross caches)."""
    return hashlib.sha256(np.asarray(list(ids), dtype=np.int64).tobytes()).digest()


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
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(out_dir)
    return {
        "file": path.name,
        "rows": [int(tensors["rows"][0]), int(tensors["rows"][-1]) + 1],
        "tokens": int(tensors["offsets"][-1]),
        "bytes": path.stat().st_size,
        "sha256": sha256(path),
    }


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    path = out_dir / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    with tmp.open("w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(out_dir)


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
        older = " (an older distil's format, which this version no longer reads)"
        raise CacheError(
            f"{path} is not a {FORMAT} manifest (format: {seen!r}"
            f"{older if seen == 'distil-teacher-cache-1' else ''}). Fix: build the cache again "
            "with this version's `distil cache-teacher`"
        )
    if problem := _shape_problem(manifest):
        raise CacheError(
            f"{path} is damaged: {problem}. Fix: build the cache again with `distil "
            "cache-teacher` into a new directory"
        )
    return manifest


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_SHARD_FILE = re.compile(r"^shard-\d{5}\.safetensors$")


def _shape_problem(m: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's structure (keys, types, shard entries), or None."""
    for key, kind in (("k", int), ("rows", int), ("data_fingerprint", str), ("values", str)):
        if type(m.get(key)) is not kind:
            return f"{key!r} should be a {kind.__name__}, got {m.get(key)!r:.60}"
    if m["values"] not in VALUE_CODECS or m["k"] <= 0:
        return f"values {m['values']!r:.40} / k {m['k']} is not a known encoding"
    if not _number(m.get("temperature")):
        return f"'temperature' should be a number, got {m.get('temperature')!r:.60}"
    for key in STEP_KEYS.values():
        v = m.get(key)
        if v is not None and not (_number(v) and 0 < v < math.inf):
            return f"{key!r} should be a positive number or null, got {v!r:.60}"
    if not isinstance(m.get("shards"), list):
        return "'shards' should be a list"
    if problem := _routes_problem(m.get("routes")):
        return problem
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


def _routes_problem(routes: Any) -> str | None:
    """What is wrong with a manifest's `routes` (several teachers' names), or None."""
    if routes is None:
        return None
    names = routes.get("names") if isinstance(routes, dict) else None
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return f"'routes' should hold a list of teacher names, got {routes!r:.60}"
    return None


# the manifest key of each lossy codec's step (absent or null: the codec's default)
STEP_KEYS = {"q8": "logprob_step", "sqrt": "sqrt_step"}


def value_header(values: str, k: int) -> dict[str, Any]:
    """The manifest's codec keys: `values` and the step of a quantising codec."""
    steps = {"q8": LOGPROB_STEP, "sqrt": sqrt_step(k)}
    return {"values": values, **{key: steps.get(values) for key in STEP_KEYS.values()}}


def value_step(manifest: dict[str, Any]) -> float | None:
    key = STEP_KEYS.get(manifest["values"])
    return manifest.get(key) if key else None


def read_shard(cache_dir: Path, entry: dict, k: int, values: str, step: float | None) -> Shard:
    from safetensors.numpy import load_file

    arrays = load_file(str(cache_dir / entry["file"]))
    ids, lps, rest, token = decode_tokens(arrays, k, values, step)
    teacher_ids = arrays.get("teacher_ids")
    if teacher_ids is not None:
        teacher_ids = torch.from_numpy(teacher_ids.astype(np.int64))
    return Shard(
        arrays["rows"],
        arrays["offsets"],
        ids,
        lps,
        rest,
        token,
        teacher_ids,
        arrays.get("route"),
        arrays.get("prompt_sha256"),
    )


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
        elif sha256(path) != entry["sha256"]:
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
