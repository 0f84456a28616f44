"""aligned_kl's boundary mix (`boundary.entry_targets`) against a dense loop over random tables.

At a token boundary the teacher's next-token distribution is mixed with its odds, one position
earlier, of having written a longer token than the one it ended (`align.batch._boundaries`).
Random teacher rows, a many-to-one table 0 with ambiguous entries and tables before the
boundary whose students are partly outside table 0's support (new slots): the merged support,
pi, rest and mix weight equal the formula computed entry by entry over the whole vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from distil.align.project import pad_projection
from distil.losses.boundary import BoundaryTables, entry_targets

VS, VT = 9, 12


def tables(g: torch.Generator):
    """Table 0: every teacher id -> a student id in [0, 6) or -1; then three tables of a few
    teacher ids -> student ids in [0, VS) (some outside table 0's support) or -1, the first of
    them the token that spells the table's key (-1, as `ProjectionTables` builds it)."""
    s0 = torch.randint(-1, 6, (VT,), generator=g)
    out = [(torch.arange(VT), s0)]
    for size in (3, 4, 2):
        t = torch.randperm(VT, generator=g)[:size].sort().values
        s = torch.randint(-1, VS, (size,), generator=g)
        s[0] = -1  # t[0] spells the remainder itself: the token before the boundary, ambiguous
        out.append((t, s))
    return out


def dense(row_V, table):
    """(pi over the student vocabulary, ambiguous share, mass) of one teacher row through a table."""
    p = row_V.exp()
    t_ids, s_ids = table
    mass = p[t_ids].sum()
    pi = torch.zeros(VS, dtype=p.dtype)
    amb = p.new_zeros(())
    for t, s in zip(t_ids.tolist(), s_ids.tolist(), strict=True):
        if s < 0:
            amb += p[t] / mass
        else:
            pi[s] += p[t] / mass
    return pi, amb, mass


@pytest.mark.parametrize("apart", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_boundary_mix_equals_the_dense_formula(seed, apart):
    """apart: the tables before a boundary padded apart (`boundary_tables`), as the loss does."""
    g = torch.Generator().manual_seed(seed)
    tabs = tables(g)
    teacher = torch.log_softmax(torch.randn(2, 5, VT, generator=g, dtype=torch.float64) * 2, -1)
    n = 8
    row = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(1, 5, (n,), generator=g)
    prev_table = torch.randint(0, 4, (n,), generator=g)  # 0: no boundary (-1)
    prev_table = torch.where(prev_table == 0, -1, prev_table)
    # the token before the boundary spells its table's key: the table's ambiguous first id
    prev_tok = torch.tensor([int(tabs[k][0][0]) if k > 0 else -1 for k in prev_table.tolist()])
    ids, valid, log_pi, log_rest, log_mass, cont = entry_targets(
        teacher, row, pos, torch.zeros(n, dtype=torch.long), (prev_tok, prev_table),
        pad_projection(tabs), 1.0,
        BoundaryTables(pad_projection(tabs[1:]), torch.tensor([-1, 0, 1, 2])) if apart else None,
    )  # fmt: skip
    for k in range(n):
        pi, amb, mass = dense(teacher[row[k], pos[k]], tabs[0])
        want_cont = 0.0
        if prev_table[k] >= 0:
            before = teacher[row[k], pos[k] - 1]
            pi_p, amb_p, mass_p = dense(before, tabs[int(prev_table[k])])
            e = before[prev_tok[k]].exp() / mass_p
            pi, amb, want_cont = e * pi + pi_p, e * amb + amb_p - e, 1 - e
        got = torch.zeros(VS, dtype=torch.float64)
        got.index_put_((ids[k][valid[k]],), log_pi[k][valid[k]].exp(), accumulate=True)
        # each student id has one slot: its mass is not split (the student's is read once)
        assert ids[k][valid[k]].unique().numel() == int(valid[k].sum())
        torch.testing.assert_close(got, pi, rtol=1e-10, atol=1e-12)
        assert log_rest[k].exp().item() == pytest.approx(float(amb), abs=1e-12)
        assert log_mass[k].exp().item() == pytest.approx(float(mass), rel=1e-12)
        assert float(cont[k]) == pytest.approx(float(want_cont), abs=1e-12)
        # every id pi gives mass to is on the support
        assert set(torch.nonzero(pi).squeeze(1).tolist()) <= set(ids[k][valid[k]].tolist())
