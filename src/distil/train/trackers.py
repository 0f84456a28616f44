"""Experiment trackers (`logging.trackers`: tensorboard, wandb, trackio, mlflow) through
accelerate, each given `logging.project` and `logging.run_name`.

A resumed run continues the same tracker run instead of opening a new one: the ids W&B and
MLflow give a run are kept in the run directory (`trackers.json`) and handed back on resume;
trackio continues the run of the same name (`resume="allow"`, on resume only: a fresh start
opens a new trackio run even where the project holds one of that name); TensorBoard appends
to the same directory, `output_dir/tensorboard/<run_name>`. A run that starts over (no
checkpoint to resume from) opens new tracker runs. W&B writes its files under the run
directory (`wandb/`); MLflow logs to MLFLOW_TRACKING_URI, its metric names with "." for "/"
(`log_metrics`).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from distil.config import DistilConfig
from distil.errors import require
from distil.files import atomic_write

# logging.trackers name -> the module it needs (the `trackers` extra installs them all)
TRACKER_MODULES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trackio": "trackio",
    "mlflow": "mlflow",
}
IDS_FILE = "trackers.json"


def log_with(cfg: DistilConfig) -> list | None:
    """`Accelerator(log_with=...)`: the tracker names, TensorBoard as a tracker object so that
    its directory carries the run name. Raises naming the extra when a module is missing."""
    names = list(cfg.logging.trackers)
    for name in names:
        require(TRACKER_MODULES[name], "trackers", f"logging.trackers={name}")
    if "tensorboard" in names:
        from accelerate.tracking import TensorBoardTracker

        where = Path(cfg.train.output_dir) / "tensorboard"
        names[names.index("tensorboard")] = TensorBoardTracker(cfg.logging.run_name, where)
    return names or None


def start_trackers(accelerator, cfg: DistilConfig, resumed: bool) -> None:
    """Open (or, for a resumed run, reopen) each tracker's run and record the config in it."""
    names = cfg.logging.trackers
    if not names:
        return
    run_dir = Path(cfg.train.output_dir)
    kept = read_ids(run_dir) if resumed else {}
    name = cfg.logging.run_name
    wandb_id = kept.get("wandb") or secrets.token_hex(4)  # W&B ids: [a-z0-9], ours 8 hex digits
    init_kwargs = {
        "wandb": {"name": name, "id": wandb_id, "resume": "allow", "dir": str(run_dir)},
        "trackio": {"name": name, "resume": "allow" if resumed else "never"},
        "mlflow": {"run_name": name, "run_id": kept.get("mlflow")},
    }
    accelerator.init_trackers(
        cfg.logging.project, init_kwargs={k: v for k, v in init_kwargs.items() if k in names}
    )
    config = flat_config(cfg)
    for tracker in accelerator.trackers:
        # MLflow params cannot change once logged: a reopened MLflow run keeps its first ones
        if not (tracker.name == "mlflow" and kept.get("mlflow")):
            tracker.store_init_configuration(config)
    if accelerator.is_main_process:
        ids = {"wandb": wandb_id} if "wandb" in names else {}
        if "mlflow" in names:
            ids["mlflow"] = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
        text = json.dumps(ids, indent=2, sort_keys=True) + "\n"
        atomic_write(run_dir / IDS_FILE, lambda tmp: Path(tmp).write_text(text))


def log_metrics(accelerator, metrics: dict[str, Any]) -> None:
    """A step's numbers to every tracker (main process). MLflow gets `loss.on_policy` for
    `loss/on_policy`: its file store keeps a metric as a file named after it, so `loss` and
    `loss/on_policy` cannot both exist there."""
    if not accelerator.is_main_process:
        return
    numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
    for tracker in accelerator.trackers:
        if tracker.name == "mlflow":
            tracker.log({k.replace("/", "."): v for k, v in numbers.items()}, step=metrics["step"])
        else:
            tracker.log(numbers, step=metrics["step"])


def read_ids(run_dir: str | Path) -> dict[str, str]:
    """The tracker run ids kept in `run_dir` ({} when none were)."""
    path = Path(run_dir) / IDS_FILE
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def flat_config(cfg: DistilConfig) -> dict[str, Any]:
    """The resolved config as flat `section.key: value` pairs of plain types (trackers'
    hyperparameter tables)."""
    from distil.config import flatten, to_dict

    return {
        k: (v if isinstance(v, (int, float, str, bool)) else str(v))
        for k, v in flatten(to_dict(cfg)).items()
    }
