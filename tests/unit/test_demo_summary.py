"""The demo's report over seeds on hand-made runs (no training): seed directories, compute to
match from recorded curves, the rows' mean ± sd, and the paired leads with their intervals."""

import json
import math
from types import SimpleNamespace

import pytest

from distil.demo.presets import manifest
from distil.demo.report import rows, table
from distil.demo.run import DemoRun
from distil.demo.stages import _seed, demo_path
from distil.demo.summary import (
    aggregate,
    leads_table,
    matches,
    paired_leads,
    seeds_table,
    start_label,
)

CROSS = "char student: distilled, cross-tokenizer (aligned KL on teacher-written completions)"
SEQKD = "char student: control, sequence-level KD (the same teacher-written completions)"
SFT = "char student: control, continued SFT"
SAME = "bpe student: on-policy distilled, same tokenizer"
SFT_BPE = "bpe student: control, continued SFT"
SEQKD_BPE = "bpe student: control, sequence-level KD (teacher-written completions of its prompts)"


def demo(tmp_path, n_seeds=1) -> DemoRun:
    m = manifest()
    return DemoRun(tmp_path, "smoke", m.presets["smoke"], m, 2, tmp_path / "cache", n_seeds=n_seeds)


def write_curve(run: DemoRun, key: str, points: list[tuple[float, float | None]]) -> None:
    """metrics.jsonl of runs/<key>: one line per (flops, accuracy or None: no eval) step."""
    d = run.paths["runs"] / key
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, (flops, acc) in enumerate(points, 1):
        m = {"step": step, "loss": 1.0, "cost/student_flops": flops}
        if acc is not None:
            m["eval/accuracy"] = acc
        lines.append(json.dumps(m))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_one_seed_keeps_the_single_seed_layout_and_several_get_seed_dirs(tmp_path):
    one = demo(tmp_path)
    assert one.paths["runs"] == tmp_path / "runs" and one.paths["models"] == tmp_path / "models"
    assert _seed(one) == {} and one.tag == ""
    two = demo(tmp_path, 2).for_seed(1)
    assert two.paths["runs"] == tmp_path / "seed1" / "runs"
    assert two.paths["models"] == tmp_path / "seed1" / "models"
    assert _seed(two) == {"train.seed": 1} and two.tag == "seed 1: "
    # data, tokenizers and the teacher are shared by the seeds
    assert demo_path(two, "data/prompts.jsonl") == tmp_path / "data" / "prompts.jsonl"
    assert demo_path(two, "models/teacher") == tmp_path / "models" / "teacher"
    assert demo_path(two, "runs/teacher") == tmp_path / "runs" / "teacher"
    assert demo_path(two, "models/student_char_start") == two.paths["models"] / "student_char_start"
    assert demo_path(two, "runs/control_sft") == two.paths["runs"] / "control_sft"
    labels = [r.model for r in rows(two)]
    assert labels[0] == "models/teacher" and labels[1] == "seed1/models/student_char_start"


def test_compute_to_match_from_the_recorded_curves(tmp_path):
    run = demo(tmp_path)
    # the char control ends at 0.50 after 40 TFLOP; the distilled student passes 0.50 between
    # 10 (0.40) and 20 (0.60) TFLOP: 15 by linear interpolation -> 40 / 15 = 2.67x
    write_curve(run, "control_sft", [(20e12, 0.3), (30e12, None), (40e12, 0.5)])
    write_curve(run, "distill_cross_tokenizer", [(10e12, 0.4), (20e12, 0.6), (40e12, 0.7)])
    # the bpe distilled student never reaches its control's 0.8
    write_curve(run, "control_sft_bpe", [(30e12, 0.8)])
    write_curve(run, "distill_same_tokenizer", [(15e12, 0.5), (30e12, 0.7)])
    acc = {start_label("char"): 0.2, start_label("bpe"): 0.3}
    m = matches(run, acc)
    assert set(m) == {CROSS, SAME}  # the seq-KD control is not a continued-SFT control
    assert m[CROSS]["control"] == SFT and m[CROSS]["target_accuracy"] == 0.5
    assert m[CROSS]["distilled_flops"] == pytest.approx(15e12)
    assert m[CROSS]["ratio"] == pytest.approx(40 / 15) and m[CROSS]["status"] == "reached"
    assert m[SAME]["ratio"] is None and m[SAME]["status"] == "not reached"
    # the start (at 0 compute) already at the control's accuracy
    m = matches(run, {start_label("char"): 0.55, start_label("bpe"): 0.3})
    assert m[CROSS]["status"] == "at start" and m[CROSS]["ratio"] is None


def fake_results(accuracy: dict[str, float]) -> list:
    return [
        SimpleNamespace(name=k, summary={"accuracy": v, "correct": round(24 * v), "total": 24})
        for k, v in accuracy.items()
    ]


