"""Two processes (torchrun, gloo on CPU) train exactly like one process with the whole batch:
the loss divides by the loss tokens of the window over all ranks, and DDP averages gradients.
The one process is this one (`loop.train`, one thread like each rank). And two ranks skip a
grpo window (reward.skip_flat) only when its groups are flat on both."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from distil.config import load_config
from distil.train import loop

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]


@pytest.mark.budget(100, "a two-rank torchrun launch beside the one-process run")
def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path, make_train_config):
    base = make_train_config(
        train={
            "max_steps": 3,
            "lambda": 0.0,
            "grad_accum_steps": 1,
            "per_device_batch_size": 8,
            "lr": 1e-3,
        },
        generation={"num_generations": 1},
    )
    one = tmp_path / "one.yaml"
    one.write_text(
        yaml.safe_dump({**base, "train": {**base["train"], "output_dir": str(tmp_path / "one")}})
    )
    two = tmp_path / "two.yaml"
    two.write_text(
        yaml.safe_dump(
            {
                **base,
                "train": {
                    **base["train"],
                    "per_device_batch_size": 4,
                    "output_dir": str(tmp_path / "two"),
                },
            }
        )
    )
    loop.train(load_config(one))  # the one-process reference, in this process (one thread)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            "-m",
            "distil",
            "train",
            str(two),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    m1 = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["tokens/loss"] == a["tokens/loss"]  # the global count
    from safetensors.torch import load_file

    w1 = load_file(tmp_path / "one" / "final" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "final" / "model.safetensors")
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], atol=1e-6, rtol=1e-5)


_RANKED_REWARD = """
import os

CALLS = []


def score(row, completion):
    CALLS.append(1)
    # rank 1's first window (4 samples: 2 groups of 2) alternates 1, 0; every other sample, on
    # either rank, gets 0.5: window 1 has a signal on rank 1 only, windows 2 and 3 on neither
    if os.environ.get("RANK") == "1" and len(CALLS) <= 4:
        return float(len(CALLS) % 2)
    return 0.5
"""

# `distil train CONFIG` with the reward's module directory (argv[1]) importable
_TRAIN = "import sys; sys.path.insert(0, sys.argv[1]); from distil.cli import main; "
_TRAIN += "raise SystemExit(main(['train', sys.argv[2]]))"


def test_two_ranks_skip_a_grpo_window_only_when_it_is_flat_on_both(tmp_path, make_train_config):
    from distil.serve.process import free_port
    from warm import launch_ranks

    (tmp_path / "rw_ranked.py").write_text(_RANKED_REWARD)
    raw = make_train_config(
        loss={"name": "grpo"},
        reward={"function": "rw_ranked:score"},
        train={
            "lambda": 1.0,
            "max_steps": 3,
            "grad_accum_steps": 1,
            "per_device_batch_size": 4,
            "schedule": "constant",
            "save_every": 1,
            "keep_last": 3,
        },
    )
    raw["teacher"] = {}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-c", _TRAIN, str(tmp_path), str(path)]
    run = launch_ranks(cmd, 2, free_port())  # forked from the warm interpreter (tests/warm.py)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "run"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # window 1: rank 0's own groups were flat, rank 1's were not, so both trained on it
    assert lines[0]["reward/no_signal_groups"] == 1.0 and lines[0]["grad_norm"] > 0
    assert [m["reward/skipped_flat"] for m in lines] == [0, 1, 1]
    from safetensors.torch import load_file

    after_one = load_file(out / "checkpoints" / "step-00000001" / "model.safetensors")
    final = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(after_one[k], final[k]) for k in final)  # skipped on both ranks
