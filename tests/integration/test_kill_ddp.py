"""Two ranks (torchrun's worker environment, gloo on CPU): every rank's RNG is checkpointed,
a run SIGKILLed in the middle resumes on both ranks from the same verified checkpoint, and
finishes exactly like the uninterrupted two-rank run."""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from distil.train import loop
from warm import launch_ranks

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

# torchrun's worker: on rank 1, kill the whole job (SIGKILL to the process group) in the N-th
# micro-batch (N > 0), or make every loss from micro-batch -N on NaN (N < 0)
CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from distil.train import loop
real, calls, n = loop.micro_step, [0], int(sys.argv[2])
def micro(*a, **k):
    calls[0] += 1
    rank1 = os.environ.get("RANK") == "1"
    if calls[0] == n and rank1:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    out = real(*a, **k)
    if n < 0 and calls[0] >= -n and rank1:
        out.loss = out.loss * float("nan")
        out.metrics["loss_sum"] = out.metrics["loss_sum"] * float("nan")
    return out
loop.micro_step = micro
from distil.cli import main
raise SystemExit(main(["train", sys.argv[3]]))
"""


def torchrun(tmp_path, cfg_path, kill_at_micro=0, port=29531):
    """Two ranks with torchrun's worker environment, forked from the warm interpreter
    (tests/warm.py; tests/integration/test_ddp.py launches torchrun itself)."""
    src = str(Path(loop.__file__).parents[2])
    cmd = [sys.executable, "-c", CHILD, src, str(kill_at_micro), str(cfg_path)]
    return launch_ranks(cmd, 2, port)


@pytest.mark.budget(100, "two ranks killed mid-run and resumed, against the uninterrupted run")
def test_two_ranks_killed_mid_run_resume_exactly(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 5, "save_every": 1, "keep_last": 5})
    paths = {}
    for name in ("full", "killed"):
        cfg = {**raw, "train": {**raw["train"], "output_dir": str(tmp_path / name)}}
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(cfg))
    full = torchrun(tmp_path, paths["full"], port=29531)
    assert full.returncode == 0, full.stderr[-3000:]
    killed = torchrun(tmp_path, paths["killed"], kill_at_micro=7, port=29532)  # in step 4
    assert killed.returncode != 0
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert ckpts[-1] == "step-00000003", ckpts
    last = tmp_path / "killed" / "checkpoints" / "step-00000003"
    assert (last / "rng_state_0.safetensors").exists() and (
        last / "rng_state_1.safetensors"
    ).exists()
    resumed = torchrun(tmp_path, paths["killed"], port=29533)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step-00000003" in resumed.stdout
    read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    a, b = read(tmp_path / "full"), read(tmp_path / "killed")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], x["step"]
    from safetensors.torch import load_file

    wa = load_file(tmp_path / "full" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_a_nan_loss_on_one_rank_stops_every_rank_with_its_name(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 6, "save_every": 1, "max_consecutive_skips": 2})
    cfg_path = tmp_path / "nan.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    run = torchrun(tmp_path, cfg_path, kill_at_micro=-3, port=29534)  # from step 2 on, rank 1
    assert run.returncode != 0
    assert "non-finite loss on rank 1)" in run.stderr
    assert "2 consecutive steps had a non-finite loss or gradient" in run.stderr
    # both ranks stop with the same DistilError at the same step (the launch then reports exit 2)
    assert run.stderr.count("distil: error: training stopped at step 3: 2 consecutive") == 2
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-00000001"]
