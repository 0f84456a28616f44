"""The live teacher's scoring memory: the head and log-softmax run only on the positions a loss
reads, in chunks of the loss's auto rule, written into one output; no (B, T, V) copies, no
division at temperature 1; an FSDP teacher runs under no_grad; the previous micro-batch's
targets are gone before the next is scored; packing's unpack builds one output.

The tensors an operation creates are seen with a TorchDispatchMode (sizes, not timings)."""

from __future__ import annotations

import weakref

import pytest
import torch
from alloc_probe import Created

from distil.data.collate import collate
from distil.data.packing import plan_packing, unpack
from distil.teacher import live
from distil.teacher.live import LiveTeacher
from distil.testing import tiny_llama
from distil.types import Sample

V = 1000  # larger than every hidden width of the tiny model


def _batch(prompt=6, lengths=(9, 3, 12, 5)):
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(i, torch.randint(3, V, (prompt,), generator=g).tolist(),
               torch.randint(3, V, (n,), generator=g).tolist(), "off_policy")
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    return collate(samples, pad_id=0)


def _reference(model, batch, temperature=1.0):
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L
        ).logits[:, :-1]
    return torch.log_softmax(logits / temperature, -1)


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("top_k", [None, 5])
def test_only_the_loss_rows_go_through_the_head_and_no_full_copy_is_made(top_k, packing):
    model = tiny_llama(V, seed=3)
    batch = _batch()
    b, t = batch.mask_B_T.shape
    n = int(batch.mask_B_T.sum())
    with Created() as seen:
        out = LiveTeacher(model, top_k=top_k, packing=packing).score(batch)
    softmax_rows = [s[0] for op, _, s in seen.seen if op == "_log_softmax"]
    assert sum(softmax_rows) == n < b * t  # prompt and padding rows cost nothing
    # the (B, T, V) output (top-k: none) is the only full-size allocation: no logits of every
    # position, no reshape copy, no gathered copy
    assert seen.allocations(b * t * V * 4) == (1 if top_k is None else 0)
    ref = _reference(model, batch)
    m = batch.mask_B_T
    if top_k is None:
        torch.testing.assert_close(out.logprobs_B_T_V[m], ref[m], atol=1e-5, rtol=1e-5)
        assert torch.isfinite(out.logprobs_B_T_V).all()  # unread rows: finite filler
    else:
        torch.testing.assert_close(
            out.topk_logprobs_B_T_K[m], ref.topk(top_k, -1).values[m], atol=1e-5, rtol=1e-5
        )
    tok = ref.gather(-1, batch.labels_B_T[..., None])[..., 0]
    torch.testing.assert_close(out.token_logprobs_B_T[m], tok[m], atol=1e-5, rtol=1e-5)


def test_chunks_follow_the_losses_auto_rule(monkeypatch):
    asked = []

    def rule(vocab):
        asked.append(vocab)
        return 4

    monkeypatch.setattr(live, "auto_chunk_size", rule)
    model = tiny_llama(V, seed=3)
    batch = _batch()
    with Created() as seen:
        LiveTeacher(model, top_k=5).score(batch)
    rows = [s[0] for op, _, s in seen.seen if op == "_log_softmax"]
    assert asked == [V] and max(rows) == 4 and sum(rows) == int(batch.mask_B_T.sum())


def test_no_division_at_temperature_one():
    model = tiny_llama(V, seed=3)
    batch = _batch()
    for temperature, divisions in ((1.0, 0), (2.0, 1)):
        with Created() as seen:
            out = LiveTeacher(model, temperature=temperature).score(batch)
        big_divs = [s for op, _, s in seen.seen if op == "div" and s[-1:] == (V,)]
        assert len(big_divs) == divisions  # one chunk here
        m = batch.mask_B_T
        ref = _reference(model, batch, temperature)
        torch.testing.assert_close(out.logprobs_B_T_V[m], ref[m], atol=1e-5, rtol=1e-5)


