"""The demo's students' stages as a graph (what each waits for, the order one lane runs them
in), and a stage that fails in a lane: the error reaches the demo and the stage's log keeps it."""

from pathlib import Path

import pytest

from distil.demo.lanes import all_tasks, run_seeds, seed_tasks
from distil.demo.presets import manifest
from distil.demo.run import DemoRun


def _run(out: Path, seeds: int = 1, lanes: int = 1) -> DemoRun:
    m = manifest()
    return DemoRun(
        out, "smoke", m.presets["smoke"], m, 2, out / "cache", n_seeds=seeds, lanes=lanes
    )


def test_each_stage_waits_for_what_it_reads(tmp_path):
    tasks = seed_tasks(_run(tmp_path).for_seed(1))
    assert all(t.seed == 1 for t in tasks)
    got = {t.key: set(t.after) for t in tasks}
    # the order one lane runs them in: the starts, the teacher's completions, demo.yaml's runs
    assert list(got) == [
        "start:char",
        "start:bpe",
        "writes:teacher_writes",
        "run:distill_cross_tokenizer",
        "run:control_seqkd",
        "run:control_sft",
        "run:distill_same_tokenizer",
        "run:control_seqkd_bpe",
        "run:control_sft_bpe",
    ]
    assert got == {
        "start:char": set(),
        "start:bpe": set(),
        "writes:teacher_writes": set(),
        # trains on the teacher's written completions
        "run:distill_cross_tokenizer": {"start:char", "writes:teacher_writes"},
        # ... and gets the distillation's student compute
        "run:control_seqkd": {
            "start:char",
            "writes:teacher_writes",
            "run:distill_cross_tokenizer",
        },
        "run:control_sft": {"start:char", "run:distill_cross_tokenizer"},  # the labelled set
        # on-policy: prompts only, those the teacher writes for (its seq-KD control's)
        "run:distill_same_tokenizer": {"start:bpe", "writes:teacher_writes"},
        "run:control_seqkd_bpe": {
            "start:bpe",
            "writes:teacher_writes",
            "run:distill_same_tokenizer",
        },
        "run:control_sft_bpe": {"start:bpe", "run:distill_same_tokenizer"},
    }


def test_a_stage_that_fails_in_a_lane_stops_the_demo_and_keeps_its_error(tmp_path):
    # no data, tokenizers or teacher: every start fails in its worker process
    run = _run(tmp_path / "demo", lanes=2)
    with pytest.raises(Exception, match=r"tokenizer|No such file|not found|does not exist"):
        run_seeds([run])
    logs = sorted((tmp_path / "demo" / "logs").glob("*.log"))
    assert logs and "Traceback" in logs[0].read_text()
    assert run.stages == []  # nothing finished


def test_a_study_seed_ends_with_its_summary_before_the_next_seeds_stages(tmp_path):
    run = _run(tmp_path, seeds=2)
    seeded = [run.for_seed(0), run.for_seed(1)]
    assert all_tasks(seeded) == seed_tasks(seeded[0]) + seed_tasks(seeded[1])
    todo = all_tasks(seeded, study="reward")
    n = len(seed_tasks(seeded[0]))
    for k in (0, 1):
        summary = todo[(k + 1) * (n + 1) - 1]
        assert (summary.seed, summary.kind, summary.name) == (k, "summary", "reward")
        assert set(summary.after) == {t.key for t in seed_tasks(seeded[k])}
        assert todo[k * (n + 1) : (k + 1) * (n + 1) - 1] == seed_tasks(seeded[k])
