"""The vLLM generator against a stand-in of the vLLM API it uses (`vllm_standin`): conversion
of the engine's outputs into a Rollout (pairing under shuffled outputs and n > 1, padding,
masks, log-probs), the sampling parameters sent, the sleep/wake order, the config errors, and
training through the loop. Weight pushes: test_vllm_weights.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_standin import (
    PROMPTS,
    FakeLLM,
    Logprob,
    RequestOutput,
    V,
    install,
    make,
    step,
    vllm_config,
)

from distil.config import build_config
from distil.errors import ConfigError
from distil.generation import vllm as vgen
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.preflight import command_problems
from distil.testing import tiny_llama, tiny_qwen2


@pytest.fixture
def fake_vllm(monkeypatch):
    return install(monkeypatch)


def frequent_tokens(model, k=2):
    """Ids the greedy model emits mid-completion, so that stops cut rows at several places."""
    out = HFGenerator(model, pad_id=0, stop_ids=[V - 1]).generate(
        PROMPTS, SamplingParams(12, temperature=0.0)
    )
    counts = torch.bincount(out.completion_ids_B_C[:, 1:-1].flatten(), minlength=V)
    return counts.topk(k).indices.tolist()


# ---- conversion ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [tiny_llama, tiny_qwen2])
def test_greedy_rollout_equals_hf_generator(fake_vllm, arch):
    student = arch(V)
    stops = frequent_tokens(student)
    params = SamplingParams(12, temperature=0.0, n=2)
    gen = make(student, stop_ids=stops)
    got = gen.generate(PROMPTS, params)
    want = HFGenerator(student, pad_id=0, stop_ids=stops).generate(PROMPTS, params)
    assert got.prompt_index == want.prompt_index == [0, 0, 1, 1, 2, 2, 3, 3]
    width = want.completion_ids_B_C.shape[1]
    assert torch.equal(got.completion_ids_B_C[:, :width], want.completion_ids_B_C)
    assert torch.equal(got.completion_mask_B_C[:, :width], want.completion_mask_B_C)
    assert not got.completion_mask_B_C[:, width:].any()
    assert torch.allclose(got.logprobs_B_C[:, :width], want.logprobs_B_C, atol=1e-5)
    assert torch.equal(got.stopped_B, want.stopped_B) and got.stopped_B.any()
    assert not got.stopped_B.all()  # some rows ran to max_new_tokens
    assert (got.logprobs_B_C[~got.completion_mask_B_C] == 0).all()
    assert (got.completion_ids_B_C[~got.completion_mask_B_C] == 0).all()  # pad id


def test_sampled_rows_follow_their_prompt_and_seed(fake_vllm):
    """Seeded requests: each prompt's samples are what the engine drew for that prompt, in
    sample order, whatever order the engine returned them in; the log-probs are the chosen
    tokens' under the warped (temperature, top-k, top-p) distribution."""
    student = tiny_llama(V)
    prompts = PROMPTS[:3]  # distinct prompts: identical ones are interchangeable
    params = SamplingParams(10, temperature=0.8, top_p=0.9, top_k=20, n=3)
    shuffled = make(student, seeded=True).generate(prompts, params)
    FakeLLM.shuffle = False
    try:
        ordered = make(student, seeded=True).generate(prompts, params)
    finally:
        FakeLLM.shuffle = True
    assert shuffled.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(shuffled.completion_ids_B_C, ordered.completion_ids_B_C)
    assert torch.equal(shuffled.logprobs_B_C, ordered.logprobs_B_C)
    rows = shuffled.completion_lists()
    assert len({tuple(r) for r in rows}) > 4  # samples differ
    for row, (i, tokens) in enumerate(zip(shuffled.prompt_index, rows)):
        want = warped_logprobs(student, prompts[i], tokens, params)
        assert torch.allclose(shuffled.logprobs_B_C[row, : len(tokens)], want, atol=1e-4)


