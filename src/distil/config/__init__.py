"""The typed config tree: one home for every default, YAML + `key.sub=value` overrides.

    cfg = load_config("configs/countdown_onpolicy.yaml", ["train.max_steps=200", "loss.beta=0.5"])

Loading collects every problem before raising one `ConfigError`: unknown keys (with the nearest
valid key), values of the wrong type or out of range (with the fix), and rules that tie several
values together (checked after `resolve()` fills the derived values). The resolved config, every
value included, is written to the run directory as `config.yaml`.
"""

from distil.config.derived import resolve
from distil.config.loading import (
    apply_overrides,
    build_config,
    leaf_fields,
    load_config,
    parse_yaml,
    read_yaml,
)
from distil.config.output import diff, flatten, save_resolved, to_dict, to_yaml
from distil.config.rules import check, semantic_problems
from distil.config.schema import (
    LOCATION_KEYS,
    DataConfig,
    DistilConfig,
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    LossConfig,
    ModelConfig,
    RewardConfig,
    TeacherConfig,
    TrainConfig,
)

__all__ = [
    "LOCATION_KEYS",
    "DataConfig",
    "DistilConfig",
    "EvalConfig",
    "GenerationConfig",
    "LoggingConfig",
    "LossConfig",
    "ModelConfig",
    "RewardConfig",
    "TeacherConfig",
    "TrainConfig",
    "apply_overrides",
    "build_config",
    "check",
    "diff",
    "flatten",
    "leaf_fields",
    "load_config",
    "parse_yaml",
    "read_yaml",
    "resolve",
    "save_resolved",
    "semantic_problems",
    "to_dict",
    "to_yaml",
]
