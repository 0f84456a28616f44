"""train.bf16_weights on two processes (torchrun, gloo on CPU): the window's gradient reaches
the fp32 masters after DDP's all-reduce, so two ranks train like one process with the whole
window, within bf16 tolerance."""

import json
import sys

import pytest
import torch
import yaml

from distil.testing import run_process_group

pytestmark = pytest.mark.slow


def run(tmp_path, raw, name, ranks):
    raw = json.loads(json.dumps(raw))
    raw["train"]["output_dir"] = str(tmp_path / name)
    raw["train"]["per_device_batch_size"] = 4 // ranks
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    launch = ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks)] if ranks > 1 else []
    proc = run_process_group([sys.executable, *launch, "-m", "distil", "train", str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_two_ranks_with_bf16_weights_follow_one_process(tmp_path, make_train_config):
    raw = make_train_config(
        train={"max_steps": 3, "lambda": 0.0, "grad_accum_steps": 2, "bf16_weights": True},
        generation={"num_generations": 1},
    )
    one, two = run(tmp_path, raw, "one", 1), run(tmp_path, raw, "two", 2)
    assert [m["step"] for m in two] == [1, 2, 3]
    for a, b in zip(one, two, strict=True):
        assert b["tokens/loss"] == a["tokens/loss"]
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-2)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=5e-2)
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    assert {t.dtype for t in w2.values()} == {torch.float32}
    for name, t in w1.items():
        # measured: 8.6e-4 at most; 3.9e-3 when each rank folds its first micro-batch before
        # the all-reduce (that micro-batch then never reaches the other rank)
        torch.testing.assert_close(w2[name], t, atol=1.5e-3, rtol=0)
