"""`make gpu-check-dry`: the GPU check rehearsed on a machine without CUDA.

Fast: the resolver of bench/gpu/deps.py on a folder of small fake wheels (a missing wheel and a
version conflict are named), the wheel-tag check, the launcher refusing a wrong flag, and the
summary's tally (a test skipped for a missing extra is never counted as passed; the exit code
says incomplete). Slow: the whole rehearsal with the real pinned wheels (downloaded when the
folder is not there; skipped if no index is reachable), then the same with one wheel removed,
which must fail naming it; and bench/realsize.py end to end at tiny sizes on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import warm

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"
sys.path.insert(0, str(GPU))

import check  # noqa: E402
import deps  # noqa: E402
import summary  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a rehearsal without CUDA")


def fake_wheel(folder: Path, name: str, version: str, requires=(), tag="py3-none-any") -> Path:
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n{meta}"
        )
    return path


def resolve(folder: Path, image: dict[str, str | None], roots: list[str]) -> deps.Report:
    report = deps.Report()
    available = {k: deps.Dist(k, deps.Version(v) if v else None, "image") for k, v in image.items()}
    available.update(deps.wheel_dists(folder, report))
    result = deps.check([(r, "test") for r in roots], available, deps.TARGET_ENV)
    result.problems = report.problems + result.problems
    return result


def test_the_resolver_names_a_missing_wheel_a_conflict_and_a_duplicate(tmp_path):
    fake_wheel(tmp_path, "datasets", "5.2.0", ["dill<0.4.2,>=0.3.0", "numpy>=1.17", "pandas"])
    fake_wheel(tmp_path, "dill", "0.4.1")
    fake_wheel(
        tmp_path, "mathy", "1.0", ['extra_only; extra == "fancy"', "old; python_version<'3'"]
    )
    image = {"numpy": "2.5.2", "pandas": None}
    ok = resolve(tmp_path, image, ["datasets==5.2.0", "mathy"])
    assert ok.problems == [] and ok.unchecked == {"pandas"}
    (tmp_path / "dill-0.4.1-py3-none-any.whl").unlink()
    missing = resolve(tmp_path, image, ["datasets==5.2.0"])
    assert any("dill" in p and "no wheel" in p for p in missing.problems), missing.problems
    fake_wheel(tmp_path, "dill", "0.4.3")
    conflict = resolve(tmp_path, image, ["datasets==5.2.0"])
    assert any("dill<0.4.2" in p and "0.4.3" in p for p in conflict.problems)
    fake_wheel(tmp_path, "dill", "0.4.1")
    assert any("two wheels of dill" in p for p in resolve(tmp_path, image, []).problems)
    extra = resolve(tmp_path, image, ["mathy[fancy]"])
    assert any("extra-only" in p or "extra_only" in p for p in extra.problems)


def test_wheel_tags_for_cpython_312_on_x86_64_linux(tmp_path):
    fits = {
        "a-1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": True,
        "a-1-py3-none-any.whl": True,
        "a-1-cp311-cp311-manylinux_2_17_x86_64.whl": False,
        "a-1-cp312-cp312-macosx_11_0_arm64.whl": False,
        "a-1-cp312-cp312-manylinux_2_17_aarch64.whl": False,
    }
    assert {n: deps.wheel_fits(Path(n)) for n in fits} == fits


JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_a" name="test_ok"/>
<testcase classname="tests.gpu.test_a" name="test_liger"><skipped type="pytest.skip"
 message="could not import 'liger_kernel': No module named 'liger_kernel'"/></testcase>
<testcase classname="tests.gpu.test_packing" name="test_flash"><skipped type="pytest.skip"
 message="flash-attn is not installed"/></testcase>
<testcase classname="" name="tests.gpu.test_vllm"><skipped message="collection skipped"
 >tests/gpu/test_vllm.py:22: could not import 'vllm': No module named 'vllm'</skipped></testcase>
<testcase classname="tests.gpu.test_b" name="test_other"><skipped message="needs two GPUs"/>
</testcase>
</testsuite></testsuites>"""


