"""Shared fixtures: locally trained tokenizers, tiny model directories, seeding, the gpu marker.

Tokenizer fixtures are trained once per session, saved, and reloaded with
`AutoTokenizer.from_pretrained`, so tests exercise the real loading path. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

# no test reaches the hub: a hub id that is not in the (test's own) hub cache fails at once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from distil.testing import (
    build_model_dir,
    save_tokenizer,
    tiny_llama,
    train_config,
    train_tokenizer,
)

torch.set_num_threads(int(os.environ.get("DISTIL_TEST_THREADS", "1")))

MAIN_FAMILIES = ("bpe", "unigram", "wordpiece")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _trained_and_reloaded(tmp_path_factory: pytest.TempPathFactory, family: str):
    from transformers import AutoTokenizer

    path = save_tokenizer(train_tokenizer(family), tmp_path_factory.mktemp(f"tok_{family}"))
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    """Byte-level BPE ('Ġ'), ChatML template; reloaded from disk."""
    return _trained_and_reloaded(tmp_path_factory, "bpe")


@pytest.fixture(scope="session")
def unigram_tokenizer(tmp_path_factory):
    """SentencePiece-style Unigram ('▁', byte fallback, adds <bos>), Gemma-like template."""
    return _trained_and_reloaded(tmp_path_factory, "unigram")


@pytest.fixture(scope="session")
def wordpiece_tokenizer(tmp_path_factory):
    """WordPiece ('##', whitespace split), [INST]-style template; reloaded from disk."""
    return _trained_and_reloaded(tmp_path_factory, "wordpiece")


@pytest.fixture(scope="session")
def char_tokenizer(tmp_path_factory):
    """One token per character plus <answer>/</answer>; reloaded from disk."""
    return _trained_and_reloaded(tmp_path_factory, "char")


@pytest.fixture(params=MAIN_FAMILIES)
def tokenizer_family(request) -> str:
    """The name of one of the three main families: "bpe", "unigram", "wordpiece"."""
    return request.param


@pytest.fixture
def family_tokenizer(request, tokenizer_family):
    """The session tokenizer of `tokenizer_family` (so a test runs once per main family)."""
    return request.getfixturevalue(f"{tokenizer_family}_tokenizer")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, bpe_tokenizer) -> Path:
    """A saved tiny Llama (hidden 64, 2 layers, seed 0) with the bpe tokenizer."""
    return build_model_dir(
        tmp_path_factory.mktemp("tiny_llama"), "bpe", "llama", tokenizer=bpe_tokenizer
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, unigram_tokenizer) -> Path:
    """A saved tiny Qwen2 with the unigram tokenizer.

    Load its tokenizer with `distil.testing.load_tokenizer`: plain AutoTokenizer replaces it
    with a Qwen2 BPE built from the vocabulary alone (transformers 5 behaviour for qwen2).
    """
    return build_model_dir(
        tmp_path_factory.mktemp("tiny_qwen2"), "unigram", "qwen2", tokenizer=unigram_tokenizer
    )


@pytest.fixture
def tiny_llama_model(bpe_tokenizer):
    """A fresh tiny Llama (seed 0) over the bpe tokenizer's vocabulary, in eval mode."""
    return tiny_llama(len(bpe_tokenizer), tokenizer=bpe_tokenizer)


@pytest.fixture(scope="session")
def countdown_dir(tmp_path_factory) -> Path:
    """64 train / 16 test Countdown problems (3 numbers), plain template, seed 0."""
    from distil.tasks.countdown import generate_dataset

    out = tmp_path_factory.mktemp("countdown")
    generate_dataset(out, n=64, test_n=16, template="countdown_plain", seed=0)
    return out


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory, bpe_tokenizer) -> tuple[Path, Path]:
    """(teacher, student) model directories sharing the bpe tokenizer: hidden 96 vs 64."""
    root = tmp_path_factory.mktemp("pair")
    teacher = build_model_dir(root / "teacher", tokenizer=bpe_tokenizer, hidden_size=96, seed=1)
    student = build_model_dir(root / "student", tokenizer=bpe_tokenizer, hidden_size=64, seed=2)
    return teacher, student


@pytest.fixture(scope="session")
def second_teacher(tmp_path_factory, bpe_tokenizer) -> Path:
    """Another teacher with the pair's tokenizer (other seed, other width): several teachers."""
    return build_model_dir(
        tmp_path_factory.mktemp("t2"), tokenizer=bpe_tokenizer, hidden_size=80, seed=7
    )


@pytest.fixture(scope="session")
def routed_data(tmp_path_factory, countdown_dir) -> Path:
    """The tests' train rows with a `source` column alternating big, small (routed teachers)."""
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r["source"] = "small" if i % 2 else "big"
    path = tmp_path_factory.mktemp("routed") / "routed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def make_train_config(tmp_path, countdown_dir, pair_dirs):
    """make_train_config(**sections) -> a small training config dict (sections override)."""
    return lambda **sections: train_config(tmp_path, countdown_dir, pair_dirs, **sections)
