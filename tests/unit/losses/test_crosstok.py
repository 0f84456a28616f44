"""Cross-tokenizer losses (uld, gold, aligned_kl, sampled_chunk_reverse_kl): limits and references.

Identical tokenizers reduce each loss to a same-tokenizer one; a hand-worked 1:2 group checks
the numbers; loop implementations check random cases (values and gradients, float64).
Helpers here are shared with test_xtok_properties.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from distil.losses import get_loss
from distil.types import AlignmentGroups, TeacherTargets

XTOK = ["uld", "gold", "aligned_kl", "sampled_chunk_reverse_kl"]
FLOOR = 1e-10  # the rest-bucket floor of topk.py


def identity_alignment(mask_B_T, labels_B_T, V):
    """One tokenizer: a 1:1 group and a projection entry per masked position, identity tables."""
    b, t = mask_B_T.nonzero(as_tuple=True)
    tok = labels_B_T[b, t][:, None]
    ident = (torch.arange(V), torch.arange(V))
    zero = torch.zeros(len(b), dtype=torch.long)
    return AlignmentGroups(
        b, t[:, None], tok, t[:, None], tok.clone(), zero, [ident], b, t, t, zero.clone(), [ident]
    )


def random_case(seed=0, B=2, Ts=10, Tt=9, Vs=7, Vt=6, dtype=torch.float64):
    """Random groups (1-3 tokens per side), tables with many-to-one maps, and logits."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    groups, entries = [], []
    for row in range(B):
        ps, pt = 1, 1  # position 0 is "prompt"
        while True:
            ls, lt = rand(1, 3), rand(1, 3)
            if ps + ls > Ts or pt + lt > Tt:
                break
            spos, tpos = list(range(ps, ps + ls)), list(range(pt, pt + lt))
            stok = [rand(0, Vs - 1) for _ in spos]
            ttok = [rand(0, Vt - 1) for _ in tpos]
            groups.append((row, spos, stok, tpos, ttok, rand(0, 2)))
            for i, p in enumerate(spos):  # first entry: whole-vocab table 0, later: prefix tables
                entries.append((row, p, tpos[rand(0, lt - 1)], 0 if i == 0 else rand(1, 3)))
            ps, pt = ps + ls, pt + lt
    S, T = 3, 3
    pad = lambda xs, n: xs + [-1] * (n - len(xs))  # noqa: E731
    matched = torch.randperm(Vt, generator=g)[: Vt - 2]
    match_tables = [
        (torch.randperm(Vs, generator=g)[: Vt - 2], matched),  # a partial bijection
        (torch.tensor([1, 4]), torch.tensor([0, 5])),
        (torch.tensor([6, 0, 2]), torch.tensor([3, 1, 2])),
    ]
    proj_tables = [
        (torch.arange(Vt), torch.randint(0, Vs, (Vt,), generator=g)),  # many-to-one
        (torch.tensor([0, 2, 5]), torch.tensor([3, 3, 1])),
        (torch.tensor([4, 1]), torch.tensor([6, 0])),
        (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),  # empty: skipped
    ]
    col = lambda i: torch.tensor([x[i] for x in groups])  # noqa: E731
    ecol = lambda i: torch.tensor([x[i] for x in entries])  # noqa: E731
    alignment = AlignmentGroups(
        col(0),
        torch.tensor([pad(x[1], S) for x in groups]),
        torch.tensor([pad(x[2], S) for x in groups]),
        torch.tensor([pad(x[3], T) for x in groups]),
        torch.tensor([pad(x[4], T) for x in groups]),
        col(5),
        match_tables,
        ecol(0),
        ecol(1),
        ecol(2),
        ecol(3),
        proj_tables,
    )
    mask = torch.zeros(B, Ts, dtype=torch.bool)
    for row, spos, *_ in groups:
        mask[row, spos] = True
    logits = (torch.randn(B, Ts, Vs, generator=g, dtype=dtype) * 2).requires_grad_()
    teacher_logits = torch.randn(B, Tt, Vt, generator=g, dtype=dtype) * 2
    return logits, teacher_logits, mask, alignment


def call(name, student, teacher_logp, mask, alignment, **kw):
    kw.setdefault("num_tokens", int(mask.sum()))
    targets = kw.pop("targets", None) or TeacherTargets(logprobs_B_T_V=teacher_logp)
    return get_loss(name)(student, targets, mask, alignment=alignment, **kw)


