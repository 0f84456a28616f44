"""A CPU user who asks for bfloat16 (the GSM8K/MATH presets do) is told once that it is slow
there, with the overrides that switch it off."""

from __future__ import annotations

import shlex

from distil.config import build_config
from distil.preflight import cpu_precision_note, preflight
from distil.testing import config_with
from distil.train import loop


def test_bf16_on_a_cpu_is_noted_with_its_fix(make_train_config):
    raw = make_train_config(train={"bf16": True}, student={"dtype": "bfloat16"})
    note = cpu_precision_note(build_config(raw), cuda=False)
    assert note and "train.bf16, student.dtype ask for bfloat16" in note
    assert cpu_precision_note(build_config(raw), cuda=True) is None
    fix = note.rsplit("For a CPU run: ", 1)[1]
    fixed = config_with(raw)
    for override in shlex.split(fix):
        key, value = override.split("=")
        section, name = key.split(".")
        fixed = config_with(fixed.model_dump(by_alias=True), **{section: {name: value}})
    assert cpu_precision_note(fixed, cuda=False) is None
    assert cpu_precision_note(build_config(make_train_config()), cuda=False) is None


def test_validate_and_train_say_it_once(make_train_config, capsys):
    raw = make_train_config(train={"bf16": True, "max_steps": 1, "grad_accum_steps": 1})
    _, notes = preflight(build_config(raw))
    assert sum("ask for bfloat16" in n for n in notes) == 1
    loop.train(build_config(raw))
    assert capsys.readouterr().err.count("ask for bfloat16") == 1


def test_the_default_fp32_student_on_cuda_is_noted_with_its_fixes(make_train_config):
    """gpu-review-2 finding 12: a GPU run with the defaults trains fp32 weights without
    autocast; the start-up notes say so and name the switches (each of which silences it)."""
    from distil.config.rules import fp32_on_cuda_note

    cfg = build_config(make_train_config())
    note = fp32_on_cuda_note(cfg, cuda=True)
    assert note and "fp32 weights and no autocast" in note
    assert fp32_on_cuda_note(cfg, cuda=False) is None  # a CPU run: fp32 is its fast path
    for section, values in (("train", {"bf16_weights": True}), ("train", {"bf16": True}),
                            ("student", {"dtype": "bfloat16"}),
                            ("student", {"lora": {"enabled": True}})):  # fmt: skip
        assert fp32_on_cuda_note(config_with(make_train_config(), **{section: values}),
                                 cuda=True) is None, values  # fmt: skip
