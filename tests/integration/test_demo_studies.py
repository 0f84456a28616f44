"""`distil demo --study multi-teacher|self-distill` end to end at smoke size (minutes on the
shared 2-core VM): every stage runs, the table has its columns and rows in manifest order (the
mix column adding up both slices, each seed's values), the generalist teacher trains on both
slices with the specialists' total budget, every student run matches the routed run's compute,
and the comparisons are paired over the seeds with Holm-adjusted p-values."""

import json
import os
import sys

import pytest
import yaml

import warm
from distil.demo.studies import study_manifest

pytestmark = pytest.mark.slow

MT_ROWS = [
    "teacher (3-number slice)",
    "teacher (4-number slice)",
    "teacher (generalist)",
    "bpe student: start (SFT on labelled set)",
    "bpe student: distilled, two teachers routed by slice",
    "bpe student: distilled, one generalist teacher (both slices, the same total teacher budget)",
    "bpe student: distilled, three-number teacher alone",
    "bpe student: distilled, four-number teacher alone",
    "bpe student: control, continued SFT",
]
SD_ROWS = [
    "teacher (the demo's: the positive control's)",
    "teacher: the frozen start, the reference solution in its context",
    "bpe student: start (SFT on labelled set)",
    "bpe student: self-distilled, reference solution as privileged context",
    "bpe student: self-distilled, worked examples as system prompt (context distillation)",
    "bpe student: positive control, distilled from the demo's teacher (same start, data, lr, steps)",
    "bpe student: control, continued SFT",
]


