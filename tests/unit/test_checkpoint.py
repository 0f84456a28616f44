"""Checkpoints: safetensors + JSON only (nothing unpickled), exact RNG/optimizer round trips,
a manifest verified on resume, fallback past a corrupt checkpoint, the config check, the lock."""

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from distil.config import build_config
from distil.errors import ConfigError, DistilError
from distil.models.load import load_model
from distil.testing import read_metrics
from distil.train import checkpoint as ck
from distil.train import loop
from distil.train.rundir import RunLock, RunLockedError


def draws():
    out = [random.random(), random.gauss(0, 1), np.random.rand(), np.random.randn()]
    return out + torch.rand(3).tolist() + [torch.randint(0, 10**6, (1,)).item()]


def test_rng_states_round_trip_exactly(tmp_path):
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.randn()  # and numpy's (has_gauss = 1)
    ck._save_rng(tmp_path / "rng.safetensors")
    expected = draws()
    assert draws() != expected  # the generators moved on
    ck._load_rng(tmp_path / "rng.safetensors")
    assert draws() == expected


def adamw_after_steps(seed, steps):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    for _ in range(steps):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_state_round_trips_through_safetensors_and_json(tmp_path):
    model, opt = adamw_after_steps(0, 3)
    ck._save_optimizer(opt, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ck.OPTIM_META, ck.OPTIM_TENSORS]
    other, fresh = adamw_after_steps(1, 0)
    other.load_state_dict(model.state_dict())
    from safetensors.torch import load_file

    ck._load_optimizer(
        fresh,
        load_file(tmp_path / ck.OPTIM_TENSORS),
        json.loads((tmp_path / ck.OPTIM_META).read_text()),
    )
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]  # betas come back as a tuple, lr, decay
    assert b["param_groups"][0]["betas"] == (0.8, 0.95)
    for pid in a["state"]:
        for name, t in a["state"][pid].items():
            assert torch.equal(t, b["state"][pid][name]), (pid, name)
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (other, fresh)):  # the next update is identical too
        m(x).square().sum().backward()
        o.step()
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, countdown_dir, pair_dirs):
    """A 4-step run with checkpoints at steps 2 and 4 (the uninterrupted reference)."""
    from distil.testing import train_config

    root = tmp_path_factory.mktemp("ref")
    raw = train_config(root, countdown_dir, pair_dirs, train={"max_steps": 4, "save_every": 2})
    torch.manual_seed(0)
    loop.train(build_config(raw))
    return root / "run", raw


def copy_run(reference_run, tmp_path, max_steps=4, **train):
    """A copy of the reference run directory and its config (pointing at the copy)."""
    src, raw = reference_run
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    raw = json.loads(json.dumps(raw))
    raw["train"].update(output_dir=str(dst), max_steps=max_steps, **train)
    return dst, raw


def test_checkpoints_hold_only_safetensors_and_json_with_a_manifest(reference_run):
    run_dir, _ = reference_run
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["step-00000002", "step-00000004"]
    files = {p.name for p in (run_dir / "checkpoints" / "step-00000004").iterdir()}
    assert files == {
        "model.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
        "rng_state_0.safetensors",
        "trainer_state.json",
        "config.yaml",
        "manifest.json",
    }
    assert not [p for p in run_dir.rglob("*") if p.suffix in (".bin", ".pkl", ".pt", ".pth")]
    manifest = json.loads((run_dir / "checkpoints" / "step-00000004" / "manifest.json").read_text())
    assert set(manifest["files"]) == files - {"manifest.json"} and manifest["step"] == 4
    assert ck.verify_checkpoint(run_dir / "checkpoints" / "step-00000004") == []


def test_resume_never_unpickles(reference_run, tmp_path, monkeypatch):
    run_dir, raw = copy_run(reference_run, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    shutil.rmtree(run_dir / "final")

    def no_pickle(*args, **kwargs):
        raise AssertionError("something was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    loop.train(build_config(raw))
    monkeypatch.undo()
    assert_same_as_reference(reference_run, run_dir, from_step=2)


def assert_same_as_reference(reference_run, run_dir, from_step):
    ref = read_metrics(reference_run[0])
    got = read_metrics(run_dir)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for a, b in zip(ref[from_step:], got[from_step:], strict=True):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], a["step"]
    wa = load_model(str(reference_run[0] / "final")).state_dict()
    wb = load_model(str(run_dir / "final")).state_dict()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path):
    path.write_bytes(b"")


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = [
    ("model.safetensors", truncate, "model.safetensors has"),
    ("model.safetensors", empty, "model.safetensors has 0 bytes"),
    ("model.safetensors", flip_byte, "model.safetensors does not match its sha256"),
    ("optimizer.safetensors", truncate, "optimizer.safetensors has"),
    ("optimizer.json", truncate, "optimizer.json has"),
    ("trainer_state.json", truncate, "trainer_state.json has"),
    ("rng_state_0.safetensors", truncate, "rng_state_0.safetensors has"),
    ("rng_state_0.safetensors", flip_byte, "rng_state_0.safetensors does not match"),
    ("config.yaml", flip_byte, "config.yaml does not match"),
    ("manifest.json", truncate, "manifest.json is not a valid manifest"),
    ("manifest.json", lambda p: p.unlink(), "manifest.json is missing"),
    ("rng_state_0.safetensors", lambda p: p.unlink(), "rng_state_0.safetensors is missing"),
]