def warped_logprobs(model, prompt, tokens, params):
    """Reference: log-softmax after temperature, top-k and top-p, at each chosen token."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
    logits = TopKLogitsWarper(params.top_k)(ids, logits)
    logits = TopPLogitsWarper(params.top_p)(ids, logits)
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_sampling_params_sent_to_the_engine(fake_vllm, monkeypatch):
    seen = []
    original = FakeLLM.generate

    def spy(self, prompts, sampling_params=None, **kw):
        seen.append((len(prompts), sampling_params))
        return original(self, prompts, sampling_params, **kw)

    monkeypatch.setattr(FakeLLM, "generate", spy)
    gen = make(tiny_llama(V), stop_ids=[5, 7])
    gen.generate(PROMPTS[:2], SamplingParams(6, temperature=0.7, top_p=0.5, top_k=3, n=4))
    count, sp = seen[-1]
    assert count == 2 and sp.n == 4 and sp.max_tokens == 6 and sp.stop_token_ids == [5, 7]
    assert (sp.temperature, sp.top_p, sp.top_k, sp.logprobs, sp.detokenize) == (
        0.7,
        0.5,
        3,
        0,
        False,
    )
    assert sp.seed is None  # unseeded: one engine seed
    gen.generate(PROMPTS[:2], SamplingParams(6, temperature=0.0, n=3))
    count, sp = seen[-1]
    assert count == 6 and sp.n == 1 and sp.temperature == 0.0  # greedy: n copies of n=1
    # a call's own seed (generation.async's): one seed per request, a function of that seed
    seeded = SeededParams(6, temperature=0.7, n=2, seed=7)
    gen.generate(PROMPTS[:3], seeded)
    first = [sp.seed for sp in seen[-1][1]]
    gen.generate(PROMPTS[:3], seeded)
    assert [sp.seed for sp in seen[-1][1]] == first and len(set(first)) == 3
    gen.generate(PROMPTS[:3], SeededParams(6, temperature=0.7, n=2, seed=8))
    assert not set(first) & {sp.seed for sp in seen[-1][1]}
    kwargs = gen.llm.kwargs
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"]
    assert kwargs["max_model_len"] == 256 + 128  # max_prompt_tokens + max_new_tokens
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["max_num_batched_tokens"] == 4096
    assert kwargs["dtype"] == "bfloat16"  # an fp32 student: a bf16 engine unless asked


# ---- engine settings ----------------------------------------------------------------------


def test_engine_dtype_is_bf16_unless_float32_is_asked():
    fp32, fp16 = tiny_llama(V), tiny_llama(V).half()
    assert vgen.engine_dtype("auto", fp32) == "bfloat16"
    assert vgen.engine_dtype("auto", fp32.to(torch.bfloat16)) == "bfloat16"
    assert vgen.engine_dtype("auto", fp16) == "float16"
    assert vgen.engine_dtype("float32", fp32) == "float32"  # only when set
    v = build_config({}).generation.vllm
    assert (v.dtype, v.sleep_level, v.max_num_batched_tokens) == ("auto", 2, 4096)


def test_default_engine_sleeps_at_level_2(fake_vllm):
    gen = make(tiny_llama(V))
    gen.generate(PROMPTS[:1], SamplingParams(4, temperature=0.0))
    assert gen.llm.events[0] == ("sleep", 2) and gen.llm.events[-1] == ("sleep", 2)
    assert not any(e == ("wake_up", ("weights", "kv_cache")) for e in gen.llm.events)


def test_max_model_len_covers_the_in_training_eval():
    """The eval samples with the same engine: its completions must fit too."""
    raw = {"generation": {"backend": "vllm", "max_new_tokens": 128}}
    assert vgen.engine_max_len(build_config(raw)) == 256 + 128
    raw |= {"train": {"eval_every": 10}, "eval": {"max_new_tokens": 2048}}
    assert vgen.engine_max_len(build_config(raw)) == 256 + 2048
    raw["eval"]["max_new_tokens"] = 16
    assert vgen.engine_max_len(build_config(raw)) == 256 + 128
    raw["generation"]["vllm"] = {"max_model_len": 4000}
    assert vgen.engine_max_len(build_config(raw)) == 4000


def test_a_set_max_model_len_too_short_for_the_run_is_a_config_error():
    raw = {
        "generation": {"backend": "vllm", "max_new_tokens": 128, "vllm": {"max_model_len": 900}},
        "train": {"eval_every": 10},
        "eval": {"max_new_tokens": 1024},
    }
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    text = str(err.value)
    assert "generation.vllm.max_model_len = 900" in text and "eval.max_new_tokens" in text
    assert "at least 1280" in text  # 256 + 1024
    raw["eval"]["max_new_tokens"] = 512
    build_config(raw)  # 256 + 512 fits in 900
    raw["generation"]["vllm"] |= {"max_num_seqs": 8192}
    with pytest.raises(ConfigError, match="max_num_batched_tokens = 4096"):
        build_config(raw)


def test_building_the_engine_leaves_the_global_rngs_as_they_were(fake_vllm):
    """vLLM's start-up reseeds Python, numpy and torch (the stand-in does too): the trainer's
    streams continue after the build as if it had not happened."""
    import numpy as np

    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    draws()
    want = draws()
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    draws()
    make(tiny_llama(V))
    assert draws() == want


def test_allocator_cache_is_emptied_just_before_the_engine_is_built(fake_vllm, monkeypatch):
    order = []
    monkeypatch.setattr(vgen.gc, "collect", lambda *a: order.append("gc.collect"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    real = FakeLLM.__init__

    def build(self, *args, **kwargs):
        order.append("LLM")
        real(self, *args, **kwargs)

    monkeypatch.setattr(FakeLLM, "__init__", build)
    make(tiny_llama(V))
    assert order[:3] == ["gc.collect", "empty_cache", "LLM"]


MODEL_CONFIGS = Path(__file__).parents[1] / "data" / "model_configs"


def test_moe_or_quantized_students_are_refused(fake_vllm, tmp_path):
    """The raw load_weights push is complete for dense models only (vllm-conformance A11)."""
    moe = build_config(
        {
            "generation": {"backend": "vllm"},
            "student": {"path": str(MODEL_CONFIGS / "qwen3-30b-a3b")},
        }
    )
    (problem,) = vgen.backend_problems(moe)
    assert "mixture-of-experts model (num_experts = 128)" in problem
    assert "generation.backend=hf_static" in problem
    assert problem in command_problems(moe, "train")  # before any model is loaded
    dense = moe.model_copy(deep=True)
    dense.student.path = str(MODEL_CONFIGS / "qwen3-0.6b")
    assert vgen.backend_problems(dense) == []
    assert vgen.not_dense({"quantization_config": {"quant_method": "awq"}}) == (
        "a quantized model (awq)"
    )
    student = tiny_llama(V)
    student.config.num_local_experts = 8  # a hub id: checked on the loaded model's config
    with pytest.raises(ConfigError, match=r"mixture-of-experts model \(num_local_experts = 8\)"):
        vgen.VLLMGenerator.from_config(vllm_config(), student, pad_id=0, stop_ids=[1])


def test_expandable_segments_with_sleep_mode_refused_on_vllm_before_0_12(monkeypatch):
    monkeypatch.setattr(vgen, "cuda_available", lambda: True)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512,expandable_segments:True")
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.11.2")
    (problem,) = vgen.backend_problems(vllm_config())
    assert "PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:True" in problem
    assert "vllm 0.11.2" in problem and "sleep_level=0" in problem
    assert vgen.backend_problems(vllm_config(sleep_level=0)) == []
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.12.0")
    assert vgen.backend_problems(vllm_config()) == []  # 0.12+ switches them off itself
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.11.2")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert vgen.backend_problems(vllm_config()) == []


@dataclass(frozen=True)
class SeededParams(SamplingParams):
    seed: int | None = None  # the field generation.async adds to SamplingParams


@dataclass
class Out:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]


@settings(max_examples=30, deadline=1000)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=6),  # prompt ids (repeats allowed)
    st.integers(1, 4),  # n
    st.integers(0, 10_000),  # shuffle seed
    st.data(),
)
def test_regroup_and_rollout_pair_every_sample_with_its_prompt(prompt_keys, n, seed, data):
    """Synthetic outputs whose tokens name their prompt and sample: any output order, any
    lengths, stops anywhere -> each row holds its own prompt's sample, padded and masked."""
    stop, pad = 1, 0
    prompts = [[100 + k, 7] for k in prompt_keys]
    outputs = []
    for r, p in enumerate(prompts):
        outs = []
        for j in range(n):
            length = data.draw(st.integers(0, 5))
            ends = data.draw(st.booleans())
            tokens = [p[0], 10 + j] + [2] * length + ([stop] if ends else [])
            lps = [-(0.1 * (i + 1) + j) for i in range(len(tokens))]
            outs.append(Out(j, tokens, [{t: Logprob(lp)} for t, lp in zip(tokens, lps)]))
        random.Random(seed + r).shuffle(outs)
        outputs.append(RequestOutput(str(r), list(p), outs))
    random.Random(seed).shuffle(outputs)
    samples = vgen.regroup(outputs, prompts, list(range(len(prompts))), n)
    rollout = vgen.to_rollout(samples, pad_id=pad, stop_ids=[stop])
    assert rollout.prompt_index == [i for i in range(len(prompts)) for _ in range(n)]
    for row, (i, tokens) in enumerate(zip(rollout.prompt_index, rollout.completion_lists())):
        assert tokens[0] == prompts[i][0] and tokens[1] == 10 + row % n
        assert rollout.stopped_B[row] == (tokens[-1] == stop)
        lps = rollout.logprobs_B_C[row, : len(tokens)]
        assert torch.allclose(lps, -(0.1 * torch.arange(1, len(tokens) + 1) + row % n))
        assert (rollout.logprobs_B_C[row, len(tokens) :] == 0).all()
        assert (rollout.completion_ids_B_C[row, len(tokens) :] == pad).all()


