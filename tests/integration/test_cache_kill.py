"""SIGKILL `distil cache-teacher` at its worst moments, then run it again: the finished cache
equals one written without interruption, and only the unlisted rows are scored again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distil.teacher import cache as fmt
from distil.testing import train_config
from warm import run as warm_run

pytestmark = pytest.mark.slow

# The real CLI in a child process that SIGKILLs itself: "shard:N" after shard N's .tmp file is
# written but before its rename, "manifest:N" after shard N is in place but before the manifest
# lists it, "none" to run to the end. argv: src dir, kill point, CLI args...
CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from distil.teacher import cache, writer
where, _, n = sys.argv[2].partition(":")
real_replace, real_manifest = cache.os.replace, cache.write_manifest
shards = [0]
def replace(src, dst):
    if where == "shard" and str(src).endswith(cache.shard_name(int(n)) + ".tmp"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)
def manifest(out, m):
    if where == "manifest" and len(m["shards"]) == int(n) + 1 and not m.get("complete"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_manifest(out, m)
cache.os.replace = replace
writer.fmt.write_manifest = manifest
from distil.cli import main
sys.exit(main(sys.argv[3:]))
"""

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(kill_at: str, cfg_file: Path, out: Path) -> subprocess.CompletedProcess:
    args = ["cache-teacher", str(cfg_file), "--out", str(out), "--shard-rows", "8"]
    # a real process, forked from the warm interpreter (tests/warm.py)
    return warm_run(
        [sys.executable, "-c", CHILD, SRC, kill_at, *args], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, countdown_dir, pair_dirs):
    """(config file, its cache written without interruption): once, for every kill below."""
    root = tmp_path_factory.mktemp("cache_kill")
    raw = train_config(root, countdown_dir, pair_dirs, teacher={"top_k": 8}, train={"lambda": 0.0})
    cfg_file = root / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    full = run("none", cfg_file, root / "full")
    assert full.returncode == 0, full.stderr
    return cfg_file, root / "full"


@pytest.mark.budget(100, "a teacher cache killed part way and rerun, per layout")
@pytest.mark.parametrize("kill_at", ["shard:2", "manifest:2", "manifest:0"])
def test_sigkill_then_rerun_equals_an_uninterrupted_cache(tmp_path, uninterrupted, kill_at):
    cfg_file, full = uninterrupted
    out = tmp_path / "killed"
    killed = run(kill_at, cfg_file, out)
    assert killed.returncode == -9, killed.stderr
    listed = (
        json.loads((out / fmt.MANIFEST).read_text())["shards"]
        if (out / fmt.MANIFEST).exists()
        else []
    )
    assert len(listed) == int(kill_at.split(":")[1])  # the cut shard is not listed
    again = run("none", cfg_file, out)
    assert again.returncode == 0, again.stderr
    want, got = fmt.read_manifest(full), fmt.read_manifest(out)
    assert got["complete"] and got["tokens"] == want["tokens"]
    assert [e["sha256"] for e in got["shards"]] == [e["sha256"] for e in want["shards"]]
    assert not list(out.glob("*.tmp"))
