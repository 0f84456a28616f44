"""`generation.backend` -> a Generator: the one place that maps the backend name to its class.

Each backend class is named by its import path and imported on first use (vllm only when
chosen), and builds itself from the config with
`from_config(cfg, model, *, pad_id, stop_ids, vocab_limit)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from distil.config import DistilConfig
from distil.errors import ConfigError
from distil.generation.base import Generator

GENERATORS = {
    "hf": "distil.generation.hf:HFGenerator",
    "hf_static": "distil.generation.static:StaticCacheGenerator",
    "vllm": "distil.generation.vllm:VLLMGenerator",
}


def generator_class(name: str):
    """The Generator class registered as `name`, imported on first use."""
    if name not in GENERATORS:
        raise ConfigError(
            f"generation.backend = {name!r} is not a generation backend. Fix: use one of "
            f"{', '.join(GENERATORS)}"
        )
    module, attr = GENERATORS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def build_generator(
    cfg: DistilConfig,
    model,
    *,
    pad_id: int,
    stop_ids: Sequence[int],
    vocab_limit: int | None,
    backend: str | None = None,
) -> Generator:
    """The `generation.backend` generator (or `backend`'s) over `model`, unwrapped from
    DDP/FSDP by the caller. `vocab_limit`: the id rows (largest id + 1) of the tokenizer that
    decodes what it writes; no id at or past it is sampled (a vocabulary padded past the tokenizer)."""
    cls = generator_class(backend or cfg.generation.backend)
    return cls.from_config(
        cfg, model, pad_id=pad_id, stop_ids=list(stop_ids), vocab_limit=vocab_limit
    )


def teacher_backend(cfg: DistilConfig) -> str:
    """The backend a teacher samples with (seq-KD slices, `distil generate`): the configured
    one, except vllm, whose colocated engine serves the student's weights."""
    return "hf" if cfg.generation.backend == "vllm" else cfg.generation.backend