def seed_table(run: DemoRun, cross: float, seqkd: float, sft: float) -> list[dict]:
    """One seed's rows with these three char accuracies (hand-made metrics for every row)."""
    for row in rows(run):
        d = run.out / row.metrics
        if not (d / "metrics.jsonl").exists():
            write_curve(run, d.name, [(1e12, 0.1)])
    (run.out / "models" / "teacher").mkdir(parents=True, exist_ok=True)
    (run.out / "models" / "teacher" / "distil_demo_train.json").write_text(
        json.dumps({"step": 4, "cost/student_flops": 5e12})
    )
    acc = {row.label: 0.1 for row in rows(run)}
    acc.update({"teacher (bpe)": 0.9, CROSS: cross, SEQKD: seqkd, SFT: sft})
    return table(run, fake_results(acc))[1]


def test_rows_over_seeds_and_paired_leads_by_hand(tmp_path):
    base = demo(tmp_path, 3)
    # cross - seqkd = [0.01, 0.02, 0.03]: mean 2 points, sd 1, 95% CI 2 ± 4.303/sqrt(3) = 2 ± 2.48
    # cross - sft = [0.10, 0.12, 0.14]: 12 ± 2 points, CI 12 ± 4.97: significant
    per_seed = [
        seed_table(base.for_seed(0), 0.51, 0.50, 0.41),
        seed_table(base.for_seed(1), 0.52, 0.50, 0.40),
        seed_table(base.for_seed(2), 0.53, 0.50, 0.39),
    ]
    agg = {r["model"]: r for r in aggregate(per_seed)}
    assert agg[CROSS]["accuracy"] == pytest.approx(0.52)
    assert agg[CROSS]["accuracy_sd"] == pytest.approx(0.01)
    # gap recovered from the start (0.1) to the teacher (0.9): (0.52 - 0.1) / 0.8 on average
    assert agg[CROSS]["gap_recovered"] == pytest.approx(0.42 / 0.8)
    assert agg[SEQKD]["accuracy_sd"] == pytest.approx(0.0)
    leads = {(x["distilled"], x["control"]): x for x in paired_leads(base, per_seed)}
    assert set(leads) == {(CROSS, SEQKD), (CROSS, SFT), (SAME, SEQKD_BPE), (SAME, SFT_BPE)}
    seqkd = leads[(CROSS, SEQKD)]
    assert seqkd["mean"] == pytest.approx(0.02) and seqkd["sd"] == pytest.approx(0.01)
    assert seqkd["ci95"] == pytest.approx([0.02 - 0.02484, 0.02 + 0.02484], abs=1e-5)
    # two-sided p with 2 dof in closed form, 1 - t / sqrt(2 + t^2): t = 2 sqrt(3) and 6 sqrt(3)
    p_seqkd, p_sft = 1 - math.sqrt(12 / 14), 1 - math.sqrt(108 / 110)
    assert seqkd["p"] == pytest.approx(p_seqkd, rel=1e-9)
    assert leads[(CROSS, SFT)]["p"] == pytest.approx(p_sft, rel=1e-9)
    # the bpe rows tie (0.1 each): p = 1. Holm over the 4: 4 p_sft, 3 p_seqkd, then 1, 1
    assert leads[(SAME, SFT_BPE)]["p"] == 1.0
    assert leads[(CROSS, SFT)]["p_holm"] == pytest.approx(4 * p_sft, rel=1e-9)
    assert seqkd["p_holm"] == pytest.approx(3 * p_seqkd, rel=1e-9)
    assert seqkd["verdict"] == "not significant after Holm"
    assert leads[(CROSS, SFT)]["verdict"] == "significant after Holm, ahead"
    text = leads_table(list(leads.values()))
    assert "| +1.0 / +2.0 / +3.0 | +2.0 ± 1.0 sd | [-0.5, +4.5] | 0.074 | 0.223 |" in text
    assert "| +12.0 ± 2.0 sd | [+7.0, +17.0] | 0.009 | 0.037 | significant after Holm" in text
    md = seeds_table(aggregate(per_seed))
    assert f"| {CROSS} | 52.0 ± 1.0% (51.0 / 52.0 / 53.0) | 52.5 ± 1." in md
    assert agg[CROSS]["gap_recovered_sd"] == pytest.approx(0.01 / 0.8)
    assert md.splitlines()[0].endswith("| Compute to Match |")


def test_one_seed_lead_has_no_interval(tmp_path):
    run = demo(tmp_path)
    per_seed = [seed_table(run, 0.5, 0.45, 0.4)]
    lead = next(x for x in paired_leads(run, per_seed) if x["control"] == SEQKD)
    assert lead["mean"] == pytest.approx(0.05) and lead["ci95"] is None and lead["p"] is None
    assert "| +5.0 |  |  |  | one seed: no interval |" in leads_table([lead])
