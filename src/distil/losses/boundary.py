"""The teacher side of `aligned_kl` at a token boundary, where both models start a token at the
same byte right after the teacher's token t (`distil.align.batch._boundaries`).

The teacher's distribution at the boundary conditions on t having ended. The text's next
character also depends on how likely the teacher was to end t there rather than write a longer
token that starts with bytes(t), which its distribution one position earlier says. With the
table `prev` of those longer tokens (t itself its ambiguous share) and Z their mass with t's:
    e = P_{j-1}(t) / Z,   pi(s) = e pi_j(s) + P_{j-1}(longer tokens going on with s) / Z,
    rest = e rest_j + (prev's ambiguous share - e).
Without it a student that cuts the teacher's tokens short (a number's first digit, a word's
first letters) is never charged for it: the projection at j - 1 counts '4' and '46' as the
same first character, and the distribution at j reads the teacher after a finished '4'.
`entry_targets` mixes a projection entry's pi; `stop_logprob` gives log e for the groups whose
one student token spans several teacher tokens (compared as [token, rest] by the chain rule).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distil.align.project import PaddedProjection, pad_projection, project_rows
from distil.losses.chunked import upcast
from distil.losses.divergences import gather_rows


class BoundaryTables(NamedTuple):
    """The batch's tables read before a boundary, padded apart from the others (they are small;
    table 0 pads every table to the teacher's vocabulary): `padded`, and `remap` from a batch
    table id to its row there."""

    padded: PaddedProjection
    remap: torch.Tensor


def boundary_tables(alignment) -> BoundaryTables | None:
    """`BoundaryTables` of an `AlignmentGroups` (None: no boundary in the batch)."""
    parts = [
        t[t >= 0]
        for t in (alignment.proj_prev_table_N, alignment.group_prev_table_G)
        if t is not None
    ]
    ids = torch.unique(torch.cat(parts)) if parts else None
    if ids is None or not ids.numel():
        return None
    padded = pad_projection([alignment.proj_tables[i] for i in ids.tolist()])
    remap = torch.full((len(alignment.proj_tables),), -1, dtype=torch.long, device=ids.device)
    remap[ids] = torch.arange(ids.numel(), device=ids.device)
    return BoundaryTables(padded, remap)


def _teacher_rows(teacher_B_T_V, row_n, pos_n, ratio):
    t_n_V = upcast(teacher_B_T_V[row_n, pos_n])
    return torch.log_softmax(t_n_V * ratio, dim=-1) if ratio != 1.0 else t_n_V


@torch.no_grad()
def entry_targets(
    teacher_B_T_V, row_n, pos_n, table_n, prev, padded: PaddedProjection, ratio,
    before: BoundaryTables | None = None,
):  # fmt: skip
    """The teacher side of a chunk's projection entries: [ids_n_U, valid_n_U, log pi_n_U over
    them, log rest_n, log mass_n, continue_n]. prev: (prev_tok_n, prev_table_n), -1 where an
    entry is not at a boundary (None: none is); before: the batch's `boundary_tables` (None:
    `padded` serves); continue_n = 1 - e (0 elsewhere)."""
    proj = project_rows(_teacher_rows(teacher_B_T_V, row_n, pos_n, ratio), padded, table_n)
    out = [proj.support_ids_N_U, proj.support_valid_N_U, proj.logprobs_N_U]
    out += [proj.log_ambiguous_N, proj.log_mass_N, torch.zeros_like(proj.log_mass_N)]
    if prev is not None:
        tok_n, prev_table = prev
        mixed = torch.nonzero((prev_table >= 0) & torch.isfinite(proj.log_mass_N)).squeeze(1)
        if mixed.numel():
            t_p = _teacher_rows(teacher_B_T_V, row_n[mixed], pos_n[mixed] - 1, ratio)
            proj_p = _project_before(t_p, prev_table[mixed], padded, before)
            _mix(out, mixed, _odds(t_p, tok_n[mixed], proj_p), proj_p)
    return out


def _project_before(t_p_V, table_m, padded, before: BoundaryTables | None):
    if before is None:
        return project_rows(t_p_V, padded, table_m)
    return project_rows(t_p_V, before.padded, before.remap[table_m])


def _odds(t_p_V, tok_m, before):
    """log e: where the table has no teacher mass, e = 1 and nothing is added."""
    ok = torch.isfinite(before.log_mass_N)
    return torch.where(ok, (gather_rows(t_p_V, tok_m) - before.log_mass_N).clamp_max(0.0), 0.0)


def _mix(out: list, m, log_e, before) -> None:
    """Rows m of `out` mixed with the table before the boundary. Supports are merged: the ids of
    `before` found in row m's sorted support add to its slots, the others get slots after."""
    ids, valid, log_pi, log_rest, _, cont = out
    ok = torch.isfinite(before.log_mass_N)  # where not, log_e is 0 and log_p -inf
    log_p = torch.where(ok[:, None], before.logprobs_N_U, float("-inf"))
    sorted_m = torch.where(valid[m], ids[m], torch.iinfo(ids.dtype).max).contiguous()
    new_ids = before.support_ids_N_U.contiguous()
    at = torch.searchsorted(sorted_m, new_ids).clamp_max(ids.shape[1] - 1)
    found = before.support_valid_N_U & (sorted_m.gather(1, at) == new_ids)
    # row m's slots scaled by e, then the found ids' mass added in place (a few per row)
    mixed = log_pi[m] + log_e[:, None]
    r, c = torch.nonzero(found, as_tuple=True)
    mixed[r, at[r, c]] = torch.logaddexp(mixed[r, at[r, c]], log_p[r, c])
    out[2] = log_pi.index_put((m,), mixed)
    extra = before.support_valid_N_U & ~found & ok[:, None]
    if extra.any():  # ids the row's support lacks: slots after its own
        width, more = ids.shape[1], extra.shape[1]
        out[0], out[1], out[2] = (
            torch.cat([x, x.new_full((x.shape[0], more), fill)], 1)
            for x, fill in ((ids, 0), (valid, False), (out[2], float("-inf")))
        )
        out[0][m, width:] = torch.where(extra, new_ids, 0)
        out[1][m, width:] = extra
        out[2][m, width:] = torch.where(extra, log_p, float("-inf"))
    e = log_e.exp()
    stop_rest = (before.log_ambiguous_N.exp() - e).clamp_min(0.0)
    rest = torch.where(ok, e * log_rest[m].exp() + stop_rest, log_rest[m].exp())
    out[3] = log_rest.index_put((m,), rest.log())
    out[5] = cont.index_put((m,), 1.0 - e)


@torch.no_grad()
def stop_logprob(
    teacher_B_T_V, row_g, pos_g, prev, padded: PaddedProjection, ratio,
    before: BoundaryTables | None = None,
):  # fmt: skip
    """log e per group (its first teacher position pos_g): the teacher's odds of having ended
    the token before it there; 0 where the group is not at a boundary (prev: (prev_tok_g,
    prev_table_g) with -1, or None)."""
    out = torch.zeros(row_g.shape[0], dtype=torch.float32, device=row_g.device)
    if prev is None:
        return out
    tok, table = prev
    m = torch.nonzero(table >= 0).squeeze(1)
    if m.numel():
        t_p = _teacher_rows(teacher_B_T_V, row_g[m], pos_g[m] - 1, ratio)
        log_e = _odds(t_p, tok[m], _project_before(t_p, table[m], padded, before))
        out = out.to(log_e.dtype).index_put((m,), log_e)
    return out
