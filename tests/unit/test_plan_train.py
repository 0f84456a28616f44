"""`distil train` prints the plan's headline at the start and records the planned and the
measured peaks in metrics.jsonl."""

from __future__ import annotations

from distil.config import build_config
from distil.testing import read_metrics
from distil.train import loop


def test_train_prints_the_plan_and_logs_planned_and_measured_peaks(
    tmp_path, make_train_config, capsys
):
    cfg = build_config(make_train_config(train={"max_steps": 2}))
    loop.train(cfg)
    out = capsys.readouterr().out  # stdout: stderr is for notices and errors
    assert "memory plan: peak" in out and "usable on cpu" in out
    metrics = read_metrics(tmp_path / "run")
    planned = [m["memory/planned_peak_bytes"] for m in metrics]
    assert len(set(planned)) == 1 and planned[0] > 0
    rss = [m["memory/rss_peak_bytes"] for m in metrics]
    assert rss == sorted(rss) and rss[0] > planned[0]  # the process: tensors and the rest


def test_a_config_the_planner_cannot_read_still_trains(tmp_path, make_train_config, monkeypatch,
                                                       capsys):  # fmt: skip
    import distil.plan

    def fail(cfg, target):
        raise ValueError("no plan today")

    monkeypatch.setattr(distil.plan, "make_plan", fail)
    loop.train(build_config(make_train_config(train={"max_steps": 1})))
    assert "memory plan: not made (no plan today)" in capsys.readouterr().out
    (m,) = read_metrics(tmp_path / "run")
    assert "memory/planned_peak_bytes" not in m and m["memory/rss_peak_bytes"] > 0