@pytest.mark.parametrize(("name", "damage", "reported"), CORRUPTIONS)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    reference_run, tmp_path, capsys, name, damage, reported
):
    run_dir, raw = copy_run(reference_run, tmp_path)
    damage(run_dir / "checkpoints" / "step-00000004" / name)
    loop.train(build_config(raw))  # auto: step-4 is broken, step-2 is used
    err = capsys.readouterr().err
    assert "skipping checkpoint step-00000004" in err and reported in err, err
    assert "falling back to step-00000002" in err
    assert_same_as_reference(reference_run, run_dir, from_step=2)


@pytest.mark.parametrize(("name", "damage", "reported"), CORRUPTIONS[::3])
def test_no_complete_checkpoint_stops_with_the_file_and_the_way_out(
    reference_run, tmp_path, name, damage, reported
):
    run_dir, raw = copy_run(reference_run, tmp_path, max_steps=5)
    for step in ("step-00000002", "step-00000004"):
        damage(run_dir / "checkpoints" / step / name)
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(ck.CheckpointError) as info:
        loop.train(build_config(raw))
    msg = str(info.value)
    assert reported in msg and "step-00000002" in msg and "step-00000004" in msg
    assert "train.resume=never" in msg and "train.resume=<dir>" in msg
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing touched
    # an explicit train.resume=<dir> that is broken says so too
    raw["train"]["resume"] = str(run_dir / "checkpoints" / "step-00000002")
    with pytest.raises(ck.CheckpointError, match=reported):
        loop.train(build_config(raw))


def test_a_partial_last_metrics_line_does_not_block_resume(reference_run, tmp_path):
    run_dir, raw = copy_run(reference_run, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:3]) + '\n{"step": 4, "lo')
    loop.train(build_config(raw))
    assert_same_as_reference(reference_run, run_dir, from_step=2)


def test_a_killed_save_leaves_a_tmp_dir_that_is_ignored_and_removed(reference_run, tmp_path):
    run_dir, raw = copy_run(reference_run, tmp_path)
    final = run_dir / "checkpoints" / "step-00000004"
    final.rename(final.with_name("step-00000004.tmp"))
    (final.with_name("step-00000004.tmp") / "manifest.json").unlink()  # killed before the end
    loop.train(build_config(raw))
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert_same_as_reference(reference_run, run_dir, from_step=2)


def test_resume_never_moves_the_old_checkpoints_aside(reference_run, tmp_path, capsys):
    """Starting over keeps what the earlier run wrote (moved out of the way, so that a later
    train.resume=auto cannot pick it up) and writes the new run's own checkpoints."""
    run_dir, raw = copy_run(reference_run, tmp_path, max_steps=2, resume="never")
    old = (run_dir / "checkpoints" / "step-00000004" / "model.safetensors").read_bytes()
    loop.train(build_config(raw))
    aside = list(run_dir.glob("checkpoints.before-*"))
    assert len(aside) == 1 and "moved 2 checkpoint(s)" in capsys.readouterr().err
    assert sorted(p.name for p in aside[0].iterdir()) == ["step-00000002", "step-00000004"]
    assert (aside[0] / "step-00000004" / "model.safetensors").read_bytes() == old
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000002"]


def test_changed_config_is_refused_unless_allowed(reference_run, tmp_path):
    run_dir, raw = copy_run(reference_run, tmp_path, max_steps=5)  # max_steps: allowed
    raw["train"]["lr"] = 5e-4
    raw["loss"]["beta"] = 0.25
    with pytest.raises(DistilError) as info:
        loop.train(build_config(raw))
    msg = str(info.value)
    assert "train.lr: 0.001 -> 0.0005" in msg and "loss.beta: 0.5 -> 0.25" in msg
    assert "train.resume_changed=[loss.beta,train.lr]" in msg
    assert "train.max_steps" not in msg
    assert not list(run_dir.glob("config-resume-*"))  # refused before anything was written
    raw["train"]["resume_changed"] = ["train.lr", "loss.*"]
    metrics = loop.train(build_config(raw))
    assert metrics["step"] == 5 and metrics["lr"] < 5e-4
    first = yaml.safe_load((run_dir / "config.yaml").read_text())
    again = yaml.safe_load((run_dir / "config-resume-4.yaml").read_text())
    assert first["train"]["lr"] == 1e-3 and first["train"]["max_steps"] == 4  # kept as it was
    assert again["train"]["lr"] == 5e-4 and again["loss"]["beta"] == 0.25


def test_resume_changed_must_name_config_keys(make_train_config):
    with pytest.raises(ConfigError, match=r"train\.resume_changed names no config key: train\.lrr"):
        build_config(make_train_config(train={"resume_changed": ["train.lrr"]}))


