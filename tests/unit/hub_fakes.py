"""A local stand-in of the Hugging Face hub cache, so that configs naming hub ids (the presets'
Qwen/Qwen3-0.6B, meta-llama/Llama-3.1-8B-Instruct) validate and plan offline: each id is a
snapshot directory holding the publisher's config.json (tests/data/model_configs) and the real
tokenizer files (../shared/tokenizers), found by transformers exactly as after a download.
Every hub file request is recorded, so a test can say which models a command looked up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
REAL = Path(os.environ.get("DISTIL_REAL_TOKENIZERS", ROOT.parent / "shared" / "tokenizers"))
COMMIT = "0" * 40
# hub id -> (tests/data/model_configs directory, real tokenizer directory)
MODELS = {
    "Qwen/Qwen3-0.6B": ("qwen3-0.6b", "qwen3"),
    "Qwen/Qwen3-8B": ("qwen3-8b", "qwen3"),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama-3.1-8b", "llama3"),
}
HAVE_TOKENIZERS = all((REAL / t / "tokenizer.json").exists() for _, t in MODELS.values())
needs_real_tokenizers = pytest.mark.skipif(
    not HAVE_TOKENIZERS,
    reason=f"real tokenizer files not found under {REAL} (set DISTIL_REAL_TOKENIZERS)",
)


def fill_hub_cache(root: Path, ids) -> Path:
    """Snapshots of hub `ids` (keys of MODELS) under `root`, laid out as huggingface_hub's
    cache: models--ORG--NAME/{snapshots/COMMIT/..., refs/main}."""
    for repo in ids:
        config, tokenizer = MODELS[repo]
        base = root / f"models--{repo.replace('/', '--')}"
        snap = base / "snapshots" / COMMIT
        snap.mkdir(parents=True, exist_ok=True)
        shutil.copy(CONFIGS / config / "config.json", snap / "config.json")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (snap / name).exists():
                os.symlink(REAL / tokenizer / name, snap / name)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(COMMIT)
    return root


def offline_hub(tmp_path_factory, monkeypatch):
    """The body of a test's `offline_hub` fixture: offline_hub(*ids) -> the list of repo ids requested from the hub from then on: the hub
    cache holds `ids` only and the hub is offline (a request for anything else fails at once,
    as with HF_HUB_OFFLINE=1)."""
    import huggingface_hub.constants as constants
    import transformers.utils.hub as hub

    requested: list[str] = []
    real = hub.hf_hub_download

    def recording(*args, **kwargs):
        requested.append(kwargs.get("repo_id") or args[0])
        return real(*args, **kwargs)

    def start(*ids: str) -> list[str]:
        root = fill_hub_cache(tmp_path_factory.mktemp("hub"), ids)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(hub, "hf_hub_download", recording)
        return requested

    return start
