"""A cross-tokenizer training run on the real tokenizers: a Gemma-3-tokenized student and a
Qwen3-tokenized teacher (tiny random models built on those tokenizer files).

Off-policy on completions with indentation and runs of spaces and newlines, the text where
Gemma's added whitespace tokens ('▁▁▁', '\\n\\n\\n') appear: the run trains, every completion
byte is aligned exactly, and the printed example shows the whitespace runs aligned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from distil.config import build_config
from distil.models.load import load_tokenizer
from distil.testing import build_model_dir
from distil.train import loop

ROOT = Path(
    os.environ.get(
        "DISTIL_REAL_TOKENIZERS", Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
    )
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all((ROOT / n / "tokenizer.json").exists() for n in ("gemma3", "qwen3", "llama3")),
        reason=f"real tokenizer files not found under {ROOT} (set DISTIL_REAL_TOKENIZERS)",
    ),
]

COMPLETIONS = [
    "def f(x):\n    if x:\n        return 1\n\n\n    return 0",
    "a   b    c\n\n\nd",
    "table:\n  | x |   y |\n  | 1 |   2 |",
    "for i in range(3):\n\tprint(i)   # three spaces",
]


@pytest.mark.budget(
    140, "the real Gemma 3 and Qwen3 tokenizers (262k and 151k vocabularies) in a training run"
)
def test_gemma_student_qwen_teacher_aligns_whitespace_runs(tmp_path, capsys):
    student = build_model_dir(
        tmp_path / "student", tokenizer=load_tokenizer(ROOT / "gemma3"), hidden_size=32, seed=1
    )
    teacher = build_model_dir(
        tmp_path / "teacher",
        arch="qwen2",
        tokenizer=load_tokenizer(ROOT / "qwen3"),
        hidden_size=32,
        seed=2,
    )
    data = tmp_path / "code.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"write snippet {i}"}], "completion": c}
        for i, c in enumerate(COMPLETIONS)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(
        {
            "data": {"train": str(data), "shuffle": False},
            "student": {"path": str(student)},
            "teacher": {"path": str(teacher)},
            "generation": {"num_generations": 1},
            "loss": {"name": "aligned_kl"},
            "train": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "per_device_batch_size": 4,
                "grad_accum_steps": 1,
                "lambda": 0.0,
                "lr": 1e-3,
                "warmup_steps": 0,
            },
            "logging": {"progress": False, "print_example": True},
        }
    )
    loop.train(cfg)
    shown = capsys.readouterr()
    printed = shown.out + shown.err
    # the first completion's blank lines and indentation, as Gemma's added tokens, each in a
    # group with the teacher's tokens for the same bytes
    example = printed[printed.index("student │") :]
    print(example)
    assert "↵↵↵" in example and "␣␣␣␣" in example, example
    assert "0 of 21 student tokens outside groups" in printed, printed[-3000:]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["skipped"] == 0 for m in metrics)
    assert metrics[0]["align/bytes"] == metrics[0]["align/bytes_exact"] > 0
    assert metrics[0]["align/unalignable_tokens"] == 0


@pytest.mark.budget(
    100, "the real Qwen3 and Llama 3 tokenizers, on-policy at a 151,936-row vocabulary"
)
def test_qwen3_student_padded_to_151936_rows_samples_on_policy_with_a_llama_teacher(tmp_path):
    """The issue's crash: Qwen3's model vocabulary is 151,936 rows, its tokenizer 151,669
    tokens; a sampled padding id (151,793 there) reached the aligned loss's 151,669-wide tables.
    Here the padding rows' logits are made the largest by far (+-100 x some real rows, so
    unmasked nearly every sampled token would be one) and the run trains on-policy against a
    Llama-3-tokenized teacher."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(ROOT / "qwen3")
    assert len(tok) == 151_669
    student = build_model_dir(tmp_path / "student", arch="qwen2", tokenizer=tok, hidden_size=32,
                              seed=1, tie_word_embeddings=False)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(student)
    model.resize_token_embeddings(151_936)  # Qwen3's padded rows
    with torch.no_grad():
        w, pad = model.lm_head.weight, 151_936 - len(tok)
        w[len(tok) :: 2] = 100 * w[: (pad + 1) // 2]  # softmax all but 1 on the padding
        w[len(tok) + 1 :: 2] = -100 * w[: pad // 2]
    model.save_pretrained(student)
    teacher = build_model_dir(
        tmp_path / "teacher", tokenizer=load_tokenizer(ROOT / "llama3"), hidden_size=32, seed=2
    )
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"count to {i}"}]} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config({
        "data": {"train": str(data)},
        "student": {"path": str(student)},
        "teacher": {"path": str(teacher)},
        "generation": {"num_generations": 1, "max_new_tokens": 12},
        "loss": {"name": "aligned_kl"},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "lambda": 1.0,
                  "per_device_batch_size": 4, "grad_accum_steps": 1, "lr": 1e-3},
        "logging": {"progress": False, "print_example": False},
    })  # fmt: skip
    loop.train(cfg)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["skipped"] == 0 for m in metrics)
    assert metrics[0]["completion/mean_tokens"] > 0