def grad_of(out, x):
    return torch.autograd.grad(out.loss, x)[0]


# ----------------------------------------------------------------------------- naive loops


def naive_div(p, q, beta):
    """JSD_β(student p, teacher q) over explicit vectors; β=0 KL(q‖p), β=1 KL(p‖q)."""
    if beta == 0.0:
        return (q * (q.log() - p.log()))[q > 0].sum()
    if beta == 1.0:
        return (p * (p.log() - q.log()))[p > 0].sum()
    m = beta * q + (1 - beta) * p
    return beta * (q * (q / m).log())[q > 0].sum() + (1 - beta) * (p * (p / m).log())[p > 0].sum()


def naive_l1(a, b):
    a, b = a.sort(descending=True).values, b.sort(descending=True).values
    n = max(len(a), len(b))
    return (F.pad(a, (0, n - len(a))) - F.pad(b, (0, n - len(b)))).abs().sum()


def kept_groups(alignment, mask):
    out = []
    for g in range(alignment.num_groups):
        row = int(alignment.group_row_G[g])
        spos = [p for p in alignment.student_pos_G_S[g].tolist() if p >= 0]
        if all(mask[row, p] for p in spos):
            stok = alignment.student_tok_G_S[g].tolist()[: len(spos)]
            tpos = [p for p in alignment.teacher_pos_G_T[g].tolist() if p >= 0]
            ttok = alignment.teacher_tok_G_T[g].tolist()[: len(tpos)]
            out.append((g, row, spos, stok, tpos, ttok))
    return out


def merged(logp, row, pos, tok):
    """m(y) = sum_{i<k} log P_{p_i}(x_i) + log P_{p_k}(y), one group, a loop."""
    prefix = sum((logp[row, p, x] for p, x in zip(pos[:-1], tok[:-1], strict=True)), start=0.0)
    return prefix + logp[row, pos[-1]]


def naive_loss(
    name, logits, teacher_logp, mask, alignment, beta=0.5, temperature=1.0, weights=None
):
    """(sum over groups or entries, kl_sum, extras) with explicit loops, float64."""
    s_logp = torch.log_softmax(logits / temperature, -1)
    total, kl, extras = 0.0, 0.0, {"matched": 0.0, "unmatched": 0.0, "mass": 0.0}
    groups = kept_groups(alignment, mask)
    for g, row, spos, stok, tpos, ttok in groups:
        ms, mt = merged(s_logp, row, spos, stok), merged(teacher_logp, row, tpos, ttok)
        lS, lT = ms[stok[-1]], mt[ttok[-1]]
        kl += float((lS - lT).detach())
        ps, pt = ms.exp(), mt.exp()
        if name == "uld":
            total += naive_l1(ps, pt)
        elif name == "sampled_chunk_reverse_kl":  # surrogate with the right value and gradient
            adv = -(lS.detach() - lT)
            total += -adv * torch.exp(lS - lS.detach())
        elif name == "gold":
            sids, tids = (
                t.tolist() for t in alignment.match_tables[int(alignment.match_table_G[g])]
            )
            s_rest = (1 - ps[sids].sum()).clamp_min(FLOOR)
            t_rest = (1 - pt[tids].sum()).clamp_min(FLOOR)
            div = naive_div(
                torch.cat([ps[sids], s_rest[None]]), torch.cat([pt[tids], t_rest[None]]), beta
            )
            s_un = ps[[y for y in range(len(ps)) if y not in sids]]
            t_un = pt[[y for y in range(len(pt)) if y not in tids]]
            l1 = naive_l1(s_un, t_un)
            mass = (pt[tids].sum() / pt.sum()).detach()
            w_m, w_u = (mass, 1 - mass) if weights is None else weights
            total += w_m * div + w_u * l1
            extras["matched"] += float(div.detach())
            extras["unmatched"] += float(l1.detach())
            extras["mass"] += float(mass)
    if name == "aligned_kl":
        total = naive_aligned(s_logp, teacher_logp, alignment, groups, beta)
    return total, kl, extras


