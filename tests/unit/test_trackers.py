"""Trackers get logging.run_name, and a resumed run continues the same tracker run: W&B in
its offline mode (it writes the run to disk), MLflow with a local file store, trackio's local
database, TensorBoard's directory. Each run trains 2 steps with a checkpoint per step, then
the same config resumes to 3 or 4 steps."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from distil.config import build_config
from distil.testing import read_metrics
from distil.train import loop
from distil.train.trackers import IDS_FILE


def _train_then_resume(make_train_config, tracker: str, steps: int = 4) -> Path:
    for max_steps in (2, steps):
        raw = make_train_config(
            train={"max_steps": max_steps, "save_every": 1},
            logging={"trackers": [tracker], "run_name": "my-run", "project": "proj"},
        )
        loop.train(build_config(raw))
    return Path(raw["train"]["output_dir"])


def test_wandb_offline_run_is_named_and_continued_on_resume(
    tmp_path, make_train_config, monkeypatch
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = _train_then_resume(make_train_config, "wandb")
    run_id = json.loads((run / IDS_FILE).read_text())["wandb"]
    dirs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in dirs)  # one run, twice
    for d in dirs:  # the run record (protobuf) holds the name and the project
        data = (d / f"run-{run_id}.wandb").read_bytes()
        assert b"my-run" in data and b"proj" in data
    fresh = make_train_config(
        train={"max_steps": 1, "resume": "never", "output_dir": str(tmp_path / "other")},
        logging={"trackers": ["wandb"], "run_name": "my-run"},
    )
    loop.train(build_config(fresh))  # a new run directory: a new W&B run
    assert json.loads((tmp_path / "other" / IDS_FILE).read_text())["wandb"] != run_id


def test_mlflow_run_is_named_and_continued_on_resume(tmp_path, make_train_config, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny: no database store
    run = _train_then_resume(make_train_config, "mlflow", steps=3)
    run_id = json.loads((run / IDS_FILE).read_text())["mlflow"]
    client = mlflow.tracking.MlflowClient()
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    (only,) = client.search_runs([experiment.experiment_id])
    assert only.info.run_id == run_id and only.info.run_name == "my-run"
    history = client.get_metric_history(run_id, "loss")
    logged = read_metrics(run)
    assert [(h.step, h.value) for h in history] == [(m["step"], m["loss"]) for m in logged]
    assert only.data.params["train.max_steps"] == "2"  # params are set once, by the first run


def test_trackio_run_is_named_and_continued_on_resume(tmp_path, make_train_config, monkeypatch):
    pytest.importorskip("trackio")
    import trackio.sqlite_storage
    import trackio.utils

    store = tmp_path / "trackio"
    store.mkdir()
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    monkeypatch.setattr(trackio.utils, "TRACKIO_DIR", store)
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", store)
    run = _train_then_resume(make_train_config, "trackio", steps=3)
    db_path = next(store.glob("proj*.db"))
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "select run_name, step, metrics, run_id from metrics order by id"
        ).fetchall()
    assert [(name, step) for name, step, *_ in rows] == [
        ("my-run", 1),
        ("my-run", 2),
        ("my-run", 3),
    ]
    assert [json.loads(m)["loss"] for _, _, m, _ in rows] == [m["loss"] for m in read_metrics(run)]
    (run_id,) = {r[3] for r in rows}  # one run, continued
    fresh = make_train_config(
        train={"max_steps": 1, "resume": "never", "output_dir": str(tmp_path / "other")},
        logging={"trackers": ["trackio"], "run_name": "my-run", "project": "proj"},
    )
    loop.train(build_config(fresh))  # a new run directory, the same name: a new trackio run
    with sqlite3.connect(db_path) as db:
        rows = db.execute("select run_id, step from metrics order by id").fetchall()
    assert rows[:3] == [(run_id, 1), (run_id, 2), (run_id, 3)]  # the old run left as it was
    assert len(rows) == 4 and rows[3][0] != run_id and rows[3][1] == 1


def test_tensorboard_writes_under_the_run_name(make_train_config):
    pytest.importorskip("tensorboard")
    run = _train_then_resume(make_train_config, "tensorboard", steps=3)
    events = sorted((run / "tensorboard" / "my-run").glob("events.out.tfevents.*"))
    assert len(events) == 2  # one file per process run, in the same run's directory
