"""Compute counters (train/cost.py): token counts and FLOPs by hand, in a real run, and the
`train.max_student_flops` stop."""

import pytest
import torch

from distil.config import build_config
from distil.data.collate import collate
from distil.models.load import load_model
from distil.models.scratch import count_parameters
from distil.testing import read_metrics, train_killed_after_checkpoint
from distil.train import loop
from distil.train.buffer import Window
from distil.train.cost import CostMeter, student_flops, teacher_flops
from distil.types import Sample


def test_window_counts_and_flops_by_hand():
    # rows: prompt 3 + completion 2, prompt 1 + completion 4 | prompt 2 + completion 1
    a = Sample(0, [5, 6, 7], [8, 9], "on_policy")
    b = Sample(1, [5], [6, 7, 8, 9], "on_policy")
    c = Sample(2, [5, 6], [7], "seq_kd")
    window = Window(
        [collate([a, b], 0), collate([c], 0)],
        ["on_policy", "seq_kd"],
        {
            "tokens/on_policy_prefill": 4,  # 3 + 1 prompt tokens
            "tokens/on_policy_generated": 6,  # 2 + 4
            "tokens/seq_kd_prefill": 2,
            "tokens/seq_kd_generated": 1,
        },
    )
    meter = CostMeter(student_params=10, teacher_params=100, teacher_scores=True)
    meter.add_window(window)
    meter.add_window(window)
    assert meter.totals == {
        "student_train_tokens": 2 * (5 + 5 + 3),  # non-pad tokens, padding (b: 5 vs 5) excluded
        "student_prefill_tokens": 8,
        "student_generated_tokens": 12,
        "teacher_score_tokens": 26,
        "teacher_prefill_tokens": 4,
        "teacher_generated_tokens": 2,
    }
    assert meter.student_flops == 2 * 10 * (3 * 26 + 8 + 12) == 1960
    assert meter.teacher_flops == 2 * 100 * (26 + 4 + 2) == 6400
    m = meter.metrics()
    assert m["cost/student_flops"] == 1960 and m["cost/teacher_params"] == 100
    # a cached (or absent) teacher runs no forward here
    quiet = CostMeter(student_params=10, teacher_params=0, teacher_scores=False)
    quiet.add_window(window)
    assert quiet.totals["teacher_score_tokens"] == 0 and quiet.teacher_flops == 0


def test_flop_formulas():
    assert student_flops(1_000, 7, 2, 3) == 2 * 1_000 * (21 + 2 + 3)
    assert teacher_flops(1_000, 7, 2, 3) == 2 * 1_000 * 12


def test_run_logs_cumulative_costs_that_add_up(tmp_path, make_train_config, pair_dirs):
    # on-policy only, same tokenizer: the student trains on exactly the rows it sampled, so its
    # training tokens are its prefilled prompts (one per row, 2 rows per prompt) + its samples
    cfg = build_config(make_train_config(train={"lambda": 1.0, "max_steps": 3}))
    loop.train(cfg)
    m = read_metrics(tmp_path / "run")
    rows = cfg.train.per_device_batch_size * cfg.train.grad_accum_steps
    n_student = sum(p.numel() for p in load_model(str(pair_dirs[1])).parameters())
    n_teacher = sum(p.numel() for p in load_model(str(pair_dirs[0])).parameters())
    train = prefill = gen = 0
    for x in m:
        train += x["tokens/input_local"]
        gen += round(x["completion/mean_tokens"] * rows)
        assert x["cost/student_train_tokens"] == train
        assert x["cost/student_generated_tokens"] == gen
        prefill = x["cost/student_prefill_tokens"]
        assert x["cost/student_train_tokens"] == prefill + gen
        assert x["cost/teacher_score_tokens"] == train  # same tokenizer: the same inputs
        assert x["cost/teacher_generated_tokens"] == 0
        assert x["cost/student_flops"] == 2 * n_student * (3 * train + prefill + gen)
        assert x["cost/teacher_flops"] == 2 * n_teacher * train
    assert m[0]["cost/student_prefill_tokens"] > 0 and gen > 0
    assert m[0]["cost/student_params"] == n_student


def test_seq_kd_counts_the_teacher_writing(tmp_path, make_train_config):
    cfg = build_config(
        make_train_config(loss={"name": "sft"}, train={"lambda": 0.0, "seq_kd": True})
    )
    loop.train(cfg)
    last = read_metrics(tmp_path / "run")[-1]
    assert last["cost/student_prefill_tokens"] == 0 == last["cost/student_generated_tokens"]
    assert last["cost/teacher_prefill_tokens"] > 0 and last["cost/teacher_generated_tokens"] > 0
    assert last["cost/teacher_score_tokens"] == 0  # sft: the teacher only writes