def naive_aligned(s_logp, teacher_logp, alignment, groups, beta):
    positions = {(row, p) for _, row, spos, *_ in groups for p in spos}
    total = 0.0
    for n in range(len(alignment.proj_row_N)):
        row, sp = int(alignment.proj_row_N[n]), int(alignment.proj_student_pos_N[n])
        tp, tab = int(alignment.proj_teacher_pos_N[n]), int(alignment.proj_table_N[n])
        if (row, sp) not in positions:
            continue
        T = teacher_logp[row, tp].exp()
        pi: dict[int, torch.Tensor] = {}
        for t, s in zip(*(x.tolist() for x in alignment.proj_tables[tab]), strict=True):
            pi[s] = pi.get(s, 0.0) + T[t]  # s = -1 collects the ambiguous teacher tokens
        mass = sum(pi.values(), start=0.0)
        if not pi or mass == 0:
            continue  # the teacher puts no mass on the table: nothing to compare
        support = sorted(s for s in pi if s >= 0)
        rest = (pi.get(-1, torch.tensor(0.0, dtype=T.dtype)) / mass).clamp_min(FLOOR)
        q = torch.stack([pi[s] / mass for s in support] + [rest])
        S = s_logp[row, sp].exp()
        p = torch.cat([S[support], (1 - S[support].sum()).clamp_min(FLOOR)[None]])
        total = total + naive_div(p, q, beta)
    # a single student token spanning several teacher tokens, with no entry of its own:
    # [token, rest] on both sides
    exact = alignment.exact_G
    entry_at = set(zip(alignment.proj_row_N.tolist(), alignment.proj_student_pos_N.tolist()))
    for g, row, spos, stok, tpos, ttok in groups:
        coarse = len(spos) == 1 and len(tpos) > 1 and (row, spos[0]) not in entry_at
        if coarse and (exact is None or bool(exact[g])):
            ps = s_logp[row, spos[0], stok[0]].exp()
            pt = sum(teacher_logp[row, p, x] for p, x in zip(tpos, ttok, strict=True)).exp()
            p2 = torch.stack([ps, (1 - ps).clamp_min(FLOOR)])
            q2 = torch.stack([pt, (1 - pt).clamp_min(FLOOR)])
            total = total + naive_div(p2, q2, beta)
    return total


# ----------------------------------------------------------------------------- identical tokenizers


def same_tokenizer_case(seed=0, B=2, T=6, V=11):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2).requires_grad_()
    teacher = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2, -1)
    mask = torch.rand(B, T, generator=g) > 0.3
    labels = torch.randint(0, V, (B, T), generator=g)
    return logits, teacher, mask, labels, identity_alignment(mask, labels, V)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("name", ["gold", "aligned_kl"])
def test_identical_tokenizers_reduce_to_jsd(name, beta):
    logits, teacher, mask, _labels, alignment = same_tokenizer_case()
    targets = TeacherTargets(logprobs_B_T_V=teacher)
    ref = get_loss("jsd")(logits, targets, mask, num_tokens=20, beta=beta, temperature=1.3)
    out = call(name, logits, teacher, mask, alignment, num_tokens=20, beta=beta, temperature=1.3)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_of(out, logits), grad_of(ref, logits), rtol=1e-10, atol=1e-12)
    if name == "gold":  # every candidate matched: the unmatched term and its weight vanish
        assert out.metrics["unmatched_sum"].item() == 0.0
        assert out.metrics["matched_mass_sum"].item() == pytest.approx(int(mask.sum()))
        fixed = call(name, logits, teacher, mask, alignment, num_tokens=20, beta=beta,
                     temperature=1.3, matched_weight=1.0, unmatched_weight=0.4)  # fmt: skip
        torch.testing.assert_close(fixed.loss, ref.loss, rtol=1e-12, atol=1e-12)


def test_identical_tokenizers_sampled_chunk_equals_sampled_reverse_kl():
    logits, teacher, mask, labels, alignment = same_tokenizer_case(seed=1)
    tokens = teacher.gather(-1, labels[..., None])[..., 0]
    targets = TeacherTargets(token_logprobs_B_T=tokens)
    ref = get_loss("sampled_reverse_kl")(logits, targets, mask, num_tokens=9, labels_B_T=labels)
    out = call(
        "sampled_chunk_reverse_kl", logits, None, mask, alignment, num_tokens=9, targets=targets
    )
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(grad_of(out, logits), grad_of(ref, logits))
    for key in ("kl_sum", "student_logprob_sum", "teacher_logprob_sum", "student_entropy_sum"):
        torch.testing.assert_close(out.metrics[key], ref.metrics[key])


