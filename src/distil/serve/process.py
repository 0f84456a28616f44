"""Start `distil serve-teacher` in a child process and wait until it answers `/health`
(tests, notebooks, scripts that bring their own teacher server up and down)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def teacher_server(
    model: str | Path,
    *args: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 180.0,
    log_path: str | Path | None = None,
):
    """Yield (url ending in /v1, Popen) of a running server; stopped (killed) on exit."""
    import httpx

    port = port or free_port()
    cmd = [sys.executable, "-m", "distil", "serve-teacher", str(model), "--port", str(port)]
    child_env = {**os.environ, **(env or {})}
    src = str(Path(__file__).resolve().parents[2])  # this distil first, as the caller sees it
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, child_env.get("PYTHONPATH")]))
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen([*cmd, *args], env=child_env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve-teacher exited with {proc.returncode}: {[*cmd, *args]}")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"serve-teacher did not answer /health in {timeout_s} s")
            time.sleep(0.2)
        yield url + "/v1", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()
