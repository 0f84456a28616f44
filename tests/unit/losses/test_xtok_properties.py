"""Cross-tokenizer losses: chunking, empty inputs, micro-batch splits, temperature, weights, errors."""

from __future__ import annotations

import math

import pytest
import torch

from distil.errors import ConfigError
from distil.losses import StudentHidden
from distil.types import AlignmentGroups, TeacherTargets

from .test_crosstok import XTOK, call, grad_of, naive_loss, random_case


def hidden_case(seed=0, H=5, Vs=7):
    _logits, teacher_logits, mask, alignment = random_case(seed=seed, Vs=Vs, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 100)
    B, Ts = mask.shape
    hidden = torch.randn(B, Ts, H, generator=g, requires_grad=True)
    weight = torch.randn(Vs, H, generator=g).requires_grad_()
    bias = (torch.randn(Vs, generator=g) * 0.1).requires_grad_()
    return hidden, weight, bias, torch.log_softmax(teacher_logits, -1), mask, alignment


@pytest.mark.parametrize("name", XTOK)
def test_chunked_equals_unchunked(name):
    hidden, weight, bias, teacher, mask, alignment = hidden_case()
    params = (hidden, weight, bias)
    kw = dict(num_tokens=25, beta=0.3, temperature=1.3)
    ref = call(
        name, torch.nn.functional.linear(hidden, weight, bias), teacher, mask, alignment, **kw
    )
    ref_grads = torch.autograd.grad(ref.loss, params)
    for chunk_size in (1, 3, 5):  # 14 student positions, 6 groups: 3 and 5 divide neither
        student = StudentHidden(hidden, weight, bias)
        out = call(name, student, teacher, mask, alignment, chunk_size=chunk_size, **kw)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-7)
        for g, r in zip(torch.autograd.grad(out.loss, params), ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
        assert out.metrics.keys() == ref.metrics.keys()
        for key, value in out.metrics.items():
            torch.testing.assert_close(value, ref.metrics[key], rtol=1e-5, atol=1e-6)
    assert ref.loss.abs() > 0 and all(g.abs().sum() > 0 for g in ref_grads)


def empty_alignment():
    e1, e2 = torch.zeros(0, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long)
    ident = (torch.arange(6), torch.arange(6))
    return AlignmentGroups(e1, e2, e2, e2, e2, e1, [ident], e1, e1, e1, e1, [ident])


@pytest.mark.parametrize("name", XTOK)
def test_no_groups_or_all_masked_is_exact_zero_with_zero_gradients(name):
    hidden, weight, bias, teacher, mask, alignment = hidden_case(seed=1)
    cases = [(mask, empty_alignment()), (torch.zeros_like(mask), alignment)]
    for m, a in cases:
        for chunk_size in (None, 4):
            out = call(name, StudentHidden(hidden, weight, bias), teacher, m, a,
                       chunk_size=chunk_size, ce_weight=0.5, num_tokens=0)  # fmt: skip
            assert out.loss.item() == 0.0 and out.loss.requires_grad
            for g in torch.autograd.grad(out.loss, (hidden, weight, bias)):
                assert torch.isfinite(g).all() and torch.all(g == 0)
            if m.any():
                out.metrics.pop("tokens_count")
            assert all(v.item() == 0 for v in out.metrics.values()), out.metrics


def take_rows(alignment: AlignmentGroups, rows: list[int]) -> AlignmentGroups:
    """The alignment of a micro-batch made of `rows` (renumbered 0..len(rows)-1)."""
    new = torch.full((int(alignment.group_row_G.max()) + 1,), -1, dtype=torch.long)
    new[torch.tensor(rows)] = torch.arange(len(rows))
    g = new[alignment.group_row_G] >= 0
    n = new[alignment.proj_row_N] >= 0
    a = alignment
    return AlignmentGroups(
        new[a.group_row_G[g]], a.student_pos_G_S[g], a.student_tok_G_S[g], a.teacher_pos_G_T[g],
        a.teacher_tok_G_T[g], a.match_table_G[g], a.match_tables, new[a.proj_row_N[n]],
        a.proj_student_pos_N[n], a.proj_teacher_pos_N[n], a.proj_table_N[n], a.proj_tables,
    )  # fmt: skip


@pytest.mark.parametrize("name", XTOK)
def test_micro_batch_split_gives_the_whole_batch_gradient(name):
    logits, teacher_logits, mask, alignment = random_case(seed=4, B=3)
    teacher = torch.log_softmax(teacher_logits, -1)
    total = int(mask.sum())
    whole = call(name, logits, teacher, mask, alignment, num_tokens=total)
    parts = 0.0
    for rows in ([0, 2], [1]):
        sub = call(name, logits[rows], teacher[rows], mask[rows], take_rows(alignment, rows),
                   num_tokens=total)  # fmt: skip
        parts = parts + sub.loss
    torch.testing.assert_close(parts, whole.loss)
    torch.testing.assert_close(torch.autograd.grad(parts, logits)[0], grad_of(whole, logits))


@pytest.mark.parametrize("name", XTOK)
def test_teacher_targets_are_retempered_exactly(name):
    logits, teacher_logits, mask, alignment = random_case(seed=5)
    tau = 0.7
    at_tau = TeacherTargets(logprobs_B_T_V=torch.log_softmax(teacher_logits / tau, -1))
    at_two = TeacherTargets(logprobs_B_T_V=torch.log_softmax(teacher_logits / 2.0, -1))
    a = call(name, logits, None, mask, alignment, targets=at_tau, temperature=tau,
             targets_temperature=tau)  # fmt: skip
    b = call(name, logits, None, mask, alignment, targets=at_two, temperature=tau,
             targets_temperature=2.0)  # fmt: skip
    torch.testing.assert_close(a.loss, b.loss)
    torch.testing.assert_close(grad_of(a, logits), grad_of(b, logits))
    # and the student is tempered too: the naive loop at τ agrees
    value, _, _ = naive_loss(name, logits, at_tau.logprobs_B_T_V, mask, alignment, temperature=tau)
    assert a.loss.item() == pytest.approx(float(value.detach()) / int(mask.sum()), rel=1e-10)


def test_gold_fixed_and_adaptive_weights():
    logits, teacher_logits, mask, alignment = random_case(seed=6)
    teacher = torch.log_softmax(teacher_logits, -1)
    adaptive = call("gold", logits, teacher, mask, alignment, num_tokens=1)
    fixed = call("gold", logits, teacher, mask, alignment, num_tokens=1, matched_weight=0.7,
                 unmatched_weight=0.2)  # fmt: skip
    m = fixed.metrics
    expected = 0.7 * m["matched_sum"] + 0.2 * m["unmatched_sum"]
    torch.testing.assert_close(fixed.loss.detach(), expected)
    for key in ("matched_sum", "unmatched_sum", "matched_mass_sum"):  # weights change no term
        torch.testing.assert_close(adaptive.metrics[key], m[key])
    # adaptive: per group w_m = the teacher's matched share, which differs across groups
    value, _, extras = naive_loss("gold", logits, teacher, mask, alignment)
    torch.testing.assert_close(adaptive.loss, value)
    assert 0 < extras["mass"] < alignment.num_groups
    assert adaptive.loss.item() != pytest.approx(fixed.loss.item(), rel=1e-3)
    for bad in ({"matched_weight": 1.0}, {"matched_weight": -1.0, "unmatched_weight": 1.0}):
        with pytest.raises(ConfigError, match="matched_weight"):
            call("gold", logits, teacher, mask, alignment, **bad)


@pytest.mark.parametrize("name", XTOK)
def test_sparse_targets_missing_alignment_and_bad_beta_raise(name):
    logits, teacher_logits, mask, alignment = random_case(seed=7)
    teacher = torch.log_softmax(teacher_logits, -1)
    vals, ids = teacher.topk(3, -1)
    sparse = TeacherTargets(topk_ids_B_T_K=ids, topk_logprobs_B_T_K=vals)
    with pytest.raises(ValueError, match="not supported"):
        call(name, logits, None, mask, alignment, targets=sparse)
    with pytest.raises(ValueError, match="needs alignment"):
        call(name, logits, teacher, mask, None)
    if name != "uld" and name != "sampled_chunk_reverse_kl":
        with pytest.raises(ValueError, match="beta"):
            call(name, logits, teacher, mask, alignment, beta=1.5)


def test_sampled_chunk_uses_teacher_token_logprobs_in_teacher_positions():
    logits, teacher_logits, mask, alignment = random_case(seed=8)
    teacher = torch.log_softmax(teacher_logits, -1)
    # the teacher's log-prob of its own realized next token at each teacher position
    ttok = torch.zeros(teacher.shape[:2], dtype=torch.long)
    valid = alignment.teacher_pos_G_T >= 0
    rows = alignment.group_row_G[:, None].expand_as(valid)
    ttok[rows[valid], alignment.teacher_pos_G_T[valid]] = alignment.teacher_tok_G_T[valid]
    tokens = teacher.gather(-1, ttok[..., None])[..., 0]
    name = "sampled_chunk_reverse_kl"
    a = call(name, logits, None, mask, alignment, targets=TeacherTargets(token_logprobs_B_T=tokens))
    b = call(name, logits, teacher, mask, alignment)
    torch.testing.assert_close(a.loss, b.loss)
    torch.testing.assert_close(grad_of(a, logits), grad_of(b, logits))
    with pytest.raises(ValueError, match="re-tempered"):
        call(name, logits, None, mask, alignment, targets=TeacherTargets(token_logprobs_B_T=tokens),
             temperature=0.5)  # fmt: skip


@pytest.mark.parametrize("name", XTOK)
def test_ce_weight_adds_cross_entropy_of_the_student_tokens(name):
    logits, teacher_logits, mask, alignment = random_case(seed=9)
    teacher = torch.log_softmax(teacher_logits, -1)
    base = call(name, logits, teacher, mask, alignment, num_tokens=20, temperature=1.5)
    with_ce = call(name, logits, teacher, mask, alignment, num_tokens=20, temperature=1.5,
                   ce_weight=0.7)  # fmt: skip
    labels = torch.zeros(mask.shape, dtype=torch.long)
    valid = alignment.student_pos_G_S >= 0
    rows = alignment.group_row_G[:, None].expand_as(valid)
    labels[rows[valid], alignment.student_pos_G_S[valid]] = alignment.student_tok_G_S[valid]
    ce = -torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0][mask].sum()
    torch.testing.assert_close(with_ce.loss - base.loss, 0.7 * ce / 20)
    torch.testing.assert_close(with_ce.metrics["ce_sum"], ce.detach())
    assert "ce_sum" not in base.metrics


