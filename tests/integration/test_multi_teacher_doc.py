"""docs/multi-teacher.md "Try it on a CPU" runs as written on a fresh clone: its bash block is
read from the page (so the doc cannot drift) and run by bash, with this environment's `distil`
and `python` first on PATH, in a temporary directory holding only docs/configs/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def doc_block() -> str:
    text = (ROOT / "docs/multi-teacher.md").read_text()
    return re.search(r"## Try it on a CPU\n.*?```bash\n(.*?)```", text, re.S).group(1)


def test_the_doc_block_trains_the_docs_config():
    block = doc_block()
    assert "distil config validate docs/configs/multi_teacher.yaml" in block
    assert "distil train docs/configs/multi_teacher.yaml" in block


@pytest.mark.budget(
    180, "runs the page's commands as written: data, tokenizers, two teachers, a routed run"
)
@pytest.mark.slow
def test_try_it_on_a_cpu_runs_as_written(tmp_path):
    shutil.copytree(ROOT / "docs" / "configs", tmp_path / "docs" / "configs")
    bin_dir = str(Path(sys.executable).parent)  # the environment's python and distil
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", doc_block()],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [
        json.loads(x) for x in (tmp_path / "runs/mt/run/metrics.jsonl").read_text().splitlines()
    ]
    assert len(metrics) == 4
    assert any("loss/teacher/three" in m and "loss/teacher/four" in m for m in metrics)
