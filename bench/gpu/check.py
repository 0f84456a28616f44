"""`make gpu-check`: distil on one GPU within one lease, a verdict per goal in one summary file.

    python bench/gpu/check.py                 # on the GPU machine (make gpu-check)
    python bench/gpu/check.py --dry           # on a CPU machine (make gpu-check-dry)
    python bench/gpu/check.py --only tests,realsize-hf

A lease: 15 minutes of device time, a machine start (about 30 s on the H100s seen so far; up
to 2 minutes) and ONE command of at most 10 minutes, with too little left for a second start.
So the whole check, the install included, fits TOTAL_S (540 s), and the steps run in the order
the goals need them, each under its own budget (`gpu_steps`; a step past it is interrupted,
and its kill fits in the budget too):
  install          the wheels of --wheels (`make gpu-wheels`) into --site with pip --no-index
                   --no-deps --target (the image's torch is never touched); distil runs from src/
  deps             bench/gpu/deps.py --installed: every requirement of distil and the benchmarks
  realsize-hf      bench/realsize.py: Qwen3-0.6B/1.7B-shaped models, the bare model calls first
                   (their figures written at once), then distil's on-policy step: the step/bare
                   ratio, training MFU (distil's and the bare calls'), planned vs measured peak
  tests            pytest -m gpu tests/gpu; each test's outcome is appended to tests.jsonl as it
                   ends (tests/gpu/conftest.py), so a cut-off run still says what failed and why
  generation       bench/generation.py greedy only: decode 64 x 128 tokens, SmolLM2-135M-shaped,
                   distil's compiled hf_static against transformers' compiled static cache
  realsize-hf_static  the real-size step with the compiled decode (reusing realsize-hf's bare side)
distil against TRL's GOLDTrainer (vs_trl, a goal) and the other benchmarks (async,
train_throughput, cache) run only when named in --only (a second lease: the first lease on an
H100 measured more than the 480 s this check had then). The summary (--out/SUMMARY.md, copied
to $OUT when set) names the device, holds every figure and ends with one table: goal | target |
measured | PASS / FAIL / NOT RUN.

`--dry` (no CUDA needed): checks that the step budgets add up to at most TOTAL_S; `wheels`
proves the wheels + the image's packages (bench/gpu/image.txt) satisfy every requirement
without an index (deps.py, and pip --dry-run for the wheels' tags); then every step starts and
ends skipped for want of CUDA (pytest collects and skips the GPU tier; each script parses its
flags, then stops). A Python without what the check imports (a fresh clone, no .venv) is told
what to install, with no traceback.

Exit status: 0 every step ran and passed (--dry: every step started and was skipped for want of
CUDA); 1 a step failed or timed out (or a GPU test failed, or --dry: the budgets exceed the
total); 2 nothing failed but something did not run: a GPU test skipped for a missing extra
(vllm, flash-attn, ...), a step skipped or left for want of time, or this Python lacks what
the check imports. The summary's first lines say which.
"""

from __future__ import annotations

import argparse
import importlib.util
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
TOTAL_S = 540.0  # the whole check, install included: one command of at most 10 minutes (the
# starts measured on an H100 took about 30 s of the lease's 15 minutes)
REPORT_S = 10.0  # kept back for the summary and the copy to $OUT
GRACE_S = 10.0  # a step past its budget: SIGINT, 5 s, SIGTERM, 3 s, SIGKILL, 2 s
INSTALL_S = 20.0  # pip install --no-index --no-deps of ~6 MiB of wheels
NEEDS = {"torch": "torch", "transformers": "transformers", "pytest": "pytest"}
NEEDS_DRY = {**NEEDS, "packaging": "packaging", "pip": "pip"}


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]  # after the Python interpreter
    budget: float  # seconds this step may take, its kill included
    status: str = "not run"
    seconds: float = 0.0
    log: Path | None = None
    lines: list[str] = field(default_factory=list)  # RESULT lines and markdown table rows


