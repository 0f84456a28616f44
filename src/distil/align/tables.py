"""The candidate tables of the cross-tokenizer losses, built from two tokenizers' byte tables
(vocab_map.py) and cached per byte context: `MatchTables` (the GOLD hybrid's matched
candidates) and `ProjectionTables` (aligned-chunk KL's projection of teacher tokens onto the
student's next token).
"""

from __future__ import annotations

import numpy as np
import torch

from distil.align.byte_index import absent_prefix_sum, as_query, match_pairs, projection_pairs
from distil.align.keys import KeyIndex
from distil.align.vocab_map import VocabBytes, matched_vocab, role_map


def _pair_tensors(first: np.ndarray, second: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    # pairs sorted by (first, second), as two int64 tensors
    order = np.lexsort((second, first))
    return (
        torch.from_numpy(np.ascontiguousarray(first[order], dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(second[order], dtype=np.int64)),
    )


_NONE = np.zeros(0, dtype=np.int64)


class MatchTables:
    """Candidate pairs for the GOLD hybrid loss, cached per byte context.

    A group spells bytes G; its last student token is predicted after the group prefix ps, its
    last teacher token after pt (one is a prefix of the other). A student candidate y spells
    ps + bytes(y), a teacher candidate y' spells pt + bytes(y'); they are the same candidate iff
    those strings are equal. Only delta (the longer prefix minus the shorter) matters:
      |ps| >= |pt|: bytes(y') == delta + bytes(y)     (delta = ps[len(pt):])
      |ps| <  |pt|: bytes(y)  == delta + bytes(y')    (delta = pt[len(ps):])
    `tables[i]` = (student_ids_P, teacher_ids_P), sorted by student id. Table 0 is delta = b""
    (`matched_vocab`); tables for other deltas may be empty (the loss then uses only its rest
    bucket). `empty_id()` is an always-empty table for groups with no candidate map.
    """

    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] = [
            matched_vocab(student_vb, teacher_vb)
        ]
        self._ids: dict[tuple, int] = {(True, b""): 0, (False, b""): 0}
        self.keys = KeyIndex()  # (delta, student_longer) -> table id, for batch lookups

    def table_id(self, ps: bytes, pt: bytes) -> int:
        """Table of the group prefixes `ps` (student) and `pt` (teacher)."""
        if len(ps) >= len(pt):
            return self.delta_id(ps[len(pt) :], student_longer=True)
        return self.delta_id(pt[len(ps) :], student_longer=False)

    def delta_id(self, delta: bytes, *, student_longer: bool) -> int:
        """Table for `delta`, the bytes by which the longer of ps/pt exceeds the shorter."""
        key = (student_longer, delta)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.tables)
            self.tables.append(self._build(delta, student_longer))
            self.keys.add(delta, student_longer, found)
        return found

    def empty_id(self) -> int:
        """An empty table (no candidate of one side spells a candidate of the other)."""
        found = self._ids.get(("empty",))
        if found is None:
            found = self._ids[("empty",)] = len(self.tables)
            self.tables.append(_pair_tensors(_NONE, _NONE))
        return found

    def _build(self, delta: bytes, student_longer: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # enumerate the side whose candidates must start with delta; look the rest up
        longer, other = (
            (self.teacher_vb, self.student_vb)
            if student_longer
            else (self.student_vb, self.teacher_vb)
        )
        ids_l, ids_o = match_pairs(
            *longer.index().arrays(), *other.index().arrays(), as_query(delta)
        )
        return _pair_tensors(ids_o, ids_l) if student_longer else _pair_tensors(ids_l, ids_o)


AMBIGUOUS = -1  # student id of a teacher token whose next student token cannot be told


class ProjectionTables:
    """Sparse teacher -> student next-token maps for the aligned-chunk KL, cached per remainder.

    The teacher predicts at a point `remainder` bytes *behind* the student. A teacher token t
    that starts with `remainder` and is strictly longer would put the student at the start of
    bytes(t)[len(remainder):]; the student token that comes next is the longest student token
    that is a prefix of those bytes (t is dropped when none is), unless a longer student token
    that the teacher has no token for starts with those bytes: then the student might cover
    more than t with one token, and t maps to AMBIGUOUS (-1; its mass is the teacher's
    "anything else" bucket, e.g. the teacher's '<' when the student has '<answer>' and the
    teacher has not; see `_build`). For remainder b"" teacher specials map to student
    specials by role. `tables[i]` = (teacher_ids_K, student_ids_K),
    sorted by teacher id; table 0 is remainder b"". Tables for other remainders may be empty
    (callers skip those positions; see `is_empty`).
    """

    def __init__(self, student_vb: VocabBytes, teacher_vb: VocabBytes):
        self.student_vb, self.teacher_vb = student_vb, teacher_vb
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ids: dict[bytes, int] = {}
        self._empty: list[int] = []
        self._absent: np.ndarray | None = None  # see byte_index.absent_prefix_sum
        self._by_token: np.ndarray | None = None  # see boundary_ids
        self.keys = KeyIndex()  # remainder -> table id, for batch lookups
        self.table_id(b"")

    def table_id(self, remainder: bytes) -> int:
        """Index into `tables` for the teacher being `remainder` bytes behind the student."""
        found = self._ids.get(remainder)
        if found is None:
            found = self._ids[remainder] = len(self.tables)
            self.tables.append(self._build(remainder))
            self.keys.add(remainder, False, found)
            if self.is_empty(found):
                self._empty.append(found)
        return found

    def boundary_ids(self, teacher_ids: np.ndarray) -> np.ndarray:
        """Per teacher token t (int64 ids in the teacher's table): the table for the remainder
        bytes(t) when it holds a longer token than t, else -1, and -1 for a special or a token
        spelling no bytes (what `align.batch._boundaries` mixes in); cached per id, new tables
        built in id order."""
        vb = self.teacher_vb
        if self._by_token is None:
            self._by_token = np.full(vb.size, -2, np.int64)  # -2: not seen yet
            self._by_token[vb.is_special | (vb.lengths == 0)] = -1
        new = np.unique(teacher_ids[self._by_token[teacher_ids] == -2])
        for t in new.tolist():
            table = self.table_id(vb.token_bytes[t])
            self._by_token[t] = table if self.tables[table][0].numel() > 1 else -1
        return self._by_token[teacher_ids]

    def is_empty(self, table_id: int) -> bool:
        return self.tables[table_id][0].numel() == 0

    def empty_ids(self) -> np.ndarray:
        """Ids of the empty tables so far, int64."""
        return np.asarray(self._empty, dtype=np.int64)

    def _build(self, remainder: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher token t starting with `remainder`, strictly longer: the longest student token
        u0 that is a prefix of rest = bytes(t)[len(remainder):] (t dropped when none is), or
        AMBIGUOUS when a longer student token u starting with rest exists and the teacher has no
        token for remainder + bytes(u) (having emitted the shorter token, the teacher did not
        mean u: with one tokenizer on both sides nothing is ambiguous; the teacher's '<' is, for
        a student with a single '<answer>' token the teacher lacks). A teacher token spelling
        exactly the remainder ends where the student stands: what comes next would be predicted
        at a later teacher position, which this text does not reach (it continued with a longer
        token); its mass is "anything else" (AMBIGUOUS), not dropped: dropping it would tell the
        student that the token never ends here. For remainder b"" teacher specials map to
        student specials by role."""
        t_vb, s_vb = self.teacher_vb, self.student_vb
        t_data, t_start, t_order, _ = t_vb.index().arrays()
        if self._absent is None:
            self._absent = absent_prefix_sum(*s_vb.index().arrays(), t_data, t_start, t_order)
        t_ids, s_ids = projection_pairs(
            t_data, t_start, t_order, *s_vb.index().arrays(), as_query(remainder), self._absent
        )
        if not remainder:
            roles = np.array(list(role_map(s_vb, t_vb).items()), dtype=np.int64).reshape(-1, 2)
            t_ids = np.concatenate([t_ids, roles[:, 0]])
            s_ids = np.concatenate([s_ids, roles[:, 1]])
        return _pair_tensors(t_ids, s_ids)
