"""Window normalization: micro-batch splits do not change gradients, for every loss."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from distil.losses import (
    CROSS_TOKENIZER_LOSSES,
    count_loss_tokens,
    get_loss,
    list_losses,
    token_sum_over,
)
from distil.types import TeacherTargets

CASES = [
    (name, kind) for name in ("forward_kl", "reverse_kl", "jsd") for kind in ("dense", "sparse")
]
CASES.append(("sampled_reverse_kl", "tokens"))
CASES.append(("sft", "tokens"))
CASES.append(("grpo", "tokens"))  # a task's reward: per-row advantages (ADVANTAGES)
# grpo's per-row advantages of ragged_batch's 8 rows (two groups of four)
ADVANTAGES = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.8, -0.2, 0.3, -0.9])


def test_cases_cover_every_registered_loss():
    # the cross-tokenizer losses need AlignmentGroups; tests/unit/losses/test_crosstok.py
    assert {name for name, _ in CASES} == set(list_losses()) - CROSS_TOKENIZER_LOSSES


def test_count_and_token_sum():
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert count_loss_tokens(mask).item() == 3
    values = torch.tensor([1.0, 2.0, 3.0])
    assert token_sum_over(values, 4).item() == 1.5
    assert token_sum_over(values, torch.tensor(4)).item() == 1.5  # int tensor count
    assert token_sum_over(values[:0], 0).item() == 0.0  # empty window: 0, not NaN


def ragged_batch(kind, B=8, T=10, V=13, seed=0):
    """Rows with different prompt lengths and completion lengths (right padding)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 2
    teacher = torch.log_softmax(torch.randn(B, T, V, generator=g) * 2, -1)
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, (prompt, completion) in enumerate(
        [(1, 8), (3, 2), (2, 5), (4, 1), (1, 3), (5, 5), (2, 7), (6, 2)]
    ):
        mask[b, prompt : prompt + completion] = True
    tokens = teacher.gather(-1, labels[..., None])[..., 0]
    if kind == "dense":
        targets = TeacherTargets(logprobs_B_T_V=teacher)
    elif kind == "sparse":
        vals, ids = teacher.topk(4, -1)
        rest = torch.log(-torch.expm1(torch.logsumexp(vals, -1)))
        targets = TeacherTargets(
            topk_ids_B_T_K=ids, topk_logprobs_B_T_K=vals, rest_logprob_B_T=rest
        )
    else:
        targets = TeacherTargets(token_logprobs_B_T=tokens)
    return logits, targets, mask, labels


def rows(targets, sl):
    return replace(
        targets,
        **{f.name: v[sl] for f in fields(targets) if (v := getattr(targets, f.name)) is not None},
    )


def accumulated_grad(name, logits, targets, mask, labels, micro, normalize="window"):
    """Backward per micro-batch into one leaf, as the loop does with gradient accumulation."""
    leaf = logits.clone().requires_grad_()
    window = int(mask.sum())
    for start in range(0, leaf.shape[0], micro):
        sl = slice(start, start + micro)
        num_tokens = window if normalize == "window" else int(mask[sl].sum())
        reward = {"advantages_B": ADVANTAGES[sl]} if name == "grpo" else {}
        out = get_loss(name)(
            leaf[sl],
            rows(targets, sl),
            mask[sl],
            num_tokens=num_tokens,
            labels_B_T=labels[sl],
            beta=0.3,
            **reward,
        )
        out.loss.backward()
    return leaf.grad


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_micro_batch_split_does_not_change_gradients(name, kind):
    logits, targets, mask, labels = ragged_batch(kind)
    whole = accumulated_grad(name, logits, targets, mask, labels, micro=8)
    assert whole.abs().sum() > 0
    for micro in (2, 1):  # micro 2 x accum 4, micro 1 x accum 8
        split = accumulated_grad(name, logits, targets, mask, labels, micro=micro)
        torch.testing.assert_close(split, whole, rtol=0, atol=1e-6)
    # control: a per-micro-batch mean weights short micro-batches more and changes the gradient
    local = accumulated_grad(name, logits, targets, mask, labels, micro=2, normalize="local")
    assert (local - whole).abs().max() > 1e-3
