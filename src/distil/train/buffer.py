"""The generation buffer: one generation call per optimizer window, split into micro-batches.

A window holds `generation_batch_size` unique prompts per rank, each repeated
`num_generations` times, so `generation_batch_size * num_generations == per_device_batch_size *
grad_accum_steps` rows (validated in config). The rows are cut into `grad_accum_steps` slices of
`per_device_batch_size`; each slice is drawn on-policy (the student samples) with probability
`lambda`, else off-policy: the dataset's completion, or with `seq_kd` a completion the teacher
writes. The draw is a pure function of (seed, window index): identical on every rank without a
broadcast, and the same after a resume. All on-policy slices of a window are sampled by ONE
generate call (likewise the teacher's seq-KD slices). With `teacher_windows` = K > 1 the
teacher writes the seq-KD slices of K windows (a block: windows bK .. bK + K - 1) in one call,
sampled from a seed of (seed, rank, block): it does not train, so what it writes ahead is what it
would write later, and a run resumed inside a block writes that block again, identically.
Every completion id must be below `vocab_limit` (the student tokenizer's largest id + 1): an id
past it (a model vocabulary padded past its tokenizer; the generators never sample one) is a
DataError naming the row, not an index error deep in a loss.
With `reward` (train/reward.py) the window's on-policy samples are scored right after they
are sampled (on the sampler's thread with generation.async) and carry their reward and
group-relative advantage.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from distil.data.collate import collate
from distil.errors import ConfigError, DataError
from distil.generation.base import Generator, SamplingParams
from distil.generation.seeded import sampling_seed
from distil.types import Batch, Example, Sample

ON, OFF, SEQ_KD = "on_policy", "off_policy", "seq_kd"


@dataclass
class BufferState:
    """Where the buffer is in the data; saved with every checkpoint."""

    epoch: int = 0
    position: int = 0  # prompts of this epoch's order already used (all ranks together)
    windows: int = 0  # windows produced so far (= optimizer steps)
    # teacher_windows > 1: the first window of the current block and where it started
    block_window: int | None = None
    block_epoch: int = 0
    block_position: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Window:
    micro_batches: list[Batch]
    policies: list[str]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_loss_tokens(self) -> int:
        return sum(b.num_loss_tokens for b in self.micro_batches)

    @property
    def num_completion_tokens(self) -> int:
        """The reward term's count: completion tokens, aligned or not (`Batch`)."""
        return sum(b.num_completion_tokens for b in self.micro_batches)


@dataclass
class PromptSide:
    """How one model sees the prompts: token ids per example and its generator.

    `to_student` turns that model's completion ids into (student ids, text); None when the
    model shares the student's tokenizer.
    """

    prompt_ids: list[list[int]]
    generator: Generator | None = None
    to_student: Callable[..., tuple[list[int], str | None]] | None = None


