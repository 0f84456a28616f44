"""`make gpu-check`: distil on one GPU in under nine minutes, every figure in one summary file.

    python bench/gpu/check.py                 # on the GPU machine (make gpu-check)
    python bench/gpu/check.py --dry           # on a CPU machine (make gpu-check-dry)
    python bench/gpu/check.py --only tests,realsize-hf

Steps, in this order, each in its own process under its own timeout (cut to what is left of
the `--budget`), going on after a failure:
  install   the wheels of --wheels (`make gpu-wheels`) into --site with pip --no-index
            --no-deps --target (the image's torch is never touched); distil runs from src/
  deps      bench/gpu/deps.py --installed: every requirement of distil and the benchmarks met
  tests     pytest -m gpu tests/gpu (a test skipped for a missing extra is listed as such)
  realsize-hf, realsize-hf_static
            bench/realsize.py: Qwen3-0.6B/1.7B-shaped models, one on-policy step per backend
  generation, async, train_throughput, vs_trl, cache
            the benchmarks of bench/ at GPU sizes (bench/gpu/launch.py runs each)
The summary (--out/SUMMARY.md, copied to $OUT when set) names the device and holds every
figure, ready to paste into bench/RESULTS.md.

`--dry` (no CUDA needed): `wheels` proves the wheels + the image's packages (bench/gpu/image.txt)
satisfy every requirement without an index (deps.py, and pip --dry-run for the wheels' tags);
then every step starts and ends skipped for want of CUDA (pytest collects and skips the GPU
tier; each script parses its flags, then stops).

Exit status: 0 every step ran and passed (--dry: every step started and was skipped for want of
CUDA); 1 a step failed or timed out (or a GPU test failed); 2 nothing failed but something did
not run: a GPU test skipped for a missing extra (vllm, flash-attn, ...), a step skipped or left
for want of time. The summary's first lines say which.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summary import PytestTally, device_line, write_summary

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "bench/gpu/launch.py"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]  # after the Python interpreter
    timeout: float
    status: str = "not run"
    seconds: float = 0.0
    log: Path | None = None
    lines: list[str] = field(default_factory=list)  # RESULT lines and markdown table rows


def gpu_steps(out: Path, site: Path) -> list[Step]:
    """The steps of a GPU run, most important first (the budget cuts the last ones short)."""
    junit = out / "pytest.xml"
    steps = [
        Step("deps", "requirements met by what this Python imports",
             ["bench/gpu/deps.py", "--installed", "--carried", str(site)], 20),
        Step("tests", "pytest -m gpu tests/gpu",
             ["-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider",
              f"--junitxml={junit}", *pytest_extras()], 200),
    ]  # fmt: skip
    for backend, timeout in (("hf", 80), ("hf_static", 120)):  # hf_static compiles first
        reuse = ["--bare-json", str(out / "realsize-hf.json")] if backend != "hf" else []
        steps.append(
            Step(f"realsize-{backend}", f"real-size on-policy step, backend {backend}",
                 [LAUNCH, "bench/realsize.py", "--backend", backend,
                  "--json", str(out / f"realsize-{backend}.json"), *reuse], timeout)
        )  # fmt: skip
    bench = [
        ("generation", "decode 64 x 128 tokens, SmolLM2-135M-shaped, bf16",
         ["bench/generation.py", "--preset", "gpu135m", "--repeats", "2", "--backends",
          "generate,generate_static,hf,hf_static+compile"], 80),
        ("async", "step vs bare calls, async off/on (gpu preset)",
         ["bench/step_breakdown.py", "--preset", "gpu", "--bf16", "--async", "--steps", "6",
          "--warmup", "2", "--threads", "4"], 60),
        ("train_throughput", "training step MFU: packing, chunked loss, fused AdamW",
         ["bench/train_throughput.py", "--part", "step", "--steps", "2", "--warmup", "1"], 60),
        ("vs_trl", "distil vs TRL GOLDTrainer, on-policy",
         ["bench/vs_trl.py", "--device", "cuda", "--threads", "4", "--modes", "on",
          "--rounds", "1", "--steps", "6", "--warmup", "2", "--trl", "gold"], 45),
        ("cache", "teacher cache vs live teacher (demo sizes)",
         ["bench/cache.py", "--preset", "demo", "--rows", "512", "--epochs", "1",
          "--repeats", "1", "--threads", "4"], 30),
    ]  # fmt: skip
    steps += [Step(n, w, [LAUNCH, *a], t) for n, w, a, t in bench]
    return steps


def pytest_extras() -> list[str]:
    """Where the GPU image's plugins are there: a per-test timeout (pytest-timeout) and, on a
    CUDA machine, 4 workers (pytest-xdist; one module per worker, so that a module's shared
    engine or server stays in one process)."""
    import importlib.util

    import torch

    out = ["--timeout=120"] if importlib.util.find_spec("pytest_timeout") else []
    if importlib.util.find_spec("xdist") and torch.cuda.is_available():
        out += ["-n", "4", "--dist", "loadfile"]
    return out


def child_env(site: Path | None) -> dict[str, str]:
    paths = [str(ROOT / "src"), *([str(site)] if site else [])]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",  # nothing is downloaded: every model is built here
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_step(step: Step, python: str, env: dict, logs: Path, left: float) -> None:
    """Run one step under min(its timeout, `left`); its log under `logs`."""
    timeout = max(1.0, min(step.timeout, left))
    step.log = logs / f"{step.name}.log"
    start = time.monotonic()
    with step.log.open("w") as log:
        proc = subprocess.Popen(
            [python, *step.argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            rc = None
    step.seconds = time.monotonic() - start
    text = step.log.read_text(errors="replace")
    skipped = [x for x in text.splitlines() if x.startswith("SKIPPED: ")]
    if rc is None:
        step.status = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        step.status = f"failed (exit {rc})"
    elif skipped:
        step.status = "skipped: " + skipped[-1][len("SKIPPED: ") :]
    else:
        step.status = "passed"
    step.lines = [x for x in text.splitlines() if x.startswith(("RESULT", "|", "deps:"))]
    print(f"[gpu-check] {step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT the step's process group (pytest then writes its report of the tests so far),
    SIGTERM after 15 s, SIGKILL after 10 more."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def install(python: str, wheels: Path, site: Path) -> Step:
    step = Step(
        "install", f"pip install --no-index --no-deps --target {site} {wheels}/*.whl", [], 60
    )
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        step.status = (
            f"skipped: no wheels in {wheels} (`make gpu-wheels` where pip reaches an index; "
            "or install distil[dev,liger,serve,math] yourself)"
        )
        return step
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site), *files]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=step.timeout)
    except subprocess.TimeoutExpired:
        step.status = f"timed out after {step.timeout:.0f} s"
        return step
    step.seconds = time.monotonic() - start
    step.status = "passed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    step.lines = [f"installed {len(files)} wheels into {site}", *proc.stderr.splitlines()[-5:]]
    return step


def dry_wheels(python: str, wheels: Path, logs: Path) -> Step:
    """The wheels + the image's packages satisfy every requirement (deps.py), and pip takes
    every wheel for CPython 3.12 on x86-64 Linux without an index (pip --dry-run)."""
    step = Step("wheels", "wheels + image packages satisfy distil's requirements, no index",
                ["bench/gpu/deps.py", "--wheels", str(wheels)], 60)  # fmt: skip
    run_step(step, python, child_env(None), logs, step.timeout)
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if step.status != "passed" or not files:
        return step
    platforms = [x for p in PLATFORMS for x in ("--platform", p)]
    cmd = [python, "-m", "pip", "install", "--dry-run", "-q", "--no-index", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           *platforms, "--target", str(logs / "dry-target"), *files]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        step.status = "timed out (pip --dry-run)"
        return step
    if proc.returncode != 0:
        step.status = f"failed (pip --dry-run exit {proc.returncode})"
        step.lines += proc.stderr.splitlines()[-5:]
    else:
        step.lines.append(f"pip --dry-run --no-index: {len(files)} wheels install on cp312 x86-64")
    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="rehearse on a machine without CUDA")
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    p.add_argument("--site", type=Path, default=Path("/tmp/distil-gpu-site"))
    p.add_argument("--out", type=Path, default=ROOT / "runs/gpu-check")
    p.add_argument("--budget", type=float, default=520.0, help="seconds for all steps")
    p.add_argument("--only", default=None, help="comma-separated step names")
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    start = time.monotonic()
    logs = args.out / "logs"
    shutil.rmtree(args.out, ignore_errors=True)
    logs.mkdir(parents=True)
    done: list[Step] = []
    site = None
    if args.dry:
        done.append(dry_wheels(args.python, args.wheels, logs))
    else:
        done.append(install(args.python, args.wheels, args.site))
        site = args.site if done[-1].status == "passed" else None
    env = child_env(site)
    wanted = set(args.only.split(",")) if args.only else None
    for step in gpu_steps(args.out, args.site):
        if (wanted is not None and step.name not in wanted) or (args.dry and step.name == "deps"):
            continue  # dry: the wheels step above stands for deps
        left = args.budget - (time.monotonic() - start)
        if left < 5:
            step.status = "not run: the time budget was spent"
        else:
            run_step(step, args.python, env, logs, left)
        done.append(step)
    tally = PytestTally.read(args.out / "pytest.xml")
    for step in done:
        if step.name == "tests" and step.status == "passed" and tally and tally.all_without_cuda:
            step.status = (
                f"skipped: no CUDA device ({tally.total} GPU tests collected, each skipped)"
            )
    code = exit_code(done, tally, dry=args.dry)
    path = write_summary(
        args.out, done, tally, code, device=device_line(), dry=args.dry,
        seconds=time.monotonic() - start,
    )  # fmt: skip
    if os.environ.get("OUT"):  # the device tool brings back what is there (8 files at most)
        copy_out(args.out, Path(os.environ["OUT"]))
    print(path.read_text())
    return code


def copy_out(out: Path, dest: Path) -> None:
    """SUMMARY.md, the pytest report, the real-size figures and the logs (one archive)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("SUMMARY.md", "pytest.xml", "realsize-hf.json", "realsize-hf_static.json"):
        if (out / name).exists():
            shutil.copy(out / name, dest / name)
    shutil.make_archive(str(dest / "gpu-check-logs"), "gztar", out, "logs")


def exit_code(steps: list[Step], tally: PytestTally | None, *, dry: bool) -> int:
    """0 all ran and passed (dry: all skipped for want of CUDA), 1 a failure, 2 incomplete."""
    if any(s.status.startswith(("failed", "timed out")) for s in steps):
        return 1
    if tally is not None and (tally.failed or tally.errors):
        return 1
    if dry:
        ok = ("passed", "skipped: no CUDA")
        return 0 if all(s.status.startswith(ok) for s in steps) else 2
    incomplete = [s for s in steps if s.status != "passed" and s.name != "install"]
    return 2 if incomplete or (tally is not None and tally.missing) else 0


if __name__ == "__main__":
    sys.exit(main())
