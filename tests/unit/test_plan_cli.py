"""`distil plan` at the command line: every shipped model config, --json, the suggested fixes
(each re-planned: it must fit), and errors that name the flag or key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from distil.cli import main
from distil.config import build_config
from distil.plan import make_target, plan_config
from distil.plan.advice import parse_change, replan

MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"
SHIPPED = sorted(p.name for p in MODEL_CONFIGS.iterdir() if (p / "config.json").is_file())


def write_config(tmp_path: Path, **sections) -> str:
    raw = {
        "student": {"path": str(MODEL_CONFIGS / "qwen3-0.6b"), "dtype": "bfloat16"},
        "teacher": {"path": str(MODEL_CONFIGS / "qwen3-1.7b"), "dtype": "bfloat16"},
        "train": {"per_device_batch_size": 8, "grad_accum_steps": 2},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_shipped_configs_are_the_families_users_distil():
    assert set(SHIPPED) >= {
        "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "llama-3.2-1b", "llama-3.2-3b",
        "llama-3.1-8b", "gemma-3-1b", "gemma-3-4b", "qwen3-30b-a3b",
    }  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_plan_json_on_each_shipped_config(name, tmp_path, capsys):
    path = write_config(tmp_path)
    rc = main(["plan", path, f"student.path={MODEL_CONFIGS / name}", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    (device,) = out["devices"]
    assert device["peak"] == max(p["peak"] for p in device["phases"])
    for phase in device["phases"]:
        assert phase["peak"] == sum(t["bytes"] for t in phase["terms"])
        assert all(isinstance(t["bytes"], int) and t["bytes"] > 0 for t in phase["terms"])
    weights = next(t for t in device["phases"][0]["terms"] if t["name"] == "student weights")
    assert weights["bytes"] == out["student"]["params"] * 2
    assert out["fits"] == device["fits"] and out["step"]["tokens_per_s"] > 0


def test_plan_table_names_the_peak_and_the_bounding_phase(tmp_path, capsys):
    assert main(["plan", write_config(tmp_path), "--device", "h200"]) == 0
    text = capsys.readouterr().out
    assert "memory plan: peak" in text and "(h200)" in text and "<- peak" in text
    assert "bounded by" in text and "student fwd/bwd + loss" in text


def test_suggested_overrides_make_the_plan_fit(tmp_path):
    raw = yaml.safe_load(
        Path(write_config(tmp_path, train={"per_device_batch_size": 16})).read_text()
    )
    cfg = build_config(raw)
    target = make_target("h100", memory="20GiB")
    plan = plan_config(cfg, target)
    assert not plan.fits and plan.suggestions
    for line in plan.suggestions:
        again = replan(cfg, target, parse_change(line))
        assert again is not None and again.fits, line


def test_a_plan_that_cannot_fit_one_change_gets_a_combination(tmp_path):
    raw = yaml.safe_load(Path(write_config(tmp_path)).read_text())
    raw["student"]["path"] = str(MODEL_CONFIGS / "qwen3-30b-a3b")
    raw["student"]["dtype"] = "float32"
    cfg = build_config(raw)
    target = make_target("h100")
    plan = plan_config(cfg, target)
    assert not plan.fits
    (line,) = plan.suggestions
    changes = parse_change(line)
    assert len(changes) > 1  # a combination of changes, each key once
    assert len({c.split("=")[0] for c in changes}) == len(changes)
    again = replan(cfg, target, parse_change(line))
    assert again is not None and again.fits, line


def test_plan_errors_name_the_flag(tmp_path, capsys):
    assert main(["plan", write_config(tmp_path), "--gpu-memory", "lots"]) == 2
    assert "--gpu-memory = 'lots'" in capsys.readouterr().err
    assert main(["plan", write_config(tmp_path), "--gpus", "1", "--fsdp"]) == 2
    assert "--gpus = 1 with --fsdp" in capsys.readouterr().err
    assert main(["plan", write_config(tmp_path, student={"path": None})]) == 2
    assert "student.path is not set" in capsys.readouterr().err


def test_plan_help(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    assert "--gpu-memory" in text and "--json" in text and "meta device" in text
