"""`generation.backend=hf_static`: distil's own decode loop over a fixed-shape KV cache.

transformers' `generate` with a dynamic cache grows its tensors every step, so nothing can be
captured once and replayed. Here the prompts of a call are left-padded to one of a few widths
(`length_buckets`) and the rows to one of a few batch sizes (`batch_buckets`), the KV cache is a
transformers `StaticCache` of width prompt + max_new_tokens kept between calls, and the
one-token step (forward + warpers + sampling + log-prob of the chosen token) has the same
shapes at every step and every call of a bucket, so on CUDA it is compiled once and replayed
as a CUDA graph (`torch.compile(mode="reduce-overhead")`).

Same contract as `HFGenerator` (it reuses its batching and EOS masking): the warpers are
transformers' own, applied in generate's order, and the recorded log-prob is that of the
chosen token under the warped distribution. Greedy completions equal HFGenerator's. The step
reads the module's parameters at every call (they are graph inputs, not constants), so an
in-place optimizer step is seen by the next generation with nothing to sync.

`cache_position` is passed to the prefill and to every decode step (a device tensor of the
decode state) where the model's forward takes it (transformers 4.x): without it those models
derive it from the cache's contents, a data-dependent scalar that splits the compiled step in
several graphs with a host sync per token. transformers 5.17+ have no such argument (their
static cache counts its length in a device tensor), and it is not passed there.

On another thread than the first to use CUDA graphs (generation.async's sampler: `worker_copy`),
torch < 2.12 asserts inside cudagraph trees (pytorch#123177: their thread-local state exists
only in the thread that first imported them; fixed by pytorch PR #184357, in 2.12), so there
the compiled step runs without CUDA graphs (inductor's default mode): still one fused graph per
bucket, one kernel launch per op instead of a replay.

Memory: one cache per bucket shape the training calls use stays allocated for the run (at most
one per width bucket up to `data.max_prompt_tokens` per batch bucket; the plan counts them): a
CUDA graph is recorded against its cache's addresses (transformers marks them static), so a
cache dropped and made again re-records the graph, and older inductors stop using CUDA graphs
for a function after enough re-records. The calls made inside `scratch_caches()` (an
evaluation) use the training caches where shapes match and keep none of their own afterwards:
each evaluation records its own shapes' graphs once, and training's stay as they were.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from distil.generation.base import SamplingParams, mask_after_eos, mask_past_vocab
from distil.generation.hf import HFGenerator, sampling_warpers
from distil.models.tokenizers import left_pad

DEFAULT_BATCH_BUCKETS = (8, 16, 32, 64, 128, 256)
DEFAULT_LENGTH_BUCKETS = (64, 128, 256, 512, 1024)
CHECK_EVERY_CUDA = 8  # decode steps between "has every row stopped?" host syncs on CUDA


def bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= size; past the largest, the next multiple of the largest."""
    ordered = sorted(buckets)
    i = bisect.bisect_left(ordered, size)
    if i < len(ordered):
        return ordered[i]
    return -(-size // ordered[-1]) * ordered[-1]


class StaticCacheGenerator(HFGenerator):
    """Generator with a fixed-shape KV cache and an optionally compiled decode step."""

    def __init__(
        self,
        model,
        *,
        pad_id: int,
        stop_ids: Sequence[int],
        compile: bool = False,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
        compile_backend: str = "inductor",
        compile_mode: str | None = None,
        vocab_limit: int | None = None,
    ):
        # calls larger than the largest batch bucket are split by HFGenerator.generate
        super().__init__(
            model,
            pad_id=pad_id,
            stop_ids=stop_ids,
            max_batch=max(batch_buckets),
            vocab_limit=vocab_limit,
        )
        self.batch_buckets = sorted(batch_buckets)
        self.length_buckets = sorted(length_buckets)
        self.compile = compile
        self.compile_backend = compile_backend
        self.compile_mode = compile_mode
        self._caches: dict[tuple, Any] = {}  # one per (batch, length) shape, kept for the run
        self._scratch: dict[tuple, Any] | None = None  # inside scratch_caches(): dropped after
        self._step_fn = None
        self._cache_position = takes_cache_position(model)
        self._cache_arg = cache_argument(model)

    @classmethod
    def from_config(
        cls, cfg, model, *, pad_id: int, stop_ids: Sequence[int], vocab_limit: int | None = None
    ) -> StaticCacheGenerator:
        """The `generation.backend=hf_static` generator; `generation.compile=auto` compiles
        on CUDA only (on CPU the first call of each shape waits minutes for the C++ build)."""
        g = cfg.generation
        device = next(model.parameters()).device
        compile_ = device.type == "cuda" if g.compile == "auto" else bool(g.compile)
        return cls(
            model,
            pad_id=pad_id,
            stop_ids=stop_ids,
            compile=compile_,
            batch_buckets=g.static_batch_buckets,
            length_buckets=g.static_length_buckets,
            vocab_limit=vocab_limit,
        )

    def worker_copy(self) -> StaticCacheGenerator:
        """A copy to sample on a worker thread: on torch < 2.12 its compiled step runs without
        CUDA graphs (see the module docstring), else as this one's."""
        out = copy.copy(self)
        out._caches, out._scratch = {}, None  # its own caches: it runs beside this one
        if self.compile and self.compile_mode is None and not cudagraphs_on_any_thread():
            out.compile_mode = "default"  # inductor without CUDA graphs
            out._step_fn = None
        return out

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:  # another module: its caches and compiled step are not ours
            self._caches = {}
            self._step_fn = None
            self._cache_position = takes_cache_position(model)
        self._cache_arg = cache_argument(model)
        self.model = model

    @contextlib.contextmanager
    def scratch_caches(self) -> Iterator[None]:
        """The calls inside (an evaluation) keep no KV cache afterwards: the caches they
        allocate are dropped at the end, while the training's stay allocated and are reused
        where shapes match, so training's compiled steps keep their cache addresses (no CUDA
        graph re-recorded after an evaluation)."""
        self._scratch = {}
        try:
            yield
        finally:
            self._scratch = None

    # ------------------------------------------------------------------ one call

    @torch.no_grad()
    def _generate_rows(self, rows: list[list[int]], params: SamplingParams):
        device = next(self.model.parameters()).device
        n_rows, new = len(rows), params.max_new_tokens
        batch = bucket(n_rows, self.batch_buckets)
        width = bucket(max(len(r) for r in rows), self.length_buckets)
        # filler rows repeat a real prompt (an all-padding row has nothing to attend to)
        ids, attn = left_pad([*rows, *[rows[0]] * (batch - n_rows)], self.pad_id)
        ids = torch.nn.functional.pad(ids, (width - ids.shape[1], 0), value=self.pad_id)
        attn = torch.nn.functional.pad(attn, (width - attn.shape[1], 0), value=0)
        ids, attn = ids.to(device), attn.to(device)
        # cache slots: prompt (padding masked), then one per new token (the causal mask hides
        # the slots not written yet), so one mask serves the prefill and every decode step
        mask_B_L = torch.cat([attn.bool(), attn.new_ones(batch, new, dtype=torch.bool)], 1)
        # positions count real tokens only, as generate's (left padding does not shift RoPE)
        pos_B_P = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = self._cache(batch, width + new)
        warpers = sampling_warpers(params)
        # the cache slot each step writes (models that take it): a device tensor, no host sync
        slot_P = torch.arange(width, device=device) if self._cache_position else None
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(
                input_ids=ids,
                attention_mask=mask_B_L,
                position_ids=pos_B_P,
                **{self._cache_arg: cache},
                use_cache=True,
                logits_to_keep=1,
                **({} if slot_P is None else {"cache_position": slot_P}),
            ).logits[:, -1]
            # a call's own seed (generation.async): the draws' noise from a private generator
            rng = None
            if params.seed is not None and not params.greedy:
                rng = torch.Generator(device=device).manual_seed(params.seed)
            noise = _noise(rng, logits)
            token, logprob = _choose(logits, warpers, params.greedy, noise, self.vocab_limit)
            done = torch.arange(batch, device=device) >= n_rows  # filler rows count as stopped
            slot_1 = None if slot_P is None else slot_P[-1:] + 1
            state = (token, logprob, pos_B_P[:, -1:] + 1, slot_1, mask_B_L, cache, done)
            out_ids, out_lp = self._decode(state, params, warpers, rng)
        finally:
            self.model.train(was_training)
        self.calls += 1
        out_ids, out_lp = out_ids[:n_rows].cpu(), out_lp[:n_rows].cpu()
        # as generate: as many columns as the longest row needs (a CUDA run checks for the
        # end only every few steps)
        used = mask_after_eos(out_ids, self.stop_ids).any(0).nonzero()
        width_c = int(used[-1]) + 1 if len(used) else 0
        return out_ids[:, :width_c], out_lp[:, :width_c]

    def _decode(self, state, params: SamplingParams, warpers: list, rng):
        """Decode until max_new_tokens or every row stopped; (ids, log-probs) on the device."""
        token, logprob, pos_B_1, slot_1, mask_B_L, cache, done = state
        batch, new = token.shape[0], params.max_new_tokens
        out_ids = token.new_full((batch, new), self.pad_id)
        out_lp = logprob.new_zeros((batch, new))
        stops = torch.tensor(self.stop_ids, device=token.device)
        step = self._step(token.device)
        vocab = self.model.get_output_embeddings().weight.shape[0] if rng is not None else 0
        check_every = CHECK_EVERY_CUDA if token.device.type == "cuda" else 1
        steps = new
        graphs = self.compile and token.device.type == "cuda"
        for t in range(new):
            if t > 0:
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                noise = _noise(rng, out_lp, vocab) if rng is not None else None
                token, logprob = step(
                    token, pos_B_1, slot_1, mask_B_L, cache, warpers, params.greedy, noise
                )
                if graphs:  # the next replay overwrites its outputs, and `token` is its input
                    token, logprob = token.clone(), logprob.clone()
                pos_B_1 = pos_B_1 + 1
                slot_1 = None if slot_1 is None else slot_1 + 1
            out_ids[:, t] = token  # copies out of the graph's output buffer
            out_lp[:, t] = logprob
            done |= torch.isin(token, stops)
            if (t + 1) % check_every == 0 and bool(done.all()):
                steps = t + 1
                break
        return out_ids[:, :steps], out_lp[:, :steps]

    def _step(self, device: torch.device):
        """The one-token step: compiled (CUDA graphs on CUDA) when `compile`, else eager."""
        if not self.compile:
            return self._one_token
        if self._step_fn is None:
            _allow_bucket_recompiles()
            mode = self.compile_mode
            if mode is None and self.compile_backend == "inductor" and device.type == "cuda":
                mode = "reduce-overhead"
            self._step_fn = torch.compile(
                self._one_token, backend=self.compile_backend, mode=mode, dynamic=False
            )
        return self._step_fn

    def _one_token(
        self, token_B, pos_B_1, slot_1, mask_B_L, cache, warpers, greedy: bool, noise_B_V=None
    ):
        """Feed each row's last token (into cache slot `slot_1` where the model takes
        cache_position); (next token, its log-prob), both (B,)."""
        logits = self.model(
            input_ids=token_B[:, None],
            attention_mask=mask_B_L,
            position_ids=pos_B_1,
            **{self._cache_arg: cache},
            use_cache=True,
            **({} if slot_1 is None else {"cache_position": slot_1}),
        ).logits[:, -1]
        return _choose(logits, warpers, greedy, noise_B_V, self.vocab_limit)

    def _cache(self, batch: int, length: int):
        """The StaticCache for (batch, length), emptied: the kept one of that shape, else a new
        one, kept for the run (or, inside `scratch_caches`, until its end)."""
        from transformers import StaticCache

        key = (batch, length)
        cache = self._caches.get(key)
        if cache is None and self._scratch is not None:
            cache = self._scratch.get(key)
        if cache is not None:
            cache.reset()
            return cache
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        (self._caches if self._scratch is None else self._scratch)[key] = cache
        return cache

    def kept_cache_bytes(self) -> int:
        """Bytes of the KV caches kept allocated between calls."""
        caches = {id(c): c for c in [*self._caches.values(), *(self._scratch or {}).values()]}
        return sum(_cache_bytes(c) for c in caches.values())


def cudagraphs_on_any_thread(version: str | None = None) -> bool:
    """Whether this torch runs cudagraph trees on any thread (2.12+, pytorch PR #184357);
    a pre-release of 2.12 counts as older."""
    from torch.torch_version import TorchVersion

    return TorchVersion(version or torch.__version__) >= "2.12"


def takes_cache_position(model) -> bool:
    """Whether `model`'s forward (under a peft wrapper: the base model's) has a
    `cache_position` argument (transformers 4.x models; 5.17+ have none)."""
    return "cache_position" in _forward_arguments(model)


def cache_argument(model) -> str:
    """The name the forward takes the KV cache under: `cache` from transformers 5.24 on
    (`past_key_values` is deprecated there, and removed in 5.40), else `past_key_values`."""
    return "cache" if "cache" in _forward_arguments(model) else "past_key_values"


def _forward_arguments(model) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return set(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):  # no signature to read: the names of transformers 4/5.x
        return set()


def _cache_bytes(cache) -> int:
    tensors = [t for layer in getattr(cache, "layers", []) for t in _layer_tensors(layer)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _layer_tensors(layer) -> list[torch.Tensor]:
    return [
        t
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if isinstance(t, torch.Tensor)
    ]


def _noise(rng, like: torch.Tensor, vocab: int | None = None) -> torch.Tensor | None:
    """Exp(1) noise for one draw of every row from the call's own generator (None: none)."""
    if rng is None:
        return None
    shape = (like.shape[0], vocab or like.shape[-1])
    return torch.empty(shape, device=like.device).exponential_(generator=rng)


def _choose(
    logits_B_V: torch.Tensor, warpers: list, greedy: bool, noise_B_V=None, vocab_limit=None
):
    """(token_B, log-prob_B) from the last position's logits.

    Like generate: fp32 scores, -inf past `vocab_limit` (ids the tokenizer cannot decode, as
    HFGenerator's `PastVocabMasked`), warpers in order, argmax when greedy, else a draw from
    softmax(scores) (as argmax of p / Exp(1) noise: the same distribution as multinomial, and
    no host sync or data-dependent shapes inside a CUDA graph); the noise is `noise_B_V` when
    given (drawn from a call's seed outside the compiled step), else drawn here. The log-prob
    is read from the warped distribution the token is drawn from (log-softmax of the raw
    logits when greedy).
    """
    scores = mask_past_vocab(logits_B_V.float(), vocab_limit)
    for w in warpers:
        scores = w(None, scores)
    logp_B_V = torch.log_softmax(scores, dim=-1)
    if greedy:
        token = scores.argmax(dim=-1)
    else:
        noise = noise_B_V if noise_B_V is not None else torch.empty_like(logp_B_V).exponential_()
        token = (logp_B_V.exp() / noise).argmax(dim=-1)
    return token, logp_B_V.gather(1, token[:, None]).squeeze(1)


def _allow_bucket_recompiles() -> None:
    """One compiled graph per (batch bucket, cache width): raise dynamo's recompile limit above
    the bucket count so that a run with many shapes does not fall back to eager."""
    import torch._dynamo

    limit = len(DEFAULT_BATCH_BUCKETS) * len(DEFAULT_LENGTH_BUCKETS) + 8
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), limit))