@pytest.mark.slow
@settings(max_examples=500, deadline=1000)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=12),
    st.integers(1, 6),
    st.integers(0, 10_000),
    st.data(),
)
def test_regroup_and_rollout_pairing_long(prompt_keys, n, seed, data):
    test_regroup_and_rollout_pair_every_sample_with_its_prompt.hypothesis.inner_test(
        prompt_keys, n, seed, data
    )


def test_regroup_refuses_missing_or_foreign_outputs():
    prompts = [[1, 2], [3]]
    good = [RequestOutput("0", [1, 2], [Out(0, [5], [])]), RequestOutput("1", [3], [])]
    with pytest.raises(RuntimeError, match="samples per prompt"):
        vgen.regroup(good, prompts, [0, 1], 1)
    foreign = [RequestOutput("0", [9], [Out(0, [5], [])])]
    with pytest.raises(RuntimeError, match="not requested"):
        vgen.regroup(foreign, prompts, [0, 1], 1)


# ---- sleep / wake -------------------------------------------------------------------------


def test_sleep_level_1_wakes_what_each_phase_needs(fake_vllm):
    student = tiny_llama(V)
    gen = make(student, sleep_level=1)
    assert gen.llm.events == [("sleep", 1)]  # training gets the memory from the start
    gen.generate(PROMPTS[:2], SamplingParams(4, temperature=0.0))
    push = [("wake_up", ("weights",)), ("apply_model",), ("reset_prefix_cache",)]
    sample = [("wake_up", ("kv_cache",)), ("generate", 2), ("sleep", 1)]
    assert gen.llm.events == [("sleep", 1), *push, *sample]
    step(student)
    gen.sync_weights(student)
    gen.generate(PROMPTS[:2], SamplingParams(4, temperature=0.0))
    assert gen.llm.events[7:] == [*push, *sample]
    assert gen.llm.asleep == {"weights", "kv_cache"}


