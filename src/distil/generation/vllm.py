"""vLLM backend (`generation.backend: vllm`): a vLLM engine colocated in the training process.

The engine is built from the student's config alone (`load_format="dummy"`, no tokenizer) and
receives the student's weights from memory before it samples: `sync_weights` (after each
optimizer step) and `generate` push them when they changed since the last push (a fingerprint
of the parameters' version counters), merged under LoRA and gathered under FSDP
(`generation/weights.py`), and check that every engine parameter was written. Between
generations the engine sleeps (`generation.vllm.sleep_level`) so that training gets the GPU
memory back. The engine runs in-process (`distributed_executor_backend="external_launcher"`,
as TRL's colocate mode does), one engine per rank, tensor parallel size 1.

Ids past the tokenizer (`vocab_limit`: Qwen3 pads 151,669 tokens to 151,936 rows) are never
sampled: each request carries a logit bias of -inf on them (vLLM checks bias ids against the
model's rows; only its OpenAI server clamps bias values; `allowed_token_ids` sends 151k ids).

Log-probs: the engine is built with `logprobs_mode="processed_logprobs"`, so the log-prob
returned for each sampled token is taken after temperature, top-k and top-p, i.e. under the
distribution the token was drawn from: the `Rollout` contract of `HFGenerator` (greedy: the
plain log-softmax, as there). Both compute it in float32 from the same model, so the values
agree to kernel round-off, not bit for bit (different attention kernels and batching).

Written against vLLM's public API as of 0.11.0 and 0.33.0 (`LLM`, `SamplingParams`,
`TokensPrompt`, `LLM.sleep/wake_up/apply_model/reset_prefix_cache`, `RequestOutput`); the
`vllm` extra pins that range. vllm is imported only here, and only when this backend is used.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import importlib.util
import os
import random
import re
import tempfile
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from distil.errors import ConfigError
from distil.generation.base import SamplingParams, mask_after_eos, past_vocab_bias
from distil.generation.weights import is_peft_model, named_weights, weights_fingerprint
from distil.ranks import launch_rank
from distil.types import Rollout

SUPPORTED = "vllm>=0.11,<0.34"  # the versions whose API this module was read against
MIN_VERSION = (0, 11)
_TAGS = ("weights", "kv_cache")


def backend_problems(cfg, model_config=None) -> list[str]:
    """What stops `generation.backend=vllm` on this machine (vllm missing or too old, no
    CUDA, an allocator setting the installed vllm's sleep mode refuses) or for this student
    (not a dense model: MoE or quantized), each with the fix; checked before any model is
    loaded (the student's config.json where student.path is a local directory) and again with
    the loaded model's config."""
    if cfg.generation.backend != "vllm":
        return []
    problems = []
    seen = "generation.backend = 'vllm'"
    found = installed_version()
    if found is None:
        problems.append(
            f"{seen} needs the optional package 'vllm', which is not installed. Install it "
            f"with: pip install 'distil[vllm]' ({SUPPORTED}), or set generation.backend=hf"
        )
    elif found != "unknown" and _release(found) < MIN_VERSION:
        problems.append(
            f"{seen} needs {SUPPORTED}; vllm {found} is installed. Fix: pip install "
            "'distil[vllm]', or set generation.backend=hf"
        )
    if not cuda_available():
        problems.append(
            f"{seen} needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is "
            "False). Fix: set generation.backend=hf (or hf_static) on this machine"
        )
    if (problem := _allocator_problem(cfg, found)) is not None:
        problems.append(problem)
    config = model_config if model_config is not None else _local_config(cfg.student.path)
    if config is not None and (why := not_dense(config)):
        problems.append(
            f"{seen}: the student is {why}. distil pushes the student's weights into the "
            "engine with the model's raw load_weights, which is complete only for dense, "
            "unquantized models (MoE and quantized layers repack their weights after loading, "
            "and would sample from checkpoint-layout data). Fix: generation.backend=hf_static "
            "(or hf) for this student"
        )
    return problems


def not_dense(config) -> str | None:
    """Why a model config (a transformers config or its dict) is not a dense unquantized
    model, or None."""
    get = config.get if isinstance(config, dict) else partial(getattr, config)
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        if get(key, None):
            return f"a mixture-of-experts model ({key} = {get(key, None)})"
    if quant := get("quantization_config", None):
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        method = method or getattr(quant, "quant_method", None) or "quantization_config set"
        return f"a quantized model ({method})"
    return None


def _local_config(path) -> dict | None:
    """The config.json of a local model directory (a hub id or a missing file: None)."""
    import json
    from pathlib import Path

    file = Path(path) / "config.json" if path else None
    if file is None or not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):  # unreadable: the model loader reports it
        return None


def _allocator_problem(cfg, found: str | None) -> str | None:
    """vllm < 0.12 asserts at engine start when sleep mode meets expandable segments (0.12+
    turns them off around its own pool)."""
    if cfg.generation.vllm.sleep_level == 0 or found in (None, "unknown"):
        return None
    if _release(found) >= (0, 12):
        return None
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if re.search(r"expandable_segments\s*:\s*true", os.environ.get(name, ""), re.I):
            return (
                f"{name} sets expandable_segments:True, which vllm {found}'s sleep mode "
                f"refuses (generation.vllm.sleep_level = {cfg.generation.vllm.sleep_level}). "
                f"Fix: unset it (or set expandable_segments:False), upgrade to vllm>=0.12, or "
                "set generation.vllm.sleep_level=0"
            )
    return None


def cuda_available() -> bool:
    return torch.cuda.is_available()


def installed_version() -> str | None:
    """vllm's version without importing it (None: not installed)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:  # importable but not installed as a distribution
        return "unknown"


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class VLLMGenerator:
    """Generator over a colocated `vllm.LLM` that serves the student's current weights."""

    def __init__(
        self,
        llm,
        model: torch.nn.Module,
        *,
        pad_id: int,
        stop_ids: Sequence[int],
        sleep_level: int = 2,
        seed: int | None = None,
        workdir=None,
        vocab_limit: int | None = None,
    ):
        self.llm = llm
        self.model = model
        # -inf on the ids past the tokenizer, shared by every request (None: nothing to mask)
        self.logit_bias = past_vocab_bias(model, vocab_limit)
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.sleep_level = sleep_level
        self.seed = seed  # None: the engine's own seeded RNG; else per-request seeds
        self.workdir = workdir  # keeps the engine's config directory alive
        self.calls = 0  # generate calls made
        self.weights_version = 0  # weight pushes made
        # what the engine holds: shared by copies of this generator (generation.async samples
        # with a copy over the weight snapshot), since they drive the one engine
        self._engine = _EngineState()
        self._sleep()

    @classmethod
    def from_config(
        cls, cfg, model, *, pad_id: int, stop_ids: list[int], vocab_limit: int | None = None
    ) -> VLLMGenerator:
        """The engine for `model` (the unwrapped student) with `generation.vllm`'s settings."""
        base = model.get_base_model() if is_peft_model(model) else model
        if problems := backend_problems(cfg, base.config):
            raise ConfigError(problems)
        vllm = importlib.import_module("vllm")
        v = cfg.generation.vllm
        rank = launch_rank()
        workdir = tempfile.TemporaryDirectory(prefix="distil-vllm-")
        _write_engine_config(model, workdir.name)
        _set_launcher_env()
        # vLLM's start-up profiling compares free memory before and after; blocks the caching
        # allocator releases meanwhile make it fail ("Error in memory profiling")
        gc.collect()
        if cuda_available():
            torch.cuda.empty_cache()
        with kept_rng_states():  # the engine reseeds the global RNGs at start-up
            llm = vllm.LLM(
                model=workdir.name,
                skip_tokenizer_init=True,  # prompts arrive as ids; completions leave as ids
                load_format="dummy",  # the student's weights are pushed from memory
                dtype=engine_dtype(v.dtype, model),
                gpu_memory_utilization=v.gpu_memory_utilization,
                max_model_len=engine_max_len(cfg),
                max_num_batched_tokens=v.max_num_batched_tokens,
                enforce_eager=v.enforce_eager,
                enable_sleep_mode=v.sleep_level > 0,
                seed=cfg.train.seed + rank,
                logprobs_mode="processed_logprobs",  # the sampled token's log-prob after warping
                generation_config="vllm",  # no sampling defaults from the checkpoint
                distributed_executor_backend="external_launcher",  # in-process engine
                tensor_parallel_size=1,
                **({"max_num_seqs": v.max_num_seqs} if v.max_num_seqs else {}),  # else vLLM's
            )
        seed = cfg.train.seed * 1_000_003 + rank if v.seeded else None
        return cls(
            llm,
            model,
            pad_id=pad_id,
            stop_ids=stop_ids,
            sleep_level=v.sleep_level,
            seed=seed,
            workdir=workdir,
            vocab_limit=vocab_limit,
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push `model`'s weights now if they changed since the last push (call it after each
        optimizer step, from the training thread)."""
        self.model = model
        self._push_if_stale()

    def scratch_caches(self) -> contextlib.AbstractContextManager[None]:
        """Calls inside keep nothing afterwards: the engine sleeps after every generate."""
        return contextlib.nullcontext()

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollout:
        """`params.n` completions per prompt, rows of one prompt adjacent, right-padded."""
        vllm = importlib.import_module("vllm")
        self._push_if_stale()
        prompts = [list(p) for p in prompt_ids]
        # vLLM refuses n > 1 with greedy decoding: ask for n copies of the request instead
        per_request = 1 if params.greedy else params.n
        request_index = [i for i in range(len(prompts)) for _ in range(params.n // per_request)]
        requests = [vllm.TokensPrompt(prompt_token_ids=prompts[i]) for i in request_index]
        sampling = self._sampling_params(vllm, params, per_request, len(requests))
        self._wake()
        try:
            outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        finally:
            self._sleep()
        self.calls += 1
        samples = regroup(outputs, prompts, request_index, params.n)
        return to_rollout(samples, pad_id=self.pad_id, stop_ids=self.stop_ids)

    def _sampling_params(self, vllm, params: SamplingParams, n: int, count: int):
        common = {
            "n": n,
            "temperature": params.temperature,  # 0: greedy (vLLM resets top-p/top-k then)
            "top_p": params.top_p,
            "top_k": params.top_k,  # 0: off, in vLLM >= 0.11 as in distil
            "max_tokens": params.max_new_tokens,
            "stop_token_ids": self.stop_ids,
            "logprobs": 0,  # the sampled token's log-prob only
            "detokenize": False,
            **({"logit_bias": self.logit_bias} if self.logit_bias else {}),
        }
        # a call's own seed (when the caller gives one) or generation.vllm.seeded's: one seed
        # per request, so the samples do not depend on the engine's batching
        seed = getattr(params, "seed", None)
        seed = f"{self.seed}:{self.calls}" if seed is None and self.seed is not None else seed
        if seed is None:
            return vllm.SamplingParams(**common)
        rng = random.Random(str(seed))
        return [vllm.SamplingParams(**common, seed=rng.getrandbits(48)) for _ in range(count)]

    def _push_if_stale(self) -> None:
        fingerprint = weights_fingerprint(self.model)
        if fingerprint == self._engine.fingerprint:
            return
        self._wake(["weights"])
        missing = self.llm.apply_model(partial(_load_weights, weights=named_weights(self.model)))
        if any(missing):
            raise RuntimeError(
                "the vLLM engine has parameters that the student's weights did not write: "
                f"{sorted(set().union(*missing))[:10]}; its checkpoint names do not match the "
                "engine's model (an unsupported architecture or wrapper)"
            )
        self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self._engine.fingerprint = fingerprint
        self.weights_version += 1

    def _wake(self, tags: Sequence[str] = _TAGS) -> None:
        todo = [t for t in tags if t in self._engine.asleep]
        if todo:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # hand the training's cached blocks to the engine
            self.llm.wake_up(tags=todo)
            self._engine.asleep -= set(todo)

    def _sleep(self) -> None:
        if self.sleep_level == 0 or self._engine.asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._engine.asleep = set(_TAGS)
        if self.sleep_level == 2:  # level 2 discards the weights: push them again
            self._engine.fingerprint = None


@dataclass
class _EngineState:
    asleep: set[str] = field(default_factory=set)  # memory tags the engine has put to sleep
    fingerprint: tuple | None = None  # the weights the engine holds (None: none / discarded)


def _load_weights(model, weights) -> set[str]:
    """Runs inside the engine's worker: load (name, tensor) pairs with the model's own loader
    (which maps checkpoint names onto fused layers) and return the parameters it left unset."""
    loaded = model.load_weights(weights)
    if not isinstance(loaded, set):  # a loader that does not report: trust it
        return set()
    return {name for name, _ in model.named_parameters()} - loaded


def regroup(outputs, prompts: list[list[int]], request_index: list[int], n: int) -> list[list]:
    """The engine's outputs as `n` samples per prompt, in prompt order. Each request output is
    matched to a request by its prompt ids (identical prompts are interchangeable), never by
    position, and samples of one request are ordered by their index."""
    slots: dict[tuple[int, ...], deque[int]] = defaultdict(deque)
    for i in request_index:
        slots[tuple(prompts[i])].append(i)
    samples: list[list] = [[] for _ in prompts]
    for out in outputs:
        queue = slots.get(tuple(out.prompt_token_ids))
        if not queue:
            raise RuntimeError("vLLM returned an output for a prompt that was not requested")
        samples[queue.popleft()].extend(sorted(out.outputs, key=lambda c: c.index))
    counts = {len(s) for s in samples}
    if counts != {n}:
        raise RuntimeError(f"vLLM returned {sorted(counts)} samples per prompt, expected {n}")
    return samples


def to_rollout(samples: list[list], *, pad_id: int, stop_ids: Sequence[int]) -> Rollout:
    """Completion outputs (token_ids, logprobs: one {token: Logprob} per position), grouped
    per prompt, as a right-padded Rollout with HFGenerator's masking."""
    rows = [c for per_prompt in samples for c in per_prompt]
    width = max([1, *(len(c.token_ids) for c in rows)])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    logprobs = torch.zeros((len(rows), width), dtype=torch.float32)
    lengths = torch.tensor([len(c.token_ids) for c in rows])
    for r, c in enumerate(rows):
        tokens = list(c.token_ids)
        ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logprobs[r, : len(tokens)] = torch.tensor(_chosen_logprobs(c, tokens))
    inside = torch.arange(width)[None, :] < lengths[:, None]
    mask = mask_after_eos(ids, stop_ids) & inside
    stopped = (torch.isin(ids, torch.tensor(list(stop_ids))) & mask).any(dim=1)
    index = [i for i, per_prompt in enumerate(samples) for _ in per_prompt]
    ids = ids.masked_fill(~mask, pad_id)
    return Rollout(index, ids, mask, logprobs.masked_fill(~mask, 0.0), stopped)


def _chosen_logprobs(completion, tokens: list[int]) -> list[float]:
    if completion.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs although logprobs=0 was requested")
    return [float(position[t].logprob) for position, t in zip(completion.logprobs, tokens)]


def _write_engine_config(model: torch.nn.Module, path: str) -> None:
    """The student's model config as a checkpoint directory without weights."""
    base = model.get_base_model() if is_peft_model(model) else model
    config = copy.deepcopy(base.config)
    if not getattr(config, "architectures", None):  # models built from a config have none
        config.architectures = [type(base).__name__.removeprefix("FSDP")]
    config.save_pretrained(path)


def engine_dtype(setting: str, model: torch.nn.Module) -> str:
    """generation.vllm.dtype for the engine: auto is bfloat16 (float16 for a float16 student),
    whatever the student trains in: vLLM's FlashAttention backends do not run float32 (it
    falls back to slower ones, with twice the weight and KV memory). float32 only when set."""
    if setting != "auto":
        return setting
    return "float16" if next(model.parameters()).dtype == torch.float16 else "bfloat16"


def engine_max_len(cfg) -> int:
    """generation.vllm.max_model_len, or the longest sequence the run asks of the engine: the
    longest prompt plus the larger of the training's and the in-training eval's new tokens
    (the eval samples with the same engine)."""
    if cfg.generation.vllm.max_model_len:
        return cfg.generation.vllm.max_model_len
    new = cfg.generation.max_new_tokens
    if cfg.train.eval_every:
        new = max(new, cfg.eval.max_new_tokens)
    return cfg.data.max_prompt_tokens + new


@contextlib.contextmanager
def kept_rng_states() -> Iterator[None]:
    """Restore Python's, numpy's and torch's (CPU and CUDA) global RNG states afterwards:
    vLLM's engine start-up calls set_random_seed, which would restart the trainer's streams."""
    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _set_launcher_env() -> None:
    """external_launcher reads the torchrun variables; a single process gets rank 0 of 1."""
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # the engine core in this process (vLLM sets it too for external_launcher; set it before
    # the engine reads it): weights pass to the worker as references, not serialized
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
