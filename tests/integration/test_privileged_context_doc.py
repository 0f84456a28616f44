"""docs/privileged-context.md "Try it on a CPU" runs as written on a fresh clone: each command is
parsed from the page (so the doc cannot drift) and run through the real CLI entry, in order, in
a temporary directory holding only docs/configs/."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from distil.cli import main

ROOT = Path(__file__).resolve().parents[2]


def doc_commands() -> list[list[str]]:
    text = (ROOT / "docs/privileged-context.md").read_text()
    block = re.search(r"## Try it on a CPU\n.*?```bash\n(.*?)```", text, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_doc_commands_are_distil_commands_and_use_its_configs():
    commands = doc_commands()
    assert commands and all(c[0] == "distil" for c in commands)
    trains = [c for c in commands if c[1] == "train"]
    assert {c[2] for c in trains} == {
        "docs/configs/privileged_context.yaml",
        "docs/configs/self_distillation.yaml",
    }
    assert any("train.seq_kd=true" in c for c in trains)


@pytest.mark.slow
def test_try_it_on_a_cpu_runs_as_written(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "docs" / "configs", tmp_path / "docs" / "configs")
    monkeypatch.chdir(tmp_path)
    for argv in doc_commands():
        code = main(argv[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"{shlex.join(argv)} exited {code}:\n{err[-2000:]}"
        if argv[1:3] == ["config", "validate"]:
            assert out.strip().endswith(": ok"), out
        if argv[1:3] == ["inspect", "pair"]:  # both prompts of the first rows, before training
            assert "the teacher sees" in out and "the student sees" in out
        if argv[1:3] == ["train", "docs/configs/privileged_context.yaml"] and len(argv) == 3:
            assert "the teacher sees" in err and "the student sees" in err
    for run in ("run", "seq_kd", "self"):
        assert (tmp_path / "runs/pc" / run / "final" / "config.json").is_file(), run