def test_sleep_level_2_pushes_again_after_the_weights_were_discarded(fake_vllm):
    student = tiny_llama(V)
    gen = make(student, sleep_level=2)
    greedy = SamplingParams(8, temperature=0.0)
    first = gen.generate(PROMPTS, greedy)
    assert torch.isnan(next(gen.llm.model.parameters())).all()  # slept: weights discarded
    second = gen.generate(PROMPTS, greedy)  # same student: pushed again all the same
    assert gen.weights_version == 2
    assert torch.equal(first.completion_ids_B_C, second.completion_ids_B_C)
    assert torch.isfinite(second.logprobs_B_C).all()


def test_sleep_level_0_never_sleeps(fake_vllm):
    gen = make(tiny_llama(V), sleep_level=0)
    gen.generate(PROMPTS[:1], SamplingParams(4, temperature=0.0))
    gen.generate(PROMPTS[:1], SamplingParams(4, temperature=0.0))
    assert [e[0] for e in gen.llm.events] == [
        "apply_model",
        "reset_prefix_cache",
        "generate",
        "generate",
    ]
    assert gen.llm.kwargs["enable_sleep_mode"] is False


@pytest.mark.parametrize("level", [1, 2])
def test_copies_of_the_generator_share_what_the_engine_holds(fake_vllm, level):
    """generation.async samples with a copy of the generator over the weight snapshot: the
    copies drive one engine, so each must know whether it sleeps and whose weights it holds."""
    import copy

    student, other = tiny_llama(V), tiny_llama(V, seed=5)
    greedy = SamplingParams(8, temperature=0.0)
    gen = make(student, sleep_level=level)
    first = gen.generate(PROMPTS, greedy)
    twin = copy.copy(gen)
    twin.sync_weights(other)  # pushes the other weights into the shared engine
    got_twin = twin.generate(PROMPTS, greedy)
    got = gen.generate(PROMPTS, greedy)  # must wake the engine and push its weights again
    for model, rollout in ((other, got_twin), (student, got)):
        want = HFGenerator(model, pad_id=0, stop_ids=[5, 6]).generate(PROMPTS, greedy)
        width = want.completion_ids_B_C.shape[1]
        assert torch.equal(rollout.completion_ids_B_C[:, :width], want.completion_ids_B_C)
        assert torch.allclose(rollout.logprobs_B_C[:, :width], want.logprobs_B_C, atol=1e-5)
    assert torch.equal(first.logprobs_B_C, got.logprobs_B_C)
    assert not torch.allclose(got.logprobs_B_C, got_twin.logprobs_B_C, atol=1e-3)


