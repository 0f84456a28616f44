"""FSDP2 on 2 CPU processes (gloo), launched with the accelerate configs users launch with.

The same run under FSDP (student sharded, generation on gathered weights, full checkpoints
gathered to rank 0) and under DDP gives the same losses, token counts and final weights; a run
killed mid-way under FSDP resumes from its checkpoint and ends exactly like the uninterrupted
FSDP run; a sharded teacher scores like a replicated one.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from distil.testing import run_process_group
from distil.train import loop

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

CONFIGS = Path(__file__).parents[2] / "configs" / "accelerate"

# the launched script: optionally SIGKILL the whole job on rank 1 in the N-th micro-batch
CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from distil.train import loop
real, calls, n = loop.micro_step, [0], int(sys.argv[2])
def micro(*a, **k):
    calls[0] += 1
    if calls[0] == n and os.environ.get("RANK") == "1":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return real(*a, **k)
loop.micro_step = micro
from distil.cli import main
raise SystemExit(main(["train", *sys.argv[3:]]))
"""


def launch(tmp_path, config: str, cfg_path, *overrides, kill_at_micro=0, port=None):
    """`accelerate launch --config_file configs/accelerate/<config>` of `distil train`."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    src = str(Path(loop.__file__).parents[2])
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    cmd += [str(CONFIGS / config)]
    if port is not None:
        cmd += ["--main_process_port", str(port)]
    cmd += [str(script), src, str(kill_at_micro), str(cfg_path), *overrides]
    return run_process_group(cmd)


def write_config(tmp_path, raw, name, **train):
    cfg = {**raw, "train": {**raw["train"], "output_dir": str(tmp_path / name), **train}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "final" / "model.safetensors")


def assert_same_run(a_dir: Path, b_dir: Path, steps: int) -> None:
    a, b = metrics(a_dir), metrics(b_dir)
    assert [m["step"] for m in b] == list(range(1, steps + 1))
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
        assert y["tokens/loss"] == x["tokens/loss"]
    wa, wb = final_weights(a_dir), final_weights(b_dir)
    assert set(wa) == set(wb)
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, countdown_dir, pair_dirs):
    """Five launches shared by the tests below (each costs ~20 s of process start-up here):
    DDP; FSDP; FSDP with a sharded teacher; the same killed in step 3 and resumed."""
    from distil.testing import train_config

    root = tmp_path_factory.mktemp("fsdp")
    # on-policy and off-policy slices (lambda 0.5): generation runs on the gathered student;
    # evaluations (steps 2 and 4) generate on rank 0 alone while the other rank waits
    raw = train_config(
        root,
        countdown_dir,
        pair_dirs,
        train={"max_steps": 4, "lambda": 0.5, "save_every": 1, "keep_last": 5, "eval_every": 2},
    )
    out = {"root": root, "raw": raw}
    out["ddp"] = launch(root, "ddp_cpu_2proc.yaml", write_config(root, raw, "ddp"))
    out["fsdp"] = launch(root, "fsdp_cpu_2proc.yaml", write_config(root, raw, "fsdp"))
    shard = ["teacher.placement=shard"]
    out["shard"] = launch(root, "fsdp_cpu_2proc.yaml", write_config(root, raw, "shard"), *shard)
    killed_cfg = write_config(root, raw, "killed")
    # 2 micro-batches a step: the 6th is in step 3, after checkpoint step-2
    out["killed"] = launch(root, "fsdp_cpu_2proc.yaml", killed_cfg, *shard, kill_at_micro=6)
    out["ckpts"] = sorted(p.name for p in (root / "killed" / "checkpoints").iterdir())
    out["resumed"] = launch(root, "fsdp_cpu_2proc.yaml", killed_cfg, *shard)
    return out


def ok(result) -> None:
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.budget(
    200, "its module fixture launches five two-rank runs (DDP, FSDP, sharded, killed, resumed)"
)
def test_fsdp_equals_ddp_on_two_processes(runs):
    root = runs["root"]
    ok(runs["ddp"])
    ok(runs["fsdp"])
    assert "FSDP2: student sharded over 2 processes" in runs["fsdp"].stdout  # no DDP fallback
    assert "teacher replicated" in runs["fsdp"].stdout
    assert "sharded" not in runs["ddp"].stdout
    assert_same_run(root / "ddp", root / "fsdp", 4)
    fsdp = metrics(root / "fsdp")
    # on-policy windows were drawn: the student generated on gathered weights
    assert any(m["policy/on_policy_share"] > 0 for m in fsdp)
    ddp = metrics(root / "ddp")
    for i in (1, 3):  # steps 2 and 4: the same verdicts from the gathered student
        for key in ("eval/accuracy", "eval/total"):
            assert fsdp[i][key] == ddp[i][key]
    # the final model is a plain transformers directory, whole (not a shard)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(root / "fsdp" / "final")
    student = AutoModelForCausalLM.from_pretrained(runs["raw"]["student"]["path"])
    assert model.num_parameters() == student.num_parameters()
    # the FSDP checkpoint holds the full model and optimizer state, indexed like DDP's
    from safetensors.torch import load_file

    ck = "checkpoints/step-00000004"
    for name in ("optimizer.safetensors", "model.safetensors"):
        a, b = load_file(root / "ddp" / ck / name), load_file(root / "fsdp" / ck / name)
        assert set(a) == set(b)
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=1e-6, rtol=1e-5)


def test_sharded_teacher_scores_like_a_replicated_one(runs):
    ok(runs["shard"])
    assert "teacher sharded" in runs["shard"].stdout
    assert_same_run(runs["root"] / "fsdp", runs["root"] / "shard", 4)


def test_fsdp_killed_mid_run_resumes_exactly(runs):
    assert runs["killed"].returncode != 0
    assert runs["ckpts"][-1] == "step-00000002", runs["ckpts"]
    ok(runs["resumed"])
    assert "resumed from" in runs["resumed"].stdout
    assert "step-00000002" in runs["resumed"].stdout
    assert_same_run(runs["root"] / "shard", runs["root"] / "killed", 4)
