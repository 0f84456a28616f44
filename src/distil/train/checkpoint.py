"""Checkpoints a killed run can resume from, and the final Hugging Face model.

A checkpoint is `run_dir/checkpoints/step-00000010/`, holding only safetensors and JSON, so
loading one never unpickles anything:

    model.safetensors          the student's weights (LoRA: adapters and frozen base)
    optimizer.safetensors      every tensor of the optimizer state, keyed state/<param>/<name>
    optimizer.json             the rest of the optimizer state: param groups, hyperparameters
    rng_state_<rank>.safetensors  torch CPU/CUDA, numpy and python `random` states of each rank
    trainer_state.json         step, buffer position, counters, training clock
    sampler.safetensors        generation.async only: the weights sampling the window in flight
    config.yaml                the resolved config the run had when it wrote the checkpoint
    manifest.json              size and sha256 of every file above; written last

Everything is written into `step-N.tmp/`, each file and the directory are fsynced, and the
directory is renamed into place (then its parent is fsynced), so a `step-N/` directory is
complete unless the storage itself lost data; the manifest catches that (a truncated, emptied
or altered file) before anything is loaded. The learning rate is a function of the step and the
training clock, both in the trainer state, so there is no scheduler state.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distil.errors import DistilError
from distil.files import fsync_dir, sha256
from distil.train.fsdp import (
    full_model_state,
    full_optimizer_state,
    is_sharded,
    load_full_state,
)
from distil.train.tensorfile import write_safetensors, write_text

STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIM_TENSORS = "optimizer.safetensors"
OPTIM_META = "optimizer.json"
CONFIG_FILE = "config.yaml"
MANIFEST = "manifest.json"
FORMAT = "distil-checkpoint-1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(DistilError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.safetensors"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every `step-N` directory under run_dir/checkpoints, newest first (complete or not)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


# ----------------------------------------------------------------------------- save


def save_checkpoint(
    accelerator,
    run_dir: str | Path,
    step: int,
    state: dict[str, Any],
    keep_last: int,
    *,
    model,
    optimizer,
    config_text: str,
    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write checkpoint `step` atomically (every rank calls this); returns its directory.

    `extra_tensors` ({file name: tensors}, e.g. generation.async's sampler weights) are saved
    by the main process as more safetensors files of the checkpoint, covered by the manifest.
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    main = accelerator.is_main_process
    if main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    model_state = full_model_state(accelerator, model)  # a collective under sharded training
    unwrapped = accelerator.unwrap_model(model)
    # FSDP: the whole optimizer state gathered to rank 0, indexed like an unsharded run's
    optim_state = full_optimizer_state(unwrapped, optimizer) if is_sharded(unwrapped) else None
    digests: dict[str, str] = {}  # sha256 of each file this process wrote, hashed as written
    if main:
        digests[MODEL_FILE] = _save_model(unwrapped, model_state, tmp / MODEL_FILE)
        digests.update(_save_optimizer(optimizer, tmp, optim_state))
        for name, tensors in (extra_tensors or {}).items():
            digests[name] = write_safetensors(tensors, tmp / name)
    rng_name = rng_file(accelerator.process_index)
    digests[rng_name] = _save_rng(tmp / rng_name)
    accelerator.wait_for_everyone()
    if main:
        digests[STATE_FILE] = write_text(
            tmp / STATE_FILE, json.dumps(state, indent=2, sort_keys=True)
        )
        digests[CONFIG_FILE] = write_text(tmp / CONFIG_FILE, config_text)
        files = sorted(p.name for p in tmp.iterdir())
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": accelerator.num_processes,
            # other ranks' RNG files (small) are the only ones read back
            "files": {name: _describe(tmp / name, digests.get(name)) for name in files},
        }
        write_text(tmp / MANIFEST, json.dumps(manifest, indent=2))  # last: marks completeness
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        _prune(root, keep_last)
    accelerator.wait_for_everyone()
    return final


def _save_model(unwrapped: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> str:
    # tied weights (embedding == lm_head) share storage; keep the first name of each
    seen: set[tuple] = set()
    flat = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride())
        if key in seen:
            continue
        seen.add(key)
        flat[name] = t  # copied to the host one tensor at a time, as it is written
    return write_safetensors(flat, path)


def _save_optimizer(optimizer, out: Path, sd: dict | None = None) -> dict[str, str]:
    """Write optimizer.safetensors and optimizer.json; their sha256 by name."""
    sd = optimizer.state_dict() if sd is None else sd
    tensors, plain = {}, {}
    for pid, entry in sd["state"].items():
        plain[str(pid)] = {}
        for name, v in entry.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state/{pid}/{name}"] = v
            else:
                plain[str(pid)][name] = _encode(v)
    meta = {"state": plain, "param_groups": _encode(sd["param_groups"])}
    return {
        OPTIM_TENSORS: write_safetensors(tensors, out / OPTIM_TENSORS),
        OPTIM_META: write_text(out / OPTIM_META, json.dumps(meta, indent=2)),
    }


def _save_rng(path: Path) -> str:
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors = {
        "torch_cpu": torch.get_rng_state(),
        "python_mt": torch.tensor(mt, dtype=torch.int64),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda_{i}"] = s
    meta = {
        "python": json.dumps({"version": version, "gauss_next": gauss}),
        "numpy": json.dumps({"kind": kind, "pos": pos, "has_gauss": has_gauss, "cached": cached}),
    }
    return write_safetensors(tensors, path, metadata=meta)


# ----------------------------------------------------------------------------- verify


def verify_checkpoint(path: str | Path, world_size: int = 1) -> list[str]:
    """What is wrong with checkpoint `path` (one line per problem, naming the file); [] if it
    is complete: the manifest lists every file this run needs and each matches its size and
    sha256."""
    path = Path(path)
    if not path.is_dir():
        return [f"{path} is not a directory"]
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return [
            f"{MANIFEST} is missing (the checkpoint was never finished, or was written by an "
            "older distil in pickle format, which is not loaded)"
        ]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        files = None
    valid = isinstance(files, dict) and all(
        isinstance(k, str) and k == Path(k).name and isinstance(v, dict) for k, v in files.items()
    )
    if not valid:
        return [f"{MANIFEST} is not a valid manifest (truncated or corrupted)"]
    needed = [MODEL_FILE, OPTIM_TENSORS, OPTIM_META, STATE_FILE, CONFIG_FILE]
    needed += [rng_file(r) for r in range(world_size)]
    problems = [
        f"{name} is not in {MANIFEST}"
        + (
            f" (the checkpoint was written by {manifest.get('world_size')} processes, this "
            f"run has {world_size})"
            if name.startswith("rng_state_")
            else ""
        )
        for name in needed
        if name not in files
    ]
    for name, want in files.items():
        problems += _check_file(path / name, want)
    return problems


def _check_file(file: Path, want: dict) -> list[str]:
    if not file.is_file():
        return [f"{file.name} is missing"]
    size = file.stat().st_size
    if size != want.get("bytes"):
        return [
            f"{file.name} has {size} bytes, the manifest says {want.get('bytes')} "
            "(truncated, emptied or overwritten)"
        ]
    if sha256(file) != want.get("sha256"):
        return [f"{file.name} does not match its sha256 in the manifest (corrupted)"]
    return []


# ----------------------------------------------------------------------------- load


def read_config_text(path: str | Path) -> str:
    return (Path(path) / CONFIG_FILE).read_text()


def load_checkpoint(accelerator, path: str | Path, *, model, optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG states in place; return the trainer state.

    Call `verify_checkpoint` first; a file that still fails to parse raises CheckpointError.
    """
    from safetensors.torch import load_file

    path = Path(path)
    unwrapped = accelerator.unwrap_model(model)
    try:
        current = path / MODEL_FILE
        weights = load_file(str(current))
        _check_names(unwrapped, weights)
        current = path / OPTIM_TENSORS
        tensors = load_file(str(current))
        current = path / OPTIM_META
        meta = json.loads(current.read_text())
        if is_sharded(unwrapped):  # every rank keeps its shard of the full tensors
            load_full_state(unwrapped, optimizer, weights, _optimizer_dict(tensors, meta))
        else:
            _load_model(unwrapped, weights)
            _load_optimizer(optimizer, tensors, meta)
        current = path / rng_file(accelerator.process_index)
        _load_rng(current)
        current = path / STATE_FILE
        return json.loads(current.read_text())
    except DistilError:
        raise
    except Exception as exc:  # a parse error of a file that passed its checksum
        raise CheckpointError(
            f"checkpoint {path}: {current.name} cannot be loaded ({type(exc).__name__}: {exc}). "
            f"Fix: resume from another checkpoint with train.resume=<dir>, or start over with "
            "train.resume=never"
        ) from exc


