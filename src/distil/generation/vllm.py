"""vLLM backend (`generation.backend: vllm`): a vLLM engine colocated in the training process.

The engine is built from the student's config alone (`load_format="dummy"`, no tokenizer) and
receives the student's weights from memory before it samples: `sync_weights` (after each
optimizer step) and `generate` push them when they changed since the last push (a fingerprint
of the parameters' version counters), merged under LoRA and gathered under FSDP
(`generation/weights.py`), and check that every engine parameter was written. Between
generations the engine sleeps (`generation.vllm.sleep_level`) so that training gets the GPU
memory back. The engine runs in-process (`distributed_executor_backend="external_launcher"`,
as TRL's colocate mode does), one engine per rank, tensor parallel size 1.

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
import importlib
import importlib.util
import os
import random
import tempfile
from collections import defaultdict, deque
from collections.abc import Sequence
from functools import partial

import torch

from distil.errors import ConfigError
from distil.generation.base import SamplingParams, mask_after_eos
from distil.generation.weights import is_peft_model, named_weights, weights_fingerprint
from distil.types import Rollout

SUPPORTED = "vllm>=0.11,<0.34"  # the versions whose API this module was read against
MIN_VERSION = (0, 11)
_TAGS = ("weights", "kv_cache")


def backend_problems(cfg) -> list[str]:
    """What stops `generation.backend=vllm` on this machine (vllm missing or too old, no
    CUDA), each with the fix; checked before any model is loaded."""
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
    return problems


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
        sleep_level: int = 1,
        seed: int | None = None,
        workdir=None,
    ):
        self.llm = llm
        self.model = model
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.sleep_level = sleep_level
        self.seed = seed  # None: the engine's own seeded RNG; else per-request seeds
        self.workdir = workdir  # keeps the engine's config directory alive
        self.calls = 0  # generate calls made
        self.weights_version = 0  # weight pushes made
        self._engine_fingerprint = None  # the student's state the engine holds (None: none)
        self._asleep: set[str] = set()
        self._sleep()

    @classmethod
    def from_config(cls, cfg, model, *, pad_id: int, stop_ids: list[int]) -> VLLMGenerator:
        """The engine for `model` (the unwrapped student) with `generation.vllm`'s settings."""
        if problems := backend_problems(cfg):
            raise ConfigError(problems)
        vllm = importlib.import_module("vllm")
        v = cfg.generation.vllm
        rank = int(os.environ.get("RANK", "0"))
        workdir = tempfile.TemporaryDirectory(prefix="distil-vllm-")
        _write_engine_config(model, workdir.name)
        _set_launcher_env()
        llm = vllm.LLM(
            model=workdir.name,
            skip_tokenizer_init=True,  # prompts arrive as ids; completions leave as ids
            load_format="dummy",  # the student's weights are pushed from memory
            dtype=v.dtype if v.dtype != "auto" else _param_dtype(model),
            gpu_memory_utilization=v.gpu_memory_utilization,
            max_model_len=v.max_model_len
            or cfg.data.max_prompt_tokens + cfg.generation.max_new_tokens,
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
        if fingerprint == self._engine_fingerprint:
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
        self._engine_fingerprint = fingerprint
        self.weights_version += 1

    def _wake(self, tags: Sequence[str] = _TAGS) -> None:
        todo = [t for t in tags if t in self._asleep]
        if todo:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # hand the training's cached blocks to the engine
            self.llm.wake_up(tags=todo)
            self._asleep -= set(todo)

    def _sleep(self) -> None:
        if self.sleep_level == 0 or self._asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = set(_TAGS)
        if self.sleep_level == 2:  # level 2 discards the weights: push them again
            self._engine_fingerprint = None


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


def _param_dtype(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


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
