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
    assert all(r.cost_of == "distill_cross_tokenizer" for r in controls)


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
        (lambda r: r["presets"]["smoke"].update(minutes=3), "preset smoke"),
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
                "student": "char",
                "label": "mixed",
                "steps": "same",
            }
        )

    m = manifest(_write(tmp_path, add))
    assert m.runs[-1].label == "mixed" and m.runs[-1].student == "char"


def test_cli_rejects_an_unknown_preset_and_a_bad_scale(capsys):
    assert main(["demo", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--preset 'nope' is not a demo preset" in err and "smoke" in err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--distill-scale", "0"])
    assert exc.value.code == 2
    assert "expected a positive number" in capsys.readouterr().err


def test_demo_help_documents_the_scale_flag(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--distill-scale X" in out and "multiply the distillation" in out
