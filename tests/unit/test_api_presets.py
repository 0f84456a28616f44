"""The README's "From Python" code names a real-pair preset: from Python it validates and plans
exactly as `distil config validate` and `distil plan` do on the command line (offline: the
hub ids are answered by a local hub cache of the publishers' config.json and real tokenizers,
hub_fakes), and the plan's headline is the one the README quotes."""

from __future__ import annotations

import ast
import re

import hub_fakes
import pytest
from hub_fakes import ROOT, needs_real_tokenizers

import distil
from distil.cli import main
from distil.plan import headline

pytestmark = needs_real_tokenizers
PAIR = ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct")


def readme_python() -> tuple[str, dict]:
    """(the config path, the overrides) of the README's From Python block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S).group(1)
    found = re.search(r'distil\.Distiller\("([^"]+)", (\{[^}]*\})\)', block)
    assert len([x for x in block.splitlines() if x.strip()]) <= 10
    return found.group(1), ast.literal_eval(found.group(2))


@pytest.fixture
def offline_hub(tmp_path_factory, monkeypatch):
    return hub_fakes.offline_hub(tmp_path_factory, monkeypatch)


def test_the_readme_python_quickstart_validates_and_plans_as_the_cli(offline_hub, tmp_path, capsys):
    config, overrides = readme_python()
    offline_hub(*PAIR)
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text('{"question": "How many clips?", "answer": "48 clips.\\n#### 48"}\n')
    local = {"data.train": str(rows), "train.output_dir": str(tmp_path / "run")}
    run = distil.Distiller(ROOT / config, {**overrides, **local, "generation.backend": "hf"})
    notes = run.validate().notes
    args = [f"{k}={v}" for k, v in {**overrides, **local, "generation.backend": "hf"}.items()]
    assert main(["config", "validate", str(ROOT / config), *args]) == 0
    cli = capsys.readouterr().out.splitlines()
    assert [f"note: {n}" for n in notes] == [x for x in cli if x.startswith("note: ")]
    planned = headline(distil.Distiller(ROOT / config, overrides).plan())
    assert planned in (ROOT / "README.md").read_text()  # the Quickstart B headline it quotes
    assert main(["plan", str(ROOT / config), *[f"{k}={v}" for k, v in overrides.items()]]) == 0
    assert planned in capsys.readouterr().out
