"""`distil train` and `distil eval` end to end through the real CLI on tiny models (CPU): train,
resume and eval through the CLI's entry point in this process (what a subprocess would add is
the interpreter start; the process itself is tested by the bad config's exit status below,
tests/integration/test_kill.py and test_tasks_cli.py); a bad config in a real process."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from distil.cli import main

pytestmark = pytest.mark.slow

REQUIRED = {
    "loss",
    "kl",
    "student_entropy",
    "policy/on_policy_share",
    "grad_norm",
    "lr",
    "tokens/loss",
    "time/generate",
    "time/teacher",
    "time/train",
    "skipped",
}


def in_process(capsys, *args) -> tuple[int, str, str]:
    """`distil *args` through the CLI's entry point: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def distil(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "distil", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.budget(100, "a training run, its resume and an evaluation through the CLI")
def test_train_then_resume_then_eval(
    tmp_path, make_train_config, countdown_dir, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(make_train_config(logging={"print_example": True})))
    code, _, err = in_process(capsys, "train", str(cfg_path), "train.max_steps=3")
    assert code == 0, err
    assert "training example" in err and "trained on" in err
    run_dir = tmp_path / "run"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert set(metrics[0]) >= REQUIRED
    # pinned first loss (tiny seeded models, seeded data and sampling; CPU fp32)
    assert metrics[0]["loss"] == pytest.approx(FIRST_LOSS, rel=1e-3)
    assert (run_dir / "checkpoints" / "step-00000003" / "trainer_state.json").exists()
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (
        resolved["train"]["max_steps"] == 3 and resolved["generation"]["generation_batch_size"] == 4
    )

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    tok = AutoTokenizer.from_pretrained(run_dir / "final")
    assert tok.chat_template and model.config.vocab_size >= len(tok)
    assert (
        json.loads((run_dir / "final" / "distil_model.json").read_text())["template"]
        == "countdown_plain"
    )

    code, out, err = in_process(capsys, "train", str(cfg_path), "train.max_steps=5")
    assert code == 0, err
    assert "resumed from" in out and "step-00000003" in out
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]

    code, out, err = in_process(
        capsys,
        "eval",
        "--model",
        str(run_dir / "final"),
        "--data",
        str(countdown_dir / "test.jsonl"),
        "--n",
        "8",
        "--max-new-tokens",
        "12",
        "--no-progress",
        "--out",
        "report",
    )
    assert code == 0, err
    assert out.startswith("| Model | Correct | Accuracy |") and "| run/final | " in out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["models"][0]["total"] == 8


def test_bad_config_is_one_paragraph_and_exit_2(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train:\n  max_step: 3\n")
    run = distil("train", str(cfg), cwd=tmp_path)
    assert run.returncode == 2
    assert "did you mean 'train.max_steps'" in run.stderr and "Traceback" not in run.stderr


FIRST_LOSS = 0.0081429  # measured once; a change means the math or the data path changed
