"""Chunked == unchunked for every loss (values, metrics, gradients); no (N, V) saved at once."""

from __future__ import annotations

import pytest
import torch

from distil.losses import CROSS_TOKENIZER_LOSSES, StudentHidden, get_loss, list_losses
from distil.types import TeacherTargets

CASES = [
    (name, kind) for name in ("forward_kl", "reverse_kl", "jsd") for kind in ("dense", "sparse")
]
CASES.append(("sampled_reverse_kl", "tokens"))
CASES.append(("sft", "tokens"))


def test_cases_cover_every_registered_loss():
    # the cross-tokenizer losses need AlignmentGroups: tests/unit/losses/test_crosstok.py; grpo
    # needs per-row advantages and has no ce_weight (on-policy only): test_reward.py has its
    # chunked == unchunked (logits and hidden + head) and all-masked cases
    others = CROSS_TOKENIZER_LOSSES | {"grpo"}
    assert {name for name, _ in CASES} == set(list_losses()) - others


def make_case(kind, seed=0, B=3, T=7, H=6, V=29):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g).requires_grad_()
    bias = (torch.randn(V, generator=g) * 0.1).requires_grad_()
    teacher = torch.log_softmax(torch.randn(B, T, V, generator=g) * 2, -1)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 2:] = True
    mask[1, 1:4] = True
    mask[2, 3:] = True  # N = 5 + 3 + 4 = 12 rows
    labels = torch.randint(0, V, (B, T), generator=g)
    tokens = teacher.gather(-1, labels[..., None])[..., 0]
    if kind == "dense":
        targets = TeacherTargets(logprobs_B_T_V=teacher, token_logprobs_B_T=tokens)
    elif kind == "sparse":
        vals, ids = teacher.topk(5, -1)
        rest = torch.log(-torch.expm1(torch.logsumexp(vals, -1)))
        targets = TeacherTargets(
            topk_ids_B_T_K=ids, topk_logprobs_B_T_K=vals, rest_logprob_B_T=rest
        )
    else:
        targets = TeacherTargets(token_logprobs_B_T=tokens)
    return hidden, weight, bias, targets, mask, labels


def call(name, student, targets, mask, labels, chunk_size, targets_temperature=1.0):
    return get_loss(name)(
        student,
        targets,
        mask,
        num_tokens=20,
        labels_B_T=labels,
        chunk_size=chunk_size,
        beta=0.3,
        temperature=1.3,
        targets_temperature=targets_temperature,
    )


@pytest.mark.parametrize(("name", "kind"), CASES)
@pytest.mark.parametrize("chunk_size", [1, 5, 7])  # N = 12: 5 and 7 do not divide it
def test_chunked_equals_unchunked(name, kind, chunk_size):
    hidden, weight, bias, targets, mask, labels = make_case(kind)
    tt = 1.3 if kind != "dense" else 1.0  # sparse/token targets must be at the loss temperature
    params = (hidden, weight, bias)

    # reference: plain logits, unchunked
    ref = call(
        name,
        torch.nn.functional.linear(hidden, weight, bias),
        targets,
        mask,
        labels,
        None,
        targets_temperature=tt,
    )
    ref_grads = torch.autograd.grad(ref.loss, params)

    # hidden + head, chunked (checkpointed)
    out = call(
        name,
        StudentHidden(hidden, weight, bias),
        targets,
        mask,
        labels,
        chunk_size,
        targets_temperature=tt,
    )
    grads = torch.autograd.grad(out.loss, params)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-7)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    assert out.metrics.keys() == ref.metrics.keys()
    for key, value in out.metrics.items():
        torch.testing.assert_close(value, ref.metrics[key], rtol=1e-5, atol=1e-6)

    # plain logits, chunked: gradients w.r.t. the logits
    logits = torch.nn.functional.linear(hidden, weight, bias).detach().requires_grad_()
    a = call(name, logits, targets, mask, labels, None, targets_temperature=tt)
    (ga,) = torch.autograd.grad(a.loss, logits)
    b = call(name, logits, targets, mask, labels, chunk_size, targets_temperature=tt)
    (gb,) = torch.autograd.grad(b.loss, logits)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-7)
    assert gb.abs().sum() > 0 and torch.all(gb[~mask] == 0)


def test_hidden_path_without_bias():
    hidden, weight, _, targets, mask, labels = make_case("dense", seed=1)
    a = call("jsd", StudentHidden(hidden, weight), targets, mask, labels, 5)
    b = call("jsd", hidden @ weight.T, targets, mask, labels, None)
    torch.testing.assert_close(a.loss, b.loss)
    ga = torch.autograd.grad(a.loss, (hidden, weight))
    gb = torch.autograd.grad(b.loss, (hidden, weight))
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def saved_numel(fn, inputs):
    """Elements of the new storages autograd saves (outside checkpointed regions) during fn.

    Storages of `inputs` (the hidden states and the head, alive anyway) are not counted.
    """
    skip = {t.untyped_storage().data_ptr() for t in inputs}
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


