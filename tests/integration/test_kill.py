"""SIGKILL at the worst moments (mid-step, mid-checkpoint, just before the rename, and at
random times), then `distil train` again: the finished run equals an uninterrupted one."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from distil.config import build_config
from distil.models.load import load_model
from distil.testing import read_metrics
from distil.train import loop
from warm import popen

pytestmark = pytest.mark.slow

# The real CLI in a child process. argv: src dir, seconds of sleep per micro-batch, where to
# kill itself ("micro:N" = in the N-th micro-batch, "manifest:S" = while writing the manifest
# of checkpoint S, "rename:S" = after the manifest, before the rename; "none"), config path.
CHILD = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from distil.train import checkpoint, loop
delay, kill_at = float(sys.argv[2]), sys.argv[3]
where, _, n = kill_at.partition(":")
real_micro, real_write, real_fsync = loop.micro_step, checkpoint.write_text, checkpoint.fsync_dir
calls = [0]
def micro(*a, **k):
    calls[0] += 1
    if where == "micro" and calls[0] == int(n):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(delay)
    return real_micro(*a, **k)
def write(path, text):
    if where == "manifest" and path.name == "manifest.json" and f"{int(n):08d}" in str(path):
        path.write_text(text[: len(text) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(path, text)
def fsync_dir(path):
    real_fsync(path)
    if where == "rename" and path.name == f"step-{int(n):08d}.tmp":
        os.kill(os.getpid(), signal.SIGKILL)
loop.micro_step, checkpoint.write_text, checkpoint.fsync_dir = micro, write, fsync_dir
from distil.cli import main
raise SystemExit(main(["train", sys.argv[4]]))
"""


def start(cfg_path, kill_at="none", delay=0.0):
    src = str(Path(loop.__file__).parents[2])
    # a real process, forked from the warm interpreter (tests/warm.py): killed as any other
    return popen(
        [sys.executable, "-c", CHILD, src, str(delay), kill_at, str(cfg_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.budget(160, "kills training processes at many moments and resumes each")
def test_sigkill_at_any_moment_then_resume_equals_the_uninterrupted_run(
    tmp_path, make_train_config
):
    steps = 10
    raw = make_train_config(train={"max_steps": steps, "save_every": 1, "keep_last": 3})
    loop.train(build_config(raw))  # the uninterrupted reference in tmp_path/run
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    killed = tmp_path / "killed"
    ckpts = killed / "checkpoints"

    def kill(kill_at):
        child = start(cfg_path, kill_at)
        _, err = child.communicate(timeout=300)
        assert child.returncode == -signal.SIGKILL, (kill_at, err[-2000:])
        return sorted(p.name for p in ckpts.iterdir())

    # micro:N counts micro-batches (2 per step) of the restarted process, after its resume
    assert kill("manifest:2") == ["step-00000001", "step-00000002.tmp"]
    assert kill("micro:7") == ["step-00000002", "step-00000003", "step-00000004"]  # in step 5
    assert kill("rename:5")[-1] == "step-00000005.tmp"  # complete but never renamed: unused
    assert (ckpts / "step-00000005.tmp" / "manifest.json").exists()
    assert kill("micro:5")[-1] == "step-00000006"  # in step 7
    rng = random.Random(0)
    # random moments (startup, steps, checkpoints, the final save): a forked child starts in
    # well under a second, and its 8 micro-batches left take 0.3 s each at least
    for _ in range(3):
        child = start(cfg_path, delay=0.3)
        time.sleep(rng.uniform(0.0, 2.5))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.communicate(timeout=300)
    child = start(cfg_path)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    ref, got = read_metrics(tmp_path / "run"), read_metrics(killed)
    assert [m["step"] for m in got] == list(range(1, steps + 1))
    for a, b in zip(ref, got, strict=True):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], a["step"]
    wa = load_model(str(tmp_path / "run" / "final")).state_dict()
    wb = load_model(str(killed / "final")).state_dict()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
