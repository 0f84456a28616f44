"""Progress in a log (stderr not a terminal: a job under SLURM or nohup): a line every few
seconds with what is done, the rate and the time left, and one at the end; `distil generate`
prints them through a real run."""

from __future__ import annotations

import io
import sys

import pytest

from distil import progress
from distil.progress import LineProgress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_line_every_period_with_rows_rate_and_eta():
    clock, lines = Clock(), []
    bar = LineProgress("cache-teacher", 64, unit="rows", every=30, clock=clock, write=lines.append)
    bar.skip(8)  # a resume: 8 rows were written by an earlier run
    for _ in range(7):  # 8 rows every 10 s
        clock.t += 10
        bar.advance(8)
        bar.update(info="shard 1")
    assert lines == [
        "cache-teacher: 32/64 rows (50%), 0.8 rows/s, eta 0m40s, 0m30s elapsed | shard 1",
        "cache-teacher: 56/64 rows (88%), 0.8 rows/s, eta 0m10s, 1m00s elapsed | shard 1",
    ]
    # the last 8 rows came 10 s after the last line: none printed for them yet
    bar.finish()
    assert lines[-1] == (
        "cache-teacher: 64/64 rows (100%), 0.8 rows/s, eta 0m00s, 1m10s elapsed | shard 1"
    )
    bar.finish()  # nothing moved: no second last line
    assert len(lines) == 3


def test_the_docstring_example_is_a_line_it_prints():
    clock, lines = Clock(), []
    bar = LineProgress("cache-teacher", 64, unit="rows", every=40, clock=clock, write=lines.append)
    bar.update(info="shard 2")
    clock.t += 40
    bar.advance(32)
    assert f"`{lines[0]}`" in " ".join(LineProgress.__doc__.split())


def test_no_total_and_hours():
    clock, lines = Clock(), []
    bar = LineProgress("generate", None, unit="rows", every=1, clock=clock, write=lines.append)
    clock.t += 2 * 3600 + 61
    bar.advance(3)
    assert lines == ["generate: 3 rows, 0.000413 rows/s, 2h01m elapsed"]


def test_progress_bar_prints_lines_when_stderr_is_not_a_terminal(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("DISTIL_PROGRESS", raising=False)
    monkeypatch.setenv("DISTIL_PROGRESS_EVERY", "0")  # a line at every advance
    with progress.progress_bar("generate", 4, unit="rows") as bar:
        assert isinstance(bar, LineProgress)
        bar.advance(2)
        bar.advance(2)
    lines = err.getvalue().splitlines()
    assert [x.split(",")[0] for x in lines] == [
        "generate: 2/4 rows (50%)",
        "generate: 4/4 rows (100%)",
    ]
    err.truncate(0)
    with progress.progress_bar("generate", 4, enabled=False) as bar:  # logging.progress=false
        bar.advance(4)
    assert err.getvalue() == ""


@pytest.mark.slow
def test_distil_generate_prints_progress_lines_into_its_log(tmp_path, make_train_config):
    import subprocess

    import yaml

    raw = make_train_config()
    raw["logging"]["progress"] = True
    config = tmp_path / "gen.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "written.jsonl"
    cmd = [sys.executable, "-m", "distil", "generate", str(config), "--out", str(out),
           "--batch-size", "16"]  # fmt: skip
    env = {"DISTIL_PROGRESS_EVERY": "0", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [x for x in run.stderr.splitlines() if x.startswith("generate: ")]
    assert [x.split(" rows")[0] for x in lines] == [f"generate: {n}/64" for n in (16, 32, 48, 64)]
    assert "rows/s" in lines[0] and "eta" in lines[0]
