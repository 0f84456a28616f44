"""distil's FSDP2 helpers (src/distil/train/fsdp.py) on 2 CPU processes (gloo), against an
unsharded copy of the same tiny model in each process.

- generation on gathered weights: the ranks generate different numbers of tokens (a per-token
  all-gather would pair rank 0's collectives with rank 1's other ones and hang or mix them);
  the completions equal the unsharded model's and the weights are sharded again afterwards;
- the full optimizer state is the unsharded optimizer's `state_dict()`, index for index (and,
  before any step, the empty state, with no step taken to make it);
- loading full model + optimizer states into a differently initialised sharded model continues
  training exactly like the unsharded model.
"""

import copy
import os
from datetime import timedelta

import pytest
import torch

# two ranks on fixed ports: one after another with the other such tests (tests/suite_parallel.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

VOCAB = 64


def _shard(model) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)  # embeddings, tied head and final norm: the root unit


def _step(model, opt, x) -> None:
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _full_weights(model) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _generation_gathers(rank: int) -> None:
    from torch.distributed.tensor import DTensor

    from distil.generation.base import SamplingParams
    from distil.generation.hf import HFGenerator
    from distil.testing import tiny_llama
    from distil.train.fsdp import GatheringGenerator

    ref, model = tiny_llama(VOCAB, seed=0), tiny_llama(VOCAB, seed=0)
    _shard(model)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]][: rank + 2]  # 2 rows on rank 0, 3 on 1
    params = SamplingParams(max_new_tokens=3 + 6 * rank, temperature=0.0)  # 3 vs 9 tokens
    got = GatheringGenerator(HFGenerator(model, pad_id=0, stop_ids=[1]), model)
    want = HFGenerator(ref, pad_id=0, stop_ids=[1]).generate(prompts, params)
    out = got.generate(prompts, params)
    assert out.completion_ids_B_C.shape[1] == 3 + 6 * rank
    assert torch.equal(out.completion_ids_B_C, want.completion_ids_B_C)
    torch.testing.assert_close(out.logprobs_B_C, want.logprobs_B_C)
    w = model.model.layers[0].mlp.gate_proj.weight
    assert isinstance(w, DTensor) and w.to_local().shape[0] == w.shape[0] // 2  # sharded again


def _states_round_trip(rank: int) -> None:
    from distil.testing import tiny_llama
    from distil.train.fsdp import full_optimizer_state, load_full_state

    torch.manual_seed(0)
    xs = [torch.randint(2, VOCAB, (2, 7)) for _ in range(3)]  # the same batches on both ranks
    ref, model = tiny_llama(VOCAB, seed=0), tiny_llama(VOCAB, seed=0)
    ref.train()
    model.train()
    _shard(model)
    kw = {"lr": 1e-2, "betas": (0.8, 0.95), "weight_decay": 0.1}
    ref_opt = torch.optim.AdamW(ref.parameters(), **kw)
    opt = torch.optim.AdamW(model.parameters(), **kw)
    # a checkpoint before any step (grpo's skipped windows) saves the empty state as it is:
    # making it would count a zero-lr step in AdamW's bias correction
    assert full_optimizer_state(model, opt)["state"] == {} and not opt.state
    fresh = torch.optim.AdamW(model.parameters(), **kw)
    load_full_state(model, fresh, _full_weights(model), copy.deepcopy(opt.state_dict()))
    assert not fresh.state
    for x in xs[:2]:  # equal batches on both ranks: FSDP's averaged gradient is the reference's
        _step(ref, ref_opt, x)
        _step(model, opt, x)
    full = full_optimizer_state(model, opt)  # a collective: both ranks call it
    if rank == 0:
        want = ref_opt.state_dict()
        assert full["param_groups"] == want["param_groups"]  # indices, lr, betas, decay
        assert set(full["state"]) == set(want["state"])
        for i, entry in want["state"].items():
            for name, t in entry.items():
                torch.testing.assert_close(full["state"][i][name], t, atol=1e-6, rtol=1e-5)
    else:
        assert full == {}
    # a differently initialised sharded model takes the reference's full states and continues
    other = tiny_llama(VOCAB, seed=3)
    other.train()
    _shard(other)
    other_opt = torch.optim.AdamW(other.parameters(), **kw)
    # copies, as from a checkpoint file (the reference keeps training in place below)
    weights = {k: v.clone() for k, v in ref.state_dict().items()}
    load_full_state(other, other_opt, weights, copy.deepcopy(ref_opt.state_dict()))
    _step(ref, ref_opt, xs[2])
    _step(other, other_opt, xs[2])
    got = _full_weights(other)
    for name, t in ref.state_dict().items():
        torch.testing.assert_close(got[name], t, atol=1e-6, rtol=1e-5)


def _worker(rank: int, world: int, init_file: str, which: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    # a bounded timeout: mismatched collectives fail the test instead of hanging it
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        {"generate": _generation_gathers, "states": _states_round_trip}[which](rank)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("which", ["generate", "states"])
def test_fsdp_helpers_on_two_processes(tmp_path, which):
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), which), nprocs=2, join=True)
