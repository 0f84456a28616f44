"""Plans that are true on a GPU: `torch.cuda.max_memory_allocated` of real-size training steps
(Qwen3-0.6B-shaped student, Qwen3-1.7B-shaped teacher, 151,936-row vocabulary, random bf16
weights built from tests/data/model_configs; nothing is downloaded) within 20% of the peak
`distil plan` gives for the device, as `distil train` records both in metrics.jsonl.

Every prompt is cut to exactly `data.max_prompt_tokens` and random weights rarely sample EOS,
so the steps run at the plan's worst-case lengths. The loss runs eager (`loss.compile=false`):
the copy counts of the plan's loss chunk were measured eager; a compiled chunk holds fewer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from distil.config import build_config
from distil.testing import default_corpus, read_metrics, save_tokenizer, train_tokenizer
from distil.train import loop

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"
TOLERANCE = 0.20


def random_model(out: Path, name: str, tok, seed: int) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    ids = {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    raw = {**json.loads((CONFIGS / name / "config.json").read_text()), **ids}
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**raw), dtype=torch.bfloat16)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    del model
    torch.cuda.empty_cache()
    return str(out)


@pytest.mark.parametrize("precision", ["bf16_weights", "bf16"])
def test_plan_within_20_percent_of_max_memory_allocated_at_real_size(tmp_path, precision):
    tok = train_tokenizer("bpe", default_corpus(4000), 512)
    student = random_model(tmp_path / "student", "qwen3-0.6b", tok, 0)
    teacher = random_model(tmp_path / "teacher", "qwen3-1.7b", tok, 1)
    rng = random.Random(0)
    words = default_corpus(200)
    with open(tmp_path / "train.jsonl", "w") as fh:
        for _ in range(64):
            text = " ".join(rng.choice(words) for _ in range(200))
            fh.write(json.dumps({"prompt": text, "completion": text}) + "\n")
    cfg = build_config({
        "data": {"train": str(tmp_path / "train.jsonl"), "max_prompt_tokens": 128,
                 "overlong": "truncate"},
        "student": {"path": student, "dtype": "float32"},
        "teacher": {"path": teacher, "dtype": "bfloat16"},
        "generation": {"max_new_tokens": 256},
        "loss": {"name": "reverse_kl", "compile": False},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "lambda": 1.0,
                  "per_device_batch_size": 8, precision: True, "resume": "never",
                  "save_every_minutes": None},
        "logging": {"progress": False, "print_example": False},
    })  # fmt: skip
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loop.train(cfg)
    last = read_metrics(tmp_path / "run")[-1]
    measured = last["memory/peak_allocated_bytes"] - before
    planned = last["memory/planned_peak_bytes"]
    print(f"{precision}: planned {planned / 1e9:.2f} GB, measured {measured / 1e9:.2f} GB")
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)