def test_max_student_flops_stops_the_run_and_drives_the_schedule(tmp_path, make_train_config):
    first = make_train_config(train={"lambda": 1.0, "max_steps": 4})
    loop.train(build_config(first))
    spent = [x["cost/student_flops"] for x in read_metrics(tmp_path / "run")]
    budget = (spent[1] + spent[2]) / 2  # reached during the third step
    raw = make_train_config(
        train={
            "lambda": 1.0,
            "max_steps": 1000,
            "max_student_flops": budget,
            "schedule": "linear",
            "output_dir": str(tmp_path / "capped"),
        }
    )
    loop.train(build_config(raw))
    m = read_metrics(tmp_path / "capped")
    assert [x["step"] for x in m] == [1, 2, 3]
    assert [x["cost/student_flops"] for x in m] == pytest.approx(spent[:3])
    # linear decay over the compute budget, not over the 1000 steps
    cfg_lr = raw["train"]["lr"]
    assert m[0]["lr"] == pytest.approx(cfg_lr)
    assert m[1]["lr"] == pytest.approx(cfg_lr * (1 - spent[0] / budget))
    assert m[2]["lr"] == pytest.approx(cfg_lr * (1 - spent[1] / budget))


def test_max_student_flops_must_be_positive(make_train_config):
    from distil.errors import ConfigError

    with pytest.raises(ConfigError, match="max_student_flops"):
        build_config(make_train_config(train={"max_student_flops": 0}))


def test_costs_continue_across_a_resume(tmp_path, make_train_config, monkeypatch):
    overrides = {"train": {"max_steps": 4, "save_every": 2, "lambda": 1.0}}
    loop.train(build_config(make_train_config(**overrides)))
    full = read_metrics(tmp_path / "run")
    raw = make_train_config(**overrides)
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    cfg = build_config(raw)
    train_killed_after_checkpoint(monkeypatch, cfg, step=2)
    resumed = read_metrics(tmp_path / "killed")
    for key in ("cost/student_train_tokens", "cost/student_generated_tokens"):
        assert [x[key] for x in resumed] == [x[key] for x in full]
    assert torch.tensor([x["cost/student_flops"] for x in full]).diff().min() > 0


def test_a_teacher_without_a_local_module_counts_no_teacher_flops(tiny_llama_model):
    """A remote teacher's `model` is the served model's name, a cached one has none: neither is
    counted as parameters (the remote-teacher run crashed here before)."""
    from types import SimpleNamespace

    buffer = SimpleNamespace(teacher=None)
    for teacher in (SimpleNamespace(model="served-name"), SimpleNamespace()):
        c = SimpleNamespace(teacher=teacher, buffer=buffer, unwrapped=tiny_llama_model)
        meter = CostMeter.for_components(c)
        assert meter.teacher_params == 0 and not meter.teacher_scores
        assert meter.student_params == count_parameters(tiny_llama_model)


def test_several_teachers_count_the_mixtures_sum_or_the_largest_routed_one(
    tiny_llama_model, pair_dirs, second_teacher
):
    from types import SimpleNamespace

    from distil.teacher.live import LiveTeacher
    from distil.teacher.several import MixedTeacher, RoutedTeacher

    a, b = (load_model(str(p)) for p in (pair_dirs[0], second_teacher))
    na, nb = count_parameters(a), count_parameters(b)
    assert na != nb
    cached = SimpleNamespace(temperature=1.0)  # no local module
    cases = [
        (MixedTeacher([LiveTeacher(a), LiveTeacher(b)], [1.0, 2.0]), na + nb),
        (MixedTeacher([LiveTeacher(a), LiveTeacher(b)], [1.0, 0.0]), na),  # weight 0: never runs
        (RoutedTeacher([LiveTeacher(a), LiveTeacher(b)], ["a", "b"], [0, 1]), max(na, nb)),
        (RoutedTeacher([cached, LiveTeacher(b)], ["a", "b"], [0, 1]), nb),
    ]
    for teacher, want in cases:
        c = SimpleNamespace(teacher=teacher, buffer=SimpleNamespace(teacher=None),
                            unwrapped=tiny_llama_model)  # fmt: skip
        meter = CostMeter.for_components(c)
        assert meter.teacher_params == want and meter.teacher_scores
    c = SimpleNamespace(teacher=RoutedTeacher([cached], ["a"], [0]), buffer=SimpleNamespace(teacher=None),
                        unwrapped=tiny_llama_model)  # fmt: skip
    meter = CostMeter.for_components(c)
    assert meter.teacher_params == 0 and not meter.teacher_scores
