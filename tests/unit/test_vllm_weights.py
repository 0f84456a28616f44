"""The vLLM generator's weight pushes against the vLLM stand-in (`vllm_standin`): checkpoint
names and shapes, every engine parameter written, only when the weights changed and always
before sampling, LoRA merged without touching the student, FSDP2 shards gathered.
"""

from __future__ import annotations

import copy

import pytest
import torch
from vllm_standin import PROMPTS, EngineModel, V, engine_weights, install, make, step

from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.weights import named_weights
from distil.testing import tiny_llama, tiny_qwen2


@pytest.fixture
def fake_vllm(monkeypatch):
    return install(monkeypatch)


@pytest.mark.parametrize("arch", [tiny_llama, tiny_qwen2])
def test_first_generate_pushes_every_weight_by_checkpoint_name(fake_vllm, arch):
    student = arch(V)
    gen = make(student, sleep_level=1)  # level 2 (the default) discards what is read below
    assert gen.weights_version == 0
    gen.generate(PROMPTS[:1], SamplingParams(4, temperature=0.0))
    want = [(n, tuple(p.shape)) for n, p in student.named_parameters()]
    assert gen.llm.model.pushed == want  # tied lm_head once, qwen2's q/k/v biases included
    engine = engine_weights(gen)
    assert all(torch.equal(engine[n], p) for n, p in student.named_parameters())
    assert gen.weights_version == 1


def test_weights_pushed_only_when_they_changed_and_always_before_sampling(fake_vllm):
    student = tiny_llama(V)
    gen = make(student, sleep_level=1)
    greedy = SamplingParams(8, temperature=0.0)
    gen.generate(PROMPTS, greedy)
    gen.generate(PROMPTS, greedy)
    gen.sync_weights(student)
    assert gen.weights_version == 1  # nothing changed: one push
    step(student)
    gen.sync_weights(student)
    assert gen.weights_version == 2
    assert all(torch.equal(engine_weights(gen)[n], p) for n, p in student.named_parameters())
    step(student)  # no sync_weights call: generate must still see the new weights
    got = gen.generate(PROMPTS, greedy)
    assert gen.weights_version == 3
    want = HFGenerator(student, pad_id=0, stop_ids=[5, 6]).generate(PROMPTS, greedy)
    width = want.completion_ids_B_C.shape[1]
    assert torch.equal(got.completion_ids_B_C[:, :width], want.completion_ids_B_C)
    assert torch.allclose(got.logprobs_B_C[:, :width], want.logprobs_B_C, atol=1e-5)


@pytest.mark.parametrize("sleep_level", [0, 1])
@pytest.mark.parametrize("bf16_weights", [False, True])
def test_a_fused_adamw_step_is_pushed(fake_vllm, sleep_level, bf16_weights):
    """distil's optimizer with train.fused_adamw (the default on CUDA; fused runs on CPU too):
    torch's fused kernel bumps no version counter, and the engine, awake or asleep at level 1
    (both keep its weights), sampled the initial policy for the whole run (gpu-review-2
    finding 5). After each step the next generate pushes the new weights."""
    from distil.config import TrainConfig
    from distil.train.optim import build_optimizer

    student = tiny_llama(V)
    cfg = TrainConfig(fused_adamw=True, bf16_weights=bf16_weights, lr=1e-2)
    opt = build_optimizer(student, cfg, device="cpu")
    gen = make(student, sleep_level=sleep_level)
    greedy = SamplingParams(8, temperature=0.0)
    gen.generate(PROMPTS, greedy)
    for pushes in (2, 3):
        out = student(torch.tensor([PROMPTS[0]]), labels=torch.tensor([PROMPTS[0]]))
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        got = gen.generate(PROMPTS, greedy)
        assert gen.weights_version == pushes
        engine = engine_weights(gen)
        assert all(torch.equal(engine[n], p) for n, p in student.named_parameters())
    want = HFGenerator(student, pad_id=0, stop_ids=[5, 6]).generate(PROMPTS, greedy)
    width = want.completion_ids_B_C.shape[1]
    assert torch.equal(got.completion_ids_B_C[:, :width], want.completion_ids_B_C)


def test_lora_student_pushes_merged_weights_and_stays_unmerged(fake_vllm):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    student = peft.get_peft_model(tiny_llama(V), config)
    before = {n: p.clone() for n, p in student.named_parameters()}
    gen = make(student, sleep_level=1)  # the engine's weights are read after a generate
    gen.generate(PROMPTS[:2], SamplingParams(4, temperature=0.0))
    merged = copy.deepcopy(student).merge_and_unload()
    want = dict(merged.named_parameters())
    assert [n for n, _ in gen.llm.model.pushed] == list(want)
    engine = engine_weights(gen)
    assert all(torch.allclose(engine[n], p, atol=1e-6) for n, p in want.items())
    base = dict(tiny_llama(V).named_parameters())
    assert not torch.allclose(
        engine["model.layers.0.self_attn.q_proj.weight"],
        base["model.layers.0.self_attn.q_proj.weight"],
    )  # the adapters moved q_proj: the merge happened
    after = dict(student.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)  # the student is untouched
    assert not any(getattr(m, "merged", False) for m in student.modules())
    greedy = SamplingParams(8, temperature=0.0)
    got = gen.generate(PROMPTS, greedy)
    want_rollout = HFGenerator(student, pad_id=0, stop_ids=[5, 6]).generate(PROMPTS, greedy)
    width = want_rollout.completion_ids_B_C.shape[1]
    assert torch.equal(got.completion_ids_B_C[:, :width], want_rollout.completion_ids_B_C)


def test_fsdp2_student_pushes_gathered_full_weights(monkeypatch):
    import socket

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        plain = tiny_qwen2(V)
        sharded = copy.deepcopy(plain)
        for layer in sharded.model.layers:
            fully_shard(layer)
        fully_shard(sharded)
        assert hasattr(sharded.model.layers[0].mlp.up_proj.weight, "full_tensor")
        got = list(named_weights(sharded))
        want = list(plain.named_parameters())
        assert [n for n, _ in got] == [n for n, _ in want]
        assert all(
            type(t) is torch.Tensor and torch.equal(t, w) for (_, t), (_, w) in zip(got, want)
        )
    finally:
        dist.destroy_process_group()


def test_engine_parameter_left_unwritten_is_an_error(fake_vllm, monkeypatch):
    original = EngineModel.load_weights

    def skip_one(self, weights):
        return original(self, (w for w in weights if w[0] != "model.norm.weight"))

    monkeypatch.setattr(EngineModel, "load_weights", skip_one)
    gen = make(tiny_llama(V))
    with pytest.raises(RuntimeError, match=r"did not write: \['hf.model.norm.weight'\]"):
        gen.generate(PROMPTS[:1], SamplingParams(4, temperature=0.0))