def test_an_fsdp_teacher_runs_under_no_grad_not_inference_mode():
    from torch.distributed.fsdp import FSDPModule

    model = tiny_llama(V, seed=3)
    modes = []
    inner = model.model.forward  # the decoder: the teacher's own path and the sharded one's

    def spy(**kw):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return inner(**kw)

    model.model.forward = spy
    batch = _batch()
    plain_teacher = LiveTeacher(model)  # its one-time logits check runs the decoder too
    modes.clear()
    plain = plain_teacher.score(batch)
    model.__class__ = type("FSDPLlama", (FSDPModule, type(model)), {})  # as fully_shard does
    sharded_teacher = LiveTeacher(model)  # no check: a sharded teacher scores whole logits
    sharded = sharded_teacher.score(batch)
    assert modes == [(True, False), (False, False)]
    m = batch.mask_B_T
    torch.testing.assert_close(sharded.logprobs_B_T_V[m], plain.logprobs_B_T_V[m])


def test_unpack_makes_one_output_and_no_zero_buffer():
    lengths = [5, 2, 7, 3]
    plan = plan_packing(lengths, 7, 9)
    y = torch.randn(*plan.shape_R_P, 11, requires_grad=True)
    with Created() as seen:
        out = unpack(y, plan)
    assert seen.allocations(4 * 7 * 11 * 4) == 1  # the output, filled in place
    flat = y.detach().reshape(-1, 11)
    for i, n in enumerate(lengths):
        at = (plan.padded_index_N >= i * 7) & (plan.padded_index_N < i * 7 + n)
        assert torch.equal(out[i, :n].detach(), flat[plan.packed_index_N[at]])
        assert not out[i, n:].detach().any()
    out.sum().backward()
    assert y.grad.sum() == sum(lengths) * 11  # only real tokens get gradient


def test_previous_targets_are_released_before_the_next_micro_batch_is_scored(
    monkeypatch, make_train_config
):
    from distil.config import build_config
    from distil.train import loop

    alive: list[weakref.ref] = []
    checked = []
    score = LiveTeacher.score

    def spy(self, batch):
        checked.append([r() is not None for r in alive])
        out = score(self, batch)
        alive[:] = [weakref.ref(out.logprobs_B_T_V)]
        return out

    monkeypatch.setattr(LiveTeacher, "score", spy)
    cfg = build_config(make_train_config(train={"max_steps": 1, "lambda": 0.0}))
    loop.train(cfg)
    assert len(checked) == 2 and checked[1] == [False]  # grad_accum_steps = 2


def test_a_soft_capped_teacher_is_scored_as_its_own_forward_scores():
    """Gemma 2's final_logit_softcapping (logits = cap * tanh(logits / cap)) comes after the
    head, which the teacher applies itself: its targets equal the model's whole forward."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, final_logit_softcapping=3.0,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits well past the cap: the tanh bends them
    batch = _batch()
    out = LiveTeacher(model).score(batch)
    m = batch.mask_B_T
    ref = _reference(model, batch)
    torch.testing.assert_close(out.logprobs_B_T_V[m], ref[m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_rows", [None, 3])
def test_one_host_read_per_micro_batch_however_many_chunks(chunk_rows):
    """The finite check of every chunk is read back once, after the last chunk is queued
    (`aten._local_scalar_dense` is what bool() / .item() / int() of a tensor run)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    model = tiny_llama(V, seed=3)
    batch = _batch()
    n = int(batch.mask_B_T.sum())
    scorer = LiveTeacher(model, chunk_rows=chunk_rows)
    with Reads():
        out = scorer.score(batch)
    assert n > 3 * 5  # several chunks of 3 rows
    assert Reads.count == 1
    m = batch.mask_B_T
    torch.testing.assert_close(out.logprobs_B_T_V[m], _reference(model, batch)[m])
