"""`distil demo --resume`: a demo killed inside a stage goes on where it stopped. The stages it
finished are reused (their files untouched), the one it was in runs again, and the table is
the uninterrupted run's, number for number.

The uninterrupted run is the shared smoke demo (tests/integration/conftest.py), copied into
this test's directory: it ran as `--out demo` in its own directory, so the copy holds the same
stages with the same commands, and the "kill" is made on the copy."""

import shutil

import pytest
from test_demo import run_demo, table_lines

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

KILLED = "distill_same_tokenizer"  # the stage the "kill" interrupted
AFTER = "control_sft_bpe"  # a stage that never ran before the kill


@pytest.mark.budget(170, "a smoke demo killed part way, then resumed to the end")
def test_a_killed_demo_resumes_where_it_stopped(smoke_demo, tmp_path):
    done, cache, first = smoke_demo
    out = tmp_path / "demo"
    shutil.copytree(done, out)
    runs = out / "runs"
    kept = {p: p.read_bytes() for p in runs.glob("*/metrics.jsonl") if p.parent.name != KILLED}
    # a kill inside KILLED: no record, no final model; AFTER never started
    (runs / KILLED / "demo_stage.json").unlink()
    shutil.rmtree(runs / KILLED / "final")
    shutil.rmtree(runs / AFTER)
    (out / "results.md").unlink()

    resumed = run_demo("demo", cache, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert table_lines(resumed.stdout) == table_lines(first.stdout)
    reused = (resumed.stdout + resumed.stderr).count("reusing the finished stage")
    assert reused >= 6  # 2 starts, the teacher's completions, 3 runs (the kill's two rerun)
    for path, content in kept.items():
        if path.parent.name != AFTER:
            assert path.read_bytes() == content, path  # reused, not rerun
    assert (runs / KILLED / "final").is_dir() and (runs / AFTER / "final").is_dir()

    # without --resume every stage after the cached teacher runs anew
    again = run_demo("demo", cache, tmp_path)
    assert again.returncode == 0
    assert "reusing the finished stage" not in again.stdout + again.stderr
    assert table_lines(again.stdout) == table_lines(first.stdout)