def test_a_skip_for_a_missing_extra_is_reported_and_makes_the_check_incomplete(tmp_path):
    (tmp_path / "pytest.xml").write_text(JUNIT)
    t = summary.PytestTally.read(tmp_path / "pytest.xml")
    assert (t.total, t.passed, t.failed, t.no_cuda) == (5, 1, 0, 0)
    assert dict(t.missing) == {"liger_kernel": 1, "flash-attn": 1, "vllm": 1}
    assert len(t.other_skips) == 1 and "needs two GPUs" in t.other_skips[0]
    passed = [check.Step("tests", "t", [], 1, status="passed")]
    assert check.exit_code(passed, t, dry=False) == 2  # never a quiet 0
    failing = JUNIT.replace(
        'name="test_ok"/>', 'name="test_ok"><failure message="boom"/></testcase>'
    )
    (tmp_path / "pytest.xml").write_text(failing)
    t = summary.PytestTally.read(tmp_path / "pytest.xml")
    assert t.failed == 1 and check.exit_code(passed, t, dry=False) == 1
    path = summary.write_summary(tmp_path, passed, t, 1, device="X", dry=False, seconds=1.0)
    text = path.read_text()
    assert "liger_kernel (1 tests)" in text and "FAILED tests.gpu.test_a::test_ok" in text


@no_cuda
def test_the_launcher_parses_the_scripts_flags_before_skipping():
    def launch(*args):
        cmd = [sys.executable, str(GPU / "launch.py"), "bench/generation.py", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)

    good = launch("--preset", "gpu", "--batches", "64")
    assert good.returncode == 0 and "SKIPPED: no CUDA device" in good.stdout
    bad = launch("--preset", "gpu", "--no-such-flag", "64")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


def wheels_folder(tmp_path: Path) -> Path:
    """The pinned wheels: the repo's .whl if `make gpu-wheels` made it, else downloaded."""
    if (ROOT / ".whl").is_dir() and any((ROOT / ".whl").glob("*.whl")):
        return ROOT / ".whl"
    out = tmp_path / "whl"
    platforms = [x for p in check.PLATFORMS for x in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out),
           "-r", str(GPU / "wheels.txt")]  # fmt: skip
    if subprocess.run(cmd, capture_output=True, timeout=300).returncode != 0:
        pytest.skip("no package index reachable to fetch the pinned wheels (`make gpu-wheels`)")
    return out


