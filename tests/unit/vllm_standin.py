"""A stand-in for exactly the part of vLLM's API that `distil.generation.vllm` uses (vllm cannot
be installed here), injected into sys.modules by `install`.

Its `LLM` builds a transformers model from the config directory it is given, initialised with
other weights than the student's (like `load_format="dummy"`), samples with `HFGenerator`
(whose log-probs follow the Rollout contract, as `logprobs_mode="processed_logprobs"` does),
may return request outputs and the samples inside them shuffled, overwrites its weights with
NaN on a level-2 sleep, refuses to generate or load weights while asleep, and records every
call. The log-prob of each position also holds a decoy token, listed first. Like the real
engine's start-up (`set_random_seed`), building it reseeds Python's, numpy's and torch's
global RNGs with its `seed`.
"""

from __future__ import annotations

import importlib.machinery
import random
import sys
import types
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from distil.config import build_config
from distil.generation import vllm as vgen
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator

V = 64
PROMPTS = [[3, 9, 12, 40], [7], [22, 23, 24, 25, 26, 27], [3, 9, 12, 40]]  # a repeated prompt


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    detokenize: bool = True
    seed: int | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self):
        if self.temperature < 1e-5 and self.n > 1:  # as vLLM's _verify_greedy_sampling
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")


class EngineModel(torch.nn.Module):
    """The engine's model: its own parameter names, a loader that returns what it loaded."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf
        self.pushed: list[tuple[str, tuple[int, ...]]] = []

    def load_weights(self, weights):
        params = dict(self.hf.named_parameters())
        loaded = set()
        for name, tensor in weights:
            params[name].data.copy_(tensor)  # unknown names raise, as vLLM's loaders do
            self.pushed.append((name, tuple(tensor.shape)))
            loaded.add(f"hf.{name}")
        return loaded


class FakeLLM:
    shuffle = True
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.kwargs = kwargs
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(12345)  # "dummy" weights: not the student's
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).eval()
        self.model = EngineModel(hf)
        seed = kwargs.get("seed", 0)  # vLLM's worker start-up: set_random_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.events: list[tuple] = []
        self.asleep: set[str] = set()
        FakeLLM.instances.append(self)

    def sleep(self, level: int = 1):
        assert not self.asleep, "sleep() on a sleeping engine"
        self.events.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # weights discarded: whatever is read next is garbage
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))

    def wake_up(self, tags=None):
        tags = list(tags or ["weights", "kv_cache"])
        assert set(tags) <= self.asleep, f"wake_up({tags}) of memory that is awake"
        self.events.append(("wake_up", tuple(tags)))
        self.asleep -= set(tags)

    def apply_model(self, func):
        assert "weights" not in self.asleep, "weights loaded into a sleeping engine"
        self.events.append(("apply_model",))
        return [func(self.model)]

    def reset_prefix_cache(self):
        self.events.append(("reset_prefix_cache",))
        return True

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        # vLLM 0.33 would queue the requests with the scheduler paused until every tag is
        # awake, i.e. hang (0.11: sample from freed memory); failing here is the useful form
        assert not self.asleep, "generate() on a sleeping engine"
        params = sampling_params
        if not isinstance(params, list):
            params = [params] * len(prompts)
        self.events.append(("generate", len(prompts)))
        outputs = [self._one(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
        if self.shuffle:
            random.Random(len(self.events)).shuffle(outputs)
        return outputs

    def _one(self, request_id, prompt, sp):
        ids = prompt["prompt_token_ids"]
        gen = _Biased(self.model.hf, sp.logit_bias, pad_id=0, stop_ids=sp.stop_token_ids)
        params = SamplingParams(sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.n)
        with torch.random.fork_rng(devices=[]):
            if sp.seed is not None:
                torch.manual_seed(sp.seed)
            rollout = gen.generate([ids], params)
        outs = []
        for j, (tokens, lps, mask) in enumerate(
            zip(rollout.completion_lists(), rollout.logprobs_B_C, rollout.completion_mask_B_C)
        ):
            # the sampled token plus a decoy entry: the converter must pick by token id
            positions = [
                {(t + 1) % V: Logprob(-99.0, rank=1), t: Logprob(float(lp))}
                for t, lp in zip(tokens, lps[mask].tolist())
            ]
            outs.append(CompletionOutput(j, tokens, positions))
        if self.shuffle:
            random.Random(request_id).shuffle(outs)
        return RequestOutput(request_id, list(ids), outs)


class _Biased(HFGenerator):
    """HFGenerator plus a request's logit_bias (added to the raw logits, before the warpers,
    as vLLM's LogitBiasLogitsProcessor does; -inf masks)."""

    def __init__(self, model, bias, **kw):
        super().__init__(model, **kw)
        self.bias = dict(bias or {})

    def _masks(self) -> list:
        if not self.bias:
            return super()._masks()
        ids = torch.tensor(list(self.bias))
        values = torch.tensor(list(self.bias.values()))

        def add_bias(input_ids, scores):
            out = scores.clone()
            out[:, ids] += values.to(out.dtype)
            return out

        return [*super()._masks(), add_bias]


def install(monkeypatch):
    """Inject the stand-in as `vllm`, installed and with a GPU as far as distil can tell."""
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM = FakeLLM
    module.SamplingParams = FakeSamplingParams
    module.TokensPrompt = lambda **kw: dict(kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vgen, "installed_version", lambda: "0.33.0")
    monkeypatch.setattr(vgen, "cuda_available", lambda: True)
    return module


def vllm_config(**vllm):
    return build_config({"generation": {"backend": "vllm", "vllm": vllm}})


def make(model, stop_ids=(5, 6), **vllm):
    return vgen.VLLMGenerator.from_config(
        vllm_config(**vllm), model, pad_id=0, stop_ids=list(stop_ids)
    )


def step(model, lr=0.5):
    """One SGD step of `model` on PROMPTS[0]."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    out = model(torch.tensor([PROMPTS[0]]), labels=torch.tensor([PROMPTS[0]]))
    out.loss.backward()
    opt.step()
    opt.zero_grad()


def engine_weights(gen):
    return dict(gen.llm.model.hf.named_parameters())