@pytest.mark.parametrize("name", XTOK)
def test_a_group_cut_by_the_mask_is_dropped_whole(name):
    logits, teacher_logits, mask, alignment = random_case(seed=3)
    teacher = torch.log_softmax(teacher_logits, -1)
    cut = mask.clone()
    cut[0, 5] = False  # inside the 3-token group at positions 4, 5, 6 of row 0
    out = call(name, logits, teacher, cut, alignment, num_tokens=10)
    value, kl, _ = naive_loss(name, logits, teacher, cut, alignment)
    torch.testing.assert_close(out.loss, value / 10)
    assert out.metrics["groups_count"].item() == alignment.num_groups - 1
    assert out.metrics["logratio_sum"].item() == pytest.approx(kl)
    full = call(name, logits, teacher, mask, alignment, num_tokens=10)
    assert not math.isclose(full.loss.item(), out.loss.item(), rel_tol=1e-6)  # control


@pytest.mark.parametrize("name", XTOK)
def test_bf16_hidden_path_is_finite_and_close(name):
    hidden, weight, bias, teacher, mask, alignment = hidden_case(seed=10)
    ref = call(name, StudentHidden(hidden, weight, bias), teacher, mask, alignment, chunk_size=4)
    h16, w16 = (
        hidden.detach().bfloat16().requires_grad_(),
        weight.detach().bfloat16().requires_grad_(),
    )
    out = call(name, StudentHidden(h16, w16, bias.detach().bfloat16()), teacher, mask, alignment,
               chunk_size=4)  # fmt: skip
    gh, gw = torch.autograd.grad(out.loss, (h16, w16))
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all() and gh.abs().sum() > 0
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=5e-2, abs=1e-2)
