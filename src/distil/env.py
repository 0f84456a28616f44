"""`distil env`: the versions a bug report needs (Python, torch, transformers, accelerate, vLLM,
the GPUs), one `name: value` line each, to paste as it is (as `accelerate env` and `trl env`
print theirs).

Package versions come from the installed distributions' metadata, so vLLM (a minutes-long
import) is never imported; torch is, for the CUDA build and the devices.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

# distributions reported, in this order ("not installed" where absent)
PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "tokenizers",
    "huggingface_hub",
    "vllm",
    "peft",
    "liger-kernel",
    "flash-attn",
    "lm_eval",
)


def version_of(distribution: str) -> str:
    """The installed version of `distribution`, or "not installed"."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, str]:
    """The report as ordered `name -> value` pairs."""
    from distil import __version__

    info = {
        "distil": __version__,
        "Python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
    }
    info.update({name: version_of(name) for name in PACKAGES})
    info.update(_devices())
    return info


def _devices() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {"GPU": "unknown (torch is not installed)"}
    cuda = torch.version.cuda or "none (CPU build)"
    if not torch.cuda.is_available():
        return {"CUDA (torch build)": cuda, "GPU": "none"}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    gib = [torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(len(names))]
    each = [f"{n} ({m:.0f} GiB)" for n, m in zip(names, gib, strict=True)]
    shown = f"{len(each)} x {each[0]}" if len(set(each)) == 1 else ", ".join(each)
    return {"CUDA (torch build)": cuda, "GPU": shown}


def format_environment(info: dict[str, str] | None = None) -> str:
    """The report as aligned `- name: value` lines (Markdown list, as bug reports take it)."""
    info = environment() if info is None else info
    width = max(len(k) for k in info) + 1
    return "\n".join(f"- {k + ':':<{width}} {v}" for k, v in info.items())


def add_env(sub) -> None:
    p = sub.add_parser("env", help="versions of Python, torch, transformers, vLLM and the GPUs")
    p.set_defaults(func=_env)


def _env(args) -> int:
    print(format_environment())
    return 0
