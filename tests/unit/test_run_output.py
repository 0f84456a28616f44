"""What a run prints: a status line with numbers a user can read at any scale, the final model
once, a requested stop as a stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from distil.train.logging import ProgressLine, rate, significant


@pytest.mark.parametrize(
    ("x", "shown"),
    [(0.2105, "0.2105"), (1.49381, "1.494"), (3e-5, "3e-05"), (-0.0511, "-0.0511"), (0.0, "0")],
)
def test_losses_keep_four_significant_digits(x, shown):
    assert significant(x) == shown


@pytest.mark.parametrize(
    ("per_s", "shown"), [(2345.0, "2.3k"), (45.2, "45.2"), (15.04, "15"), (0, "0")]
)
def test_throughput_below_a_thousand_is_not_zero_k(per_s, shown):
    assert rate(per_s) == shown


def test_the_printed_line_of_a_small_cpu_run(capsys, monkeypatch):
    monkeypatch.delenv("DISTIL_PROGRESS", raising=False)
    line = ProgressLine(10, 0, every=1, enabled=True)
    metrics = {"loss": 3e-5, "kl": 0.00012, "throughput/tokens_per_s": 45.0}
    line.update(1, metrics)
    err = capsys.readouterr().err
    assert "loss 3e-05" in err and "kl 0.00012" in err and "| 45 tok/s |" in err
    line.update(2, {"loss": 0.29, "logratio": -0.0511, "throughput/tokens_per_s": 45.0})
    err = capsys.readouterr().err  # a cross-tokenizer run: its log ratio is not called kl
    assert "log S/T -0.0511" in err and " kl " not in err


def test_eval_help_says_the_configs_task_is_the_default(capsys):
    from distil.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "countdown (default)" not in out
    assert "default: the --config's eval.task, else countdown" in out


@pytest.mark.parametrize(("rank", "printed"), [(None, 1), ("0", 1), ("1", 0)])
def test_final_model_is_printed_once_not_per_rank(tmp_path, capsys, monkeypatch, rank, printed):
    from distil.cli import main
    from distil.train import loop

    monkeypatch.setattr(loop, "train", lambda cfg, **kw: {})  # the line after training is the point
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    preset = Path(__file__).parents[2] / "configs" / "countdown_onpolicy.yaml"
    assert main(["train", str(preset), f"train.output_dir={tmp_path}"]) == 0
    assert capsys.readouterr().out.count("final model:") == printed


def test_a_requested_stop_is_not_reported_as_an_error(tmp_path, capsys, monkeypatch):
    import signal

    from distil.cli import main
    from distil.train import loop
    from distil.train.signals import TrainingInterrupted

    def stopped(cfg, **kw):
        raise TrainingInterrupted("training stopped by SIGINT after step 3: ...", signal.SIGINT)

    monkeypatch.setattr(loop, "train", stopped)
    preset = Path(__file__).parents[2] / "configs" / "countdown_onpolicy.yaml"
    assert main(["train", str(preset), f"train.output_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("distil: stopped: training stopped by SIGINT") and "error" not in err


def test_the_step_time_is_accounted_for(tmp_path, make_train_config, monkeypatch):
    """Collating a window (padding; alignment for a tokenizer pair) has its own bucket, and what
    no bucket holds is time/other: the buckets add up to time/step."""
    import time

    from distil.config import build_config
    from distil.testing import read_metrics
    from distil.train import loop, setup

    real = setup.collate

    def slow_collate(samples, pad_id):
        time.sleep(0.1)  # sleep never returns early: a lower bound, not a timing claim
        return real(samples, pad_id)

    monkeypatch.setattr(setup, "collate", slow_collate)
    loop.train(build_config(make_train_config(train={"max_steps": 2})))
    for m in read_metrics(tmp_path / "run"):
        assert m["time/collate"] >= 0.1 * 2  # grad_accum_steps micro-batches
        parts = ("time/generate", "time/collate", "time/teacher", "time/train", "time/other")
        assert all(m[k] >= 0 for k in parts)
        assert sum(m[k] for k in parts) == pytest.approx(m["time/step"], rel=1e-6, abs=1e-6)
