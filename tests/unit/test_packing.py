"""Packed (padding-free) forwards equal padded ones: the plan, the logits of student and teacher,
every loss and every gradient, and whole off-policy runs; a wrong boundary or a cache left on
is caught."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distil.config import build_config
from distil.data.packing import (
    best_fit_decreasing,
    model_forward,
    pack,
    plan_packing,
    unpack,
)
from distil.losses import get_loss
from distil.teacher.live import LiveTeacher
from distil.testing import tiny_llama, tiny_qwen2
from distil.train import loop
from distil.train.step import micro_step

# (loss, teacher top-k): top-k targets (k entries + the rest bucket) feed the same divergences
SAME = [
    ("forward_kl", None),
    ("reverse_kl", None),
    ("jsd", None),
    ("forward_kl", 8),
    ("jsd", 8),
    ("sampled_reverse_kl", None),
    ("sft", None),
]
XTOK = ["aligned_kl", "gold", "uld", "sampled_chunk_reverse_kl"]


@settings(max_examples=40, deadline=1000)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(1, 80))
def test_best_fit_decreasing_places_every_sequence_once_within_capacity(lengths, capacity):
    bins = best_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert sum(lengths[i] for i in b) <= capacity or len(b) == 1


@pytest.mark.slow
@settings(max_examples=1000, deadline=1000)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=64), st.integers(1, 600))
def test_best_fit_decreasing_longer_profile(lengths, capacity):
    test_best_fit_decreasing_places_every_sequence_once_within_capacity.hypothesis.inner_test(
        lengths, capacity
    )


def test_best_fit_decreasing_fills_the_fullest_bin_that_fits():
    # 7 -> bin A (3 free), 6 -> bin B (4 free), 3 -> A (fullest that fits), 4 -> B
    assert best_fit_decreasing([3, 7, 4, 6], 10) == [[1, 0], [3, 2]]


def _ragged(vocab: int, lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=g)
    attn = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return ids * attn, attn


def test_pack_then_unpack_returns_every_real_token_and_zeros_padding():
    ids, attn = _ragged(50, [5, 2, 7, 3])
    plan = plan_packing([5, 2, 7, 3], 7, 8)
    assert plan.shape_R_P[0] < 4  # rows hold more than one sequence
    back = unpack(pack(ids, plan), plan)
    assert torch.equal(back, ids * attn)
    pos = plan.position_ids_R_P
    assert (pos == 0).sum() >= 4  # a restart per sequence (plus row tails)


LENGTHS = [9, 3, 17, 5, 12, 2, 7]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("pack_length", [None, 20, 64])
def test_packed_logits_equal_padded_logits(arch, pack_length):
    model = (tiny_llama if arch == "llama" else tiny_qwen2)(97, seed=3)
    ids, attn = _ragged(97, LENGTHS)
    with torch.no_grad():
        padded = model_forward(model, ids, attn, packing=False)
        packed = model_forward(model, ids, attn, packing=True, pack_length=pack_length)
    real = attn.bool()
    assert (padded[real] - packed[real]).abs().max() < 1e-5
    assert torch.all(packed[~real] == 0)


def test_a_wrong_boundary_or_the_cache_left_on_changes_the_logits(monkeypatch):
    """The two ways to get packing wrong both show: positions that do not restart, and
    `use_cache=True` (transformers then skips the packed-sequence mask)."""
    import distil.data.packing as packing

    model = tiny_llama(97, seed=3)
    ids, attn = _ragged(97, LENGTHS)
    real = attn.bool()
    with torch.no_grad():
        padded = model_forward(model, ids, attn, packing=False)
        plan = plan_packing(LENGTHS, ids.shape[1], 20)
        ids_R_P = pack(ids, plan)
        cached = model(input_ids=ids_R_P, position_ids=plan.position_ids_R_P, use_cache=True)
        assert (unpack(cached.logits, plan)[real] - padded[real]).abs().max() > 1e-3

        real_plan = packing.plan_packing

        def no_restarts(*a, **k):
            p = real_plan(*a, **k)
            p.position_ids_R_P = torch.arange(p.shape_R_P[1]).expand(p.shape_R_P).clone()
            return p

        monkeypatch.setattr(packing, "plan_packing", no_restarts)
        wrong = model_forward(model, ids, attn, packing=True, pack_length=20)
    assert (wrong[real] - padded[real]).abs().max() > 1e-3


def test_every_packed_forward_turns_the_cache_and_the_mask_off():
    seen = []
    model = tiny_llama(97, seed=3)
    inner = model.model.forward  # the decoder: the model's forward calls it, a teacher directly

    def spy(**kwargs):
        seen.append(kwargs)
        return inner(**kwargs)

    teacher = LiveTeacher(model, packing=True)  # its one-time logits check: not packed
    model.model.forward = spy
    ids, attn = _ragged(97, LENGTHS)
    with torch.no_grad():
        model_forward(model, ids, attn, packing=True)
        teacher.score(_batch(ids, attn))
    assert len(seen) == 2
    for kw in seen:
        assert kw["use_cache"] is False and kw["attention_mask"] is None
        assert kw["position_ids"] is not None


def _batch(ids, attn):
    from distil.data.collate import collate
    from distil.types import Sample

    samples = [
        Sample(0, r[: n // 2].tolist(), r[n // 2 : n].tolist(), "off_policy")
        for r, n in zip(ids, attn.sum(1).tolist(), strict=True)
    ]
    return collate(samples, pad_id=0)


# ---- every loss and every gradient, through the training step, on real micro-batches --------


def _components(make_train_config, teacher=None, lam=0.5):
    from distil.train.setup import build

    sections = {"train": {"lambda": lam, "per_device_batch_size": 6, "grad_accum_steps": 1}}
    if teacher is not None:
        sections["teacher"] = {"path": str(teacher)}
        sections["loss"] = {"name": "aligned_kl"}
    c = build(build_config(make_train_config(**sections)))
    window = c.buffer.next_window()
    return c, window


def _run(c, teacher, micro, name, opts, packing, pack_length):
    c.model.zero_grad(set_to_none=True)
    teacher.packing, teacher.pack_length = packing, pack_length
    targets = teacher.score(micro)
    out = micro_step(
        c.model,
        c.unwrapped,
        micro,
        targets,
        get_loss(name),
        num_tokens=float(micro.num_loss_tokens),
        loss_opts=opts,
        vocab_size=c.vocab_size,
        packing=packing,
        pack_length=pack_length,
    )
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in c.model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads, targets


def _assert_same(name, a, b):
    (la, ga, ta), (lb, gb, tb) = a, b
    assert torch.isfinite(la) and abs(float(la - lb)) <= 1e-5 * max(1.0, abs(float(la))), name
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        scale = max(ga[k].abs().max().item(), 1e-6)
        assert (ga[k] - gb[k]).abs().max().item() <= 1e-4 * scale + 1e-7, (name, k)
    return ta, tb


def _ragged_micro(window, pack_length):
    micro = max(window.micro_batches, key=lambda b: len(set(b.attention_mask_B_L.sum(1).tolist())))
    lengths = micro.attention_mask_B_L.sum(1).tolist()
    assert len(set(lengths)) > 2  # ragged
    plan = plan_packing(lengths, max(lengths), pack_length)
    assert 1 < len(plan.rows) < len(lengths)  # several rows, some holding several sequences
    return micro


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_same_tokenizer_losses_and_gradients_packed_equal_padded(make_train_config, chunk_size):
    c, window = _components(make_train_config)
    n = window.micro_batches[0].attention_mask_B_L.sum(1)
    pack_length = 2 * int(n.max()) + 1
    micro = _ragged_micro(window, pack_length)
    for name, top_k in SAME:
        opts = {**c.loss_opts, "chunk_size": chunk_size, "ce_weight": 0.1}
        teacher = c.teacher
        if top_k is not None:
            teacher = LiveTeacher(
                c.teacher.model, top_k=top_k, vocab_size=c.teacher.vocab_size, chunk_rows=7
            )
        pad = _run(c, teacher, micro, name, opts, False, None)
        for length in (pack_length, 10_000):  # several rows; one row
            ta, tb = _assert_same(name, pad, _run(c, teacher, micro, name, opts, True, length))
            mask = micro.mask_B_T
            if ta.logprobs_B_T_V is not None:  # the teacher's targets, real positions
                assert (ta.logprobs_B_T_V[mask] - tb.logprobs_B_T_V[mask]).abs().max() < 1e-4
            if ta.topk_logprobs_B_T_K is not None:
                assert (
                    ta.topk_logprobs_B_T_K[mask] - tb.topk_logprobs_B_T_K[mask]
                ).abs().max() < 1e-4


def test_cross_tokenizer_losses_and_gradients_packed_equal_padded(
    make_train_config, tiny_qwen2_dir
):
    c, window = _components(make_train_config, teacher=tiny_qwen2_dir)
    n = window.micro_batches[0].attention_mask_B_L.sum(1)
    pack_length = 2 * int(n.max()) + 1
    micro = _ragged_micro(window, pack_length)
    assert micro.teacher_input_ids_B_L is not None and micro.alignment is not None
    for name in XTOK:
        opts = {**c.loss_opts, "ce_weight": 0.1}
        pad = _run(c, c.teacher, micro, name, opts, False, None)
        packed = _run(c, c.teacher, micro, name, opts, True, pack_length)
        ta, tb = _assert_same(name, pad, packed)
        real = micro.teacher_attention_mask_B_L[:, 1:].bool()
        assert (ta.logprobs_B_T_V[real] - tb.logprobs_B_T_V[real]).abs().max() < 1e-4


# ---- whole runs: packing on and off log the same per-step losses ----------------------------


def _losses(make_train_config, tmp_path, packing, **sections):
    raw = make_train_config(**sections)
    raw["train"].update(
        {
            "packing": packing,
            "pack_length": 96,
            "lambda": 0.0,
            "output_dir": str(tmp_path / f"run{packing}"),
        }
    )
    loop.train(build_config(raw))
    lines = (tmp_path / f"run{packing}" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines]


def test_off_policy_runs_packed_and_padded_log_the_same_losses(tmp_path, make_train_config):
    a = _losses(make_train_config, tmp_path, False)
    b = _losses(make_train_config, tmp_path, True)
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-4, abs=1e-6)
    assert len(set(a)) > 1  # the steps change the student


def test_cross_tokenizer_runs_packed_and_padded_log_the_same_losses(
    tmp_path, make_train_config, tiny_qwen2_dir
):
    kw = {"teacher": {"path": str(tiny_qwen2_dir)}, "loss": {"name": "aligned_kl"}}
    a = _losses(make_train_config, tmp_path, False, **kw)
    b = _losses(make_train_config, tmp_path, True, **kw)
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("top_k", [None, 5])
def test_teacher_log_softmax_in_chunks_equals_the_whole_batch_at_once(top_k):
    model = tiny_llama(97, seed=3)
    ids, attn = _ragged(97, LENGTHS)
    batch = _batch(ids, attn)
    whole = LiveTeacher(model, top_k=top_k, temperature=1.5, chunk_rows=10_000).score(batch)
    chunked = LiveTeacher(model, top_k=top_k, temperature=1.5, chunk_rows=7).score(batch)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].detach()
    ref = torch.log_softmax(logits / 1.5, -1)  # the reference: one log-softmax over everything
    real = batch.mask_B_T  # the positions a loss reads: the only ones scored
    assert real.sum() < attn[:, 1:].sum()  # prompt positions are left out
    ref_tok = ref.gather(-1, batch.labels_B_T[..., None])[..., 0]
    assert torch.allclose(chunked.token_logprobs_B_T[real], ref_tok[real], atol=1e-5)
    if top_k is None:
        assert torch.allclose(chunked.logprobs_B_T_V[real], ref[real], atol=1e-5)
    else:
        vals = ref.topk(top_k, -1).values
        assert torch.allclose(chunked.topk_logprobs_B_T_K[real], vals[real], atol=1e-5)
        assert torch.equal(chunked.topk_ids_B_T_K, whole.topk_ids_B_T_K)
        assert torch.allclose(chunked.rest_logprob_B_T, whole.rest_logprob_B_T)


def test_auto_chunk_size_follows_the_vocabulary(make_train_config):
    from distil.losses.chunked import auto_chunk_size

    assert [auto_chunk_size(v) for v in (512, 32768, 131072, 10**7)] == [1024, 1024, 256, 64]
    c, _ = _components(make_train_config)  # the default config: loss.chunk_size = auto
    assert c.loss_opts["chunk_size"] == 1024