# ---- config errors ------------------------------------------------------------------------


def test_missing_vllm_and_missing_cuda_are_config_errors(monkeypatch):
    monkeypatch.setattr(vgen, "installed_version", lambda: None)
    monkeypatch.setattr(vgen, "cuda_available", lambda: False)
    problems = vgen.backend_problems(vllm_config())
    assert len(problems) == 2
    assert "needs the optional package 'vllm'" in problems[0]
    assert "pip install 'distil[vllm]'" in problems[0] and "generation.backend=hf" in problems[0]
    assert "needs a CUDA GPU" in problems[1] and "generation.backend = 'vllm'" in problems[1]
    assert vgen.backend_problems(build_config({})) == []  # hf: nothing asked
    assert set(problems) <= set(command_problems(vllm_config(), "train"))  # checked before loading
    with pytest.raises(ConfigError) as err:
        vgen.VLLMGenerator.from_config(vllm_config(), tiny_llama(V), pad_id=0, stop_ids=[1])
    assert err.value.problems == problems


def test_too_old_vllm_is_a_config_error(monkeypatch):
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.10.2")
    monkeypatch.setattr(vgen, "cuda_available", lambda: True)
    (problem,) = vgen.backend_problems(vllm_config())
    assert "vllm 0.10.2 is installed" in problem and vgen.SUPPORTED in problem
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.12.0rc1+cu128")
    assert vgen.backend_problems(vllm_config()) == []


def test_vllm_settings_are_validated():
    with pytest.raises(ConfigError, match=r"generation\.vllm\.sleep_level"):
        build_config({"generation": {"vllm": {"sleep_level": 3}}})
    with pytest.raises(ConfigError, match=r"generation\.vllm\.gpu_memory_utilization"):
        build_config({"generation": {"vllm": {"gpu_memory_utilization": 1.5}}})


# ---- the training loop ----------------------------------------------------------------------


def test_greedy_training_with_vllm_logs_the_losses_of_hf(fake_vllm, make_train_config, tmp_path):
    """generation.backend=vllm through the loop (the backend factory picks the stand-in
    engine): the same per-step losses as the HF backend under greedy decoding, one engine
    generation per window, one weight push per optimizer step."""
    pytest.importorskip("distil.generation.select")  # the backend factory (generation.backend)
    import json

    from distil.train import loop

    def run(backend):
        raw = make_train_config(
            generation={"temperature": 0.0, "backend": backend},
            train={"lambda": 1.0, "output_dir": str(tmp_path / backend)},
        )
        loop.train(build_config(raw))
        lines = (tmp_path / backend / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["loss"] for x in lines if "loss" in json.loads(x)]

    FakeLLM.instances.clear()
    hf, vllm = run("hf"), run("vllm")
    (engine,) = FakeLLM.instances
    assert len(hf) == 3 and vllm == pytest.approx(hf, rel=1e-4)
    assert [e for e in engine.events if e[0] == "generate"] == [("generate", 8)] * 3
    assert sum(e == ("apply_model",) for e in engine.events) == 3  # steps 0, 1, 2 (not after 3)
