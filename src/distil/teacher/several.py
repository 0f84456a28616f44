"""Several teachers behind one `TeacherScorer` (config `teachers`).

- Routed (`teachers.column`): each training row goes to one teacher, named by a data column
  (through `teachers.map` when given). Rows of different teachers share a micro-batch; each
  teacher runs once per micro-batch on its own rows (`RoutedTeacher.score_parts`), and the loss
  of each teacher's rows is computed against that teacher's own targets (`train/step.py`), so
  teachers may differ in form (full, top-k, cached, remote) and, with a cross-tokenizer loss,
  in tokenizer: a cross-tokenizer micro-batch is collated per teacher (`RoutedCollate`), each
  teacher's rows aligned with its own tokenizer.
- Mixed (`teachers.weights`): every teacher scores every row and the targets are the mixture
  of their distributions, log M(v) = log sum_i w_i T_i(v) (weights normalized to sum to 1),
  which the configured divergence then compares with the student. A mixture of one teacher
  with weight 1 is that teacher. Only the positions a loss reads are mixed (in fp32, a chunk
  of rows at a time, into the first teacher's output): the rest hold a filler no loss reads,
  and no fp32 (B, T, V) tensor is made (about 30 GB for two teachers at B=16, T=896 and a
  151,936-row vocabulary; gpu-review-2 finding 10). It needs full distributions over one vocabulary (the
  student's, or one teacher tokenizer shared by all with a cross-tokenizer loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from distil.config.contexts import teacher_contexts
from distil.data.collate import collate
from distil.errors import DataError
from distil.losses.chunked import auto_chunk_size
from distil.teacher.live import scored_positions
from distil.types import Batch, Example, TeacherTargets


def row_teachers(examples: Sequence[Example], teachers, names: Sequence[str]) -> list[int]:
    """Index into `names` of each example's teacher (`teachers.column`, mapped by
    `teachers.map`); a row without the column, or whose value no teacher claims, is a DataError
    naming its file and line."""
    from distil.data.datasets import source_row

    index = {n: i for i, n in enumerate(names)}
    out = []
    for e in examples:
        path, _, line = e.meta.get("_where", "").rpartition(":")
        where = {"path": path or None, "line": int(line) if line.isdigit() else None}
        row = source_row(e)
        if teachers.column not in row:
            raise DataError(
                f"teachers.column = {teachers.column!r}: this row has no such column (it has "
                f"{', '.join(sorted(row)) or 'none'}). Fix: add it, or route by another column",
                **where,
            )
        value = str(row[teachers.column])
        name = teachers.map.get(value, value)
        if name not in index:
            claimed = sorted(teachers.map) if teachers.map else list(names)
            raise DataError(
                f"teachers.column {teachers.column!r} = {value!r}: no teacher claims this value "
                f"(teachers: {', '.join(names)}; values routed: {', '.join(claimed)}). Fix: "
                "add it to teachers.map, or name a teacher after it",
                **where,
            )
        out.append(index[name])
    return out


def row_contexts(cfg, examples: Sequence[Example]) -> list[tuple] | None:
    """Each example's teacher (context, system): its routed teacher's (`teachers.column`), or
    the one every teacher shares (one teacher, a mixture); None when no teacher has any."""
    names = list(cfg.teachers.models)
    per = list(teacher_contexts(cfg).values())
    if not any(c or s for c, s in per):
        return None
    if names and cfg.teachers.column:
        return [per[r] for r in row_teachers(examples, cfg.teachers, names)]
    return [per[0]] * len(examples)


def _rows(batch: Batch, idx: torch.Tensor, picked: list[int]) -> Batch:
    """The batch restricted to rows `idx` (same-tokenizer batches: no alignment)."""
    tensors = {
        f.name: v[idx.to(v.device)]
        for f in fields(batch)
        if isinstance(v := getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, samples=[batch.samples[i] for i in picked], **tensors)


@dataclass
class RoutedBatch(Batch):
    """A cross-tokenizer micro-batch of several teachers: the student's padded rows (`mask_B_T`
    the union of the teachers' loss positions) and, per teacher with rows here, those rows
    collated with that teacher's own tokenizer and alignment (`parts`, in row order)."""

    parts: dict[str, Batch] | None = None

    def to(self, device: torch.device | str) -> RoutedBatch:
        moved = Batch.to(self, device)
        parts = None if self.parts is None else {k: v.to(device) for k, v in self.parts.items()}
        return replace(moved, parts=parts)


class RoutedCollate:
    """Collates a micro-batch for routed cross-tokenizer teachers: each teacher's rows through
    its own `CrossTokenizer` (teachers sharing a tokenizer share one). Duck-types the
    `CrossTokenizer` the buffer asks for (`collate`, `teacher_tok`)."""

    def __init__(self, crosses: Sequence[Any], names: Sequence[str], route_of: Sequence[int]):
        self.crosses, self.names, self.route_of = list(crosses), list(names), list(route_of)
        self.teacher_tok = self.crosses[0].teacher_tok

    def teacher_prompt_text(self, sample) -> str:
        """The row's prompt as its own teacher renders it (the printed training example)."""
        return self.crosses[self.route_of[sample.example_id]].teacher_prompt_text(sample)

    def collate(self, samples, pad_id: int) -> RoutedBatch:
        base = collate(samples, pad_id)
        routes = [self.route_of[s.example_id] for s in samples]
        mask = torch.zeros_like(base.mask_B_T)
        parts = {}
        for t, name in enumerate(self.names):
            picked = [i for i, r in enumerate(routes) if r == t]
            if not picked:
                continue
            sub = self.crosses[t].collate([samples[i] for i in picked], pad_id)
            mask[torch.tensor(picked), : sub.mask_B_T.shape[1]] = sub.mask_B_T
            parts[name] = sub
        fields_ = {f.name: getattr(base, f.name) for f in fields(Batch)}
        fields_.update(mask_B_T=mask, completion_mask_B_T=base.mask_B_T)
        return RoutedBatch(**fields_, parts=parts)