def test_identical_tokenizers_uld_is_per_token_sorted_l1():
    logits, teacher, mask, _labels, alignment = same_tokenizer_case(seed=2)
    out = call("uld", logits, teacher, mask, alignment, num_tokens=7)
    S, Tp = torch.softmax(logits, -1)[mask], teacher.exp()[mask]
    sort = lambda x: x.sort(-1, descending=True).values  # noqa: E731
    ref = (sort(S) - sort(Tp)).abs().sum() / 7
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(grad_of(out, logits), torch.autograd.grad(ref, logits)[0])


# ----------------------------------------------------------------------------- hand-worked 1:2


def hand_case():
    """Text ' 87': teacher one token ' 87', student ' 8' then '7'.

    student ids 0 ' 8', 1 '7', 2 '9', 3 eos; teacher ids 0 ' 87', 1 ' 8', 2 '7', 3 ' 89'.
    S_0 = [.5, .2, .2, .1] (predicts ' 8'), S_1 = [.1, .6, .2, .1] (predicts '7' after ' 8'),
    T_0 = [.6, .1, .1, .2] (predicts ' 87').
    """
    S = torch.tensor([[[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1]]], dtype=torch.float64)
    T = torch.tensor([[[0.6, 0.1, 0.1, 0.2]]], dtype=torch.float64)
    alignment = AlignmentGroups(
        group_row_G=torch.tensor([0]),
        student_pos_G_S=torch.tensor([[0, 1]]),
        student_tok_G_S=torch.tensor([[0, 1]]),
        teacher_pos_G_T=torch.tensor([[0]]),
        teacher_tok_G_T=torch.tensor([[0]]),
        match_table_G=torch.tensor([1]),
        # table 0: whole-vocab byte map (' 8' <-> ' 8', '7' <-> '7'); table 1: after ' 8', the
        # student's '7' / '9' spell ' 87' / ' 89', the teacher's tokens 0 / 3
        match_tables=[(torch.tensor([0, 1]), torch.tensor([1, 2])), (torch.tensor([1, 2]), torch.tensor([0, 3]))],
        proj_row_N=torch.tensor([0, 0]),
        proj_student_pos_N=torch.tensor([0, 1]),
        proj_teacher_pos_N=torch.tensor([0, 0]),
        proj_table_N=torch.tensor([0, 1]),
        # table 0: each teacher token -> the first student token of its bytes
        # table 1 (student emitted ' 8'): ' 87' -> '7', ' 89' -> '9'
        proj_tables=[(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 0, 1, 0])), (torch.tensor([0, 3]), torch.tensor([1, 2]))],
    )  # fmt: skip
    return S.log().requires_grad_(), T.log(), torch.ones(1, 2, dtype=torch.bool), alignment


# merged S (after ' 8', P = .5): [.05, .30, .10, .05]; merged T: [.6, .1, .1, .2]
HAND = {
    # sorted [.30, .10, .05, .05] vs [.6, .2, .1, .1]: L1 = .3 + .1 + .05 + .05 = .5; / 2 tokens
    "uld": 0.5 / 2,
    # matched [.30, .10 | rest .60] vs [.6, .2 | rest .2]: KL(T‖S) = .8 ln 2 - .2 ln 3 = .334795;
    # unmatched {.05, .05} vs {.1, .1}: .1; w_m = .8: (.8 · .334795 + .2 · .1) / 2
    "gold": (0.8 * (0.8 * math.log(2) - 0.2 * math.log(3)) + 0.2 * 0.1) / 2,
    # entry 0: pi = [' 8' .9, '7' .1], S_0 = [.5, .2 | rest .3]: .9 ln 1.8 + .1 ln .5 = .459693;
    # entry 1: pi = ['7' .75, '9' .25], S_1 = [.6, .2 | .2]: ln 1.25 = .223144; / 2 tokens
    "aligned_kl": (0.9 * math.log(1.8) + 0.1 * math.log(0.5) + math.log(1.25)) / 2,
    # log S(g) = ln .3, log T(g) = ln .6: sum_g (log S - log T) / 2 = -ln 2 / 2
    "sampled_chunk_reverse_kl": -math.log(2) / 2,
}


