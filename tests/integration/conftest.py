"""The smoke demo that the demo's integration tests share (their modules are one xdist group,
"demo", so that one worker runs it once per session)."""

import pytest
from test_demo import run_demo


@pytest.fixture(scope="session")
def smoke_demo(tmp_path_factory):
    """One smoke demo from the checkout: (output dir, cache dir, completed process). It runs as
    `distil demo --out demo` in its own directory, so its stages' commands name their files
    relative to it (a copy of the directory is the same run, for `--resume`); its cache holds
    the trained teacher that the other demo runs reuse."""
    root = tmp_path_factory.mktemp("demo")
    run = run_demo("demo", root / "cache", root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root / "demo", root / "cache", run
