"""The demo's manifest (configs/demo.yaml): presets in steps, runs in table order, checks with
messages; the `distil demo` arguments."""

import pytest
import yaml

from distil.cli import main
from distil.demo.presets import CONFIG_DIR, MANIFEST, budget_steps, manifest
from distil.errors import ConfigError


def test_manifest_reads_presets_in_steps_and_runs_in_order():
    m = manifest()
    assert set(m.presets) >= {"full", "quick", "smoke"}
    for p in m.presets.values():
        assert {"teacher", "start"} <= set(p.steps)
        assert all(isinstance(v, int) and v > 0 for v in p.steps.values())
    assert [r.config for r in m.runs][:1] == ["distill_cross_tokenizer"]
    controls = [r for r in m.runs if r.cost_of]
    assert {r.config for r in controls} == {"control_seqkd", "control_sft"}
    # every student's distillation has an equal-cost continued-SFT control after it
    distilled = {r.student: r.key for r in m.runs if r.steps}
    sft = {r.student: r.cost_of for r in controls if r.config == "control_sft"}
    assert sft == distilled


def test_no_wall_clock_budget_in_any_demo_config():
    for path in CONFIG_DIR.glob("*.yaml"):
        text = path.read_text()
        assert "max_minutes" not in yaml.safe_load(text).get("train", {}), path


def test_distill_scale_multiplies_step_budgets():
    m = manifest()
    cross = next(r for r in m.runs if r.steps)
    for p in m.presets.values():
        assert budget_steps(p, cross, 3) == 3 * p.steps[cross.steps]
        assert budget_steps(p, cross, 1) == p.steps[cross.steps]


