"""Two ranks (torchrun's worker environment, gloo on CPU): data-parallel generation,
synchronous and async.

Every rank samples its own slice of the window: its generate calls see only its prompts, the
ranks' prompts together are the window (no prompt twice), and each rank trains on rollouts
paired with its own prompts. With generation.async the same holds one window ahead, the
staleness is logged, and a run killed mid-way resumes on both ranks to the uninterrupted
run's losses and weights.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from distil.serve.process import free_port
from distil.train import loop
from distil.train.buffer import GenerationBuffer
from warm import launch_ranks

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

# torchrun's worker: records, per rank, every generate call (prompts -> completions) and every
# window's samples, then writes them to <out>/rank<R>.json
CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from distil.generation.hf import HFGenerator
from distil.train.buffer import GenerationBuffer
calls, windows = [], []
real_generate, real_window = HFGenerator.generate, GenerationBuffer.next_window
def generate(self, prompt_ids, params):
    out = real_generate(self, prompt_ids, params)
    calls.append({"prompts": [list(p) for p in prompt_ids], "n": params.n,
                  "completions": out.completion_lists()})
    return out
def next_window(self):
    w = real_window(self)
    windows.append([{"example": s.example_id, "prompt": s.prompt_ids,
                     "completion": s.completion_ids, "source": s.source}
                    for b in w.micro_batches for s in b.samples])
    return w
HFGenerator.generate, GenerationBuffer.next_window = generate, next_window
from distil.cli import main
code = main(["train", sys.argv[2]])
rank = os.environ.get("RANK", "0")
with open(os.path.join(sys.argv[3], f"rank{rank}.json"), "w") as f:
    json.dump({"calls": calls, "windows": windows}, f)
raise SystemExit(code)
"""


def torchrun(tmp_path, cfg_path, out, kill_at_step=0):
    """Two ranks with torchrun's worker environment, forked from the warm interpreter
    (tests/warm.py; tests/integration/test_ddp.py launches torchrun itself)."""
    src = str(Path(loop.__file__).parents[2])
    cmd = [sys.executable, "-c", CHILD if not kill_at_step else KILLER, src, str(cfg_path)]
    cmd += [str(out), *([str(kill_at_step)] if kill_at_step else [])]
    out.mkdir(parents=True, exist_ok=True)
    return launch_ranks(cmd, 2, free_port())


def write_config(tmp_path, raw, name, **train):
    cfg = {**raw, "train": {**raw["train"], **train, "output_dir": str(tmp_path / name)}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_each_rank_samples_its_own_slice_of_the_window(tmp_path, make_train_config, use_async):
    per_device, accum, n, steps = 4, 2, 2, 4
    raw = make_train_config(
        train={"max_steps": steps, "lambda": 1.0, "per_device_batch_size": per_device},
        generation={"num_generations": n, "async": use_async},
    )
    out = tmp_path / "record"
    run = torchrun(tmp_path, write_config(tmp_path, raw, "run"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    per_rank = per_device * accum // n  # unique prompts per rank and window
    for rec in ranks:
        assert len(rec["calls"]) == steps and len(rec["windows"]) == steps  # one call per window
    for w in range(steps):
        mine = [[s["example"] for s in rec["windows"][w]] for rec in ranks]
        unique = [list(dict.fromkeys(ids)) for ids in mine]
        assert all(len(u) == per_rank for u in unique)
        assert not set(unique[0]) & set(unique[1])  # no prompt on both ranks
        for rec in ranks:
            call, samples = rec["calls"][w], rec["windows"][w]
            # the generate call saw exactly this rank's prompts, in its rows' order
            assert call["prompts"] == [s["prompt"] for s in samples[::n]]
            assert len({tuple(p) for p in call["prompts"]}) == per_rank
            # and each rollout is trained next to the prompt it was sampled for
            for j, s in enumerate(samples):
                assert s["source"] == "on_policy"
                assert call["prompts"][j // n] == s["prompt"]
                assert call["completions"][j] == s["completion"]
    # the ranks' prompts together are the global window: the epoch's order, rank by rank
    got = [ex for w in range(steps) for rec in ranks for ex in _unique(rec["windows"][w])]
    data = SimpleNamespace(examples=[None] * 64, shuffle=True, seed=0)  # countdown_dir: 64 rows
    assert got == GenerationBuffer._epoch_order(data, 0)[: steps * 2 * per_rank]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    staleness = [m.get("policy/staleness") for m in metrics]
    assert staleness == ([0.0, 1.0, 1.0, 1.0] if use_async else [None] * steps)


def _unique(samples):
    return list(dict.fromkeys(s["example"] for s in samples))


# a worker that SIGKILLs the whole job on rank 1 right after checkpoint <step> is written
KILLER = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from distil.train import loop
real, at = loop.save_checkpoint, int(sys.argv[4])
def save(acc, out, step, *a, **k):
    path = real(acc, out, step, *a, **k)
    if step == at and os.environ.get("RANK") == "1":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return path
loop.save_checkpoint = save
from distil.cli import main
raise SystemExit(main(["train", sys.argv[2]]))
"""


@pytest.mark.budget(
    130, "two ranks with async generation, killed mid-run, resumed, against the uninterrupted run"
)
def test_two_ranks_async_killed_mid_run_resume_exactly(tmp_path, make_train_config):
    raw = make_train_config(
        train={"max_steps": 5, "save_every": 1, "keep_last": 5, "lambda": 1.0},
        generation={"async": True},
    )
    full = torchrun(tmp_path, write_config(tmp_path, raw, "full"), tmp_path / "a")
    assert full.returncode == 0, full.stderr[-3000:]
    cfg = write_config(tmp_path, raw, "killed")
    killed = torchrun(tmp_path, cfg, tmp_path / "b", kill_at_step=3)
    assert killed.returncode != 0
    last = tmp_path / "killed" / "checkpoints" / "step-00000003"
    assert (last / "sampler.safetensors").exists()
    resumed = torchrun(tmp_path, cfg, tmp_path / "c")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step-00000003" in resumed.stdout
    read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    a, b = read(tmp_path / "full"), read(tmp_path / "killed")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], x["step"]
        assert x["policy/staleness"] == y["policy/staleness"]
    from safetensors.torch import load_file

    wa = load_file(tmp_path / "full" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert all((wa[k] == wb[k]).all() for k in wa)
