"""Load students and teachers (local directories or hub ids) with the ordinary transformers calls.

Errors a user can cause (a path that is neither a directory nor a reachable hub id, a dtype the
device cannot run) become `ConfigError`s naming the config key and the fix.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch

from distil.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Written next to a saved model so `distil eval` can render prompts the way training did.
META_FILE = "distil_model.json"


def torch_dtype(name: str) -> torch.dtype | str:
    return "auto" if name == "auto" else DTYPES[name]


def checkpoint_dtype(path: str) -> str:
    """The dtype a checkpoint's weights were saved in, a DTYPES name: config.json's `dtype`
    (transformers 5) or `torch_dtype` (older); float32 when it names none or one distil does
    not load in (e.g. float64)."""
    config = Path(os.path.expanduser(path)) / "config.json"
    try:
        if not config.is_file():  # a hub id: the config file in the local hub cache
            from transformers.utils import cached_file

            config = Path(cached_file(path, "config.json"))
        spec = json.loads(config.read_text(encoding="utf-8"))
    except Exception:  # no readable config: the loader reports it when it loads the model
        return "float32"
    name = spec.get("dtype") or spec.get("torch_dtype")
    return name if name in DTYPES else "float32"


def resolve_dtype(name: str, path: str, device: str | torch.device | None) -> str:
    """`student.dtype`/`teacher.dtype` as loaded on `device`: `auto` is the checkpoint's own
    dtype on CUDA (bf16 for Qwen3, Llama-3.2) and float32 elsewhere (CPU kernels run bf16
    slower than fp32, and the CPU runs' numbers stay as they were)."""
    if name != "auto":
        return name
    if device is None or torch.device(device).type != "cuda":
        return "float32"
    return checkpoint_dtype(path)


def enable_tf32(device: str | torch.device | None) -> None:
    """fp32 matmuls on CUDA through TF32 tensor cores (inputs rounded to a 10-bit mantissa,
    fp32 accumulation): torch's "high" matmul precision, process-wide and idempotent. Without
    it an fp32 GEMM runs on the FP32 cores at a small fraction of the bf16 rate. No-op off
    CUDA."""
    if device is not None and torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")


def load_tokenizer(path: str, *, key: str = "student.tokenizer", trust_remote_code: bool = False):
    """AutoTokenizer.from_pretrained with a clear error; pad token falls back to EOS."""
    from transformers import AutoTokenizer

    check_model_path(path, key)
    local = os.path.expanduser(path)
    try:
        tok = AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
        tok = _respect_tokenizer_json(tok, local)
    except Exception as exc:  # a broken tokenizer dir raises many types
        raise ConfigError(
            f"{key} = {path!r}: could not load a tokenizer ({_one_line(exc)}). Fix: point "
            f"{key} to a directory written by save_pretrained or to a hub id available offline"
        ) from exc
    if not tok.is_fast:
        raise ConfigError(
            f"{key} = {path!r} loaded a slow (Python) tokenizer; distil needs a fast tokenizer "
            "(tokenizer.json) for byte offsets. Fix: convert it with "
            "AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(dir)"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def vocab_mismatch(loss_name: str, s_tok, t_tok) -> str | None:
    """Why a same-tokenizer loss cannot compare these two tokenizers' distributions, or None."""
    s_vocab, t_vocab = s_tok.get_vocab(), t_tok.get_vocab()
    if s_vocab == t_vocab:
        return None
    only_s, only_t = len(set(s_vocab) - set(t_vocab)), len(set(t_vocab) - set(s_vocab))
    return (
        f"loss.name = {loss_name!r} compares the two models token by token, but the "
        f"teacher's tokenizer differs from the student's ({len(t_tok)} vs {len(s_tok)} "
        f"tokens; {only_s} only in the student's, {only_t} only in the teacher's). distil "
        "never resizes embeddings to hide this. Fix: use a cross-tokenizer loss "
        "(loss.name=uld, gold or aligned_kl), or a teacher with the student's tokenizer"
    )


def _respect_tokenizer_json(tok, path: str):
    """Keep the tokenizer.json a directory ships.

    transformers 5 builds some model types' tokenizers (e.g. next to a `qwen2` config) from the
    vocabulary alone, ignoring tokenizer.json's merges and pre-tokenizer: different ids, no
    warning. When the loaded pipeline differs from the file, load the file as it is.
    """
    from transformers import PreTrainedTokenizerFast

    saved = Path(path) / "tokenizer.json"
    if not (saved.is_file() and getattr(tok, "is_fast", False)):
        return tok
    if _loaded_pipeline(tok.backend_tokenizer) != _saved_pipeline(saved):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return tok


def _component(part) -> str:
    return json.dumps(None if part is None else json.loads(part.__getstate__()), sort_keys=True)


def _loaded_pipeline(backend) -> tuple[str, ...]:
    """The model type, normalizer, pre-tokenizer and decoder of a loaded tokenizer, read from
    its parts (serializing the whole tokenizer costs seconds at a 262k vocabulary)."""
    parts = (backend.normalizer, backend.pre_tokenizer, backend.decoder)
    return (type(backend.model).__name__, *map(_component, parts))


def _saved_pipeline(saved: Path) -> tuple[str, ...]:
    stat = saved.stat()
    return _pipeline_of_file(str(saved.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _pipeline_of_file(path: str, size: int, mtime_ns: int) -> tuple[str, ...]:
    """The same parts of a tokenizer.json file, parsed once per file version and process."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    parts = (spec.get("normalizer"), spec.get("pre_tokenizer"), spec.get("decoder"))
    return (spec["model"]["type"], *(json.dumps(p, sort_keys=True) for p in parts))


def load_model(
    path: str,
    *,
    key: str = "student.path",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
):
    """AutoModelForCausalLM.from_pretrained with a clear error, moved to `device` if given.

    `dtype` auto resolves against `device` (`resolve_dtype`: the checkpoint's dtype on CUDA,
    float32 elsewhere); an fp32 model on CUDA switches TF32 matmuls on (`enable_tf32`)."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    check_model_path(path, key)
    dtype = resolve_dtype(dtype, path, device)
    if dtype == "float32":
        enable_tf32(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.expanduser(path),
            dtype=torch_dtype(dtype),
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{key} = {path!r}: could not load a causal LM ({exc}). Fix: point {key} to a "
            "directory written by save_pretrained or to a hub id available offline"
        ) from exc
    if device is not None:
        model.to(device)
    return model


def place_model(model, dtype: str, device: str | torch.device | None = None, *, key="student"):
    """An already-loaded causal LM as `load_model` returns one: cast to `dtype` (a DTYPES name;
    auto keeps its own) and moved to `device`; TF32 matmuls for an fp32 model on CUDA."""
    head = getattr(model, "get_output_embeddings", None)
    if head is None or head() is None:
        raise ConfigError(
            f"{key}: got a {type(model).__name__}, not a causal language model with an output "
            "head. Fix: pass a model loaded with AutoModelForCausalLM.from_pretrained (or its "
            "path or hub id)"
        )
    if dtype in DTYPES:
        model.to(DTYPES[dtype])
    if dtype == "float32":
        enable_tf32(device)
    if device is not None:
        model.to(device)
    return model


def as_loaded(model, attn_implementation: str, *, key: str = "student"):
    """An already-loaded model made as `load_model` would load it: in eval mode (from_pretrained
    returns one; a model left in train mode would train with dropout) and with the config's
    attention implementation (`key`.attn_implementation), set where the model can switch."""
    model.eval()
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if current is None or current == attn_implementation:
        return model
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if setter is not None:
            setter(attn_implementation)
    except (ValueError, ImportError) as exc:
        raise ConfigError(
            f"{key}.attn_implementation = {attn_implementation!r}: the loaded {key} cannot "
            f"switch to it ({_one_line(exc)}). Fix: {key}.attn_implementation={current!r} (the "
            "model's own), or load the model with attn_implementation= yourself"
        ) from exc
    if model.config._attn_implementation != attn_implementation:
        import sys

        print(
            f"distil: warning: {key}.attn_implementation = {attn_implementation!r}, but the "
            f"loaded {key} ({type(model).__name__}) cannot switch from {current!r}: it runs "
            f"with {current!r}. Fix: load it with attn_implementation={attn_implementation!r}",
            file=sys.stderr,
        )
    return model


def quiet_transformers() -> None:
    """distil shows its own progress; transformers' per-file bars only add noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def check_model_path(path: str | None, key: str) -> None:
    """ConfigError naming `key` when `path` is unset, unusable, or a local path that does not
    exist (a hub id is left to the loader)."""
    from distil.paths import looks_local, path_problem

    if not path:
        raise ConfigError(f"{key} is not set. Fix: set {key} to a model directory or hub id")
    if problem := path_problem(path, key):
        raise ConfigError(problem)
    if Path(os.path.expanduser(path)).exists():
        return
    if looks_local(path):
        raise ConfigError(f"{key} = {path!r}: no such local directory. Fix: check the path")


def read_model_meta(path: str | Path) -> dict[str, Any]:
    """What distil recorded when it saved this model (prompt template, ...); {} if nothing."""
    meta = Path(path) / META_FILE
    return json.loads(meta.read_text()) if meta.exists() else {}


def write_model_meta(path: str | Path, **meta: Any) -> None:
    target = Path(path) / META_FILE
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    tmp.replace(target)