@pytest.mark.parametrize(("name", "kind"), [("jsd", "dense"), ("forward_kl", "sparse")])
def test_chunked_forward_keeps_no_full_vocab_rows(name, kind):
    hidden, weight, bias, targets, mask, labels = make_case(kind, seed=2, H=4, V=64)
    n, V = int(mask.sum()), weight.shape[0]
    student = StudentHidden(hidden, weight, bias)
    kw = dict(targets_temperature=1.3 if kind == "sparse" else 1.0)
    inputs = (hidden, weight, bias)
    out, chunked = saved_numel(lambda: call(name, student, targets, mask, labels, 3, **kw), inputs)
    _, unchunked = saved_numel(
        lambda: call(name, student, targets, mask, labels, None, **kw), inputs
    )
    assert unchunked >= n * V  # control: the unchunked path keeps (N, V) tensors
    assert chunked < n * V / 4  # chunked: only the selected hidden rows and per-row values
    hidden_grad = torch.autograd.grad(out.loss, hidden)[0]
    assert torch.isfinite(hidden_grad).all() and hidden_grad.abs().sum() > 0


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_all_masked_is_exact_zero_with_zero_gradients(name, kind):
    hidden, weight, bias, targets, mask, labels = make_case(kind, seed=3)
    tt = 1.3 if kind != "dense" else 1.0
    mask = torch.zeros_like(mask)
    for chunk_size in (None, 4):
        student = StudentHidden(hidden, weight, bias)
        out = get_loss(name)(
            student,
            targets,
            mask,
            num_tokens=0,
            labels_B_T=labels,
            chunk_size=chunk_size,
            temperature=1.3,
            targets_temperature=tt,
        )
        assert out.loss.item() == 0.0 and out.loss.requires_grad
        grads = torch.autograd.grad(out.loss, (hidden, weight, bias))
        for g in grads:
            assert torch.isfinite(g).all() and torch.all(g == 0)
        assert all(v.item() == 0 for v in out.metrics.values())
    logits = (hidden @ weight.T).detach().requires_grad_()
    out = get_loss(name)(logits, targets, mask, num_tokens=0, labels_B_T=labels)
    (g,) = torch.autograd.grad(out.loss, logits)
    assert out.loss.item() == 0.0 and torch.all(g == 0)


def test_bf16_hidden_path_is_finite_and_close_to_fp32():
    hidden, weight, bias, targets, mask, labels = make_case("dense", seed=4)
    ref = call("jsd", StudentHidden(hidden, weight, bias), targets, mask, labels, 5)
    h16 = hidden.detach().bfloat16().requires_grad_()
    w16 = weight.detach().bfloat16().requires_grad_()
    out = call("jsd", StudentHidden(h16, w16, bias.detach().bfloat16()), targets, mask, labels, 5)
    gh, gw = torch.autograd.grad(out.loss, (h16, w16))
    assert gh.dtype == torch.bfloat16 and torch.isfinite(gh).all() and torch.isfinite(gw).all()
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=3e-2)


def test_bad_chunk_size_raises():
    hidden, weight, bias, targets, mask, labels = make_case("dense")
    with pytest.raises(ValueError, match="chunk_size"):
        call("jsd", StudentHidden(hidden, weight, bias), targets, mask, labels, 0)


@pytest.mark.parametrize(("name", "kind"), CASES)
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_ce_weight_adds_weighted_cross_entropy_at_temperature_one(name, kind, chunk_size):
    hidden, weight, bias, targets, mask, labels = make_case(kind)
    student = StudentHidden(hidden, weight, bias)
    kwargs = dict(
        num_tokens=20,
        labels_B_T=labels,
        chunk_size=chunk_size,
        beta=0.3,
        temperature=1.3,
        targets_temperature=1.0 if kind == "dense" else 1.3,
    )
    fn = get_loss(name)
    base = fn(student, targets, mask, **kwargs)
    with_ce = fn(student, targets, mask, ce_weight=0.7, **kwargs)
    logits = hidden @ weight.T + bias  # CE ignores the distillation temperature
    ce = -torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0][mask]
    torch.testing.assert_close(with_ce.loss - base.loss, 0.7 * ce.sum() / 20)
    torch.testing.assert_close(with_ce.metrics["ce_sum"], ce.sum().detach())
    assert "ce_sum" not in base.metrics
