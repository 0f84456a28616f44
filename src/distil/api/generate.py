"""`distil.generate` and `distil generate`: a model (by default the config's teacher) writes
completions for the config's prompts into a JSONL file that data.train reads (sequence-level
KD data, or a dataset filtered to the completions a task judges correct).

    counts = distil.generate("configs/countdown_teacher.yaml", out="teacher.jsonl",
                             model=teacher, tokenizer=tok, train_data=rows, keep="correct")
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from distil.api.inputs import ConfigLike, Overrides, is_path, make_config


def generate(
    config: ConfigLike = None,
    overrides: Overrides = (),
    *,
    out: str | Path,
    model: Any = None,
    tokenizer: Any = None,
    train_data: Any = None,
    n: int | None = None,
    keep: str = "all",
    batch_size: int = 16,
) -> dict[str, int]:
    """Write the completions to `out`; returns {"prompts", "completions", "kept"}.

    `model`: a directory or hub id, or a loaded model with its `tokenizer` (default: the
    config's teacher); `tokenizer`: an object or a path, used in place of the model's own;
    `train_data` (data.train): a path or hub id, a Dataset or a list of dicts; `n`
    completions per prompt (default generation.num_generations); `keep="correct"`: only those
    eval.task judges correct."""
    from distil.preflight import check
    from distil.teacher.generate import generate_completions

    with tempfile.TemporaryDirectory(prefix="distil-generate-") as tmp:
        given = model is not None and not is_path(model)
        models = {"teacher": (model, tokenizer)} if given else {}
        cfg, loaded = make_config(
            config, overrides, models=models, data={"data.train": train_data}, root=tmp
        )
        check(cfg, "generate")
        path = cfg.teacher.path if given else (str(model) if model is not None else None)
        if given:  # the object itself, or the path make_config set as teacher.tokenizer
            tokenizer = tokenizer if not is_path(tokenizer) else cfg.teacher.tokenizer
        return generate_completions(
            cfg,
            out,
            model_path=path,
            model=loaded.get("teacher"),
            tokenizer=tokenizer,
            n=n,
            keep=keep,
            batch_size=batch_size,
        )
