"""Sampling from a mixture of teachers (`teachers.weights` with `train.seq_kd`): each token is
drawn from M(v) = sum_i w_i T_i(v | prefix), the mixture the teachers' targets are (teacher/
several.py's MixedTeacher), here of the teachers' own distributions (temperature 1).

`MixtureGenerator` runs its own decode loop: every teacher with a weight reads the same
left-padded tokens through its own KV cache (only the last position's logits computed), their
log-softmaxes are mixed in fp32, and the sampling warpers (temperature, top-k, top-p: the ones
`HFGenerator` applies), the log-prob record and the seeded Gumbel-max draw act on log M as they
act on one model's logits. No model's own generation_config (repetition penalties, suppressed
tokens) touches the mixture. Rows that stopped are fed the pad id, as transformers' generate
does. Every teacher shares one tokenizer; their output rows are cut to the smallest (rows past
a tokenizer's vocabulary are padding) and log M is -inf past it and past the tokenizer's
ids (`vocab_limit`: a padded vocabulary's rows are never drawn). A call decodes at most
`max_batch` rows at once (MAX_BATCH by default), each teacher's KV cache held for those rows
only: a window of 512 rows of 900 tokens would otherwise hold ~67 GB of cache per Qwen3-4B.
One teacher of weight 1 is an HFGenerator over it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch

from distil.generation.base import SamplingParams, mask_after_eos
from distil.generation.hf import HFGenerator, pad_columns, sampling_warpers
from distil.generation.seeded import part_params, seeded_processors
from distil.generation.static import _forward_arguments, cache_argument
from distil.models.inuse import module_lock
from distil.models.tokenizers import left_pad
from distil.types import Rollout

MAX_BATCH = 64  # rows decoded at once (each teacher's DynamicCache covers these rows)


def _positions(attn_B_L: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch (0 at each row's first real token), as generate
    makes them."""
    pos = attn_B_L.long().cumsum(-1) - 1
    return pos.masked_fill(attn_B_L == 0, 1)