class GenerationBuffer:
    def __init__(
        self,
        examples: Sequence[Example],
        student: PromptSide,
        *,
        completion_ids: Sequence[list[int] | None],
        params: SamplingParams,
        per_device_batch_size: int,
        grad_accum_steps: int,
        lambda_: float,
        pad_id: int,
        seed: int = 0,
        seq_kd: bool = False,
        teacher: PromptSide | None = None,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        collate_fn: Callable[[list[Sample], int], Batch] = collate,
        num_workers: int = 0,
        seeded: bool = False,
        teacher_windows: int = 1,
        vocab_limit: int | None = None,
        reward: Callable[[list[Sample]], dict[str, float]] | None = None,
    ):
        self.examples = list(examples)
        self.student, self.teacher = student, teacher
        self.completion_ids = list(completion_ids)
        self.params = params
        self.batch, self.accum = per_device_batch_size, grad_accum_steps
        self.n = params.n
        self.per_rank = per_device_batch_size * grad_accum_steps // self.n
        self.lambda_, self.seq_kd, self.seed = lambda_, seq_kd, seed
        self.pad_id, self.rank, self.world = pad_id, rank, world_size
        self.shuffle = shuffle
        self.collate_fn = collate_fn
        self.pool = _worker_pool(collate_fn, num_workers) if num_workers > 0 else None
        # seeded: every generate call draws from its own seed, a function of (seed, rank,
        # window, policy), not from torch's global RNG (generation.async needs this)
        self.seeded = seeded
        self.ahead = teacher_windows
        self.vocab_limit = vocab_limit  # completion ids must be below it (None: unchecked)
        self.reward = reward  # scores the on-policy samples: rewards, advantages, metrics
        self._written: dict[int, tuple[list[int], list[Sample | None], dict[str, float]]] = {}
        self.state = BufferState()
        self._orders: dict[int, list[int]] = {}
        self._check()

    def _check(self) -> None:
        if self.per_rank * self.world > len(self.examples):
            raise ConfigError(
                f"a window needs {self.per_rank} prompts per rank x {self.world} ranks but the "
                f"dataset has {len(self.examples)}. Fix: use more data or a smaller "
                "train.per_device_batch_size / train.grad_accum_steps"
            )
        if self.lambda_ < 1.0 and not self.seq_kd:
            missing = sum(c is None for c in self.completion_ids)
            if missing:
                raise ConfigError(
                    f"train.lambda = {self.lambda_} asks for off-policy slices but {missing} of "
                    f"{len(self.examples)} examples have no completion. Fix: set train.lambda=1 "
                    "(on-policy only), train.seq_kd=true (the teacher writes completions), or "
                    "give data with a completion column (data.completion_field)"
                )
        if (
            self.seq_kd
            and self.lambda_ < 1.0
            and (self.teacher is None or self.teacher.generator is None)
        ):
            raise ConfigError("train.seq_kd=true needs a teacher model that can generate")

    # ------------------------------------------------------------------ schedule

    def policies(self, window: int) -> list[str]:
        """The slice policies of window `window`: a pure function of (seed, window)."""
        rng = random.Random(f"distil-lambda:{self.seed}:{window}")
        off = SEQ_KD if self.seq_kd else OFF
        return [ON if rng.random() < self.lambda_ else off for _ in range(self.accum)]

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"distil-order:{self.seed}:{epoch}").shuffle(order)
        return order

    def _advance(self, epoch: int, position: int) -> tuple[list[int], int, int]:
        """This rank's example indices for the window that starts at (epoch, position), and
        where the next window starts; an incomplete tail is dropped."""
        need = self.per_rank * self.world
        if position + need > len(self.examples):
            epoch, position = epoch + 1, 0
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = self._epoch_order(epoch)
        start = position + self.rank * self.per_rank
        return self._orders[epoch][start : start + self.per_rank], epoch, position + need

    def _take_prompts(self) -> list[int]:
        """This rank's example indices for the next window."""
        st = self.state
        if self.ahead > 1 and (st.windows % self.ahead == 0 or st.block_window is None):
            st.block_window, st.block_epoch, st.block_position = st.windows, st.epoch, st.position
        prompts, st.epoch, st.position = self._advance(st.epoch, st.position)
        return prompts

    def close(self, wait: bool = True) -> None:
        """Stop the worker processes (if any); `wait=False` on the way out of an error."""
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None

    def load_state(self, state: dict[str, int]) -> None:
        self.state = BufferState(**state)
        self._orders, self._written = {}, {}

    # ------------------------------------------------------------------ filling

    def next_window(self) -> Window:
        index = self.state.windows
        prompts = self._take_prompts()
        policies = self.policies(index)
        self.state.windows += 1
        rows = [i for i in prompts for _ in range(self.n)]
        row_policy = [policies[r // self.batch] for r in range(len(rows))]
        samples: list[Sample | None] = [None] * len(rows)
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        for policy, side in ((ON, self.student), (SEQ_KD, self.teacher)):
            picked = [r for r, p in enumerate(row_policy) if p == policy]
            if picked and policy == SEQ_KD and self.ahead > 1:
                self._from_block(index, rows, picked, samples, metrics)
            elif picked:
                params = self._params(index, policy)
                self._generate(side, policy, params, rows, picked, samples, metrics)
        metrics["time/generate"] = time.perf_counter() - start
        self._written.pop(index, None)  # a block's window without teacher-written slices
        on = [s for s, p in zip(samples, row_policy, strict=True) if p == ON]
        if self.reward is not None and on:  # whole groups: a prompt's n rows share a slice
            start = time.perf_counter()
            metrics.update(self.reward(on))  # type: ignore[arg-type]
            metrics["time/reward"] = time.perf_counter() - start
        for r, p in enumerate(row_policy):
            if p == OFF:
                samples[r] = self._reference(rows[r])
        slices = [samples[k * self.batch : (k + 1) * self.batch] for k in range(self.accum)]
        start = time.perf_counter()  # padding, and for a tokenizer pair the alignment
        if self.pool is not None:  # e.g. cross-tokenizer alignment, one micro-batch per worker
            batches = list(self.pool.map(_collate_in_worker, slices, [self.pad_id] * self.accum))
        else:
            batches = [self.collate_fn(sl, self.pad_id) for sl in slices]  # type: ignore[arg-type]
        metrics["time/collate"] = time.perf_counter() - start

        metrics["policy/on_policy_share"] = policies.count(ON) / len(policies)
        metrics["policy/seq_kd_share"] = policies.count(SEQ_KD) / len(policies)
        metrics["completion/mean_tokens"] = sum(len(s.completion_ids) for s in samples) / len(rows)
        return Window(batches, policies, metrics)

    def _params(self, window: int, policy: str) -> SamplingParams:
        if not self.seeded:
            return self.params
        return replace(self.params, seed=sampling_seed(self.seed, self.rank, window, policy))

    def _generate(
        self,
        side: PromptSide | None,
        policy: str,
        params: SamplingParams,
        rows: list[int],
        picked: list[int],
        samples: list[Sample | None],
        metrics: dict[str, float],
    ) -> None:
        # rows of one prompt are adjacent and whole groups share a policy (config validates),
        # so every n-th picked row is a distinct prompt.
        assert side is not None and side.generator is not None
        unique = [rows[r] for r in picked[:: self.n]]
        rollout = side.generator.generate([side.prompt_ids[i] for i in unique], params)
        self._fill(side, policy, _Written(rollout), 0, rows, picked, samples, metrics)

    def _fill(self, side, policy, out, first, rows, picked, samples, metrics) -> None:
        """The samples of rows `picked` (of `rows`) from the rollout's rows first, first + 1,
        ...; their counts into `metrics`."""
        ended, generated = 0, 0
        for j, r in enumerate(picked, start=first):
            ex = rows[r]
            ids, text = out.ids[j], None
            generated += len(ids)
            lps = out.logprobs[j, : len(ids)].tolist() if out.logprobs is not None else None
            stopped = bool(out.stopped[j]) if out.stopped is not None else None
            ended += bool(stopped)
            if side.to_student is not None:
                ids, text = side.to_student(ids, prompt=self.examples[ex].prompt, example=ex)
                lps = None  # sampling log-probs are in the other tokenizer's units
            if policy != ON:
                lps = None
            self._check_ids(ex, ids, policy)
            samples[r] = Sample(
                ex,
                self.student.prompt_ids[ex],
                ids,
                policy,
                prompt=self.examples[ex].prompt,
                completion_text=text,
                sampling_logprobs=lps,
                stopped=stopped,
            )
        if not picked:  # a block's window without teacher-written slices
            return
        metrics[f"{policy}/stopped_share"] = ended / len(picked)
        # compute spent generating (train/cost.py): one prompt prefill per row, sampled tokens
        metrics[f"tokens/{policy}_prefill"] = sum(len(side.prompt_ids[rows[r]]) for r in picked)
        metrics[f"tokens/{policy}_generated"] = generated

    def _from_block(self, index, rows, picked, samples, metrics) -> None:
        """Window `index`'s teacher-written rows from its block (written now if not yet)."""
        if index not in self._written:
            self._write_block(index)
        block_rows, block_samples, block_metrics = self._written.pop(index)
        assert block_rows == rows, "the block's prompts drifted from the window's"
        for r in picked:
            samples[r] = block_samples[r]
        metrics.update(block_metrics)

    def _write_block(self, index: int) -> None:
        """One generate call for the seq-KD rows of every window of `index`'s block; the
        windows from `index` on are kept for later (a resumed run drops the earlier ones)."""
        side, k = self.teacher, self.ahead
        assert side is not None and side.generator is not None
        st = self.state
        assert st.block_window is not None and st.block_window <= index
        first, epoch, position = st.block_window, st.block_epoch, st.block_position
        plan = []
        for w in range(first, (first // k + 1) * k):
            prompts, epoch, position = self._advance(epoch, position)
            w_rows = [i for i in prompts for _ in range(self.n)]
            policies = self.policies(w)
            plan.append(
                (w, w_rows, [r for r in range(len(w_rows)) if policies[r // self.batch] == SEQ_KD])
            )
        unique = [w_rows[r] for _, w_rows, w_picked in plan for r in w_picked[:: self.n]]
        block = replace(
            self.params, seed=sampling_seed(self.seed, self.rank, "teacher-block", first)
        )
        out = _Written(side.generator.generate([side.prompt_ids[i] for i in unique], block))
        at = 0
        for w, w_rows, w_picked in plan:
            if w >= index:  # a resumed run's windows before `index` are trained already
                w_samples: list[Sample | None] = [None] * len(w_rows)
                w_metrics: dict[str, float] = {}
                self._fill(side, SEQ_KD, out, at, w_rows, w_picked, w_samples, w_metrics)
                self._written[w] = (w_rows, w_samples, w_metrics)
            at += len(w_picked)

    def _reference(self, ex: int) -> Sample:
        ids = self.completion_ids[ex]
        assert ids is not None
        self._check_ids(ex, ids, OFF)
        return Sample(
            ex,
            self.student.prompt_ids[ex],
            list(ids),
            OFF,
            prompt=self.examples[ex].prompt,
            completion_text=self.examples[ex].completion,
        )

    def _check_ids(self, ex: int, ids: Sequence[int], policy: str) -> None:
        """A completion id past the student tokenizer's largest id: a DataError naming the
        row (its file and line) and where the completion came from."""
        if self.vocab_limit is None or not ids or max(ids) < self.vocab_limit:
            return
        bad = max(ids)
        source = {ON: "the student's sample", OFF: "the dataset's completion"}.get(
            policy, "the teacher-written completion (seq-KD)"
        )
        path, _, line = self.examples[ex].meta.get("_where", "").rpartition(":")
        raise DataError(
            f"data row {ex}: {source} holds token id {bad}, past the student tokenizer's "
            f"ids (its largest is {self.vocab_limit - 1}; a model vocabulary padded past its "
            "tokenizer has rows no text decodes to, and every loss that reads tokens would "
            "index past its tables). "
            "Fix: check that the student's tokenizer (student.tokenizer) is the one its model "
            "and the completions were made with",
            path=path or None,
            line=int(line) if line.isdigit() else None,
        )


class _Written:
    """A rollout's completion id lists, sampling log-probs and stop flags, read once."""

    def __init__(self, rollout):
        self.ids = rollout.completion_lists()
        self.logprobs = rollout.logprobs_B_C
        self.stopped = rollout.stopped_B


_WORKER_COLLATE: Callable[[list[Sample], int], Batch] | None = None


def _init_worker(fn: Callable[[list[Sample], int], Batch]) -> None:
    global _WORKER_COLLATE
    import torch

    torch.set_num_threads(1)
    _WORKER_COLLATE = fn


def _collate_in_worker(samples: list[Sample], pad_id: int) -> Batch:
    assert _WORKER_COLLATE is not None
    return _WORKER_COLLATE(samples, pad_id)


def _worker_pool(fn: Callable[[list[Sample], int], Batch], workers: int):
    """Processes that collate micro-batches in parallel (spawned: safe next to torch threads)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(fn,))
