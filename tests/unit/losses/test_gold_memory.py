"""GOLD's memory-lean pieces equal the plain ones: the sorted L1 of the unmatched candidates
(int32 order and int8 signs saved for backward) in value and gradient, the bool table mark, and
the chunk rows GOLD takes from `loss.chunk_size`."""

from __future__ import annotations

import pytest
import torch

from distil.losses import gold as gold_mod
from distil.losses.uld import sorted_l1


@pytest.mark.parametrize("widths", [(40, 40), (30, 50), (50, 30)])
def test_unmatched_l1_equals_sorted_l1_in_value_and_gradient(monkeypatch, widths):
    monkeypatch.setattr(gold_mod, "SORT_ROWS", 3)  # several row blocks
    g = torch.Generator().manual_seed(0)
    n, (a, b) = 7, widths
    s_last = torch.log_softmax(torch.randn(n, a, generator=g) * 2, -1)
    s_last[:, :5] = float("-inf")  # candidates on the table
    t_last = torch.log_softmax(torch.randn(n, b, generator=g) * 2, -1)
    s_prefix, t_prefix = -torch.rand(n, generator=g), -torch.rand(n, generator=g)
    x = s_last.clone().requires_grad_()
    got = gold_mod.unmatched_l1(s_prefix, x, t_prefix, t_last)
    y = s_last.clone().requires_grad_()
    want = sorted_l1((s_prefix[:, None] + y).exp(), (t_prefix[:, None] + t_last).exp())
    torch.testing.assert_close(got, want)
    w = torch.rand(n, generator=g)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_gold_runs_its_chunks_at_two_thirds_of_the_given_rows(monkeypatch):
    seen = {}

    def spy(*args, chunk_size=None, **kw):
        seen["chunk_size"] = chunk_size
        raise StopIteration

    monkeypatch.setattr(gold_mod, "merged_group_loss", spy)
    monkeypatch.setattr(gold_mod, "check_inputs", lambda *a, **k: None)

    from types import SimpleNamespace

    alignment = SimpleNamespace(match_tables=[(torch.tensor([0, 1]), torch.tensor([1, 0]))])
    with pytest.raises(StopIteration):
        gold_mod.gold(None, None, None, num_tokens=1, alignment=alignment, chunk_size=220)
    assert seen["chunk_size"] == 146
