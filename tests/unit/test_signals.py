"""SIGINT/SIGTERM: the step in progress finishes, a checkpoint is written, the run exits with
128 + the signal number, and resuming gives exactly the uninterrupted run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import warm
from distil.config import build_config
from distil.models.load import load_model
from distil.testing import read_metrics
from distil.train import loop
from distil.train.signals import TrainingInterrupted


def assert_same_run(ref_dir, run_dir, steps):
    ref, got = read_metrics(ref_dir), read_metrics(run_dir)
    assert [m["step"] for m in got] == list(range(1, steps + 1))
    for a, b in zip(ref, got, strict=True):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], a["step"]
    wa = load_model(str(ref_dir / "final")).state_dict()
    wb = load_model(str(run_dir / "final")).state_dict()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_sigint_finishes_the_step_saves_and_resumes_exactly(
    tmp_path, make_train_config, monkeypatch
):
    raw = make_train_config(train={"max_steps": 4})
    loop.train(build_config(raw))  # uninterrupted reference in tmp_path/run
    raw["train"]["output_dir"] = str(tmp_path / "stopped")
    real, calls = loop.micro_step, {"n": 0}

    def ctrl_c_in_step_2(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # first micro-batch of step 2
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "micro_step", ctrl_c_in_step_2)
    torch.manual_seed(0)
    # the handler the run found (SIG_IGN when the tests run in a background job)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as info:
        loop.train(build_config(raw))
    assert info.value.exit_code == 130 and "SIGINT after step 2" in str(info.value)
    assert calls["n"] == 4  # the step in progress was finished, no further one started
    assert signal.getsignal(signal.SIGINT) is before  # restored
    assert (tmp_path / "stopped" / "checkpoints" / "step-00000002" / "manifest.json").exists()
    monkeypatch.setattr(loop, "micro_step", real)
    loop.train(build_config(raw))
    assert_same_run(tmp_path / "run", tmp_path / "stopped", 4)


# The real CLI in a child process, each micro-batch slowed down so that the signal lands in the
# middle of the run. Default checkpoint settings: no train.save_every.
SLOW_CLI = """
import sys, time
sys.path.insert(0, sys.argv[1])
from distil.train import loop
real = loop.micro_step
def slow(*a, **k):
    time.sleep(float(sys.argv[2]))
    return real(*a, **k)
loop.micro_step = slow
from distil.cli import main
raise SystemExit(main(["train", *sys.argv[3:]]))
"""


def run_cli(cfg_path, delay, *overrides):
    src = str(Path(loop.__file__).parents[2])
    return warm.popen(  # a real process, forked from the warm interpreter (tests/warm.py)
        [sys.executable, "-c", SLOW_CLI, src, str(delay), str(cfg_path), *overrides],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_with_default_settings_checkpoints_and_resumes(tmp_path, make_train_config, capsys):
    raw = make_train_config(train={"max_steps": 8})
    assert "save_every" not in raw["train"]  # the defaults: only the time-based saves
    loop.train(build_config(raw))  # uninterrupted reference in tmp_path/run
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    child = run_cli(cfg_path, 0.2)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    assert "distil: stopped: training stopped by SIGTERM" in err and "Traceback" not in err
    assert "error" not in err  # a stop that was asked for is not reported as an error
    steps = [int(p.name.split("-")[1]) for p in (tmp_path / "killed" / "checkpoints").iterdir()]
    assert len(steps) == 1 and 2 <= steps[0] < 8
    assert len(read_metrics(tmp_path / "killed")) == steps[0]
    loop.train(build_config(raw))  # the same command again (here in-process: faster)
    assert f"resumed from {tmp_path / 'killed' / 'checkpoints'}" in capsys.readouterr().out
    assert_same_run(tmp_path / "run", tmp_path / "killed", 8)
