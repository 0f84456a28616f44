"""The GPU check's summary: the pytest tally (with skips for missing extras named), the real-size
check's figures and the benchmarks' RESULT lines and tables, in one markdown file that ends
with one table: goal | target | measured | PASS / FAIL / NOT RUN (`goals`)."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NO_CUDA_SKIP = "needs a CUDA device"
# skip reasons that mean "an optional extra is not installed": importorskip's, the GPU tests' own
MISSING = (
    re.compile(r"could not import '([\w.\-]+)'"),
    re.compile(r"([\w.\-]+) is not installed"),
    re.compile(r"missing extra: ([\w.\-]+)"),
)
EXIT_MEANING = {
    0: "every step ran and passed",
    1: "a step or a GPU test FAILED (or timed out)",
    2: "INCOMPLETE: nothing failed, but something did not run (see 'not run' below)",
}
DRY_MEANING = {
    0: "rehearsal: the wheels satisfy every requirement, every step started and was skipped for "
    "want of CUDA",
    1: "rehearsal FAILED",
    2: "rehearsal incomplete",
}


@dataclass
class PytestTally:
    total: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    no_cuda: int = 0
    missing: Counter = field(default_factory=Counter)  # extra -> tests not run
    other_skips: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def all_without_cuda(self) -> bool:
        """Nothing ran: every test skipped for want of CUDA (or, before that, an extra)."""
        return self.no_cuda > 0 and self.passed == self.failed == self.errors == 0

    @classmethod
    def read(cls, path: Path) -> PytestTally | None:
        if not path.exists():
            return None
        t = cls()
        for case in ET.parse(path).getroot().iter("testcase"):
            t.total += 1
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            failure, error = case.find("failure"), case.find("error")
            skipped = case.find("skipped")
            if failure is not None or error is not None:
                node = failure if failure is not None else error
                t.failed += failure is not None
                t.errors += error is not None
                t.failures.append(f"{name}: {(node.get('message') or '')[:200]}")
            elif skipped is not None:  # a module-level skip says why in its text only
                t.add_skip(name, f"{skipped.get('message') or ''} {skipped.text or ''}")
            else:
                t.passed += 1
        return t

    def add_skip(self, name: str, reason: str) -> None:
        if NO_CUDA_SKIP in reason:
            self.no_cuda += 1
            return
        for pattern in MISSING:
            m = pattern.search(reason)
            if m:
                self.missing[m.group(1)] += 1
                return
        self.other_skips.append(f"{name}: {reason[:200]}")


def device_line() -> str:
    """The device's name and the software that ran on it."""
    import torch
    import transformers

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        what = f"{name} ({gib:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        what = "no CUDA device (CPU rehearsal)"
    return f"{what}; torch {torch.__version__}, transformers {transformers.__version__}"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_summary(
    out: Path, steps, tally, code: int, *, device: str, dry: bool, seconds: float, budget=None
):
    """SUMMARY.md under `out`; `budget`: (the plan's seconds, the total, its problems)."""
    meaning = (DRY_MEANING if dry else EXIT_MEANING).get(code, "?")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# distil GPU check{' (dry rehearsal)' if dry else ''}: {device}",
        "",
        f"{now}, commit {_commit()}, {seconds:.0f} s in all. Exit {code}: {meaning}.",
    ]
    not_run = [s for s in steps if s.status != "passed" and not s.status.startswith("failed")]
    if tally is not None and tally.missing:
        extras = ", ".join(f"{k} ({v} tests)" for k, v in sorted(tally.missing.items()))
        lines.append(f"\n**GPU tests not run for a missing extra: {extras}.**")
    lines += ["", "| step | what | status | s | budget s |", "|---|---|---|---|---|"]
    lines += [
        f"| {s.name} | {s.what} | {s.status} | {s.seconds:.0f} | {s.budget:g} |" for s in steps
    ]
    lines += _budget(budget)
    if not_run and not dry:
        lines.append("\nNot run or not passed: " + ", ".join(s.name for s in not_run) + ".")
    lines += _tests(tally, out) + _realsize(out) + _bench(steps) + goals_table(out)
    path = out / "SUMMARY.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _budget(budget) -> list[str]:
    if budget is None:
        return []
    planned, total, problems = budget
    line = f"\nBudget: {planned:g} s planned (install, every step's budget, the report) of {total:g} s."
    return [line, *[f"**BUDGET: {p}**" for p in problems]]