@dataclass
class Part:
    """One teacher's rows of a micro-batch: their indices, those rows as a batch (the batch
    itself when they are all of it; collated in its own tokens for a cross-tokenizer teacher)
    and the teacher's targets for them."""

    name: str
    rows: list[int]
    batch: Batch
    targets: TeacherTargets


class RoutedTeacher:
    """Each row scored by its own teacher; `last_routes` records the teacher of every row of
    the last micro-batch scored, `names` every teacher's name."""

    def __init__(self, teachers: Sequence[Any], names: Sequence[str], route_of: Sequence[int]):
        self.teachers, self.names, self.route_of = list(teachers), list(names), list(route_of)
        self.temperature = self.teachers[0].temperature
        self.last_routes: list[str] = []

    def score_parts(self, batch: Batch) -> list[Part]:
        """Per teacher with rows in `batch`, in teacher order: its rows and its targets (each
        teacher runs once, on its rows only; a teacher without rows does not run, except a
        sharded one, whose `idle` forward keeps the ranks' all-gathers in step)."""
        routes = [self.route_of[s.example_id] for s in batch.samples]
        self.last_routes = [self.names[r] for r in routes]
        given = getattr(batch, "parts", None)  # a RoutedBatch: collated per teacher
        out = []
        for t, teacher in enumerate(self.teachers):
            picked = [i for i, r in enumerate(routes) if r == t]
            if not picked:
                if hasattr(teacher, "idle"):  # a sharded teacher: every rank runs its forward
                    teacher.idle()
                continue
            if given is not None:
                sub = given[self.names[t]]
            elif len(picked) == len(routes):
                sub = batch
            else:
                sub = _rows(batch, torch.tensor(picked), picked)
            out.append(Part(self.names[t], picked, sub, teacher.score(sub)))
        return out

    def score(self, batch: Batch) -> TeacherTargets:
        """The parts' targets put back in row order (same-tokenizer teachers of one form)."""
        parts = self.score_parts(batch)
        if getattr(batch, "parts", None) is not None or len({_form(p.targets) for p in parts}) > 1:
            raise ValueError(
                "these teachers' targets differ in form or tokenizer: score_parts gives each "
                "teacher's own (the training step computes each teacher's loss on its rows)"
            )
        out: dict[str, torch.Tensor] = {}
        for part in parts:
            idx = torch.tensor(part.rows)
            for f in fields(part.targets):
                value = getattr(part.targets, f.name)
                if value is None:
                    continue
                if f.name not in out:  # (B, ...) in the first part's dtype and device
                    shape = (len(batch.samples), *value.shape[1:])
                    out[f.name] = value.new_zeros(shape)
                out[f.name][idx.to(value.device)] = value
        return TeacherTargets(**out)


def _form(targets: TeacherTargets) -> tuple:
    """Which fields the targets hold and their trailing shape (what merging needs equal)."""
    return tuple(
        (f.name, tuple(v.shape[1:]))
        for f in fields(targets)
        if (v := getattr(targets, f.name)) is not None
    )


class MixedTeacher:
    """Every row scored by every teacher; targets log sum_i w_i T_i (full distributions)."""

    def __init__(self, teachers: Sequence[Any], weights: Sequence[float]):
        total = float(sum(weights))
        self.teachers = list(teachers)
        self.log_w = [math.log(w / total) if w > 0 else -math.inf for w in weights]
        self.temperature = self.teachers[0].temperature

    def score(self, batch: Batch) -> TeacherTargets:
        lps, log_ws = [], []
        for teacher, log_w in zip(self.teachers, self.log_w, strict=True):
            if log_w == -math.inf:
                continue  # weight 0: never run
            lp = teacher.score(batch).logprobs_B_T_V
            if lp is None:
                raise ValueError("a mixture needs every teacher's full distribution (top_k=null)")
            lps.append(lp)
            log_ws.append(log_w)
        out = lps[0].to(lps[-1].dtype)  # written in place at the scored rows
        rows_B_T = scored_positions(batch, tuple(out.shape[:2])).to(out.device)
        row_N, pos_N = rows_B_T.nonzero(as_tuple=True)
        step = auto_chunk_size(out.shape[-1])
        for s in range(0, len(row_N), step):
            r, p = row_N[s : s + step], pos_N[s : s + step]
            mixed = None  # log sum_i w_i T_i(v), in fp32 at least, a chunk of rows at a time
            for lp, log_w in zip(lps, log_ws, strict=True):
                term = lp[r, p].to(torch.promote_types(lp.dtype, torch.float32)) + log_w
                mixed = term if mixed is None else torch.logaddexp(mixed, term)
            out[r, p] = mixed.to(out.dtype)
        return TeacherTargets(logprobs_B_T_V=out)
