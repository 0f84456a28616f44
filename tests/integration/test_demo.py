"""`distil demo` end to end with the smoke budgets (seconds): every stage, files and table; the
equal-cost controls; and the demo from a wheel installed outside the checkout, its students'
stages in two lanes, printing the same table as the checkout's run with its students trained
one after another (the smoke preset's default)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import warm

# the smoke demo of tests/integration/conftest.py is shared with test_demo_resume and
# test_demo_seeds: one worker runs them all (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    "teacher (bpe)",
    "char student: start (SFT on labelled set)",
    "char student: distilled, cross-tokenizer (aligned KL on teacher-written completions)",
    "char student: control, sequence-level KD (the same teacher-written completions)",
    "char student: control, continued SFT",
    "bpe student: start (SFT on labelled set)",
    "bpe student: on-policy distilled, same tokenizer",
    "bpe student: control, sequence-level KD (teacher-written completions of its prompts)",
    "bpe student: control, continued SFT",
]
RUNS = [
    "teacher",
    "student_char_start",
    "student_bpe_start",
    "distill_cross_tokenizer",
    "distill_same_tokenizer",
    "control_seqkd",
    "control_sft",
    "control_seqkd_bpe",
    "control_sft_bpe",
]


def run_demo(out, cache, cwd, *extra, env=None, timeout=1200):
    env = {**(env or os.environ), "OMP_NUM_THREADS": "2"}
    args = ["--preset", "smoke", "--out", out, "--cache-dir", cache, "--threads", "2", *extra]
    # forked from the warm interpreter (tests/warm.py), or a fresh one where env changes imports
    return warm.run(
        [sys.executable, "-m", "distil", "demo", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def table_lines(stdout: str) -> list[str]:
    return [x for x in stdout.splitlines() if x.startswith("|")]


def last_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.budget(130, "its session fixture runs the whole smoke demo")
def test_demo_pipeline_writes_models_metrics_table_and_plot(smoke_demo):
    out, _, run = smoke_demo
    lines = table_lines(run.stdout)
    assert lines[0] == (
        "| Model | Accuracy | Gap Recovered | Steps | Student Cost (TFLOP) | Compute to Match |"
    )
    assert [x.split(" | ")[0].lstrip("| ") for x in lines[2 : 2 + len(ROWS)]] == ROWS
    # then the paired leads: one seed, so no interval
    assert lines[2 + len(ROWS)].startswith("| Distilled | Control |")
    assert "one seed: no interval" in run.stdout
    assert "`distil demo --preset smoke" in run.stdout and "2 threads" in run.stdout
    results = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in results["rows"]] == ROWS
    assert all(r["total"] == 24 for r in results["rows"])  # the smoke test split
    assert results["threads"] == 2 and results["machine"]
    assert results["lanes"] == 1 and results["wall_seconds"] > 0  # the smoke preset's default
    # the steps column: the smoke preset's budgets (teacher 4, starts 3, distillation 3)
    steps = {r["model"]: r["steps"] for r in results["rows"]}
    assert steps[ROWS[0]] == 4 and steps[ROWS[1]] == 3 and steps[ROWS[2]] == 3
    assert steps[ROWS[6]] == 3
    assert (out / "curves.png").stat().st_size > 10_000
    for r in results["rows"]:
        assert (out / r["path"] / "config.json").exists()
        assert (out / r["path"] / "tokenizer.json").exists()
    for name in RUNS:
        assert (out / "runs" / name / "metrics.jsonl").read_text().strip()
    assert any("distil/demo/configs/distill_cross_tokenizer.yaml" in c for c in results["commands"])
    assert "where the time went" in run.stdout
    cfg = yaml.safe_load((out / "runs" / "distill_cross_tokenizer" / "config.yaml").read_text())
    assert cfg["train"]["max_minutes"] is None and cfg["train"]["max_steps"] == 3
    # curves on the dev split; the table on the test split, disjoint from it
    # (the demo ran as `--out demo` in out's parent: its configs name files relative to it)
    assert cfg["eval"]["data"] == "demo/data/dev.jsonl"
    keys = [{(tuple(sorted(json.loads(x)["nums"])), json.loads(x)["target"])
             for x in (out / "data" / f"{split}.jsonl").read_text().splitlines()}
            for split in ("dev", "test")]  # fmt: skip
    assert len(keys[0]) == 24 and not keys[0] & keys[1]
    # the bpe student's seq-KD control: the teacher's completions of the prompts its
    # on-policy run samples for
    read = {name: yaml.safe_load((out / "runs" / name / "config.yaml").read_text())["data"]["train"]
            for name in ("distill_same_tokenizer", "control_seqkd_bpe")}  # fmt: skip
    assert read == {
        "distill_same_tokenizer": "demo/written/prompts.jsonl",
        "control_seqkd_bpe": "demo/written/teacher.jsonl",
    }
    # one seed is not the pre-stated analysis (5 seeds): the table says so
    assert "THIS RUN HAS 1 SEED(S): exploratory" in run.stdout


def test_controls_get_the_distillation_student_compute(smoke_demo):
    out, _, _ = smoke_demo
    for control, distilled in (
        ("control_seqkd", "distill_cross_tokenizer"),
        ("control_sft", "distill_cross_tokenizer"),
        ("control_seqkd_bpe", "distill_same_tokenizer"),
        ("control_sft_bpe", "distill_same_tokenizer"),
    ):
        spent = last_metrics(out / "runs" / distilled)["cost/student_flops"]
        cfg = yaml.safe_load((out / "runs" / control / "config.yaml").read_text())
        assert cfg["train"]["max_student_flops"] == pytest.approx(spent)
        lines = (out / "runs" / control / "metrics.jsonl").read_text().splitlines()
        flops = [json.loads(x)["cost/student_flops"] for x in lines]
        assert flops[-1] >= spent > flops[-2]  # stopped at the first step past the budget
    results = json.loads((out / "results.json").read_text())
    row = {r["model"]: r for r in results["rows"]}
    spent = last_metrics(out / "runs" / "distill_cross_tokenizer")["cost/student_flops"]
    assert row[ROWS[2]]["student_flops"] == pytest.approx(spent)


def _wheel(tmp_path: Path) -> Path:
    """distil built as a wheel from a copy of the checkout (nothing written into it)."""
    src = tmp_path / "src_copy"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", tmp_path / "whl"]
    built = subprocess.run([*map(str, cmd), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    return next((tmp_path / "whl").glob("distil-*.whl"))


@pytest.mark.budget(210, "builds and installs a wheel, then a smoke demo from it in two lanes")
def test_demo_from_an_installed_wheel_in_two_lanes_prints_the_same_table(smoke_demo, tmp_path):
    """distil installed from its wheel outside the checkout, the shared smoke demo's cache (its
    teacher reused) and the students' stages in two one-thread lanes (the first run trained
    them one after another in its process at two threads, the smoke preset's default): the
    same table and, stage by stage, the same training trajectories."""
    first, cache, run = smoke_demo
    wheel = _wheel(tmp_path)
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", site, wheel]
    installed = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (site / "distil" / "demo" / "configs" / "demo.yaml").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)  # the dependencies come from this interpreter's environment
    where = subprocess.run(
        [sys.executable, "-c", "import distil; print(distil.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert Path(where.stdout.strip()).resolve() == (site / "distil" / "__init__.py").resolve()
    again = run_demo(tmp_path / "demo", cache, tmp_path, "--lanes", "2", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "using the cached teacher" in again.stderr
    assert "lanes of" not in run.stderr and "2 lanes of 1 thread" in again.stderr
    assert (tmp_path / "demo" / "logs" / "run_distill_cross_tokenizer.log").read_text().strip()
    assert table_lines(again.stdout) == table_lines(run.stdout)
    assert len(table_lines(run.stdout)) == len(ROWS) + 2 + 6  # the table, the 4 paired leads
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert results["lanes"] == 2
    assert any(str(site / "distil" / "demo" / "configs") in c for c in results["commands"])
    assert not any(str(ROOT / "src") in c for c in results["commands"])
    # the smoke models score 0%: the training trajectories are the sharper check
    for name in RUNS[1:]:  # the teacher: the cached one
        a, b = (d / "runs" / name / "metrics.jsonl" for d in (first, tmp_path / "demo"))
        keys = ("step", "loss", "cost/student_flops", "eval/accuracy")
        trace = [[json.loads(x).get(k) for k in keys] for x in a.read_text().splitlines()]
        assert trace == [
            [json.loads(x).get(k) for k in keys] for x in b.read_text().splitlines()
        ], name
