"""Derived values: the keys left null that the config fills from its other values (a
tokenizer from its model path, generation_batch_size from the window, run_name from
output_dir), in one place: `resolve` fills them, `underive` clears those a resolved config
holds so that overrides of what they come from are followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from distil.config.schema import DistilConfig


def derived_values(cfg: DistilConfig) -> dict[tuple[str, ...], Any]:
    """What each derived key (as a path of names) is derived to from `cfg`'s other values; the
    one place these derivations live (`resolve` fills them, `underive` clears them)."""
    gen, train = cfg.generation, cfg.train
    window = train.per_device_batch_size * train.grad_accum_steps
    out: dict[tuple[str, ...], Any] = {
        ("student", "tokenizer"): cfg.student.path,
        ("teacher", "tokenizer"): cfg.teacher.path,
        ("generation", "generation_batch_size"): (
            window // gen.num_generations if window % gen.num_generations == 0 else None
        ),
        ("logging", "run_name"): Path(train.output_dir).name,
    }
    for name, t in cfg.teachers.models.items():
        out[("teachers", "models", name, "tokenizer")] = t.path
    return out


def resolve(cfg: DistilConfig) -> DistilConfig:
    """Fill the derived values left null (`derived_values`); returns a new config."""
    cfg = cfg.model_copy(deep=True)
    for keys, value in derived_values(cfg).items():
        node = _node(cfg, keys[:-1])
        if getattr(node, keys[-1]) is None:
            setattr(node, keys[-1], value)
    return cfg


def underive(raw: dict[str, Any]) -> None:
    """Clear (to null, in place) each derived value of the config dict `raw` that still equals
    its derivation, so that `resolve` derives it again from the values overrides then change.

    A resolved config written out (a DistilConfig dumped, a run directory's config.yaml) holds
    every derived value; without this, an override of train.output_dir would keep the old
    logging.run_name, one of student.path the old tokenizer. A value set to something else is
    kept. `raw` that does not validate is left as it is (its problems are reported later)."""
    try:
        cfg = DistilConfig.model_validate(raw)
    except ValidationError:
        return
    for keys, value in derived_values(cfg).items():
        node: Any = raw
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and value is not None and node.get(keys[-1]) == value:
            node[keys[-1]] = None


def _node(root: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        root = root[key] if isinstance(root, dict) else getattr(root, key)
    return root
