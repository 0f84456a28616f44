"""One cross-tokenizer micro-batch -> `AlignmentGroups` (the tensors the losses gather with).

A warm micro-batch of plain rows is aligned in one compiled call (`fast.plain_batch`); any
other goes through the general passes: the rows' completions are aligned together
(`token_align.align_flat`); then, per group, the candidate table for its last positions
(`MatchTables`), and per student token in a group, the teacher position whose distribution
predicts it with the sparse map from teacher to student next tokens (`ProjectionTables`), all
as compiled passes over the batch (`group_keys.group_keys`, `group_keys.projection_entries`,
`outputs.finish`); Python runs only once per table that is not cached yet. Positions are
*predicting* positions: completion token j of a model whose completion starts at input index
`offset` is predicted by logit row offset - 1 + j. The collator hands over its padded id arrays
(`PaddedRows`), so no Python int is converted here. The groups leave as `GroupSpans` (first
token and length per side); the padded (G, width) tensors are expanded from them on first
read, on the device the batch is on.

Groups whose bytes differ between the two sides (`exact=False`, DP rows only) have no byte
context to compare inside them: they get one projection entry, at their first positions with
the whole-vocabulary table, and match table 0 when 1:1, otherwise an empty table (the GOLD loss
then uses only its rest bucket). The table lists in the result hold only the tables this batch
uses (renumbered, 0 always the whole-vocabulary table), so moving a batch to the GPU moves a
few small tensors, not the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distil.align.fast import plain_batch
from distil.align.group_keys import group_keys
from distil.align.keys import first_seen
from distil.align.outputs import finish, padded_cpu
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import BatchAlignment, align_flat, partners
from distil.align.vocab_map import VocabBytes
from distil.align.walk import FlatRows, teacher_text
from distil.types import AlignmentGroups, GroupSpans


@dataclass
class RowInputs:
    """One row: completion ids of both models, where they start, the teacher's byte ends.

    s_offset / t_offset: index of the first completion token in that model's input_ids.
    Ids and byte ends may be lists, numpy arrays or tensors (arrays are concatenated as they
    are; lists cost one conversion per Python int).
    t_ends: int64 (C_t,) byte ends of the teacher tokens over `t_bytes`, the UTF-8 text the
    teacher was given for the completion (`token_align.text_byte_ends`).
    """

    s_ids: Sequence[int] | np.ndarray | torch.Tensor
    s_offset: int
    t_ids: Sequence[int] | np.ndarray | torch.Tensor
    t_offset: int
    t_ends: Sequence[int] | np.ndarray | torch.Tensor
    t_bytes: bytes


@dataclass
class PaddedRows:
    """A micro-batch's rows as the collator holds them: each model's padded input ids (numpy,
    e.g. views of the batch's id tensors), where each row's completion starts in them and how
    many tokens it has, and per row the teacher's byte ends and text (as in `RowInputs`).
    t_prefix_B (optional, bool per row): the caller made the row's teacher text from the
    student's completion bytes and found its bytes a prefix of them (`bytes.startswith`: the
    text of an unfinished last character is dropped), so the aligner need not compare them
    again byte by byte; it must hold."""

    s_ids_B_L: np.ndarray
    s_offset_B: np.ndarray
    s_len_B: np.ndarray
    t_ids_B_L: np.ndarray
    t_offset_B: np.ndarray
    t_len_B: np.ndarray
    t_ends: Sequence[np.ndarray]
    t_bytes: Sequence[bytes]
    t_prefix_B: np.ndarray | None = None


def build_alignment(
    rows: Sequence[RowInputs] | PaddedRows,
    student_vb: VocabBytes,
    teacher_vb: VocabBytes,
    match_tables: MatchTables,
    proj_tables: ProjectionTables,
) -> tuple[AlignmentGroups, torch.Tensor]:
    """Align every row and pack the groups and projection entries of the batch.

    Returns (alignment, in_group_B_C): `in_group_B_C[b, j]` (bool, C = the longest student
    completion) is True when row b's student completion token j is inside a group (the trainer
    masks the others out of the loss). Group tensors are (G, S_max) / (G, T_max) padded with -1
    (S_max, T_max >= 1; expanded from `alignment.spans` on first read); projection tensors are
    (N,). `rows`: a `PaddedRows` (the collator's form) or `RowInputs` whose ids and byte ends
    may be lists, numpy arrays or tensors (arrays skip the conversion of Python ints). The
    whole batch is aligned in compiled passes; the tables are looked up once per distinct byte
    key, in the order in which the keys first appear.
    """
    flat = None
    if isinstance(rows, PaddedRows):
        # the fast path reads the completions where the padded ids hold them
        idrow = np.arange(len(rows.s_len_B))  # batch row b is row b of the padded ids
        student = _side(rows.s_ids_B_L, idrow, rows.s_offset_B, rows.s_len_B)
        teacher = _side(rows.t_ids_B_L, idrow, rows.t_offset_B, rows.t_len_B)
        s_offset, t_offset = student[2], teacher[2]
        text = teacher_text(rows.t_ends, rows.t_bytes, teacher[3])
        known = rows.t_prefix_B
        prefix = np.zeros(len(s_offset), np.bool_) if known is None else known.astype(np.bool_)
    else:
        flat = FlatRows.pack(
            [r.s_ids for r in rows], [r.t_ids for r in rows], [r.t_ends for r in rows],
            [r.t_bytes for r in rows],
        )  # fmt: skip
        student, teacher = _flat_sides(flat)
        s_offset = np.fromiter((r.s_offset for r in rows), np.int64, len(rows))
        t_offset = np.fromiter((r.t_offset for r in rows), np.int64, len(rows))
        text = (flat.t_ends, flat.t_off, flat.t_bytes, flat.tb_off)
        prefix = np.zeros(len(rows), np.bool_)
    fast = _plain(
        student, teacher, (*text, prefix), s_offset, t_offset, student_vb, teacher_vb, match_tables,
        proj_tables,
    )  # fmt: skip
    if fast is not None:
        return fast
    if flat is None:
        flat = FlatRows.from_padded(rows, text)
        student, teacher = _flat_sides(flat)
    ba = align_flat(flat, student_vb, teacher_vb)
    g = ba.groups
    kind, flag, m_off, m_len, e_row, e_s, e_t, e_off, e_len, e_fits, e_plain = group_keys(
        g, ba.exact, ba.special, flat.s_off, ba.s_ends, ba.sb_off, flat.t_ends, flat.t_off,
        s_offset, t_offset,
    )  # fmt: skip
    match_G = _match_ids(kind, flag, m_off, m_len, g[:, 0], ba.s_bytes, match_tables)
    proj_E = _proj_ids(e_off, e_len, e_plain, ba.s_bytes, proj_tables)
    *arrays, n_covered, n_inexact = finish(
        g, flat.s_off, flat.t_off, ba.covered, match_G, len(match_tables.tables), e_row, e_s,
        e_t, e_plain, e_fits, proj_E, len(proj_tables.tables), proj_tables.empty_ids(),
        ba.exact,
    )  # fmt: skip
    metrics = _metrics(ba, len(arrays[8]), n_covered, n_inexact)
    exact_G = torch.from_numpy(ba.exact)
    spans = (student, teacher, s_offset, t_offset)
    return _result(arrays, spans, match_tables, proj_tables, exact_G, metrics, teacher_vb, ba.dp)


def _side(ids, idrow, start, length) -> tuple[np.ndarray, ...]:
    # one model's completions as `fast.plain_batch` and `GroupSpans` read them
    as64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    return as64(ids), as64(idrow), as64(start), as64(length)


def _flat_sides(flat: FlatRows) -> tuple[tuple, tuple]:
    # the concatenated completions as one row of ids
    n = len(flat.s_off) - 1
    student = _side(flat.s_ids[None], np.zeros(n), flat.s_off[:-1], np.diff(flat.s_off))
    teacher = _side(flat.t_ids[None], np.zeros(n), flat.t_off[:-1], np.diff(flat.t_off))
    return student, teacher


def _result(
    arrays, spans: tuple, match_tables: MatchTables, proj_tables: ProjectionTables, exact_G,
    metrics, teacher_vb: VocabBytes, dp_B: np.ndarray | None,
) -> tuple[AlignmentGroups, torch.Tensor]:  # fmt: skip
    """(AlignmentGroups, in_group_B_C) from the compiled passes' arrays (row, student first and
    length, teacher first and length, in_group, match ids, match tables used, p_row, p_s, p_t,
    proj ids, proj tables used); the padded group tensors left to `GroupSpans` (spans: both
    sides' (ids, idrow, start, length), the completions' offsets in the inputs). dp_B: the
    rows aligned by the edit-distance fallback (None: none), which get no `_boundaries`."""
    t = torch.from_numpy
    (row, s_first, s_len, t_first, t_len, in_group, match_ids, match_used, p_row, p_s, p_t,
     proj_ids, proj_used) = arrays  # fmt: skip
    (s_ids, s_idrow, s_start, _), (t_ids, t_idrow, t_start, _), s_offset, t_offset = spans
    proj_ids, entry, group, proj_used = _boundaries(
        arrays, (t_ids, t_idrow, t_start), t_offset, teacher_vb, proj_tables, dp_B
    )
    # the ids are the spans' own copy: a view of the collator's id tensors would be a second
    # storage over the same memory, which a worker process's pickling (torch moves each storage
    # to shared memory, freeing the old one) can leave pointing at freed memory
    group_spans = GroupSpans(
        t(s_first), t(s_len), t(s_ids.copy()), t(s_idrow), t(s_offset - 1 - s_start),
        t(t_first), t(t_len), t(t_ids.copy()), t(t_idrow), t(t_offset - 1 - t_start),
        expand_cpu=padded_cpu,
    )  # fmt: skip
    result = AlignmentGroups(
        group_row_G=t(row),
        student_pos_G_S=None,  # type: ignore[arg-type]  # expanded from `spans` when read
        student_tok_G_S=None,  # type: ignore[arg-type]
        teacher_pos_G_T=None,  # type: ignore[arg-type]
        teacher_tok_G_T=None,  # type: ignore[arg-type]
        match_table_G=t(match_ids),
        match_tables=_pick(match_tables.tables, match_used),
        proj_row_N=t(p_row),
        proj_student_pos_N=t(p_s),
        proj_teacher_pos_N=t(p_t),
        proj_table_N=t(proj_ids),
        proj_tables=_pick(proj_tables.tables, proj_used),
        exact_G=exact_G,
        metrics=metrics,
        spans=group_spans,
        proj_prev_tok_N=t(entry[0]),
        proj_prev_table_N=t(entry[1]),
        group_prev_tok_G=t(group[0]),
        group_prev_table_G=t(group[1]),
    )
    return result, t(in_group)


def _boundaries(arrays, teacher, t_offset, teacher_vb, proj_tables, dp_B):
    """At each token boundary, the teacher token that ends there and the table of what else the
    teacher could have written: per projection entry and per group (prev_tok, prev_table for
    each, -1 where there is none), with the entries' table ids and the batch's table list
    renumbered to hold the new tables (in cache order).

    An entry on the whole-vocabulary table (local id 0), or a group's first tokens, has the
    student and the teacher starting a token at the same byte, right after the teacher's
    completion token j - 1, t. The teacher's distribution at j conditions on t having ended;
    the text's next character also depends on how likely the teacher was to end t there rather
    than write a longer token that starts with bytes(t), which its distribution at j - 1 says
    (the table for the remainder bytes(t), where t itself is the ambiguous share). The loss
    mixes the two (`aligned_kl`): without it, a student that cuts the teacher's tokens short (a
    number's first digit, a word's first letters) is never charged for it. Rows aligned by the
    edit-distance fallback, special tokens and tokens that no longer teacher token starts with
    (nothing to mix) get none."""
    row, _, _, t_first, _, _, _, _, p_row, _, p_t, proj_ids, proj_used = arrays
    t_start = teacher[2]
    # completion index of each entry's and each group's (first) teacher token
    j_entry = p_t - (t_offset[p_row] - 1)
    j_group = t_first - t_start[row]
    entry = _before(p_row, j_entry, proj_ids == 0, teacher, teacher_vb, proj_tables, dp_B)
    group = _before(row, j_group, np.ones(len(row), np.bool_), teacher, teacher_vb, proj_tables,
                    dp_B)  # fmt: skip
    new = np.concatenate([entry[1][entry[1] >= 0], group[1][group[1] >= 0]])
    if not len(new):
        return proj_ids, entry, group, proj_used
    mark = np.zeros(len(proj_tables.tables), np.bool_)
    mark[proj_used] = True
    mark[new] = True
    used = np.flatnonzero(mark)
    local = np.full(len(mark), -1, np.int64)  # cache id -> the batch's id
    local[used] = np.arange(len(used))
    proj_ids = local[proj_used[proj_ids]]
    for _, table in (entry, group):
        table[table >= 0] = local[table[table >= 0]]
    return proj_ids, entry, group, used


def _before(rows, j, ok, teacher, teacher_vb, proj_tables, dp_B):
    """(prev_tok, global table id) for the points at completion index j of `rows` where `ok`:
    see `_boundaries`."""
    t_ids, t_idrow, t_start = teacher
    tok_out = np.full(len(rows), -1, np.int64)
    table_out = np.full(len(rows), -1, np.int64)
    ok = ok & (j >= 1)
    if dp_B is not None:
        ok &= ~dp_B[rows]
    at = np.flatnonzero(ok)
    tok = t_ids[t_idrow[rows[at]], t_start[rows[at]] + j[at] - 1]
    inside = (tok >= 0) & (tok < teacher_vb.size)  # an id past the table: no bytes
    at, tok = at[inside], tok[inside]
    table = proj_tables.boundary_ids(tok)
    full = table >= 0  # t alone in its table: nothing to mix
    tok_out[at[full]] = tok[full]
    table_out[at[full]] = table[full]
    return tok_out, table_out


def _plain(
    student: tuple,
    teacher: tuple,
    text: tuple,
    s_offset: np.ndarray,
    t_offset: np.ndarray,
    student_vb: VocabBytes,
    teacher_vb: VocabBytes,
    match_tables: MatchTables,
    proj_tables: ProjectionTables,
) -> tuple[AlignmentGroups, torch.Tensor] | None:
    """`build_alignment` in one compiled call (`fast.plain_batch`) when every row is plain and
    every key cached; None otherwise (nothing changed). student / teacher: `_side`; text:
    `walk.teacher_text` and the rows known to be prefixes (`PaddedRows.t_prefix_B`)."""
    index, t_index = student_vb.index(), teacher_vb.index()
    n_memo = len(t_index.data) + 1
    empty = np.zeros(len(proj_tables.tables), np.bool_)
    empty[proj_tables.empty_ids()] = True
    ok, *arrays, n_covered, n_bytes, n_exact = plain_batch(
        student, teacher, *text, index.data, index.start, s_offset, t_offset,
        student_vb.is_special, teacher_vb.is_special, partners(student_vb, teacher_vb),
        match_tables.keys.arrays(), proj_tables.keys.arrays(), empty, len(match_tables.tables),
        t_index.data, t_index.start, match_tables.keys.prefix_memo(n_memo),
        proj_tables.keys.prefix_memo(n_memo),
    )  # fmt: skip
    if not ok:
        return None
    n_g, n_s = len(arrays[0]), int(student[3].sum())
    metrics = {
        "groups": float(n_g),
        "student_tokens_in_groups": float(n_covered),
        "unalignable_tokens": float(n_s - n_covered),
        "bytes": float(n_bytes),
        "bytes_exact": float(n_exact),
        "dp_rows": 0.0,
        "inexact_groups": 0.0,
        "projection_entries": float(len(arrays[8])),
    }
    exact_G = torch.ones(n_g, dtype=torch.bool)
    spans = (student, teacher, s_offset, t_offset)
    return _result(arrays, spans, match_tables, proj_tables, exact_G, metrics, teacher_vb, None)


def _match_ids(kind, flag, off, length, rows, data, match: MatchTables) -> np.ndarray:
    """Global match-table id per group. Keys already in the cache are looked up in one compiled
    pass; missing tables are built in the order the per-row build asked for them (a row's
    empty table before its deltas)."""
    out, n_miss = match.keys.lookup(data, off, length, flag, kind == 2, default=0)
    no_map = np.flatnonzero(kind == 1)  # only in DP rows
    empty_id = -1
    if n_miss:
        miss = out < 0
        reps, key = first_seen(data, off, length, flag, miss)
        # the empty table comes before the deltas of the first row that has a no-map group
        empty_at = int(np.searchsorted(rows, rows[no_map[0]])) if len(no_map) else len(kind) + 1
        ids = np.empty(len(reps), dtype=np.int64)
        new = zip(reps.tolist(), off[reps].tolist(), length[reps].tolist(), flag[reps].tolist())
        for u, (group, a, n, longer) in enumerate(new):
            if empty_id < 0 and group >= empty_at:
                empty_id = match.empty_id()
            ids[u] = match.delta_id(data[a : a + n].tobytes(), student_longer=longer)
        out[miss] = ids[key[miss]]
    if len(no_map):
        out[no_map] = match.empty_id() if empty_id < 0 else empty_id
    return out


def _proj_ids(off, length, plain, data, proj: ProjectionTables) -> np.ndarray:
    """Global projection-table id per entry (0 where the teacher is not behind); like
    `_match_ids`, cached keys in one compiled pass, missing tables in order of appearance."""
    no_flag = np.zeros(len(off), np.bool_)
    out, n_miss = proj.keys.lookup(data, off, length, no_flag, plain, default=0)
    if n_miss:
        miss = out < 0
        reps, key = first_seen(data, off, length, no_flag, miss)
        ids = [
            proj.table_id(data[a : a + n].tobytes())
            for a, n in zip(off[reps].tolist(), length[reps].tolist(), strict=True)
        ]
        out[miss] = np.asarray(ids, dtype=np.int64)[key[miss]]
    return out


def _pick(
    tables: list[tuple[torch.Tensor, torch.Tensor]], used: np.ndarray
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # the tables a batch uses, by cache id (`outputs.renumber`: 0 always first, in cache
    # order, so all of them are the cache's list as it is)
    return tables[:] if len(used) == len(tables) else [tables[i] for i in used.tolist()]


def _metrics(ba: BatchAlignment, n_proj: int, covered: int, inexact: int) -> dict[str, float]:
    # covered: student tokens in groups (groups are disjoint); inexact: groups not exact
    return {
        "groups": float(len(ba.groups)),
        "student_tokens_in_groups": float(covered),
        "unalignable_tokens": float(len(ba.covered) - covered),
        "bytes": float(len(ba.s_bytes)),
        "bytes_exact": float(ba.n_exact.sum()),
        "dp_rows": float(np.count_nonzero(ba.dp)),
        "inexact_groups": float(inexact),
        "projection_entries": float(n_proj),
    }
