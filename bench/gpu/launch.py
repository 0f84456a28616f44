"""Run a bench script as `python SCRIPT ARGS...` would; without a CUDA device, only start it.

    python bench/gpu/launch.py bench/generation.py --preset gpu --batches 64

With a CUDA device the script runs as its own `__main__` (its directory first on sys.path, as
for `python SCRIPT`). Without one (`make gpu-check-dry`) the script is imported and runs up to
its argument parser, which checks the flags the GPU check passes (a wrong flag exits 2), then
the launcher prints `SKIPPED: <reason>` and exits 0: the step started and was skipped for want
of CUDA. `--cpu` runs the script even without CUDA (a rehearsal at small sizes).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


def stop_after_parsing(script: str) -> None:
    """Make the next ArgumentParser.parse_args check the flags, then end the run as skipped."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_skip(self, args=None, namespace=None):
        original(self, args, namespace)
        print(f"SKIPPED: {NO_CUDA}; {script} imported and its flags parsed", flush=True)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = parse_then_skip  # type: ignore[method-assign]


def main() -> None:
    argv = sys.argv[1:]
    run_on_cpu = bool(argv) and argv[0] == "--cpu"
    argv = argv[1:] if run_on_cpu else argv
    if not argv:
        raise SystemExit("usage: launch.py [--cpu] SCRIPT [ARGS...]")
    script, *args = argv
    import torch

    if not (torch.cuda.is_available() or run_on_cpu):
        stop_after_parsing(script)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python SCRIPT` (not bench/gpu)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