def gpu_steps(out: Path, site: Path) -> list[Step]:
    """The steps of one lease, in the order the goals need them (see the module docstring)."""
    junit = out / "pytest.xml"
    realsize = [LAUNCH, "bench/realsize.py", "--json"]
    steps = [
        Step("deps", "requirements met by what this Python imports",
             ["bench/gpu/deps.py", "--installed", "--carried", str(site)], 15),
        Step("realsize-hf", "real-size on-policy step (bare calls first), backend hf",
             [*realsize, str(out / "realsize-hf.json"), "--backend", "hf"], 125),  # 104 s on H100
        Step("tests", "pytest -m gpu tests/gpu",
             ["-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider",
              f"--junitxml={junit}", *pytest_extras()], 150),  # 26 of 31 ended in 95 s on H100
        Step("generation", "decode 64 x 128 tokens, SmolLM2-135M-shaped, bf16, greedy",
             [LAUNCH, "bench/generation.py", "--preset", "gpu135m", "--repeats", "2",
              "--modes", "greedy", "--backends", "generate_static,hf_static+compile,hf",
              "--json", str(out / "generation.json")], 100),  # two cold compiles, 30 layers
        Step("realsize-hf_static", "real-size on-policy step, backend hf_static (compiled)",
             [*realsize, str(out / "realsize-hf_static.json"), "--backend", "hf_static",
              "--bare-json", str(out / "realsize-hf.json")], 110),
    ]  # fmt: skip
    return steps


def extra_steps(out: Path) -> list[Step]:
    """For a second lease (`--only vs_trl,async,train_throughput,cache`): distil against TRL
    (a goal, but past one lease: measured there the step alone took over 40 s) and the
    benchmarks no goal needs."""
    bench = [
        ("vs_trl", "distil vs TRL GOLDTrainer, on-policy",
         ["bench/vs_trl.py", "--device", "cuda", "--threads", "4", "--modes", "on", "--rounds",
          "1", "--steps", "6", "--warmup", "2", "--trl", "gold",
          "--json", str(out / "vs_trl.json")], 90),
        ("async", "step vs bare calls, async off/on (gpu preset)",
         ["bench/step_breakdown.py", "--preset", "gpu", "--bf16", "--async", "--steps", "6",
          "--warmup", "2", "--threads", "4"], 90),
        ("train_throughput", "training step MFU: packing, chunked loss, fused AdamW",
         ["bench/train_throughput.py", "--part", "step", "--steps", "2", "--warmup", "1"], 90),
        ("cache", "teacher cache vs live teacher (demo sizes)",
         ["bench/cache.py", "--preset", "demo", "--rows", "512", "--epochs", "1",
          "--repeats", "1", "--threads", "4"], 60),
    ]  # fmt: skip
    return [Step(n, w, [LAUNCH, *a], t) for n, w, a, t in bench]


def budget_problems(steps: list[Step], total: float = TOTAL_S) -> list[str]:
    """What makes the plan not fit one lease: the install, the steps' budgets and the report
    must add up to at most `total` seconds, each budget long enough for its kill."""
    spent = planned_seconds(steps)
    out = [
        f"step {s.name}: budget {s.budget:g} s leaves nothing after its kill ({GRACE_S:g} s)"
        for s in steps
        if s.budget <= GRACE_S
    ]
    if spent > total:
        parts = " + ".join(f"{s.name} {s.budget:g}" for s in steps)
        out.append(
            f"the budgets add up to {spent:g} s (install {INSTALL_S:g} + {parts} + report "
            f"{REPORT_S:g}), over the {total:g} s of one lease: shorten a step or move it to "
            "extra_steps()"
        )
    return out


def planned_seconds(steps: list[Step]) -> float:
    """The install, every step's budget and the report: what the plan may take at most."""
    return INSTALL_S + sum(s.budget for s in steps) + REPORT_S


def missing_modules(dry: bool) -> list[str]:
    """What this Python cannot import of what the check needs (a fresh clone's python3)."""
    needs = NEEDS_DRY if dry else NEEDS
    return [pkg for module, pkg in needs.items() if importlib.util.find_spec(module) is None]