def _check_names(unwrapped: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    own = unwrapped.state_dict()
    missing = set(own) - set(saved)
    # names dropped as duplicates on save: the tied twin restores them
    tied = {n for n in missing if any(_same(own[n], own[m]) for m in saved if m in own)}
    unexpected = set(saved) - set(own)
    if missing - tied or unexpected:
        raise ValueError(
            f"the weights do not fit the student (missing {sorted(missing - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )


def _load_model(unwrapped: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    own = unwrapped.state_dict()
    with torch.no_grad():
        for name, t in saved.items():
            own[name].copy_(t)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = _local(a), _local(b)  # an FSDP shard: the same local storage means the same weight
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.shape == b.shape


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _load_optimizer(optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    from distil.train.optim import drop_masters

    optimizer.load_state_dict(drop_masters(optimizer, _optimizer_dict(tensors, meta)))


def _optimizer_dict(tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, Any]:
    """The saved state in `torch.optim.Optimizer.state_dict()` form (indexed parameters)."""
    state: dict[int, dict[str, Any]] = {int(pid): _decode(e) for pid, e in meta["state"].items()}
    for key, t in tensors.items():
        _, pid, name = key.split("/", 2)
        state.setdefault(int(pid), {})[name] = t
    return {"state": state, "param_groups": _decode(meta["param_groups"])}


def _load_rng(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    py, npm = json.loads(meta["python"]), json.loads(meta["numpy"])
    random.setstate((py["version"], tuple(tensors["python_mt"].tolist()), py["gauss_next"]))
    keys = tensors["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state((npm["kind"], keys, npm["pos"], npm["has_gauss"], npm["cached"]))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[f"cuda_{i}"] for i in range(len(tensors)) if f"cuda_{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------- files


def _encode(v: Any) -> Any:
    """JSON form of optimizer hyperparameters; tuples (AdamW betas) are tagged to come back."""
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _encode(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"optimizer state value of type {type(v).__name__} has no JSON form: {v!r}")


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__tuple__"}:
            return tuple(_decode(x) for x in v["__tuple__"])
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def _describe(path: Path, digest: str | None = None) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": digest or sha256(path)}


def _prune(root: Path, keep_last: int) -> None:
    done = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, p in done[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def save_final_model(
    accelerator,
    model,
    tokenizer,
    out_dir: str | Path,
    *,
    files: dict[str, str] | None = None,
    **meta: Any,
) -> Path:
    """Weights, config, generation config, tokenizer (chat template included), distil's model
    metadata and the text `files` ({name: text}: the model card, the config), in the layout
    plain `transformers` loads. LoRA adapters are merged."""
    from distil.models.load import quiet_transformers, write_model_meta

    quiet_transformers()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    unwrapped = accelerator.unwrap_model(model)
    state_dict = full_model_state(accelerator, model)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        if hasattr(unwrapped, "merge_and_unload"):  # peft: save a plain model
            unwrapped = unwrapped.merge_and_unload()
            state_dict = None
        unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_model_meta(tmp, **meta)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    accelerator.wait_for_everyone()
    return out
