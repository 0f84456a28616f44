"""docs/demo.md's "Every command, on a CPU" commands run, in order, on a fresh clone (configs/
and nothing else).

Each line is parsed from docs/demo.md and run through the real CLI entry in a temporary
directory; only sizes shrink (fewer problems, tiny models, two steps), the commands and paths
are the page's own.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from distil.cli import main

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SMALL = [
    "train.max_steps=2",
    "train.warmup_steps=0",
    "train.per_device_batch_size=4",
    "train.eval_every=0",
    "generation.max_new_tokens=8",
    "logging.progress=false",
    "logging.print_example=false",
]


def readme_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "demo.md").read_text()
    block = re.search(r"## Every command, on a CPU\n.*?```bash\n(.*?)```", text, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line]


def shrink(argv: list[str]) -> list[str]:
    """The same command with small sizes (the README's are for a real run)."""
    args = argv[1:]
    sizes = {"--n": {"generate": "300", "eval": "8"}, "--hidden-size": {"init-model": "32"}}
    for i, a in enumerate(args[:-1]):
        if a in sizes:
            args[i + 1] = next(v for k, v in sizes[a].items() if k in args)
    if args[:2] == ["countdown", "generate"]:
        args += ["--test-n", "20"]
    if args[0] == "init-model":
        args += ["--layers", "1", "--heads", "2"] + (
            [] if "--hidden-size" in args else ["--hidden-size", "32"]
        )
    if args[0] == "train":
        args += TRAIN_SMALL
    if args[0] == "eval" and "--model" in args:
        args += ["--max-new-tokens", "8", "--no-progress"]
    return args


@pytest.mark.slow
def test_readme_using_it_commands_run_in_order_from_a_fresh_clone(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    commands = readme_commands()
    assert len(commands) >= 10 and all(c[0] == "distil" for c in commands)
    for argv in commands:
        code = main(shrink(argv))
        out, err = capsys.readouterr()
        assert code == 0, f"{shlex.join(argv)} exited {code}:\n{err[-2000:]}"
        if argv[1:3] == ["config", "validate"]:
            assert out.strip().endswith(": ok")
        if "--completions" in argv:  # the reference solutions themselves: all correct
            assert "| 20/20 |" in out, out
    assert (tmp_path / "runs/countdown_onpolicy/final/config.json").is_file()
    assert (tmp_path / "runs/countdown_crosstok/final/config.json").is_file()