@pytest.mark.parametrize("name", XTOK)
def test_hand_worked_one_to_two_group(name):
    logits, teacher, mask, alignment = hand_case()
    out = call(name, logits, teacher, mask, alignment, beta=0.0)
    assert out.loss.item() == pytest.approx(HAND[name], abs=1e-8)
    assert out.metrics["logratio_sum"].item() == pytest.approx(-math.log(2))
    assert out.metrics["tokens_count"].item() == 2 and out.metrics["groups_count"].item() == 1
    value, _, _ = naive_loss(name, logits, teacher, mask, alignment, beta=0.0)
    assert out.loss.item() == pytest.approx(float(value.detach()) / 2, abs=1e-12)
    if name == "gold":
        assert out.metrics["matched_mass_sum"].item() == pytest.approx(0.8)
        assert out.metrics["unmatched_sum"].item() == pytest.approx(0.1)


# ----------------------------------------------------------------------------- random vs naive


NAIVE_CASES = [("uld", 0.4), ("sampled_chunk_reverse_kl", 0.4)] + [
    (name, beta) for name in ("gold", "aligned_kl") for beta in (0.0, 0.4, 1.0)
]


@pytest.mark.parametrize(("name", "beta"), NAIVE_CASES)
def test_matches_naive_loops(name, beta):
    logits, teacher_logits, mask, alignment = random_case(seed=3)
    teacher = torch.log_softmax(teacher_logits / 1.4, -1)
    kw = dict(beta=beta, temperature=1.4, targets_temperature=1.4, num_tokens=30)
    out = call(name, logits, teacher, mask, alignment, **kw)
    value, kl, extras = naive_loss(name, logits, teacher, mask, alignment, beta, temperature=1.4)
    torch.testing.assert_close(out.loss, value / 30, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_of(out, logits), torch.autograd.grad(value / 30, logits)[0])
    assert out.metrics["logratio_sum"].item() == pytest.approx(kl, rel=1e-10)
    assert out.metrics["tokens_count"].item() == mask.sum().item()
    assert out.metrics["groups_count"].item() == alignment.num_groups
    if name == "gold":
        assert out.metrics["matched_sum"].item() == pytest.approx(extras["matched"], rel=1e-10)
        assert out.metrics["unmatched_sum"].item() == pytest.approx(extras["unmatched"], rel=1e-10)
        assert out.metrics["matched_mass_sum"].item() == pytest.approx(extras["mass"], rel=1e-10)
    if name == "aligned_kl":  # the case has entries on the empty table: skipped, counted
        assert out.metrics["proj_skipped_count"].item() == (alignment.proj_table_N == 3).sum()