def _tests(t: PytestTally | None, out: Path | None = None) -> list[str]:
    if t is None:
        head = ["", "## GPU tests", "", "No pytest report (the tests step did not run or crashed)."]
        return head + (_tests_so_far(out / "tests.jsonl") if out else [])
    out = ["", "## GPU tests (pytest -m gpu tests/gpu)", ""]
    out.append(
        f"{t.total} collected: {t.passed} passed, {t.failed} failed, {t.errors} errors, "
        f"{t.no_cuda} skipped for want of CUDA, {sum(t.missing.values())} skipped for a missing "
        f"extra, {len(t.other_skips)} skipped otherwise."
    )
    if t.missing:
        out.append(f"Missing extras: {', '.join(sorted(t.missing))}.")
    out += [f"- FAILED {x}" for x in t.failures]
    out += [f"- skipped {x}" for x in t.other_skips]
    return out


def _realsize(out: Path) -> list[str]:
    found = sorted(out.glob("realsize-*.json"))
    if not found:
        return []
    every = [json.loads(p.read_text()) for p in found]
    runs = [r for r in every if "distil" in r]  # a partial file: the bare side only
    cut = [r["backend"] for r in every if "distil" not in r]
    note = [f"\nOnly the bare side was measured for: {', '.join(cut)}."] if cut else []
    if not runs:
        return ["", "## Real-size check (bench/realsize.py)", *note]
    r0 = runs[0]
    lines = [
        "",
        "## Real-size check (bench/realsize.py)",
        "",
        f"{r0['device']}, size {r0['size']}: student {r0['student']} "
        f"({r0['student_params'] / 1e9:.3f}B), teacher "
        f"{r0['teacher']} ({r0['teacher_params'] / 1e9:.3f}B), vocabulary {r0['vocab']:,}; "
        f"{r0['batch']} x {r0['grad_accum']} sequences per step, {r0['new_tokens']} new tokens, "
        f"{r0['precision']}; median of {r0['steps'] - r0['warmup']} steps after "
        f"{r0['warmup']} warm-up. Seconds per step: distil / bare calls (ratio).",
        "",
        "| backend | generate | teacher | student fwd+bwd+loss | optimizer | step | peak GiB "
        "distil (planned) / bare | MFU train distil / bare | MFU step | decode graph breaks "
        "(warm-up / after) | new graphs after warm-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(_realsize_row(r))
    return lines + note


def _realsize_row(r: dict[str, Any]) -> str:
    d, b, ratio = r["distil"], r["bare"], r["ratio"]
    cells = [
        f"{d[k]:.3f} / {b[k]:.3f} ({ratio[k]:.2f}x)"
        for k in ("generate", "teacher", "student", "optimizer", "step")
    ]
    mfu = r["mfu"]
    fmt = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    dec = r["decode"]
    planned = r.get("planned_peak_gib")
    plan = f" ({planned:.1f})" if planned else ""
    return (
        f"| {r['backend']} | {' | '.join(cells)} | {r['peak_gib']['distil']:.1f}{plan} / "
        f"{r['peak_gib']['bare']:.1f} | {fmt(mfu['train'])} / {fmt(mfu.get('train_bare'))} | "
        f"{fmt(mfu['step'])} | {dec['graph_breaks_warmup']} / {dec['graph_breaks_after']} | "
        f"{dec['new_graphs_after']} |"
    )


def _bench(steps) -> list[str]:
    out = ["", "## Benchmarks"]
    for s in steps:
        if s.name in ("install", "deps", "wheels") or s.name.startswith("realsize"):
            if s.lines and s.name in ("install", "deps", "wheels"):
                out += ["", f"### {s.name}", "", *[f"    {x}" for x in s.lines[-12:]]]
            continue
        if s.name == "tests":
            continue
        out += ["", f"### {s.name}: {s.what} ({s.status})", ""]
        table = [x for x in s.lines if x.startswith("|")][-40:]
        results = [x for x in s.lines if x.startswith("RESULT")]
        out += table + ([""] if table and results else []) + results
        if not table and not results:
            out.append(f"(no RESULT line or table; log: {s.log})")
    return out


def _tests_so_far(path: Path) -> list[str]:
    """What tests/gpu/conftest.py recorded as each test ended (DISTIL_GPU_REPORT): the tests
    that finished before the step was cut off, each failure with its error lines (pytest's
    `E` lines, the first four)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:  # the last line may be cut off by the step's kill
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    counts = Counter(r["outcome"] for r in rows)
    tally = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    out = ["", f"Recorded as they ended ({path.name}): {tally or 'none'}."]
    for r in rows:
        if r["outcome"] == "failed":
            text = [x for x in r.get("message", "").splitlines() if x.strip()]
            errors = [x[1:].strip() for x in text if x.startswith("E ")][:4] or text[-1:]
            out.append(f"- FAILED {r['test']} ({r['when']}): {' / '.join(errors)[:400]}")
    return out


# ---- the goals: one verdict each ----------------------------------------------------------

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"
STEP_RATIO_MAX = 1.15  # distil's on-policy step / the bare model calls
DECODE_RATIO_MIN = 0.5  # distil hf_static tokens/s / transformers' compiled static cache's
MFU_MIN = 0.35  # training MFU of the real-size step
TRL_SPEEDUP_MIN = 3.0  # TRL GOLDTrainer s/step / distil's
PEAK_TOLERANCE = 0.20  # |planned - measured| / measured


def _load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / name
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        return None


def _realsize_goals(r: dict | None, backend: str) -> list[tuple[str, str, str, str]]:
    """The step ratio for one backend; for hf also the MFU and the memory plan."""
    full = r is not None and "distil" in r
    why = "not measured" if r is None else "distil's side did not finish" if not full else ""
    goal = f"on-policy step / bare model calls, real size ({backend})"
    rows = []
    if not full:
        rows.append((goal, f"<= {STEP_RATIO_MAX}x", why, NOT_RUN))
    else:
        x = r["ratio"]["step"]
        rows.append((goal, f"<= {STEP_RATIO_MAX}x", f"{x:.2f}x", _verdict(x <= STEP_RATIO_MAX)))
    if backend != "hf":
        return rows
    mfu_goal = "training MFU, real-size step (distil; the bare calls beside)"
    mfu = r["mfu"] if full else {}
    if not mfu.get("train"):
        rows.append((mfu_goal, f">= {MFU_MIN:.0%}", why or "no dense peak for this device",
                     NOT_RUN))  # fmt: skip
    else:
        bare = mfu.get("train_bare")
        seen = f"{mfu['train']:.1%}" + (f" (bare {bare:.1%})" if bare else "")
        rows.append((mfu_goal, f">= {MFU_MIN:.0%}", seen, _verdict(mfu["train"] >= MFU_MIN)))
    plan_goal = "planned peak memory vs measured, real-size step (hf)"
    planned = r.get("planned_peak_gib") if full else None
    if not planned:
        rows.append((plan_goal, f"within {PEAK_TOLERANCE:.0%}", why or "no plan made", NOT_RUN))
    else:
        got = r["peak_gib"]["distil"]
        off = (planned - got) / got if got else float("inf")
        seen = f"planned {planned:.1f} GiB, measured {got:.1f} GiB ({off:+.0%})"
        rows.append((plan_goal, f"within {PEAK_TOLERANCE:.0%}", seen,
                     _verdict(abs(off) <= PEAK_TOLERANCE)))  # fmt: skip
    return rows


def _decode_goal(g: dict | None) -> tuple[str, str, str, str]:
    goal = "decode 64 x 128 tokens, 0.135B: distil hf_static / transformers' compiled static cache"
    target = f">= {DECODE_RATIO_MIN}x the tokens/s (within 2x)"
    if g is None or g.get("goal_ratio") is None:
        return goal, target, "not measured", NOT_RUN
    x = g["goal_ratio"]
    seen = f"{x:.2f}x ({g['static']}, batch {g['batch']}, {g['new']} tokens)"
    return goal, target, seen, _verdict(x >= DECODE_RATIO_MIN)


def _trl_goal(v: dict | None) -> tuple[str, str, str, str]:
    goal = "on-policy step vs TRL GOLDTrainer, same work"
    target = f">= {TRL_SPEEDUP_MIN:g}x faster"
    ratio = (((v or {}).get("ratios") or {}).get("on") or {}).get("gold", {}).get("step")
    if not ratio:
        return goal, target, "not measured", NOT_RUN
    speedup = 1.0 / ratio
    return goal, target, f"{speedup:.2f}x faster", _verdict(speedup >= TRL_SPEEDUP_MIN)


def _verdict(ok: bool) -> str:
    return PASS if ok else FAIL


def goals(out: Path) -> list[tuple[str, str, str, str]]:
    """(goal, target, measured, PASS / FAIL / NOT RUN) of every goal, from the figures the
    steps wrote under `out` (a missing or partial file: NOT RUN)."""
    rows = _realsize_goals(_load(out, "realsize-hf.json"), "hf")
    rows += _realsize_goals(_load(out, "realsize-hf_static.json"), "hf_static")
    rows.append(_decode_goal(_load(out, "generation.json")))
    rows.append(_trl_goal(_load(out, "vs_trl.json")))
    return rows


def goals_table(out: Path) -> list[str]:
    """The summary's last lines: one row per goal."""
    lines = ["", "## Goals", "", "| goal | target | measured | verdict |", "|---|---|---|---|"]
    return lines + [f"| {g} | {t} | {m} | {v} |" for g, t, m, v in goals(out)]
