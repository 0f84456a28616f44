"""The Python API (docs/python.md): `Distiller` (validate, plan, train), `evaluate`,
`generate`; `distil` exports them. The command line's train, eval, generate and config
validate commands are thin layers over these functions, so the two cannot drift."""

from distil.api.distiller import Distiller, TrainResult
from distil.api.evaluate import evaluate
from distil.api.generate import generate

__all__ = ["Distiller", "TrainResult", "evaluate", "generate"]
