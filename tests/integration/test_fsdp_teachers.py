"""Several teachers sharded over 2 FSDP processes (gloo, CPU): `teachers.models.NAME.placement:
shard`. Rows are routed so that in each micro-batch a rank holds one teacher's rows only; the
other teacher then runs its `idle` forward there, so that both ranks make the same all-gathers.
The run equals the same FSDP run with both teachers replicated on every rank (losses, each
teacher's loss and tokens, final weights), and the idle forwards did happen."""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from distil.testing import run_process_group, train_config
from distil.train import loop

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

CONFIG = Path(__file__).parents[2] / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml"

# the launched script: counts LiveTeacher.idle forwards per rank, printed at exit
CHILD = """
import atexit, os, sys
sys.path.insert(0, sys.argv[1])
from distil.teacher import live
calls, real = [0], live.LiveTeacher.idle
def idle(self):
    calls[0] += live._is_fsdp(self.model)
    return real(self)
live.LiveTeacher.idle = idle
atexit.register(lambda: print(f"idle forwards rank {os.environ['RANK']}: {calls[0]}", flush=True))
from distil.cli import main
raise SystemExit(main(["train", *sys.argv[2:]]))
"""


def launch(root: Path, raw: dict, name: str, placement: str):
    models = {n: {**t, "placement": placement} for n, t in raw["teachers"]["models"].items()}
    cfg = {**raw, "teachers": {**raw["teachers"], "models": models}}
    cfg["train"] = {**raw["train"], "output_dir": str(root / name)}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    script = root / "child.py"
    script.write_text(CHILD)
    src = str(Path(loop.__file__).parents[2])
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG)]
    return run_process_group([*cmd, "--main_process_port", "29547", str(script), src, str(path)])


@pytest.mark.budget(100, "two two-rank FSDP launches with two teachers")
def test_routed_teachers_sharded_train_as_replicated_ones(
    tmp_path, countdown_dir, pair_dirs, second_teacher
):
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "routed.jsonl"  # rows 0, 2, ... to a; 1, 3, ... to b
    data.write_text(
        "".join(json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows))
    )
    raw = train_config(
        tmp_path,
        countdown_dir,
        pair_dirs,
        train={"max_steps": 3, "lambda": 0.0, "per_device_batch_size": 1, "grad_accum_steps": 2},
        loss={"name": "forward_kl"},
    )
    raw["data"] |= {"train": str(data), "shuffle": False}  # rank 0 gets a's rows, rank 1 b's
    raw["teacher"] = {}
    raw["teachers"] = {
        "models": {"a": {"path": str(pair_dirs[0])}, "b": {"path": str(second_teacher)}},
        "column": "src",
    }
    runs = {p: launch(tmp_path, raw, p, p) for p in ("replicate", "shard")}
    for p, r in runs.items():
        assert r.returncode == 0, (p, r.stderr[-3000:])
    out = runs["shard"].stdout
    assert "teacher a sharded" in out and "teacher b sharded" in out, out[-2000:]
    assert "teacher a replicated on every rank" in runs["replicate"].stdout
    idle = [int(x) for x in __import__("re").findall(r"idle forwards rank \d: (\d+)", out)]
    assert len(idle) == 2 and sum(idle) > 0, out[-2000:]  # micro-batches of one teacher's rows
    keys = ["loss", "loss/teacher/a", "loss/teacher/b", "tokens/teacher/a", "tokens/teacher/b"]
    got, want = (
        [json.loads(x) for x in (tmp_path / p / "metrics.jsonl").read_text().splitlines()]
        for p in ("shard", "replicate")
    )
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert [k for k in keys if k in g] == [k for k in keys if k in w]
        assert [g[k] for k in keys if k in g] == pytest.approx(
            [w[k] for k in keys if k in w], rel=1e-5
        )
    assert any("loss/teacher/a" in g and "loss/teacher/b" in g for g in got)
    from safetensors.torch import load_file

    wa, wb = (
        load_file(tmp_path / p / "final" / "model.safetensors") for p in ("shard", "replicate")
    )
    assert set(wa) == set(wb)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)
