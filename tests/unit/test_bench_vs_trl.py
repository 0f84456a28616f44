"""bench/vs_trl.py's pure logic: arguments, the settings check between distil and TRL, the
summary and the RESULT line. The benchmark itself (TRL in its own venv) is not run here."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    """bench/<name>.py by path, as module `bench_<name>` (tests/unit/align is a package named
    `align` too, so a plain `import align` may find the tests instead)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


align = _load("align")
trl_gold_step = _load("trl_gold_step")  # imports torch and transformers only, not trl
vs_trl = _load("vs_trl")

EOS = 2


def trl_stand_in(args: argparse.Namespace, lmbda: float, **changed):
    """An object with what trl_gold_step.settings reads from a GOLDTrainer built from
    `gold_config(args)` with vs_trl's flags (values as TRL 1.16 stores them)."""
    a = {
        "per_device_train_batch_size": args.batch,
        "gradient_accumulation_steps": args.ga,
        "learning_rate": args.lr,
        "lr_scheduler_type": SimpleNamespace(value="constant"),  # an enum in TrainingArguments
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
    }
    g = {"max_new_tokens": args.new_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    t = {"lmbda": lmbda, "beta": 1.0, "temperature": 1.0, "use_uld_loss": False}
    for key, value in changed.items():
        for d in (a, g, t):
            if key in d:
                d[key] = value
    return SimpleNamespace(
        args=SimpleNamespace(**a),
        generation_config=SimpleNamespace(**g, eos_token_id=[EOS]),
        accelerator=SimpleNamespace(device="cpu"),
        **t,
    )


def distil_resolved(tmp_path: Path, args: argparse.Namespace, mode: str) -> dict:
    """distil's resolved config for vs_trl's run of `mode`, as written to the run directory."""
    from distil.config import build_config, to_yaml

    setup = align.GoldSetup(tmp_path, tmp_path / "s", tmp_path / "t", tmp_path / "d.jsonl", 0)
    sections = align.distil_sections(
        setup, vs_trl.LOSS, args, beta=1.0, lmbda=vs_trl.MODES[mode], lr=args.lr,
        tag=f"-{mode}", overrides=vs_trl.distil_overrides(args),
    )  # fmt: skip
    return yaml.safe_load(to_yaml(build_config(sections)))


@pytest.mark.parametrize("mode", ["on", "off"])
def test_distil_and_trl_settings_agree(tmp_path, mode):
    args = vs_trl.parse_args([])
    cfg = distil_resolved(tmp_path, args, mode)
    ours = vs_trl.distil_settings(cfg, EOS)
    theirs = trl_gold_step.settings(trl_stand_in(args, vs_trl.MODES[mode]))
    assert vs_trl.mismatches(ours, theirs) == []
    assert ours["beta"] == 1.0 and ours["lambda"] == vs_trl.MODES[mode]
    assert ours["per_device_batch_size"] * ours["grad_accum_steps"] == 64
    assert theirs["schedule"] == "constant" and theirs["eos_token_id"] == [EOS]


def test_a_setting_that_differs_is_named(tmp_path):
    args = vs_trl.parse_args([])
    ours = vs_trl.distil_settings(distil_resolved(tmp_path, args, "on"), EOS)
    theirs = trl_gold_step.settings(trl_stand_in(args, 1.0, learning_rate=2e-4, top_k=50))
    assert vs_trl.mismatches(ours, theirs) == [
        "lr: distil 0.0001, TRL 0.0002",
        "top_k: distil 0, TRL 50",
    ]
    # TRL's lambda 1.0 against distil's off-policy 0.0: the on/off mix-up is caught
    off = vs_trl.distil_settings(distil_resolved(tmp_path, args, "off"), EOS)
    assert vs_trl.mismatches(off, theirs)[0] == "lr: distil 0.0001, TRL 0.0002"
    assert "lambda: distil 0.0, TRL 1.0" in vs_trl.mismatches(off, theirs)


def test_distil_settings_read_the_loss_direction():
    base = {
        "train": {
            "per_device_batch_size": 16, "grad_accum_steps": 4, "lr": 1e-4, "schedule": "cosine",
            "warmup_steps": 10, "weight_decay": 0.0, "max_grad_norm": 1.0, "lambda": 1.0,
        },
        "generation": {"max_new_tokens": 32, "temperature": 1.0, "top_p": 1.0, "top_k": 0},
    }  # fmt: skip
    for loss, beta in (("reverse_kl", 1.0), ("forward_kl", 0.0), ("jsd", 0.3)):
        cfg = {**base, "loss": {"name": loss, "beta": 0.3, "temperature": 1.0}}
        assert vs_trl.distil_settings(cfg, EOS)["beta"] == beta
    assert vs_trl.distil_settings(cfg, EOS)["schedule"] == "warmup+cosine"


def test_parse_args_rejects_unknown_modes_and_bad_warmup(capsys):
    assert vs_trl.parse_args(["--modes", "off, on"]).modes == ["off", "on"]
    for argv in (["--modes", "on,sideways"], ["--modes", ","], ["--warmup", "0"],
                 ["--steps", "3", "--warmup", "3"]):  # fmt: skip
        with pytest.raises(SystemExit):
            vs_trl.parse_args(argv)
    assert "sideways" in capsys.readouterr().err


def trl_run(step, interval, generate, teacher):
    return {
        "step_s": step, "interval_s": interval, "generate_s": generate, "teacher_s": teacher,
        "loss": [0.5, 0.25], "completion_tokens": 30.0, "matched_vocab": None,
    }  # fmt: skip


def test_trl_summary_rest_is_the_interval_less_the_next_steps_phases():
    # 4 steps; interval k runs from the end of step k to the end of step k + 1
    run = trl_run([9, 2.0, 2.2, 2.4], [2.1, 2.3, 2.5], [9, 1.0, 1.1, 1.2], [9, 0.5, 0.5, 0.5])
    s = align.summarize_trl([run], warmup=1)
    assert s["interval"] == pytest.approx(2.3)
    assert s["rest_interval"] == pytest.approx(0.7)  # of 0.6, 0.7, 0.8
    assert s["rest"] == pytest.approx(0.6)  # 2.2 - 1.1 - 0.5, the step alone
    phases = vs_trl.side_phases(s, "trl")
    assert phases == pytest.approx({"step": 2.3, "generate": 1.1, "teacher": 0.5, "train": 0.7})


def test_ratios_and_the_result_line():
    args = vs_trl.parse_args([])
    trl = {"step": 2.0, "generate": 1.0, "teacher": 0.5, "train": 0.5}
    on = vs_trl.ratios({"step": 1.5, "generate": 0.5, "teacher": 0.5, "train": 0.5}, trl)
    assert on == {"step": 0.75, "generate": 0.5, "teacher": 1.0, "train": 1.0}
    off = vs_trl.ratios(
        {"step": 0.9, "generate": 0.0, "teacher": 0.4, "train": 0.5},
        {"step": 1.0, "generate": 0.0, "teacher": 0.5, "train": 0.5},
    )
    assert off["generate"] is None and off["step"] == pytest.approx(0.9)
    distillation = {"step": 0.8, "generate": 0.9, "teacher": 0.7, "train": 0.8}
    line = vs_trl.result_line(
        {"on": {"gold": on, "distillation": distillation}, "off": {"gold": off}}, args
    )
    assert line.startswith(
        "RESULT vs_trl: distil/TRL GOLDTrainer s/step on-policy 0.75 (generate 0.50, "
    )
    assert (
        "off-policy 0.90 (teacher 0.80, train 1.00); vs DistillationTrainer on-policy 0.80" in line
    )
    assert "64 seqs as 16 x 4, <= 32 new tokens, reverse KL, cpu, 1 thread(s)" in line
    assert "DistillationTrainer" not in vs_trl.result_line({"on": {"gold": on}}, args)


def test_result_line_parsing():
    out = 'noise\nRESULT {"a": 1}\nmore\nRESULT {"a": 2, "b": [1.5]}\n'
    assert align.result_line(out) == {"a": 2, "b": [1.5]}
    assert align.result_line("RESULTS are in\nnothing here\n") is None


def test_trl_flags_select_the_same_tokenizer_path():
    args = vs_trl.parse_args(["--device", "cuda", "--lr", "3e-4"])
    flags = vs_trl.trl_flags(0.0, args)
    assert "--same-tokenizer" in flags
    flags.remove("--same-tokenizer")
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs == {
        "--trainer": "gold", "--lmbda": "0.0", "--beta": "1.0", "--lr": "0.0003", "--device": "cuda",
    }  # fmt: skip
    assert "distillation" in vs_trl.trl_flags(1.0, args, "distillation")


def test_trl_trainers_argument():
    assert vs_trl.parse_args([]).trl == ["gold", "distillation"]
    assert vs_trl.parse_args(["--trl", "gold"]).trl == ["gold"]
    for bad in ("distillation", "gold,gkd"):  # GOLD is the reference of every ratio
        with pytest.raises(SystemExit):
            vs_trl.parse_args(["--trl", bad])


def test_settings_of_a_trainer_without_lambda_read_as_on_policy(tmp_path):
    args = vs_trl.parse_args([])
    stand_in = trl_stand_in(args, 1.0)
    del stand_in.lmbda, stand_in.use_uld_loss  # DistillationTrainer has neither
    theirs = trl_gold_step.settings(stand_in)
    assert theirs["lambda"] == 1.0 and theirs["use_uld_loss"] is False
    ours = vs_trl.distil_settings(distil_resolved(tmp_path, args, "on"), EOS)
    assert vs_trl.mismatches(ours, theirs) == []
    off = vs_trl.distil_settings(distil_resolved(tmp_path, args, "off"), EOS)
    assert vs_trl.mismatches(off, theirs) == ["lambda: distil 0.0, TRL 1.0"]
