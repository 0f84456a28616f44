"""distil: distil large language models from a teacher's next-token distributions.

The Python API (docs/python.md), the same runs as the command line:

    import distil
    result = distil.Distiller("configs/countdown_onpolicy.yaml", {"train.max_steps": 200}).train()
    distil.evaluate(result.final_model, task="countdown", n=500).summary["accuracy"]

The names below are imported when first used, so `import distil` (and `distil --help`) stay
quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# exported name -> the module that defines it
_EXPORTS = {
    "Distiller": "distil.api.distiller",
    "TrainResult": "distil.api.distiller",
    "Callback": "distil.train.callbacks",
    "evaluate": "distil.api.evaluate",
    "generate": "distil.api.generate",
    "plan": "distil.plan",  # the package itself, callable: distil.plan(config, ...)
    "DistilConfig": "distil.config",
    "load_config": "distil.config",
    "DistilError": "distil.errors",
    "ConfigError": "distil.errors",
    "DataError": "distil.errors",
}
__all__ = [
    "Callback",
    "ConfigError",
    "DataError",
    "DistilConfig",
    "DistilError",
    "Distiller",
    "TrainResult",
    "__version__",
    "evaluate",
    "generate",
    "load_config",
    "plan",
]

if TYPE_CHECKING:
    from distil.api.distiller import Distiller, TrainResult
    from distil.api.evaluate import evaluate
    from distil.api.generate import generate
    from distil.config import DistilConfig, load_config
    from distil.errors import ConfigError, DataError, DistilError
    from distil.plan import plan
    from distil.train.callbacks import Callback


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'distil' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if module.__name__ == f"distil.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
