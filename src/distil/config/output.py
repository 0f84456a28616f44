"""A config written out: as a dict, as YAML, to a run directory, and the keys two configs
differ in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from distil.config.schema import LOCATION_KEYS, DistilConfig


def to_dict(cfg: DistilConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)


def to_yaml(cfg: DistilConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_resolved(cfg: DistilConfig, run_dir: str | Path) -> Path:
    """Write the resolved config (every value, defaults included) to run_dir/config.yaml."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(to_yaml(cfg))
    tmp.replace(path)
    return path


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def diff(a: DistilConfig, b: DistilConfig, *, include_location: bool = False):
    """Keys whose resolved values differ, as (key, value_a, value_b), in config order."""
    fa, fb = flatten(to_dict(a)), flatten(to_dict(b))
    rows = []
    for key in fa:
        if not include_location and key in LOCATION_KEYS:
            continue
        if fa[key] != fb[key]:
            rows.append((key, fa[key], fb[key]))
    return rows
