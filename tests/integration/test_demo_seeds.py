"""`distil demo --seeds 2` end to end with the smoke budgets: one teacher, each seed's students
and runs in their own directory with their own seeds, the table as mean ± sd, the paired leads
with their intervals, and compute to match (the smoke models score 0%: every lead is 0, and the
table says plainly that it is not significant)."""

import json

import pytest
import yaml
from test_demo import ROWS, run_demo, table_lines

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]


@pytest.fixture(scope="module")
def seeds2(tmp_path_factory, smoke_demo):
    """`--seeds 2` with the shared smoke demo's cache: its trained teacher, reused."""
    root = tmp_path_factory.mktemp("demo_seeds")
    out = root / "demo"
    # twice the students' stages of a smoke demo: over 20 minutes when the VM is shared
    run = run_demo(out, smoke_demo[1], root, "--seeds", "2", timeout=3600)
    assert run.returncode == 0, run.stderr[-3000:]
    return out, run


@pytest.mark.budget(100, "a two-seed smoke demo")
def test_two_seeds_share_the_teacher_and_seed_their_students(seeds2):
    out, run = seeds2
    assert (out / "models" / "teacher" / "config.json").exists()
    assert not (out / "seed0" / "models" / "teacher").exists()
    for seed in (0, 1):
        for name in ("distill_cross_tokenizer", "control_sft_bpe", "student_char_start"):
            cfg = yaml.safe_load((out / f"seed{seed}" / "runs" / name / "config.yaml").read_text())
            assert cfg["train"]["seed"] == seed, (seed, name)
    results = json.loads((out / "results.json").read_text())
    inits = [c for c in results["commands"] if c.startswith("distil init-model")]
    assert sum("--seed 1 " in c for c in inits) == 1 and sum("--seed 101 " in c for c in inits) == 1
    assert sum("--seed 2 " in c for c in inits) == 1 and sum("--seed 102 " in c for c in inits) == 1
    # different data order and sampling: different trajectories
    a, b = (
        (out / f"seed{k}" / "runs" / "distill_same_tokenizer" / "metrics.jsonl").read_text()
        for k in (0, 1)
    )
    assert [json.loads(x)["loss"] for x in a.splitlines()] != [
        json.loads(x)["loss"] for x in b.splitlines()
    ]
    assert "seed 1: bpe student: on-policy distilled" in run.stdout  # where the time went


def test_table_over_seeds_paired_leads_and_compute_to_match(seeds2):
    out, run = seeds2
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == 2 and [r["model"] for r in results["rows"]] == ROWS
    for r in results["rows"]:
        assert len(r["per_seed"]) == 2 and r["accuracy_sd"] is not None
    distilled = [r for r in results["rows"] if r["compute_to_match"]]
    assert [r["model"] for r in distilled] == [ROWS[2], ROWS[6]]
    assert all(len(r["compute_to_match"]) == 2 for r in distilled)
    leads = results["paired_leads"]
    assert [(x["distilled"], x["control"]) for x in leads] == [
        (ROWS[2], ROWS[3]),
        (ROWS[2], ROWS[4]),
        (ROWS[6], ROWS[7]),
        (ROWS[6], ROWS[8]),
    ]
    for x in leads:
        assert x["n"] == 2 and len(x["ci95"]) == 2 and len(x["differences"]) == 2
    lines = table_lines(run.stdout)
    assert lines[0].endswith("| Student Cost (TFLOP) | Compute to Match |")
    assert " ± " in lines[2]
    head = (
        "| Distilled | Control | Lead per seed | Lead (points) | 95% CI | p | p (Holm) | Verdict |"
    )
    assert head in lines
    assert all("p_holm" in x for x in leads)  # Holm over the 4 comparisons
    assert "not significant" in run.stdout and "Paired lead" in run.stdout
    assert "--seeds 2" in run.stdout
    assert (out / "curves.png").stat().st_size > 10_000
    assert "Paired lead" in (out / "results.md").read_text()