class MixtureGenerator:
    """Generator over several teachers' mixture (`models`, `log_w`: their log weights)."""

    def __init__(self, models: Sequence, log_w: Sequence[float], *, pad_id: int,
                 stop_ids: Sequence[int], vocab_limit: int | None = None,
                 max_batch: int | None = MAX_BATCH):  # fmt: skip
        self.models, self.log_w = list(models), list(log_w)
        self.pad_id, self.stop_ids = pad_id, list(stop_ids)
        self.keep = min(m.get_output_embeddings().weight.shape[0] for m in self.models)
        if vocab_limit is not None:  # ids the shared tokenizer cannot decode: never drawn
            self.keep = min(self.keep, vocab_limit)
        self.max_batch = max_batch  # rows per decode (None: a call's rows at once)
        self.calls = 0

    def sync_weights(self, model) -> None:  # the teachers do not follow the student
        pass

    def scratch_caches(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the KV caches live for one call

    def _log_mixture(self, new_B_N, attn_B_L, pos_B_N, caches) -> torch.Tensor:
        """log M (B, keep) at the last position, after every teacher reads `new_B_N`."""
        from transformers import DynamicCache

        mixed = None
        for i, (model, log_w) in enumerate(zip(self.models, self.log_w, strict=True)):
            if caches[i] is None:  # filled in place by each forward
                caches[i] = DynamicCache(config=model.config)
            d = next(model.parameters()).device  # a teacher on its own device reads there
            kw = {cache_argument(model): caches[i], "use_cache": True}
            if "logits_to_keep" in _forward_arguments(model):
                kw["logits_to_keep"] = 1  # no (B, prompt, V) logits at the prefill
            logits = model(input_ids=new_B_N.to(d), attention_mask=attn_B_L.to(d),
                           position_ids=pos_B_N.to(d), **kw).logits  # fmt: skip
            lp = torch.log_softmax(logits[:, -1, : self.keep].float(), dim=-1) + log_w
            lp = lp.to(new_B_N.device)
            mixed = lp if mixed is None else torch.logaddexp(mixed, lp)
        return mixed

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollout:
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        step = self.max_batch or len(rows)
        modes = [m.training for m in self.models]
        with contextlib.ExitStack() as held:  # not while a step swaps a head (models/inuse.py)
            for m in self.models:
                held.enter_context(module_lock(m))
                m.eval()
            try:
                parts = [
                    self._decode_rows(rows[s : s + step], part_params(params, s))
                    for s in range(0, len(rows), step)
                ]
            finally:
                for m, was in zip(self.models, modes, strict=True):
                    m.train(was)
        self.calls += 1
        width = max(p[0].shape[1] for p in parts)
        out = torch.cat([pad_columns(p[0], width, self.pad_id) for p in parts])
        lps = torch.cat([pad_columns(p[1], width, 0.0) for p in parts])
        mask = mask_after_eos(out, self.stop_ids)
        stopped = (torch.isin(out, torch.tensor(self.stop_ids)) & mask).any(dim=1)
        return Rollout(
            index, out.masked_fill(~mask, self.pad_id), mask, lps.masked_fill(~mask, 0.0), stopped
        )

    def _decode_rows(self, rows: list[list[int]], params: SamplingParams):
        """(ids (B, C), log-probs (B, C)) on the CPU for one part of a call."""
        device = next(self.models[0].parameters()).device
        ids, attn = (t.to(device) for t in left_pad(rows, self.pad_id))
        tokens, chosen = self._decode(ids, attn, params, device)
        B = len(rows)
        out = torch.stack(tokens, 1).cpu() if tokens else torch.empty((B, 0), dtype=torch.long)
        lps = torch.stack(chosen, 1).cpu() if chosen else torch.zeros(out.shape)
        return out, lps

    def _decode(self, ids, attn, params: SamplingParams, device):
        warpers = sampling_warpers(params)
        seeded = seeded_processors(params, device)
        stops = torch.tensor(self.stop_ids, device=device)
        caches: list = [None] * len(self.models)
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
        seq, new, tokens, chosen = ids, ids, [], []
        V = self.models[0].get_output_embeddings().weight.shape[0]
        for _ in range(params.max_new_tokens):
            pos = _positions(attn)[:, -new.shape[1] :]
            scores = torch.full((ids.shape[0], V), -math.inf, device=device)
            scores[:, : self.keep] = self._log_mixture(new, attn, pos, caches)
            for w in warpers:
                scores = w(seq, scores)
            lp = torch.log_softmax(scores, dim=-1)
            if params.greedy:
                token = scores.argmax(-1)
            elif seeded:
                token = seeded[0](seq, scores).argmax(-1)
            else:
                token = torch.multinomial(lp.exp(), 1)[:, 0]
            chosen.append(lp.gather(1, token[:, None])[:, 0])
            token = token.masked_fill(done, self.pad_id)
            tokens.append(token)
            done |= torch.isin(token, stops)
            if done.all():
                break
            new = token[:, None]
            seq = torch.cat([seq, new], dim=1)
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)
        return tokens, chosen


def mixture_generator(models: Sequence, weights: Sequence[float], *, pad_id: int,
                      stop_ids: Sequence[int], vocab_limit: int | None = None,
                      max_batch: int | None = MAX_BATCH):  # fmt: skip
    """The generator of the teachers' mixture (weights normalised; a teacher of weight 0 is
    not run): a MixtureGenerator, or an HFGenerator over the one teacher with a weight."""
    if len(models) != len(weights) or min(weights, default=0) < 0 or not sum(weights) > 0:
        raise ValueError("one weight >= 0 per teacher, with a positive sum")
    total = float(sum(weights))
    used = [(m, math.log(w / total)) for m, w in zip(models, weights, strict=True) if w > 0]
    if len(used) == 1:
        return HFGenerator(used[0][0], pad_id=pad_id, stop_ids=stop_ids, vocab_limit=vocab_limit)
    return MixtureGenerator([m for m, _ in used], [lw for _, lw in used], pad_id=pad_id,
                            stop_ids=stop_ids, vocab_limit=vocab_limit,
                            max_batch=max_batch)  # fmt: skip