def _write(tmp_path, change):
    raw = yaml.safe_load(MANIFEST.read_text())
    change(raw)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["runs"][0].pop("steps"), "exactly one of steps and cost_of"),
        (lambda r: r["runs"][1].update(cost_of="nope"), "must name a run listed before it"),
        (lambda r: r["runs"][0].update(student="dog"), "student 'dog' is not one of"),
        (lambda r: r["runs"][0].update(config="missing"), "no config missing.yaml"),
        (lambda r: r["presets"]["smoke"]["steps"].pop("cross"), "preset smoke has no steps.cross"),
        (lambda r: r["presets"]["smoke"]["steps"].update(start=0), "positive ints"),
        (lambda r: r["presets"]["smoke"].update(hours=3), "preset smoke"),
        (
            lambda r: r["students"]["char"].update(start_data="/data/x.jsonl"),
            "students.char.start_data must be a path under runs/demo/",
        ),
    ],
)
def test_a_bad_manifest_is_a_config_error_naming_the_entry(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        manifest(_write(tmp_path, change))


def test_a_variant_is_a_data_change(tmp_path):
    def add(raw):
        raw["runs"].append(
            {
                "config": "distill_same_tokenizer",
                "name": "char_same_recipe",
                "student": "char",
                "label": "mixed",
                "steps": "same",
            }
        )

    m = manifest(_write(tmp_path, add))
    assert m.runs[-1].label == "mixed" and m.runs[-1].student == "char"
    assert m.runs[-1].key == "char_same_recipe"  # its own run directory


def test_two_runs_of_one_config_need_their_own_names(tmp_path):
    def add(raw):
        raw["runs"].append(
            {"config": raw["runs"][0]["config"], "student": "bpe", "label": "x", "steps": "same"}
        )

    with pytest.raises(ConfigError, match="a second run named"):
        manifest(_write(tmp_path, add))


def test_cli_rejects_an_unknown_preset_and_a_bad_scale(capsys):
    assert main(["demo", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--preset 'nope' is not a demo preset" in err and "smoke" in err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--distill-scale", "0"])
    assert exc.value.code == 2
    assert "expected a positive number" in capsys.readouterr().err


def test_seeds_flag_reaches_the_demo_and_its_command(monkeypatch, capsys):
    import distil.demo

    seen = {}
    monkeypatch.setattr(distil.demo, "run_demo", lambda out, **kw: seen.update(kw))
    assert main(["demo", "--preset", "smoke", "--seeds", "3", "--out", "x"]) == 0
    assert seen["seeds"] == 3 and seen["command"].endswith(" --seeds 3")
    assert main(["demo", "--preset", "smoke", "--out", "x"]) == 0
    assert seen["seeds"] == 1 and "--seeds" not in seen["command"]  # today's command
    with pytest.raises(SystemExit):
        main(["demo", "--seeds", "0"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--seeds N" in capsys.readouterr().out


def test_demo_help_documents_the_scale_flag(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--distill-scale X" in out and "multiply the distillation" in out


def test_table_columns_gap_steps_and_cost(tmp_path):
    import json
    from types import SimpleNamespace

    from distil.demo.presets import manifest as load
    from distil.demo.report import TEACHER, rows, table
    from distil.demo.run import DemoRun

    m = load()
    run = DemoRun(tmp_path, "smoke", m.presets["smoke"], m, 2, tmp_path / "cache")
    acc = {TEACHER: 0.8}
    results = []
    for i, row in enumerate(rows(run)):
        a = acc.get(row.label, 0.2 if row.start is None else 0.5)
        d = tmp_path / row.metrics
        d.mkdir(parents=True, exist_ok=True)
        line = {"step": 10 + i, "cost/student_flops": 2e12 * (i + 1)}
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps(line) + "\n")
        summary = {"accuracy": a, "correct": round(100 * a), "total": 100}
        results.append(SimpleNamespace(name=row.label, summary=summary))
    md, out = table(run, results)
    lines = md.splitlines()
    head = "| Model | Accuracy | Gap Recovered | Steps | Student Cost (TFLOP) | Compute to Match |"
    assert lines[0] == head
    assert lines[2] == "| teacher (bpe) | 80.0% (80/100) |  | 10 | 2 |  |"
    # a run from its start: (0.5 - 0.2) / (0.8 - 0.2) = 50% of the gap (no evaluations in its
    # metrics: no compute to match)
    assert lines[4] == f"| {rows(run)[2].label} | 50.0% (50/100) | 50% | 12 | 6 |  |"
    assert out[2]["gap_recovered"] == pytest.approx(0.5) and out[2]["steps"] == 12
    assert out[1]["gap_recovered"] is None  # a start row


def test_a_short_budget_keeps_the_configs_share_of_warmup():
    from distil.demo.stages import scaled_warmup

    teacher = yaml.safe_load((CONFIG_DIR / "teacher.yaml").read_text())["train"]
    assert (teacher["warmup_steps"], teacher["max_steps"]) == (200, 1250)
    assert scaled_warmup(teacher, 1250) is None  # the full preset: the config's own warmup
    assert scaled_warmup(teacher, 200) is None
    assert scaled_warmup(teacher, 150) == 24  # a short budget: 16% of the run, not all of it
    assert scaled_warmup(teacher, 4) == 1  # smoke
    assert scaled_warmup({"warmup_steps": 10}, 5) == 5  # no max_steps: the warmup is the run


def test_expected_time_counts_the_measured_minutes_and_skips_a_cached_teacher(
    tmp_path, monkeypatch
):
    """The line the demo prints before it starts: the preset's measured minutes per seed (times
    --distill-scale), plus the teacher's unless it is cached; none for a preset without any."""
    from dataclasses import replace

    from distil.demo import teachers
    from distil.demo.run import TEACHER_SUMMARY, DemoRun

    m = manifest()
    assert all(m.presets[name].minutes for name in ("full", "quick"))  # the presets users run
    cached = tmp_path / "teacher-cache"
    monkeypatch.setattr(teachers, "teacher_cache", lambda run: cached)
    run = DemoRun(tmp_path, "full", m.presets["full"], m, threads=2, cache_dir=tmp_path)
    t, s = m.presets["full"].minutes["teacher"], m.presets["full"].minutes["seed"]
    line = teachers.expected_time(run, 1)
    assert line.startswith(f"expected time: about {t + s:.0f} more minutes (1 seed(s) x ")
    assert f"+ the teacher {t:.0f} min" in line and m.presets["full"].minutes["machine"] in line
    cached.mkdir()
    (cached / TEACHER_SUMMARY).write_text("{}")
    line = teachers.expected_time(replace(run, distill_scale=2.0), 5)
    assert (
        f"about {10 * s:.0f} more minutes (5 seed(s) x {2 * s:.0f} min, the teacher cached)" in line
    )
    smoke = DemoRun(tmp_path, "smoke", m.presets["smoke"], m, threads=2, cache_dir=tmp_path)
    assert teachers.expected_time(smoke, 1) is None
