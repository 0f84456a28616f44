"""The real-pair presets as a user runs them first, offline: `distil config validate` and
`distil plan` on configs/qwen3_8b_to_qwen3_0.6b.yaml and configs/llama3.1_8b_to_qwen3_0.6b.yaml,
their hub ids answered by a local hub cache holding the publishers' config.json and the real
tokenizers (hub_fakes). The README quotes what these commands print; a test holds it to it.
Also: a command never asks the hub for a model it does not load (a cached teacher)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hub_fakes
import pytest
from hub_fakes import ROOT, needs_real_tokenizers

from distil.cli import main

QWEN = "configs/qwen3_8b_to_qwen3_0.6b.yaml"
LLAMA = "configs/llama3.1_8b_to_qwen3_0.6b.yaml"
PAIRS = {
    QWEN: ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"),
    LLAMA: ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct"),
}
QUESTION = "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"

pytestmark = needs_real_tokenizers


@pytest.fixture
def offline_hub(tmp_path_factory, monkeypatch):
    return hub_fakes.offline_hub(tmp_path_factory, monkeypatch)


@pytest.fixture
def gsm8k_rows(tmp_path) -> Path:
    """Rows in openai/gsm8k's columns (question, answer ending in '#### N')."""
    rows = [
        {"question": QUESTION, "answer": f"She sold 48 clips.\n#### {48 + i}"} for i in range(8)
    ]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("preset", [QWEN, LLAMA])
def test_a_preset_validates_showing_the_first_row_as_each_model_reads_it(
    preset, offline_hub, gsm8k_rows, capsys, tmp_path
):
    requested = offline_hub(*PAIRS[preset])
    over = [f"data.train={gsm8k_rows}", f"train.output_dir={tmp_path / 'run'}"]
    code, out, err = run(capsys, "config", "validate", str(ROOT / preset), *over)
    # on a machine without CUDA and vLLM the preset's sampler is the one problem
    assert code == 2 and "generation.backend" in err and "vllm" in err.lower(), err
    code, out, err = run(
        capsys, "config", "validate", str(ROOT / preset), *over, "generation.backend=hf"
    )
    assert code == 0, err
    assert out.rstrip().endswith(": ok")
    student = out.split("student prompt (", 1)[1]
    # Qwen3's ChatML, with the empty think block enable_thinking=false asks for
    assert "<|im_start|>user" in student and "<think>\n    \n    </think>" in student
    assert QUESTION in student
    assert "completion: written by the student (on-policy, lambda=1)" in out
    if preset == LLAMA:  # the teacher reads Llama 3's own template
        teacher = out.split("teacher prompt:", 1)[1]
        assert "<|start_header_id|>user<|end_header_id|>" in teacher and QUESTION in teacher
        assert "teacher: its chat template does not read data.chat_template_kwargs" in out
    else:
        assert "teacher prompt: the same text as the student's" in out
    assert set(requested) == set(PAIRS[preset])  # the tokenizers the run loads, no other


def plan_headline(capsys, preset: str, *flags: str) -> str:
    code, out, err = run(capsys, "plan", str(ROOT / preset), *flags)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("memory plan: ")]
    return line


@pytest.mark.parametrize("preset", [QWEN, LLAMA])
def test_the_readme_quotes_the_plans_of_the_presets(preset, offline_hub, capsys):
    """The README's Quickstart quotes `distil plan`'s headline on one H100 and on 8 x H100
    under FSDP; both are what the planner prints now."""
    offline_hub(*PAIRS[preset])
    readme = (ROOT / "README.md").read_text()
    one = plan_headline(capsys, preset)
    eight = plan_headline(capsys, preset, "--gpus", "8", "--fsdp")
    assert one in readme, one
    assert eight in readme, eight
    assert re.search(r": fits;", one) and re.search(r": fits;", eight)


def test_no_command_asks_the_hub_for_a_teacher_it_does_not_load(
    offline_hub, gsm8k_rows, capsys, tmp_path
):
    """Training from a cross-tokenizer teacher cache with the preset's hub teacher.path left in
    place: validate and plan read the student only; the plan takes the teacher's vocabulary
    from the cache's manifest."""
    from distil.plan.shapes import model_shape
    from distil.teacher.cache import FORMAT

    model_shape.cache_clear()  # shapes other tests read from their hub caches
    requested = offline_hub("Qwen/Qwen3-0.6B")  # the teacher is not in the hub cache
    cache = tmp_path / "cache"
    cache.mkdir()
    manifest = {
        "format": FORMAT,
        "complete": True,
        "k": 1,
        "rows": 0,
        "values": "fp32",
        "temperature": 1.0,
        "data_fingerprint": "0",
        "shards": [],
        "vocab_size": 128256,
        "cross_tokenizer": True,
        "template": "gsm8k",
        "prompt_format": {
            "text_prompts": "auto",
            "chat_template_kwargs": {"enable_thinking": False},
        },
    }
    (cache / "manifest.json").write_text(json.dumps(manifest))
    over = [f"teacher.cache={cache}", "train.lambda=0.0", "generation.backend=hf"]
    line = plan_headline(capsys, LLAMA, *over)
    code, out, err = run(capsys, "plan", str(ROOT / LLAMA), *over)
    assert "teacher: top-k targets read from" in out and "vocabulary 128,256" in out
    assert line.startswith("memory plan: peak")
    code, out, err = run(capsys, "config", "validate", str(ROOT / LLAMA), *over,
                         f"data.train={gsm8k_rows}", f"train.output_dir={tmp_path / 'run'}")  # fmt: skip
    assert code == 0, err  # the cache saved no tokenizer here: the teacher's prompt is not shown
    assert "teacher prompt: not shown (its tokenizer was not read)" in out
    # the data's answer in student tokens, ended by the template's turn end (a chat prompt)
    assert (
        "completion, from the data (first 12 of 12 tokens): 'She sold 48 clips.\\n#### 48<|im_end|>'"
        in out
    )
    assert "meta-llama/Llama-3.1-8B-Instruct" not in requested, requested
    # the control: without the cache the plan reads the teacher's config.json from the hub
    code, out, err = run(capsys, "plan", str(ROOT / LLAMA), "generation.backend=hf")
    assert code == 2 and "teacher.path = 'meta-llama/Llama-3.1-8B-Instruct'" in err
    assert "meta-llama/Llama-3.1-8B-Instruct" in requested