def pytest_extras() -> list[str]:
    """Where the GPU image's plugins are there: a per-test timeout (pytest-timeout) and, on a
    CUDA machine, 4 workers (pytest-xdist; one module per worker, so that a module's shared
    engine or server stays in one process)."""
    import torch

    out = ["--timeout=60"] if importlib.util.find_spec("pytest_timeout") else []
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
    """Run one step within min(its budget, `left`) seconds, its kill included; its log under
    `logs`."""
    timeout = max(1.0, min(step.budget, left) - GRACE_S)
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
    SIGTERM after 5 s, SIGKILL after 3 more: GRACE_S in all."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 2)):
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
        "install",
        f"pip install --no-index --no-deps --target {site} {wheels}/*.whl",
        [],
        INSTALL_S,
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
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=step.budget)
    except subprocess.TimeoutExpired:
        step.status = f"timed out after {step.budget:.0f} s"
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
    run_step(step, python, child_env(None), logs, step.budget)
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
    p.add_argument("--budget", type=float, default=TOTAL_S, help="seconds for everything")
    p.add_argument("--only", default=None, help="comma-separated step names")
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    if missing := missing_modules(args.dry):
        print(needs_message(missing, args.dry), file=sys.stderr)
        return 2
    start = time.monotonic()
    logs = args.out / "logs"
    shutil.rmtree(args.out, ignore_errors=True)
    logs.mkdir(parents=True)
    plan = planned_steps(args.out, args.site, args.only)
    problems = budget_problems(plan, args.budget)
    for line in problems:
        print(f"[gpu-check] BUDGET: {line}", flush=True)
    done: list[Step] = []
    site = None
    if args.dry:
        done.append(dry_wheels(args.python, args.wheels, logs))
    else:
        done.append(install(args.python, args.wheels, args.site))
        site = args.site if done[-1].status == "passed" else None
    # each GPU test's outcome as it ends (tests/gpu/conftest.py): kept when the step is cut off
    env = {**child_env(site), "DISTIL_GPU_REPORT": str(args.out / "tests.jsonl")}
    env.pop("PYTEST_XDIST_WORKER", None)  # the check itself run inside a pytest-xdist worker
    for step in plan:
        if args.dry and step.name == "deps":
            continue  # dry: the wheels step above stands for deps
        left = args.budget - REPORT_S - (time.monotonic() - start)
        if left < GRACE_S + 5:
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
    code = 1 if args.dry and problems else exit_code(done, tally, dry=args.dry)
    path = write_summary(
        args.out, done, tally, code, device=device_line(), dry=args.dry,
        seconds=time.monotonic() - start, budget=(planned_seconds(plan), args.budget, problems),
    )  # fmt: skip
    if os.environ.get("OUT"):  # the device tool brings back what is there (8 files at most)
        copy_out(args.out, Path(os.environ["OUT"]))
    print(path.read_text())
    return code


def planned_steps(out: Path, site: Path, only: str | None) -> list[Step]:
    """The default plan, or the steps named in `only` (extra benchmarks included), in order."""
    steps = gpu_steps(out, site)
    if only is None:
        return steps
    wanted = set(only.split(","))
    return [s for s in [*steps, *extra_steps(out)] if s.name in wanted]


def needs_message(missing: list[str], dry: bool) -> str:
    what = "make gpu-check-dry" if dry else "make gpu-check"
    return (
        f"{what}: this Python ({sys.executable}) cannot import {', '.join(missing)}, which the "
        "check imports (the GPU tier's pytest, the scripts' torch and transformers"
        + (", deps.py's packaging and pip" if dry else "")
        + "). Fix: `make venv` (a .venv with the CPU torch and distil[dev]; the make targets "
        "use .venv/bin/python when it exists), or run it with a Python that has them: "
        "make GPU_PYTHON=/path/to/python " + what.split()[-1]
    )


def copy_out(out: Path, dest: Path) -> None:
    """SUMMARY.md, the pytest report, the figures and the logs (one archive)."""
    dest.mkdir(parents=True, exist_ok=True)
    figures = ("realsize-hf.json", "realsize-hf_static.json", "generation.json", "vs_trl.json")
    for name in ("SUMMARY.md", "pytest.xml", "tests.jsonl", *figures):
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