@pytest.mark.budget(100, "the GPU check rehearsed twice, the second time without one wheel")
@pytest.mark.slow
@no_cuda
def test_the_dry_rehearsal_passes_and_fails_without_one_wheel(tmp_path):
    wheels = wheels_folder(tmp_path)
    out = tmp_path / "out"
    cmd = [sys.executable, str(GPU / "check.py"), "--dry", "--wheels", str(wheels)]
    run = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    text = (out / "SUMMARY.md").read_text()
    assert "| wheels |" in text and "| passed |" in text
    order = ["realsize-hf", "tests", "generation", "realsize-hf_static"]
    at = [text.index(f"| {step} |") for step in order]
    assert at == sorted(at) and "| cache |" not in text and "| vs_trl |" not in text  # 2nd lease
    assert text.count("skipped: no CUDA device") >= 5
    assert "Budget: 530 s planned" in text and "BUDGET:" not in text
    assert text.rstrip().splitlines()[-1].endswith("| NOT RUN |")  # the goal table ends it
    pruned = tmp_path / "pruned"
    pruned.mkdir()
    for w in wheels.glob("*.whl"):
        if not w.name.startswith("dill-"):
            (pruned / w.name).write_bytes(w.read_bytes())
    cmd = [sys.executable, str(GPU / "check.py"), "--dry", "--wheels", str(pruned)]
    run = subprocess.run([*cmd, "--out", str(tmp_path / "o2"), "--only", "none"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1
    assert "dill" in run.stdout and "no wheel and not in the image" in run.stdout


@pytest.mark.budget(100, "bench/realsize.py end to end")
@pytest.mark.slow
def test_realsize_runs_end_to_end_at_tiny_sizes_on_the_cpu(tmp_path):
    out = tmp_path / "hf.json"
    cmd = [sys.executable, str(ROOT / "bench" / "realsize.py"), "--size", "tiny", "--device",
           "cpu", "--steps", "2", "--warmup", "1", "--batch", "2", "--accum", "1", "--new", "3",
           "--work", str(tmp_path / "work"), "--json", str(out)]  # fmt: skip
    run = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)  # tests/warm.py
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["vocab"] == 151_936 and r["student_params"] < r["teacher_params"]
    for side in ("distil", "bare"):
        assert all(r[side][k] > 0 for k in ("generate", "teacher", "student", "optimizer"))
    assert r["decode"]["graph_breaks_after"] == 0 and r["mfu"]["train"] is None  # CPU: no peak
    assert r["planned_peak_gib"] > 0 and r["tokens"]["loss"] > 0 and r["tokens"]["bare_loss"] > 0
    assert "RESULT realsize hf: step" in run.stdout and "planned" in run.stdout
    # the bare side alone, reused by a second backend (its own --json written before distil's
    # side runs: a run stopped there still hands it over)
    again = tmp_path / "again.json"
    cmd = [*cmd[: cmd.index("--json")], "--json", str(again), "--bare-json", str(out)]
    run = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(again.read_text())["per_step"]["bare"] == r["per_step"]["bare"]


def test_make_test_gpu_lists_a_missing_extra_and_fails_with_strict(monkeypatch):
    """tests/gpu/conftest.py's hooks, called as pytest calls them on a CUDA machine."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("gpu_conftest", ROOT / "tests/gpu/conftest.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    skip = "could not import 'vllm': No module named 'vllm'"
    hooks.pytest_collectreport(
        SimpleNamespace(skipped=True, nodeid="tests/gpu/test_vllm.py", longrepr=("f", 1, skip))
    )
    flash = "Skipped: flash-attn is not installed"
    hooks.pytest_runtest_logreport(
        SimpleNamespace(skipped=True, nodeid="tests/gpu/test_p.py::t", longrepr=("f", 2, flash))
    )
    hooks.pytest_runtest_logreport(  # a skip for another reason is not an extra
        SimpleNamespace(skipped=True, nodeid="tests/gpu/test_p.py::u", longrepr=("f", 3, "2 GPUs"))
    )
    assert hooks._not_run == {
        "vllm": ["tests/gpu/test_vllm.py"],
        "flash-attn": ["tests/gpu/test_p.py::t"],
    }
    lines = []
    reporter = SimpleNamespace(section=lambda *a, **k: None, write_line=lines.append)
    hooks.pytest_terminal_summary(reporter)
    assert any(x.startswith("missing: vllm (1 tests)") for x in lines)
    session = SimpleNamespace(exitstatus=0)
    hooks.pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0  # reported, not failed, unless DISTIL_GPU_STRICT=1
    monkeypatch.setenv("DISTIL_GPU_STRICT", "1")
    hooks.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_the_plan_fits_one_lease_in_goal_order_and_an_overrun_is_named(tmp_path):
    steps = check.gpu_steps(tmp_path, tmp_path / "site")
    assert [s.name for s in steps] == [
        "deps", "realsize-hf", "tests", "generation", "realsize-hf_static"
    ]  # fmt: skip
    assert check.budget_problems(steps) == []
    assert check.planned_seconds(steps) <= check.TOTAL_S == 540
    steps[1].budget += 40  # realsize-hf 40 s longer: past one lease
    (problem,) = check.budget_problems(steps)
    assert "add up to 570 s" in problem and "realsize-hf 165" in problem and "540 s" in problem
    steps[1].budget = check.GRACE_S  # nothing left after its kill
    assert any("realsize-hf: budget 10 s" in p for p in check.budget_problems(steps))
    extra = check.planned_steps(tmp_path, tmp_path, "async,cache,tests,vs_trl")
    assert [s.name for s in extra] == ["tests", "vs_trl", "async", "cache"]
    assert str(tmp_path / "vs_trl.json") in extra[1].argv  # its figures where the summary reads


def figures(out: Path, *, step=1.08, mfu=0.31, bare_mfu=0.42, planned=18.7, peak=19.2,
            decode=0.62, vs_trl=0.25, partial_static=True):  # fmt: skip
    full = {"ratio": {"step": step}, "distil": {}, "peak_gib": {"distil": peak, "bare": 15.0},
            "mfu": {"train": mfu, "train_bare": bare_mfu}, "planned_peak_gib": planned}  # fmt: skip
    (out / "realsize-hf.json").write_text(json.dumps(full))
    static = {"partial": "the bare side only"} if partial_static else {**full}
    (out / "realsize-hf_static.json").write_text(json.dumps(static))
    gen = {"goal_ratio": decode, "static": "hf_static+compile", "batch": 64, "new": 128}
    (out / "generation.json").write_text(json.dumps(gen))
    (out / "vs_trl.json").write_text(json.dumps({"ratios": {"on": {"gold": {"step": vs_trl}}}}))


def test_the_summary_ends_with_a_verdict_per_goal(tmp_path):
    figures(tmp_path)
    rows = {g: (m, v) for g, _, m, v in summary.goals(tmp_path)}
    assert rows["on-policy step / bare model calls, real size (hf)"] == ("1.08x", "PASS")
    assert rows["on-policy step / bare model calls, real size (hf_static)"] == (
        "distil's side did not finish", "NOT RUN")  # fmt: skip
    assert rows["training MFU, real-size step (distil; the bare calls beside)"] == (
        "31.0% (bare 42.0%)", "FAIL")  # fmt: skip
    assert rows["planned peak memory vs measured, real-size step (hf)"] == (
        "planned 18.7 GiB, measured 19.2 GiB (-3%)", "PASS")  # fmt: skip
    decode = next(k for k in rows if k.startswith("decode 64 x 128"))
    assert rows[decode][1] == "PASS" and rows[decode][0].startswith("0.62x")
    assert rows["on-policy step vs TRL GOLDTrainer, same work"] == ("4.00x faster", "PASS")
    figures(tmp_path, step=1.2, planned=14.0, decode=0.4, vs_trl=0.5, partial_static=False)
    verdicts = [v for *_, v in summary.goals(tmp_path)]
    assert verdicts == ["FAIL", "FAIL", "FAIL", "FAIL", "FAIL", "FAIL"]
    for name in ("realsize-hf.json", "generation.json"):
        (tmp_path / name).unlink()
    verdicts = [v for *_, v in summary.goals(tmp_path)]
    assert verdicts == ["NOT RUN"] * 3 + ["FAIL", "NOT RUN", "FAIL"]
    partial = {"partial": "the bare side only", "backend": "hf_static"}
    (tmp_path / "realsize-hf_static.json").write_text(json.dumps(partial))
    passed = [check.Step("tests", "t", [], 1, status="passed")]
    text = summary.write_summary(
        tmp_path, passed, None, 0, device="X", dry=False, seconds=1
    ).read_text()
    assert text.rstrip().splitlines()[-1] == (
        "| on-policy step vs TRL GOLDTrainer, same work | >= 3x faster | 2.00x faster | FAIL |"
    )


@no_cuda
def test_gpu_check_dry_without_torch_says_what_it_needs():
    """A fresh clone's python3 (no .venv): what to install, no traceback. (-S: this Python
    without its site-packages, so without torch, transformers, pytest.)"""
    cmd = [sys.executable, "-S", str(GPU / "check.py"), "--dry", "--out", "/tmp/unused-gpu-check"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cannot import torch, transformers, pytest" in run.stderr and "make venv" in run.stderr


def test_realsize_mfu_counts_the_head_at_the_loss_positions_only(tmp_path):
    """gpu-review-2 finding 13: 6 N T counted the head's FLOPs on prompt tokens, which the
    chunked loss never computes. Qwen3-0.6B (tied): the head is V H = 151,936 x 1024, counted
    once; the body multiplies every input token, the head only the loss positions."""
    sys.path.insert(0, str(ROOT / "bench"))
    import realsize

    model = tmp_path / "m"
    model.mkdir()
    config = json.loads((ROOT / "tests/data/model_configs/qwen3-0.6b/config.json").read_text())
    (model / "config.json").write_text(json.dumps(config))
    head, body = realsize.head_and_body(model, 596_049_920)
    assert head == 151_936 * 1024 and body == 596_049_920 - head
    assert realsize.train_flops(body, head, 1000, 300) == 6 * (body * 1000 + head * 300)
    (model / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    assert realsize.head_and_body(model, 596_049_920 + head) == (head, body)


def test_realsizes_bare_generate_masks_the_padded_rows_with_one_slice_fill():
    """The bare side's logits processor: -inf on every id past the tokenizer, the rest
    untouched, and no `isin` over the vocabulary (what suppress_tokens ran every step)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(ROOT / "bench"))
    from realsize_bare import PastTokenizerMasked

    names: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    scores = torch.randn(3, 20)
    before = scores.clone()
    with Ops():
        out = PastTokenizerMasked(12)(None, scores)
    assert torch.equal(out[:, :12], before[:, :12]) and (out[:, 12:] == float("-inf")).all()
    assert not any(n.startswith("isin") for n in names) and len(names) <= 3, names


