"""Several teachers behind one `TeacherScorer` (config `teachers`).

- Routed (`teachers.column`): each training row goes to one teacher, named by a data column
  (through `teachers.map` when given). Rows of different teachers share a micro-batch; each
  teacher runs once per micro-batch on its own rows, and the targets are put back in row
  order.
- Mixed (`teachers.weights`): every teacher scores every row and the targets are the mixture
  of their distributions, log M(v) = log sum_i w_i T_i(v) (weights normalized to sum to 1),
  which the configured divergence then compares with the student. A mixture of one teacher
  with weight 1 is that teacher.

Both work on full or top-k targets for routing (each row keeps its own teacher's form) and on
full targets for a mixture (top-k supports differ between teachers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import torch

from distil.errors import DataError
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


def _rows(batch: Batch, idx: torch.Tensor, picked: list[int]) -> Batch:
    """The batch restricted to rows `idx` (same-tokenizer batches: no alignment)."""
    tensors = {
        f.name: v[idx.to(v.device)]
        for f in fields(batch)
        if isinstance(v := getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, samples=[batch.samples[i] for i in picked], **tensors)


class RoutedTeacher:
    """Each row scored by its own teacher; `last_routes` records the teacher of every row of
    the last micro-batch scored."""

    def __init__(self, teachers: Sequence[Any], names: Sequence[str], route_of: Sequence[int]):
        self.teachers, self.names, self.route_of = list(teachers), list(names), list(route_of)
        self.temperature = self.teachers[0].temperature
        self.last_routes: list[str] = []

    def score(self, batch: Batch) -> TeacherTargets:
        routes = [self.route_of[s.example_id] for s in batch.samples]
        self.last_routes = [self.names[r] for r in routes]
        out: dict[str, torch.Tensor] = {}
        for t, teacher in enumerate(self.teachers):
            picked = [i for i, r in enumerate(routes) if r == t]
            if not picked:
                continue  # this teacher has no row here: it does not run
            idx = torch.tensor(picked)
            part = teacher.score(_rows(batch, idx, picked))
            for f in fields(part):
                value = getattr(part, f.name)
                if value is None:
                    continue
                if f.name not in out:  # (B, ...) in the first part's dtype and device
                    shape = (len(routes), *value.shape[1:])
                    out[f.name] = value.new_zeros(shape)
                out[f.name][idx.to(value.device)] = value
        return TeacherTargets(**out)


class MixedTeacher:
    """Every row scored by every teacher; targets log sum_i w_i T_i (full distributions)."""

    def __init__(self, teachers: Sequence[Any], weights: Sequence[float]):
        total = float(sum(weights))
        self.teachers = list(teachers)
        self.log_w = [math.log(w / total) if w > 0 else -math.inf for w in weights]
        self.temperature = self.teachers[0].temperature

    def score(self, batch: Batch) -> TeacherTargets:
        mixed = None
        for teacher, log_w in zip(self.teachers, self.log_w, strict=True):
            if log_w == -math.inf:
                continue  # weight 0: never run
            lp = teacher.score(batch).logprobs_B_T_V
            if lp is None:
                raise ValueError("a mixture needs every teacher's full distribution (top_k=null)")
            term = lp.to(torch.promote_types(lp.dtype, torch.float32)) + log_w  # fp32 at least
            mixed = term if mixed is None else torch.logaddexp(mixed, term)
        assert mixed is not None
        return TeacherTargets(logprobs_B_T_V=mixed.to(lp.dtype))