def run_study(study, tmp_path, seeds=1, *more):
    out, cache = tmp_path / study, tmp_path / "cache"
    args = ["--study", study, "--preset", "smoke", "--out", out, "--cache-dir", cache]
    args += ["--seeds", seeds, *more]
    run = warm.run(  # forked from the warm interpreter (tests/warm.py)
        [sys.executable, "-m", "distil", "demo", *map(str, args), "--threads", "2"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [x for x in run.stdout.splitlines() if x.startswith("|")]
    return out, lines, json.loads((out / "results.json").read_text())


def labels(lines):
    return [x.split(" | ")[0].lstrip("| ") for x in lines[2:]]


@pytest.mark.budget(100, "the multi-teacher study over two seeds at smoke size")
def test_multi_teacher_study_table_per_slice_and_mix(tmp_path):
    out, lines, results = run_study("multi-teacher", tmp_path, seeds=2)
    head = "| Model | 3 numbers | 4 numbers | mix | Steps | Student Cost (TFLOP) |"
    assert lines[0] == head and labels(lines)[: len(MT_ROWS)] == MT_ROWS
    for row in results["rows"]:
        assert len(row["accuracy"]) == 2  # each seed's
        for acc in row["accuracy"]:  # the slices have equally many test problems
            assert acc["mix"] == pytest.approx((acc["3 numbers"] + acc["4 numbers"]) / 2)
    for seed in (0, 1):
        runs = out / f"seed{seed}" / "runs"
        routed = yaml.safe_load((runs / "study_mt_routed" / "config.yaml").read_text())
        assert set(routed["teachers"]["models"]) == {"three", "four"}
        four = routed["teachers"]["models"]["four"]["path"]
        assert four == str(out / "models" / "teacher_four")  # shared by the seeds
        assert routed["train"]["seed"] == seed
    general = yaml.safe_load((out / "runs" / "teacher_general" / "config.yaml").read_text())
    assert general["data"]["train"] == str(out / "data" / "train.jsonl")
    assert general["train"]["max_steps"] == 2 * 3  # both specialists' budget (smoke: 3 each)
    leads = results["paired_leads"]
    assert [x["control"] for x in leads] == MT_ROWS[5:]
    assert all(len(x["differences"]) == 2 and "p_holm" in x for x in leads)
    data = [json.loads(x) for x in (out / "data" / "prompts.jsonl").read_text().splitlines()]
    assert {r["slice"] for r in data} == {"three", "four"}
    assert all(len(r["nums"]) == {"three": 3, "four": 4}[r["slice"]] for r in data)
    rows = {r["model"]: r for r in results["rows"]}
    routed = rows["bpe student: distilled, two teachers routed by slice"]["student_flops"]
    for label in MT_ROWS[5:]:  # every other student at the routed run's compute (or just past)
        assert all(a >= b for a, b in zip(rows[label]["student_flops"], routed, strict=True))


@pytest.mark.budget(100, "the self-distillation study end to end at smoke size")
def test_self_distill_study_table(tmp_path):
    out, lines, results = run_study("self-distill", tmp_path)
    assert lines[0] == "| Model | Accuracy | Steps | Student Cost (TFLOP) |"
    assert labels(lines)[: len(SD_ROWS)] == SD_ROWS
    cfg = yaml.safe_load((out / "runs" / "study_sd_context" / "config.yaml").read_text())
    assert (
        cfg["teacher"]["from_student"] == "initial" and "{completion}" in cfg["teacher"]["context"]
    )
    # the start reads the labelled rows as the student sees them and as each teacher does
    start = yaml.safe_load((out / "runs" / "student_bpe_start" / "config.yaml").read_text())
    assert start["data"]["train"] == str(out / "data" / "labelled_context.jsonl")
    assert start["data"]["template"] is None  # a template would render every row alike
    plain = (out / "data" / "labelled.jsonl").read_text().splitlines()
    mixed = [
        json.loads(x) for x in (out / "data" / "labelled_context.jsonl").read_text().splitlines()
    ]
    assert len(mixed) == 3 * len(plain) and mixed[0] == json.loads(plain[0])
    shown = mixed[1]["prompt"][-1]["content"]  # the context teacher's prompt of the first row
    assert mixed[1]["completion"] in shown and shown.count(mixed[0]["prompt"][-1]["content"]) == 2
    assert mixed[2]["prompt"][0]["role"] == "system"  # the context-distillation teacher's
    rows = {r["model"]: r for r in results["rows"]}
    control = rows["bpe student: control, continued SFT"]["student_flops"][0]
    sd = "bpe student: self-distilled, reference solution as privileged context"
    assert control >= rows[sd]["student_flops"][0]
    positive = yaml.safe_load((out / "runs" / "study_sd_external" / "config.yaml").read_text())
    assert positive["teacher"]["path"] == str(out / "models" / "teacher")
    assert positive["teacher"]["context"] is None and positive["teacher"]["from_student"] is None
    for key in ("lr", "max_steps"):  # the same recipe as the self-distilled arm
        assert positive["train"][key] == cfg["train"][key]
    assert positive["data"]["train"] == cfg["data"]["train"]
    assert len(results["paired_leads"]) == 4


RW_ARMS = ("opd", "grpo", "both")


@pytest.mark.budget(150, "the reward study end to end at smoke size, then resumed")
def test_reward_study_arms_share_starts_sampling_and_compute(tmp_path):
    out, lines, results = run_study("reward", tmp_path)
    check_reward_study(out, lines, results)
    # resumed with its students gone (a study continued another day from its seed summaries):
    # the seed is not run again and the study reports the same table
    import shutil

    shutil.rmtree(out / "runs"), shutil.rmtree(out / "models")
    out, again, resumed = run_study("reward", tmp_path, 1, "--resume")
    assert again == lines and resumed["rows"] == results["rows"]
    assert resumed["paired_leads"] == results["paired_leads"]
    assert not (out / "runs").exists()  # no stage ran


def check_reward_study(out, lines, results):
    """The reward study's smoke output: the table's rows, each panel's three arms on one
    start, sampling, data set and teacher (none for GRPO) at the distillation arm's compute,
    the reward logged by every arm, the comparisons on each run's slice, the data."""
    assert lines[0] == "| Model | 3 numbers | 4 numbers | Steps | Student Cost (TFLOP) |"
    m = study_manifest("reward")
    want = ["teacher (three numbers: the demo's)", "teacher (four numbers)"]
    for student in m.students:
        want.append(f"{student} student: start (SFT on labelled set)")
        want += [f"{student} student: {r.label}" for r in m.runs if r.student == student]
    assert labels(lines)[: len(want)] == want and len(want) == 2 + 2 * 7
    runs = out / "runs"

    def config(key):
        return yaml.safe_load((runs / key / "config.yaml").read_text())

    rows = {r["model"]: r for r in results["rows"]}
    label = {r.key: f"{r.student} student: {r.label}" for r in m.runs}
    for student, loss in (("bpe", "forward_kl"), ("char", "aligned_kl")):
        for four in ("", "4"):
            keys = [f"study_rw{four}_{arm}_{student}" for arm in RW_ARMS]
            opd, grpo, both = (config(k) for k in keys)
            assert (opd["loss"]["name"], grpo["loss"]["name"], both["loss"]["name"]) == (
                loss, "grpo", loss)  # fmt: skip
            assert both["loss"]["reward_weight"] == 1.0 and opd["loss"]["reward_weight"] == 0.0
            teacher = out / "models" / ("teacher_four" if four else "teacher")
            assert opd["teacher"]["path"] == both["teacher"]["path"] == str(teacher)
            assert grpo["teacher"]["path"] is None  # the pure-RL arm reads no teacher
            data = out / "data" / ("four/prompts.jsonl" if four else "prompts.jsonl")
            for c in (opd, grpo, both):  # one start, one sampling, one data set per panel
                assert c["student"]["path"] == str(out / "models" / f"student_{student}_start")
                assert c["data"]["train"] == str(data)
                assert c["generation"] == {**opd["generation"]}
                assert c["generation"]["num_generations"] == 8
            flops = [rows[label[k]]["student_flops"][0] for k in keys]
            for i, k in enumerate(keys):  # every arm logs the reward of its samples, every step
                m = [json.loads(x) for x in (runs / k / "metrics.jsonl").read_text().splitlines()]
                assert all("reward/mean" in x and "reward/no_signal_groups" in x for x in m)
                spent = [x["cost/student_flops"] for x in m]
                assert spent[-1] == flops[i]
                if i:  # a reward arm stops at the first step past the distillation's compute:
                    # at least it, and over it by at most that last step's compute
                    before = spent[-2] if len(spent) > 1 else 0.0
                    assert before < flops[0] <= flops[i] <= flops[0] + (spent[-1] - before)
    leads = results["paired_leads"]
    assert [x["on"] for x in leads] == ["3 numbers"] * 6 + ["4 numbers"] * 6
    mix = [json.loads(x) for x in (out / "data" / "labelled_mix.jsonl").read_text().splitlines()]
    assert [len(r["nums"]) for r in mix] == [3, 4] * (len(mix) // 2) and "completion" in mix[0]
    four = (out / "data" / "four" / "prompts.jsonl").read_text().splitlines()
    assert four and all(len(json.loads(x)["nums"]) == 4 for x in four)
    assert (out / "curves.png").stat().st_size > 0