def test_aligned_kl_coarse_student_token_and_ambiguous_teacher_tokens():
    """Row 0, group 0: the student's one token '<ans>' spells the teacher's '<' + 'ans>' (no
    projection entry; compared as [token, rest] by the chain rule). Group 1: the student's 'x'
    has an entry whose table maps teacher 'x' -> student 'x' and teacher 'xy' -> -1 (a longer
    student token could cover it: ambiguous, so its mass is the teacher's rest)."""
    # student ids: 0 '<ans>', 1 'x', 2 'z'; teacher ids: 0 '<', 1 'ans>', 2 'x', 3 'xy', 4 'q'
    S = torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]]], dtype=torch.float64)
    T = torch.tensor(
        [[[0.8, 0.05, 0.05, 0.05, 0.05], [0.1, 0.5, 0.1, 0.1, 0.2], [0.1, 0.1, 0.6, 0.2, 0.0]]],
        dtype=torch.float64,
    )
    alignment = AlignmentGroups(
        group_row_G=torch.tensor([0, 0]),
        student_pos_G_S=torch.tensor([[0], [1]]), student_tok_G_S=torch.tensor([[0], [1]]),
        teacher_pos_G_T=torch.tensor([[0, 1], [2, -1]]),
        teacher_tok_G_T=torch.tensor([[0, 1], [2, -1]]),
        match_table_G=torch.tensor([0, 0]), match_tables=[(torch.tensor([1]), torch.tensor([2]))],
        proj_row_N=torch.tensor([0]), proj_student_pos_N=torch.tensor([1]),
        proj_teacher_pos_N=torch.tensor([2]), proj_table_N=torch.tensor([0]),
        proj_tables=[(torch.tensor([2, 3]), torch.tensor([1, -1]))],
        exact_G=torch.tensor([True, True]),
    )  # fmt: skip
    logits = S.log().requires_grad_()
    out = call(
        "aligned_kl", logits, T.log(), torch.ones(1, 2, dtype=torch.bool), alignment, beta=0.0
    )
    # group 0: P_T('<ans>') = .8 * .5 = .4 vs P_S = .5: KL([.4, .6] ‖ [.5, .5])
    coarse = 0.4 * math.log(0.4 / 0.5) + 0.6 * math.log(0.6 / 0.5)
    # entry: table mass .6 + .2 = .8: pi('x') = .75, rest .25; student [.5 | rest .5]
    entry = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert out.loss.item() == pytest.approx((coarse + entry) / 2, abs=1e-10)
    assert out.metrics["coarse_count"].item() == 1
    # the rest buckets of the entry: the student's .5 ('<ans>' and 'z'), the teacher's .25 ('xy')
    assert out.metrics["student_rest_sum"].item() == pytest.approx(0.5)
    assert out.metrics["teacher_rest_sum"].item() == pytest.approx(0.25)
    value, _, _ = naive_loss(
        "aligned_kl", logits, T.log(), torch.ones(1, 2, dtype=torch.bool), alignment, beta=0.0
    )
    assert out.loss.item() == pytest.approx(float(value) / 2, abs=1e-12)


@pytest.mark.parametrize("name", XTOK)
def test_the_log_ratio_of_the_realized_text_is_not_called_kl(name):
    """log S - log T of the realized text estimates KL(S‖T) on the student's samples only (on
    teacher-written text it estimates -KL(T‖S), here negative): logged as `logratio`; only
    `sampled_chunk_reverse_kl`, whose loss is that estimate, also calls it kl."""
    logits, teacher, mask, alignment = hand_case()
    out = call(name, logits, teacher, mask, alignment, beta=0.0)
    assert out.metrics["logratio_sum"].item() == pytest.approx(-math.log(2))
    assert ("kl_sum" in out.metrics) == (name == "sampled_chunk_reverse_kl")


def test_aligned_kl_charges_a_student_that_ends_the_teachers_token_early():
    """The student writes 'a' then 'b' where the teacher's text is 'a' | 'b' and it could
    have written 'ab' or 'abc' at once. The entry predicting 'b' sits on a token boundary: the
    teacher's distribution after 'a' (b .6, c .4) conditions on 'a' having ended, which the
    teacher gave .5 against .4 for the longer tokens that go on with 'b' (`_boundaries`):
        e = .5 / .9,  pi(b) = e .6 + .4 / .9 = 7/9,  pi(c) = e .4 = 2/9.
    Built by `build_alignment`, so the tables and the boundary come from the aligner."""
    from distil.align.batch import RowInputs, build_alignment
    from distil.align.tables import MatchTables, ProjectionTables
    from distil.align.vocab_map import VocabBytes

    # student: 0 <eos>, 1 'a', 2 'b', 3 'c', 4 'ab', 5 ' '; teacher: 0 <pad>, 1 </s>, 2 'abc',
    # 3 'a', 4 'b', 5 'c', 6 'ab'
    sv = VocabBytes.from_token_bytes([b"", b"a", b"b", b"c", b"ab", b" "], {0: "eos"})
    tv = VocabBytes.from_token_bytes(
        [b"", b"", b"abc", b"a", b"b", b"c", b"ab"], {0: "pad", 1: "eos"}
    )
    row = RowInputs(
        s_ids=[1, 2], s_offset=1, t_ids=[3, 4], t_offset=1, t_ends=[1, 2], t_bytes=b"ab"
    )
    alignment, _ = build_alignment([row], sv, tv, MatchTables(sv, tv), ProjectionTables(sv, tv))
    assert alignment.proj_prev_tok_N.tolist() == [-1, 3]  # the second entry follows 'a'
    S = torch.tensor(
        [[[0.05, 0.5, 0.1, 0.05, 0.25, 0.05], [0.05, 0.05, 0.5, 0.3, 0.05, 0.05]]],
        dtype=torch.float64,
    )
    T = torch.tensor(
        [[[0.0, 0.0, 0.1, 0.5, 0.1, 0.0, 0.3], [0.0, 0.0, 0.0, 0.0, 0.6, 0.4, 0.0]]],
        dtype=torch.float64,
    )
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = call("aligned_kl", S.log().requires_grad_(), T.log(), mask, alignment, beta=0.0)
    first = 0.4 * math.log(0.4 / 0.25)  # a .5, ab .1 + .3, b .1 against the student's first
    boundary = 7 / 9 * math.log(7 / 9 / 0.5) + 2 / 9 * math.log(2 / 9 / 0.3)
    assert out.loss.item() == pytest.approx((first + boundary) / 2, abs=1e-8)
    assert out.metrics["proj_continue_sum"].item() == pytest.approx(4 / 9)
    # the teacher's share on ' ' (the student's rest) is 0 on both entries
    assert out.metrics["teacher_rest_sum"].item() == pytest.approx(0.0, abs=1e-9)
    # without the boundary the entry would read the teacher after 'a' alone: b .6, c .4
    alignment.proj_prev_tok_N = alignment.proj_prev_table_N = None
    plain = call("aligned_kl", S.log(), T.log(), mask, alignment, beta=0.0)
    conditioned = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.3)
    assert plain.loss.item() == pytest.approx((first + conditioned) / 2, abs=1e-8)


