"""bench/train_throughput.py's step and generate parts run end to end on tiny models (CPU):
every precision x fused AdamW x packing row is timed and the RESULT line is printed."""

import os
import sys
from pathlib import Path

import pytest

import warm

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "train_throughput.py"


@pytest.mark.budget(150, "runs every part of the precision benchmark once on a tiny model")
@pytest.mark.slow
def test_step_and_generate_parts_run_on_cpu():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--size", "tiny", "--steps", "1"]
    # forked from the warm interpreter (tests/warm.py); two rows per micro-batch: the code path
    step = [*cmd, "--warmup", "0", "--rows", "2", "--part", "step"]
    out = warm.run(step, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| bf16_")]
    modes = {tuple(c.strip() for c in r.split("|")[1:5]) for r in rows}
    assert len(rows) == 9 and len(modes) == 9
    assert ("bf16_weights", "True", "1024", "True") in modes
    assert out.stdout.splitlines()[-1].startswith("RESULT train_throughput: bf16 weights")
    gen = warm.run([*cmd, "--part", "generate"], env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert "generate on bf16 weights" in gen.stdout.splitlines()[-1]