def test_each_gpu_test_is_recorded_as_it_ends_so_a_cut_off_run_says_what_failed(
    tmp_path, monkeypatch
):
    """tests/gpu/conftest.py under a real pytest: with DISTIL_GPU_REPORT set, a pass, a failure
    (with its message) and a skip are on file before the process dies in the next test (no
    junit report then); SUMMARY.md's GPU-test section reads them. An xdist worker writes
    nothing (its reports reach the controlling process, which writes them once)."""
    import shutil

    shutil.copy(ROOT / "tests/gpu/conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cut.py").write_text(
        "import os, pytest\n"
        "def test_a(): pass\n"
        "def test_b(): assert 1 == 2, 'the chunked head differs'\n"
        "def test_c(): pytest.skip('needs two GPUs')\n"
        "def test_d(): os._exit(3)\n"
        "def test_e(): pass\n"
    )
    report = tmp_path / "tests.jsonl"
    env = {**os.environ, "DISTIL_GPU_REPORT": str(report), "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "no:randomly", str(tmp_path / "test_cut.py"), f"--junitxml={tmp_path / 'j.xml'}"]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3 and not (tmp_path / "j.xml").exists(), run.stdout[-2000:]
    rows = [json.loads(x) for x in report.read_text().splitlines()]
    assert [(r["test"].split("::")[1], r["outcome"]) for r in rows] == [
        ("test_a", "passed"), ("test_b", "failed"), ("test_c", "skipped")
    ]  # fmt: skip
    assert "the chunked head differs" in rows[1]["message"] and rows[2]["message"]
    with report.open("a") as f:
        f.write('{"test": "test_cut.py::test_d", "outco')  # a line the kill cut short
    lines = summary._tests(None, tmp_path)
    assert "1 failed, 1 passed, 1 skipped" in "\n".join(lines)
    (failed,) = [x for x in lines if x.startswith("- FAILED")]
    assert "test_cut.py::test_b (call): AssertionError: the chunked head differs" in failed

    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("gpu_conftest", ROOT / "tests/gpu/conftest.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    before = report.read_text()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("DISTIL_GPU_REPORT", str(report))
    hooks._record(SimpleNamespace(nodeid="t::x", when="call", outcome="passed", passed=True,
                                  failed=False, skipped=False, duration=1.0))  # fmt: skip
    assert report.read_text() == before
