"""A task's reward as a loss (losses/reward.py): GRPO's group-relative advantage and its clipped
policy gradient, against hand computations and a direct REINFORCE loop; `with_reward` adds it
to a distillation loss and is the loss itself at weight 0."""

from __future__ import annotations

import math

import pytest
import torch

from distil.losses import StudentHidden, get_loss, group_advantages, with_reward
from distil.types import TeacherTargets

grpo = get_loss("grpo")


def case(seed=0, B=4, T=7, V=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 2
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, (start, n) in enumerate([(1, 5), (2, 2), (0, 6), (3, 1)][:B]):
        mask[b, start : start + n] = True
    advantages = torch.tensor([1.5, -0.5, -0.5, 0.25][:B])
    return logits, labels, mask, advantages


def run(logits, mask, labels, advantages, **kw):
    leaf = logits.clone().requires_grad_()
    n = kw.pop("num_tokens", int(mask.sum()))
    out = grpo(leaf, None, mask, num_tokens=n, labels_B_T=labels, advantages_B=advantages, **kw)
    (grad,) = torch.autograd.grad(out.loss, leaf)
    return out, grad


def test_group_advantages_by_hand():
    # group 1: rewards 1, 0, 0, 0: mean 0.25, sample std (N-1) sqrt((0.75² + 3 · 0.25²) / 3) = 0.5
    # -> (0.75, -0.25, -0.25, -0.25) / (0.5 + 1e-6); group 2: all 0.1 -> no signal, 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1])
    a = group_advantages(rewards, 4)
    want = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6)
    torch.testing.assert_close(a[:4], want, rtol=1e-6, atol=1e-7)
    assert a[4:].abs().max().item() < 1e-6
    centred = group_advantages(rewards, 4, normalize_std=False)  # Dr. GRPO: no division
    torch.testing.assert_close(centred[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(rewards, 3)


@pytest.mark.parametrize("size", [3, 6, 7])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_a_flat_group_has_advantage_exactly_zero(size, normalize_std):
    # the mean of `size` x 0.1 rounds away from 0.1 (1.4e-17; 1.4e-11 after / (0 + 1e-6))
    rewards = torch.tensor([0.1] * size + [1.0] + [0.0] * (size - 1), dtype=torch.float64)
    a = group_advantages(rewards, size, normalize_std=normalize_std)
    assert a[:size].tolist() == [0.0] * size
    assert (a[size:] != 0).all()  # a group with a signal keeps its advantages


def test_hand_worked_value_and_gradient():
    # logits [0, 0] at both positions -> S = [1/2, 1/2]; sampled token 0 twice; advantage 2.
    # loss = sum_t -A · ρ_t / N = -2 (ρ = 1, N = 2); ∂/∂z_t = -A/N (onehot(0) - S) = [-1/2, 1/2]
    logits = torch.zeros(1, 2, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out, grad = run(logits, mask, torch.zeros(1, 2, dtype=torch.long), torch.tensor([2.0]))
    assert out.loss.item() == pytest.approx(-2.0, abs=1e-6)
    torch.testing.assert_close(grad[0], torch.tensor([[-0.5, 0.5], [-0.5, 0.5]]))
    assert out.metrics["advantage_sum"].item() == pytest.approx(4.0)  # per token: 2 x 2 tokens
    assert out.metrics["student_logprob_sum"].item() == pytest.approx(2 * math.log(0.5))
    assert out.metrics["ratio_clipped_sum"].item() == 0.0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradient_equals_a_direct_reinforce_loop(temperature):
    # REINFORCE with the group baseline: sum over loss tokens of -A_b log S_T(x_t), / N
    logits, labels, mask, adv = case()
    n = int(mask.sum())
    out, grad = run(logits, mask, labels, adv, sampling_temperature=temperature)
    leaf = logits.clone().requires_grad_()
    surrogate = torch.zeros(())
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                lp = torch.log_softmax(leaf[b, t] / temperature, -1)[labels[b, t]]
                surrogate = surrogate - adv[b] * lp
    (ref,) = torch.autograd.grad(surrogate / n, leaf)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    want_value = -sum(adv[b].item() * int(mask[b].sum()) for b in range(4)) / n
    assert out.loss.item() == pytest.approx(want_value, abs=1e-6)


def test_clipped_ratio_against_the_lagging_sampler():
    # per token: -min(ρ A, clip(ρ, 0.8, 1.2) A), ρ = exp(lp - lp_old), a loop over the tokens
    logits, labels, mask, adv = case(seed=1)
    lp = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    g = torch.Generator().manual_seed(3)
    old = lp + torch.randn(lp.shape, generator=g) * 0.4  # some ratios far outside [0.8, 1.2]
    out, grad = run(logits, mask, labels, adv, sampling_logprobs_B_T=old, importance_ratio=True)
    n = int(mask.sum())
    leaf = logits.clone().requires_grad_()
    total, clipped = torch.zeros(()), 0
    for b, t in mask.nonzero().tolist():
        rho = torch.exp(torch.log_softmax(leaf[b, t], -1)[labels[b, t]] - old[b, t])
        a = adv[b]
        total = total - torch.minimum(rho * a, rho.clamp(0.8, 1.2) * a)
        clipped += int((rho.clamp(0.8, 1.2) * a < rho * a).item())
    (ref,) = torch.autograd.grad(total / n, leaf)
    torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7)
    assert out.loss.item() == pytest.approx(total.item() / n, rel=1e-5)
    assert 0 < clipped < n and out.metrics["ratio_clipped_sum"].item() == clipped
    # the sampler's own log-probs (no lag): the synchronous loss, value and gradient
    same, same_grad = run(logits, mask, labels, adv, sampling_logprobs_B_T=lp,
                          importance_ratio=True)  # fmt: skip
    sync, sync_grad = run(logits, mask, labels, adv)
    assert same.loss.item() == pytest.approx(sync.loss.item(), abs=1e-6)
    torch.testing.assert_close(same_grad, sync_grad, rtol=1e-5, atol=1e-7)


def test_chunked_equals_unchunked_and_all_masked_is_zero():
    logits, labels, mask, adv = case(seed=2)
    full, g_full = run(logits, mask, labels, adv, chunk_size=None)
    chunked, g_chunked = run(logits, mask, labels, adv, chunk_size=3)
    assert chunked.loss.item() == pytest.approx(full.loss.item(), abs=1e-6)
    torch.testing.assert_close(g_chunked, g_full, rtol=1e-5, atol=1e-7)
    for k, v in full.metrics.items():
        torch.testing.assert_close(chunked.metrics[k], v, rtol=1e-5, atol=1e-6)
    empty, g_empty = run(logits, torch.zeros_like(mask), labels, adv, num_tokens=0)
    assert empty.loss.item() == 0.0 and torch.isfinite(g_empty).all() and g_empty.abs().sum() == 0


def test_hidden_states_and_head_chunked_equal_the_logits():
    # the memory-lean path: hidden states + head, chunked and checkpointed, against logits
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(4, 7, 6, generator=g, requires_grad=True)
    weight = torch.randn(11, 6, generator=g).requires_grad_()
    _, labels, mask, adv = case(seed=5)
    opts = dict(num_tokens=int(mask.sum()), labels_B_T=labels, advantages_B=adv,
                sampling_temperature=0.8)  # fmt: skip
    ref = grpo(hidden @ weight.T, None, mask, **opts)
    ref_grads = torch.autograd.grad(ref.loss, (hidden, weight))
    out = grpo(StudentHidden(hidden, weight), None, mask, chunk_size=4, **opts)
    grads = torch.autograd.grad(out.loss, (hidden, weight))
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden", [False, True])
def test_policy_rows_leave_padding_rows_out_of_log_s(hidden):
    # a vocabulary padded past its tokenizer (8 real rows of 11): the sampler draws from the
    # 8, so its log-probs are log_softmax over them; with policy_rows=8 the loss is the loss of
    # the logits cut to them, and ρ = 1 exactly at no lag (without: log ρ = log(1 - padding))
    g = torch.Generator().manual_seed(6)
    h = torch.randn(4, 7, 5, generator=g)
    weight = torch.randn(11, 5, generator=g)
    _, labels, mask, adv = case(seed=6)
    labels = labels % 8
    cut = h @ weight[:8].T
    old = torch.log_softmax(cut / 0.7, -1).gather(-1, labels[..., None])[..., 0]
    opts = dict(num_tokens=int(mask.sum()), labels_B_T=labels, advantages_B=adv,
                sampling_temperature=0.7, sampling_logprobs_B_T=old,
                importance_ratio=True)  # fmt: skip

    def loss_and_grad(w, **kw):
        leaf = h.clone().requires_grad_()
        student = StudentHidden(leaf, w) if hidden else leaf @ w.T
        out = grpo(student, None, mask, **opts, **kw)
        return out, torch.autograd.grad(out.loss, leaf)[0]

    want, g_want = loss_and_grad(weight[:8])
    got, g_got = loss_and_grad(weight, policy_rows=8)
    assert got.loss.item() == pytest.approx(want.loss.item(), abs=1e-6)
    torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)
    assert got.metrics["ratio_clipped_sum"].item() == 0.0  # ρ = 1: the clip binds nowhere
    n, a_sum = int(mask.sum()), got.metrics["advantage_sum"].item()
    assert got.loss.item() == pytest.approx(-a_sum / n, abs=1e-6)  # -A per token: ρ = 1
    padded, _ = loss_and_grad(weight)  # the control: padding rows in log S bias ρ
    assert padded.metrics["ratio_clipped_sum"].item() > 0


def test_with_reward_is_the_loss_plus_weight_times_grpo():
    logits, labels, mask, adv = case(seed=4)
    teacher = TeacherTargets(logprobs_B_T_V=torch.log_softmax(torch.randn(logits.shape), -1))
    base = get_loss("forward_kl")
    assert with_reward(base, 0.0) is base  # weight 0: today's distillation, the same function
    combined = with_reward(base, 0.5)
    n = int(mask.sum())

    def value_and_grad(fn, **kw):
        leaf = logits.clone().requires_grad_()
        out = fn(leaf, teacher, mask, num_tokens=n, labels_B_T=labels, **kw)
        return out, torch.autograd.grad(out.loss, leaf)[0]

    both, g_both = value_and_grad(combined, advantages_B=adv)
    kl, g_kl = value_and_grad(base)
    pg, g_pg = value_and_grad(grpo, advantages_B=adv)
    assert both.loss.item() == pytest.approx(kl.loss.item() + 0.5 * pg.loss.item(), abs=1e-6)
    torch.testing.assert_close(g_both, g_kl + 0.5 * g_pg, rtol=1e-5, atol=1e-7)
    m = both.metrics
    assert m["distill_loss_sum"].item() == pytest.approx(kl.metrics["loss_sum"].item())
    assert m["loss_sum"].item() == pytest.approx(
        kl.metrics["loss_sum"].item() + 0.5 * pg.metrics["loss_sum"].item(), abs=1e-5
    )
    # a micro-batch without advantages (an off-policy slice): the distillation loss alone
    alone, g_alone = value_and_grad(combined)
    assert alone.loss.item() == kl.loss.item() and torch.equal(g_alone, g_kl)


def test_logged_distill_loss_is_a_mean_over_the_on_policy_tokens_when_lambda_mixes():
    # train.lambda < 1: a window of one on-policy micro-batch (with advantages) and one
    # off-policy one (without); the logged distill_loss is the on-policy distillation loss,
    # not diluted by the off-policy tokens, and reward_loss the reward term over its tokens
    from types import SimpleNamespace

    from distil.train.metrics import add_metrics, step_metrics

    logits, labels, mask, adv = case(seed=9)
    teacher = TeacherTargets(logprobs_B_T_V=torch.log_softmax(torch.randn(logits.shape), -1))
    base = get_loss("forward_kl")
    combined = with_reward(base, 1.0)
    n_window = 2 * int(mask.sum())
    sums = {}
    on = combined(logits, teacher, mask, num_tokens=n_window, labels_B_T=labels,
                  advantages_B=adv, reward_num_tokens=n_window)  # fmt: skip
    add_metrics(sums, on.metrics, "on_policy")
    off = combined(logits.flip(0), teacher, mask, num_tokens=n_window, labels_B_T=labels)
    add_metrics(sums, off.metrics, "off_policy")
    window = SimpleNamespace(metrics={}, micro_batches=[])
    m = step_metrics(1, sums, window, torch.tensor(0.0), 1e-3, True, 0.0, 0.0, 0.0)
    n = int(mask.sum())
    kl_mean = base(logits, teacher, mask, num_tokens=n, labels_B_T=labels).loss.item()
    pg_mean = grpo(logits, teacher, mask, num_tokens=n, labels_B_T=labels, advantages_B=adv)
    assert m["distill_loss"] == pytest.approx(kl_mean, rel=1e-5)
    assert m["reward_loss"] == pytest.approx(pg_mean.loss.item(), rel=1e-5, abs=1e-7)
    # same tokenizer: the on-policy slices' loss is the two parts added
    assert m["loss/on_policy"] == pytest.approx(kl_mean + pg_mean.loss.item(), rel=1e-5)


def test_with_reward_trains_its_own_mask_over_its_own_count():
    # cross-tokenizer: the distillation term reads the aligned tokens (a narrowed mask), the
    # reward term every sampled token, each divided by its own count in the window
    logits, labels, mask, adv = case(seed=7)
    teacher = TeacherTargets(logprobs_B_T_V=torch.log_softmax(torch.randn(logits.shape), -1))
    aligned = mask.clone()
    aligned[0, 2] = aligned[2, 1] = aligned[2, 5] = False  # three unaligned tokens
    n_a, n_c = int(aligned.sum()), int(mask.sum())
    base, combined = get_loss("forward_kl"), with_reward(get_loss("forward_kl"), 0.5)

    def value_and_grad(fn, m, n, **kw):
        leaf = logits.clone().requires_grad_()
        out = fn(leaf, teacher, m, num_tokens=n, labels_B_T=labels, **kw)
        return out, torch.autograd.grad(out.loss, leaf)[0]

    both, g_both = value_and_grad(combined, aligned, n_a, advantages_B=adv,
                                  reward_mask_B_T=mask, reward_num_tokens=n_c)  # fmt: skip
    kl, g_kl = value_and_grad(base, aligned, n_a)
    pg, g_pg = value_and_grad(grpo, mask, n_c, advantages_B=adv)
    assert both.loss.item() == pytest.approx(kl.loss.item() + 0.5 * pg.loss.item(), abs=1e-6)
    torch.testing.assert_close(g_both, g_kl + 0.5 * g_pg, rtol=1e-5, atol=1e-7)
    m = both.metrics
    assert m["tokens_count"].item() == n_a and m["reward_tokens_count"].item() == n_c
    assert m["reward_loss_sum"].item() == pytest.approx(pg.metrics["loss_sum"].item())
    assert m["advantage_sum"].item() == pytest.approx(pg.metrics["advantage_sum"].item())
    assert m["loss_sum"].item() / n_a == pytest.approx(both.loss.item(), abs=1e-6)  # the loss
    wrong, _ = value_and_grad(grpo, aligned, n_a, advantages_B=adv)  # aligned tokens only
    assert abs(wrong.loss.item() - pg.loss.item()) > 1e-3


def test_bad_inputs_name_what_is_missing():
    logits, labels, mask, adv = case()
    with pytest.raises(ValueError, match="needs advantages_B"):
        grpo(logits, None, mask, num_tokens=1, labels_B_T=labels)
    with pytest.raises(ValueError, match=r"expected \(4,\)"):
        grpo(logits, None, mask, num_tokens=1, labels_B_T=labels, advantages_B=adv[:2])
    with pytest.raises(ValueError, match="sampling_logprobs_B_T"):
        grpo(logits, None, mask, num_tokens=1, labels_B_T=labels, advantages_B=adv,
             importance_ratio=True)  # fmt: skip
    with pytest.raises(ValueError, match="finite number >= 0"):
        with_reward(grpo, float("nan"))
