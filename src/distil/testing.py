"""Test helpers: local stand-ins for hub tokenizers and models (nothing downloads anything).

Serves tests and benchmarks only; the product never imports it (a test checks). The builders
themselves are product code: the four tokenizer families in `distil.models.tokenizer_families`
and the random-init models in `distil.models.scratch`. This module adds a synthetic corpus
(`default_corpus`: sentences, arithmetic, Countdown lines, numbers) that `train_tokenizer`
uses by default, and shortcuts: `tiny_llama`, `tiny_qwen2`, `build_model_dir` (a model and its
tokenizer saved where `from_pretrained` reads them), `load_tokenizer`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import (
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2ForCausalLM,
)

from distil.models import tokenizer_families
from distil.models.scratch import count_parameters, tiny_model
from distil.models.tokenizer_families import (
    CHAR_TEMPLATE,
    DEFAULT_VOCAB_SIZE,
    FAMILIES,
    save_tokenizer,
)
from distil.models.tokenizers import id_rows

__all__ = [
    "CHAR_TEMPLATE",
    "DEFAULT_VOCAB_SIZE",
    "FAMILIES",
    "build_model_dir",
    "count_parameters",
    "default_corpus",
    "load_tokenizer",
    "save_tokenizer",
    "tiny_llama",
    "tiny_model",
    "tiny_qwen2",
    "train_tokenizer",
]

_WORD_TEXT = (
    "the a one some every cat dog bird fish sky sun moon tree river stone road house city blue red "
    "green quick slow happy small large bright dark old new runs jumps sings swims flies sleeps "
    "eats reads writes counts adds finds keeps makes takes gives plus minus times equals answer "
    "question number sum target because therefore however while after before under over near "
    "with from into and but or not is was will can it they we you"
)
_WORDS = _WORD_TEXT.split()
_NAMES = ("Ada", "Bob", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana")


def default_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Return `n` synthetic lines: English-like sentences, arithmetic, Countdown problems, numbers.

    Countdown lines look like "nums: 12 7 3 target: 33 -> <answer>(12+7)*3</answer>", with each
    number used once and a correct target. The same (n, seed) always gives the same lines.
    """
    rng = random.Random(seed)
    makers = (_sentence, _sentence, _arithmetic, _countdown, _countdown, _numbers)
    return [makers[i % len(makers)](rng) for i in range(n)]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(_NAMES))
    if rng.random() < 0.3:
        i = rng.randrange(1, len(words))
        words[i - 1] += ","
    if rng.random() < 0.15:
        words[-1] = f'"{words[-1]}"'
    text = " ".join(words)
    if rng.random() < 0.1:
        text = text.replace(" is", "'s", 1)
    return text[0].upper() + text[1:] + rng.choice(".....!?;:")


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(1, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return rng.choice(["{e} = {v}", "What is {e}? {v}.", "{e} equals {v}"]).format(
        e=f"{a} {op} {b}", v=value
    )


_COUNTDOWN_FORMS = ("({a}+{b})*{c}", "{a}*{b}-{c}", "{a}+{b}+{c}", "{a}*({b}-{c})", "{a}-{b}+{c}")


def _countdown(rng: random.Random) -> str:
    while True:
        a, b, c = (rng.randint(1, 99) for _ in range(3))
        expr = rng.choice(_COUNTDOWN_FORMS).format(a=a, b=b, c=c)
        target = eval(expr, {"__builtins__": {}})  # only digits and + - * ( ): safe
        if 0 < target < 1000:
            return f"nums: {a} {b} {c} target: {target} -> <answer>{expr}</answer>"


def _numbers(rng: random.Random) -> str:
    return rng.choice(
        [
            f"In {rng.randint(1900, 2030)} there were {rng.randint(2, 5000)} {rng.choice(_WORDS)}s.",
            f"{rng.choice(_NAMES)} paid ${rng.randint(1, 99)}.{rng.randint(10, 99)} (about {rng.randint(2, 40)}%).",
            " ".join(
                str(rng.randint(0, 10 ** rng.randint(1, 4))) for _ in range(rng.randint(3, 8))
            ),
        ]
    )


def train_tokenizer(
    family: str,
    corpus: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    **kwargs: Any,
) -> PreTrainedTokenizerFast:
    """`distil.models.tokenizer_families.train_tokenizer` with `corpus` defaulting to
    `default_corpus()`."""
    lines = default_corpus() if corpus is None else corpus
    return tokenizer_families.train_tokenizer(family, lines, vocab_size, **kwargs)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a saved tokenizer the way distil loads user tokenizers (`models.load`)."""
    from distil.models.load import load_tokenizer as _load

    return _load(str(path), key="tokenizer")


def tiny_llama(vocab_size: int, **kwargs: Any) -> LlamaForCausalLM:
    """Return `tiny_model("llama", vocab_size, **kwargs)`, a seeded tiny `LlamaForCausalLM`."""
    return tiny_model("llama", vocab_size, **kwargs)


def tiny_qwen2(vocab_size: int, **kwargs: Any) -> Qwen2ForCausalLM:
    """Return `tiny_model("qwen2", vocab_size, **kwargs)`, a seeded tiny `Qwen2ForCausalLM`."""
    return tiny_model("qwen2", vocab_size, **kwargs)


def build_model_dir(
    path: str | Path,
    family: str = "bpe",
    arch: str = "llama",
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    **model_kwargs: Any,
) -> Path:
    """Save a tiny `arch` model ("llama" | "qwen2") and its tokenizer into `path`; returns it.

    The tokenizer is `tokenizer` when given, else one of `family` trained on `corpus` with
    `vocab_size`. The model's vocabulary is the tokenizer's id rows (`id_rows`: largest id
    + 1). `AutoModelForCausalLM` loads the model back; load the tokenizer with
    `load_tokenizer(path)` (plain `AutoTokenizer` rebuilds a qwen2 directory's tokenizer from
    its vocabulary in transformers 5, with other ids).
    """
    if tokenizer is None:
        tokenizer = train_tokenizer(family, corpus, vocab_size)
    model = tiny_model(
        arch,
        id_rows(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        seed=seed,
        tokenizer=tokenizer,
        **model_kwargs,
    )
    path = save_tokenizer(tokenizer, path)
    model.save_pretrained(path)
    return path


def train_config(tmp_path: Path, countdown_dir: Path, pair_dirs, **sections) -> dict[str, Any]:
    """A small training config dict: the tests' Countdown data, (teacher, student) = pair_dirs,
    3 steps of jsd with lambda 0.5, output under tmp_path/run; `sections` override keys."""
    teacher, student = pair_dirs
    cfg = {
        "data": {"train": str(countdown_dir / "train.jsonl"), "template": "countdown_plain"},
        "student": {"path": str(student)},
        "teacher": {"path": str(teacher)},
        "generation": {"max_new_tokens": 12, "num_generations": 2},
        "loss": {"name": "jsd", "beta": 0.5},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "per_device_batch_size": 4,
            "grad_accum_steps": 2,
            "lr": 1e-3,
            "lambda": 0.5,
            "seed": 0,
        },
        "eval": {"n": 8, "max_new_tokens": 12, "data": str(countdown_dir / "test.jsonl")},
        "logging": {"progress": False, "print_example": False},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def teacher_alone(raw: dict[str, Any], name: str):
    """`build_config` of a several-teacher config dict with teacher `name` alone as `teacher`
    (its own path, context, ...), the reference a routed or written row is compared with."""
    import copy

    from distil.config import build_config

    one = copy.deepcopy(raw)
    one["teacher"] = dict(one["teachers"].pop("models")[name])
    one["teachers"] = {}
    return build_config(one)


def config_with(raw: dict[str, Any], **sections: dict[str, Any]):
    """`build_config` of a copy of the config dict `raw`, each section updated with `sections`."""
    import copy

    from distil.config import build_config

    raw = copy.deepcopy(raw)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return build_config(raw)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl, one dict per logged step."""
    import json

    text = (Path(run_dir) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def train_killed_after_checkpoint(monkeypatch, cfg, step: int) -> None:
    """Train `cfg`, kill the run (KeyboardInterrupt) right after its step-`step` checkpoint is
    written, then run the same config again so that it resumes from that checkpoint."""
    import pytest

    from distil.train import loop

    real_save = loop.save_checkpoint

    def save_then_die(acc, out, at, state, keep, **kw):
        path = real_save(acc, out, at, state, keep, **kw)
        if at == step:
            raise KeyboardInterrupt  # killed right after the checkpoint
        return path

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        loop.train(cfg)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    loop.train(cfg)


def run_process_group(cmd: list[str], timeout: float = 600):
    """Run a multi-process launch (torchrun / accelerate launch) as tests do: one thread per
    process, output captured, in its own process group so that a kill takes every rank down."""
    import os
    import subprocess

    return subprocess.run(
        cmd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def build_peaked_teacher(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, hidden_size: int = 96, seed: int = 5
) -> Path:
    """A tiny Qwen2 teacher saved into `path` whose output head is scaled up (x30), so that its
    distributions are peaked like a trained model's (a near-uniform random teacher gives the
    sorted-probability losses, uld and gold, almost nothing to learn from)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = build_model_dir(
        path,
        arch="qwen2",
        tokenizer=tokenizer,
        hidden_size=hidden_size,
        seed=seed,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    model.save_pretrained(path)
    return path