def test_a_second_run_on_a_locked_directory_is_refused(tmp_path, make_train_config):
    cfg = build_config(make_train_config())
    with RunLock(cfg.train.output_dir), pytest.raises(RunLockedError) as info:
        loop.train(cfg)
    import os

    assert f"pid {os.getpid()}" in str(info.value) and "another train.output_dir" in str(info.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[2]); from distil.train.rundir import RunLock;"
            "import time; RunLock(sys.argv[1]).__enter__(); print('locked', flush=True); "
            "time.sleep(60)",
            str(tmp_path / "run"),
            str(ck.Path(ck.__file__).parents[2]),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(RunLockedError, match=f"pid {holder.pid}"), RunLock(tmp_path / "run"):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with RunLock(tmp_path / "run"):  # the kernel released the dead process's lock
        assert "pid" in (tmp_path / "run" / ".distil.lock").read_text()


def test_time_based_saves_are_on_by_default(tmp_path, make_train_config):
    from distil.config import TrainConfig

    assert TrainConfig().save_every_minutes == 10.0 and TrainConfig().save_every == 0
    cfg = make_train_config(train={"max_steps": 3, "save_every_minutes": 1e-6, "keep_last": 5})
    loop.train(build_config(cfg))
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step-00000001", "step-00000002", "step-00000003"]
    cfg["train"].update(save_every_minutes=None, output_dir=str(tmp_path / "off"))
    loop.train(build_config(cfg))
    assert [p.name for p in (tmp_path / "off" / "checkpoints").iterdir()] == ["step-00000003"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)


def manifests_are_only_reported(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        (ck.Path(d) / "manifest.json").write_bytes(data)
        (ck.Path(d) / "model.safetensors").write_bytes(b"x")
        problems = ck.verify_checkpoint(d)
    assert problems and all(isinstance(p, str) for p in problems)


manifest_bytes = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | json_values.map(lambda v: json.dumps({"files": v}).encode())
)
file_names = st.sampled_from(["model.safetensors", "../model.safetensors", "", "."]) | st.text(
    max_size=10
)
file_entries = json_values | st.fixed_dictionaries(
    {"bytes": st.integers(-2, 2) | json_values, "sha256": st.text(max_size=64) | json_values}
)


@settings(max_examples=150, deadline=1000)
@given(manifest_bytes)
def test_any_manifest_bytes_give_problems_never_an_exception(data):
    manifests_are_only_reported(data)


@settings(max_examples=150, deadline=1000)
@given(st.dictionaries(file_names, file_entries, max_size=4))
def test_any_files_table_gives_problems_never_an_exception(files):
    manifests_are_only_reported(json.dumps({"format": ck.FORMAT, "files": files}).encode())


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("DISTIL_FUZZ_EXAMPLES", "1500")), deadline=1000)
@given(
    manifest_bytes
    | st.dictionaries(file_names, file_entries).map(lambda f: json.dumps({"files": f}).encode())
)
def test_any_manifest_long_run(data):
    manifests_are_only_reported(data)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_output_dir_that_is_or_sits_under_a_file_is_a_clear_error(tmp_path, where):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "run"
    with pytest.raises(DistilError, match=r"is a file, not a directory"), RunLock(out):
        pass
    assert (tmp_path / "f").read_text() == "x"


def test_a_run_that_fails_before_writing_leaves_no_directory(tmp_path):
    """The lock creates the run directory; a run that fails before writing anything (bad data,
    a model that does not load) removes what the lock created, and only that."""
    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError), RunLock(out):
        raise RuntimeError("bad data")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), RunLock(tmp_path / "kept" / "run"):
        (tmp_path / "kept" / "run" / "metrics.jsonl").write_text("{}")
        raise RuntimeError("after the first step")
    assert (tmp_path / "kept" / "run" / "metrics.jsonl").exists()


def test_streamed_safetensors_read_back_and_hash_as_the_file(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from distil.files import sha256
    from distil.train.tensorfile import write_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(5, 3, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "half": torch.randn(2, 2, generator=g).half(),
        "ids": torch.arange(11, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(5, dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 6, generator=g).t(),  # not contiguous
    }
    digest = write_safetensors(tensors, tmp_path / "t.safetensors", metadata={"k": "v"})
    assert digest == sha256(tmp_path / "t.safetensors")
    back = load_file(str(tmp_path / "t.safetensors"))
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        assert f.metadata() == {"k": "v"}


def test_checkpoint_files_are_hashed_as_written_not_read_back(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from distil.files import sha256

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    reads = []
    monkeypatch.setattr(ck, "sha256", lambda path: reads.append(path) or sha256(path))
    path = ck.save_checkpoint(
        acc, tmp_path, 1, {"step": 1}, 2, model=model, optimizer=opt, config_text="a: 1\n",
        extra_tensors={"sampler.safetensors": {"w": model.weight.detach()}},
    )  # fmt: skip
    assert reads == []  # one process wrote every file and hashed it on the way
    manifest = json.loads((path / "manifest.json").read_text())
    assert len(manifest["files"]) == 7
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(path / name), name
    assert ck.verify_checkpoint(path) == []