def test_aligned_kl_charges_a_coarse_token_after_a_cut_short_one():
    """Text 'aab': student 'a', 'ab' (one token over the teacher's 'a', 'b'), teacher 'a', 'a',
    'b'. The student's 'ab' has no projection entry and is compared as [token, rest] with the
    teacher's chain rule, P_1('a') P_2('b') = .6 * .7, times the teacher's odds of having ended
    its first 'a' there: e = .5 / (.5 + .3 + .1) (it could have written 'ab' or 'abc')."""
    from distil.align.batch import RowInputs, build_alignment
    from distil.align.tables import MatchTables, ProjectionTables
    from distil.align.vocab_map import VocabBytes

    sv = VocabBytes.from_token_bytes([b"", b"a", b"b", b"c", b"ab", b" "], {0: "eos"})
    tv = VocabBytes.from_token_bytes(
        [b"", b"", b"abc", b"a", b"b", b"c", b"ab"], {0: "pad", 1: "eos"}
    )
    row = RowInputs(
        s_ids=[1, 4], s_offset=1, t_ids=[3, 3, 4], t_offset=1, t_ends=[1, 2, 3], t_bytes=b"aab"
    )
    alignment, _ = build_alignment([row], sv, tv, MatchTables(sv, tv), ProjectionTables(sv, tv))
    assert alignment.group_prev_tok_G.tolist() == [-1, 3]
    S = torch.tensor(
        [[[0.05, 0.5, 0.1, 0.05, 0.25, 0.05], [0.05, 0.2, 0.1, 0.05, 0.55, 0.05]]],
        dtype=torch.float64,
    )
    T = torch.tensor(
        [
            [
                [0.0, 0.0, 0.1, 0.5, 0.1, 0.0, 0.3],
                [0.0, 0.0, 0.0, 0.6, 0.2, 0.0, 0.2],
                [0.0, 0.0, 0.0, 0.0, 0.7, 0.3, 0.0],
            ]
        ],
        dtype=torch.float64,
    )
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = call("aligned_kl", S.log(), T.log(), mask, alignment, beta=0.0)
    first = 0.4 * math.log(0.4 / 0.25)
    p, s = 0.6 * 0.7 * 0.5 / 0.9, 0.55
    binary = p * math.log(p / s) + (1 - p) * math.log((1 - p) / (1 - s))
    assert out.metrics["coarse_count"].item() == 1
    assert out.loss.item() == pytest.approx((first + binary) / 2, abs=1e-8)
    # the log-ratio metric stays the realized text's: log T(g) by the chain rule alone
    want = math.log(0.5 * 0.55) - math.log(0.5 * 0.6 * 0.7)
    assert out.metrics["logratio_sum"].item() == pytest.approx(want)
