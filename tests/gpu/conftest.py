"""The GPU tier's reporting: a test skipped because an optional extra is not installed (vllm,
flash-attn, liger-kernel, ...) is never a quiet pass.

On a machine with CUDA, the end of the run lists every such test under "GPU tests not run for a
missing extra"; with DISTIL_GPU_STRICT=1 (`make test-gpu`) the run then exits 1 even when
everything that ran passed. Without CUDA every GPU test is skipped for that reason instead
(tests/conftest.py) and nothing is listed. Tests skip for an extra with `pytest.importorskip`
or `pytest.skip("missing extra: NAME ...")`; both reasons are recognized (bench/gpu/summary.py reads the same
ones from the junit report of `make gpu-check`).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

MISSING = (
    re.compile(r"could not import '([\w.\-]+)'"),
    re.compile(r"([\w.\-]+) is not installed"),
    re.compile(r"missing extra: ([\w.\-]+)"),
)
_not_run: dict[str, list[str]] = {}


@pytest.fixture(autouse=True)
def _matmul_precision_restored():
    """A training run turns TF32 on process-wide (`distil.models.load.enable_tf32`); put the
    fp32 matmul precision back after each test, so that a later exact comparison (packed ==
    padded in fp32, ...) does not inherit it."""
    saved = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(saved)


def _extra_of(reason: str) -> str | None:
    for pattern in MISSING:
        m = pattern.search(reason)
        if m:
            return m.group(1)
    return None


def _note(report) -> None:
    if not report.skipped or not torch.cuda.is_available() or "tests/gpu" not in report.nodeid:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    extra = _extra_of(reason)
    if extra:
        _not_run.setdefault(extra, []).append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note(report)
    _record(report)


def _record(report: pytest.TestReport) -> None:
    """With DISTIL_GPU_REPORT=FILE (`make gpu-check`), each test's outcome is appended to FILE
    as one JSON line the moment it is known, a failure with its message: a run cut off at its
    time budget (pytest's own reports are written only at the end) still says what failed and
    why. Written by the controlling process only (under xdist the workers' reports reach it)."""
    path = os.environ.get("DISTIL_GPU_REPORT")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and report.passed:
        return  # setup and teardown are recorded only when they fail or skip
    row = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
           "seconds": round(report.duration, 2)}  # fmt: skip
    if report.failed:
        row["message"] = report.longreprtext[-4000:]
    elif report.skipped:
        row["message"] = (
            str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        )
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note(report)  # a module-level importorskip (tests/gpu/test_vllm.py)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _not_run:
        return
    tr = terminalreporter
    tr.section("GPU tests not run for a missing extra", sep="=", red=True, bold=True)
    for extra, ids in sorted(_not_run.items()):
        tr.write_line(f"missing: {extra} ({len(ids)} tests): {', '.join(ids)}")
    if os.environ.get("DISTIL_GPU_STRICT") == "1":
        tr.write_line("DISTIL_GPU_STRICT=1: the run fails (install the extras or unset it)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _not_run and os.environ.get("DISTIL_GPU_STRICT") == "1" and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
