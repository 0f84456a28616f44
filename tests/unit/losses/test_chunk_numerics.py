"""The chunked loss at real vocabularies (gpu-readiness findings 2 and 10), on CPU.

- compiled chunks (`compile_backend`, a fixed chunk shape with the last chunk padded) equal the
  eager chunks in value, metrics and gradients;
- `diagnostics=False` drops the logging-only metrics and changes neither the loss nor the
  gradients;
- a bf16 head under autocast adds its chunks' dW up in fp32: many chunks stay as close to an
  fp64 reference as one chunk does (before, the bf16 sum drifted with the chunk count).
"""

from __future__ import annotations

import pytest
import torch

from distil.losses import StudentHidden, get_loss
from distil.types import TeacherTargets


def make_case(kind: str, B=3, T=9, H=8, V=61, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.5
    bias = torch.randn(V, generator=g) * 0.1
    teacher = torch.log_softmax(torch.randn(B, T, V, generator=g) * 2, -1)
    mask = torch.rand(B, T, generator=g) > 0.3
    labels = torch.randint(0, V, (B, T), generator=g)
    if kind == "dense":
        targets = TeacherTargets(logprobs_B_T_V=teacher)
    else:
        vals, ids = teacher.topk(6, -1)
        rest = torch.log(-torch.expm1(torch.logsumexp(vals, -1)))
        targets = TeacherTargets(
            topk_ids_B_T_K=ids, topk_logprobs_B_T_K=vals, rest_logprob_B_T=rest
        )
    return hidden, weight, bias, targets, mask, labels


def run(case, **opts):
    hidden, weight, bias, targets, mask, labels = case
    h, w, b = (x.clone().requires_grad_() for x in (hidden, weight, bias))
    out = get_loss(opts.pop("name", "jsd"))(
        StudentHidden(h, w, b), targets, mask, num_tokens=23, labels_B_T=labels,
        temperature=1.2, targets_temperature=1.2, beta=0.3, **opts,
    )  # fmt: skip
    out.loss.backward()
    return out, (h.grad, w.grad, b.grad)


def assert_same(a, b, atol=1e-6):
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a.loss, out_b.loss, atol=atol, rtol=1e-5)
    assert out_a.metrics.keys() == out_b.metrics.keys()
    for k in out_a.metrics:
        torch.testing.assert_close(out_a.metrics[k], out_b.metrics[k], atol=atol, rtol=1e-5)
    for x, y in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-5)


def _compiled_equals_eager(kind: str, backend: str):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    case = make_case(kind)
    n = int(case[4].sum())
    assert n % 4 != 0  # the last chunk is padded
    opts = dict(chunk_size=4, ce_weight=0.5)
    assert_same(run(case, **opts), run(case, compile_backend=backend, **opts))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile


def test_compiled_chunks_equal_eager_chunks():
    _compiled_equals_eager("dense", "aot_eager")


@pytest.mark.budget(
    120, "compiles the chunked loss with inductor (a cold compile cache on a fresh machine)"
)
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "backend"), [("sparse", "aot_eager"), ("dense", "inductor")])
def test_compiled_chunks_equal_eager_chunks_sparse_and_inductor(kind, backend):
    _compiled_equals_eager(kind, backend)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("name", ["jsd", "forward_kl", "reverse_kl"])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_diagnostics_off_drops_metrics_only(kind, name, chunk_size):
    case = make_case(kind)
    full = run(case, name=name, chunk_size=chunk_size)
    lean = run(case, name=name, chunk_size=chunk_size, diagnostics=False)
    assert {"kl_sum", "student_entropy_sum", "student_logprob_sum"} <= full[0].metrics.keys()
    assert set(lean[0].metrics) == {"loss_sum", "tokens_count"}
    torch.testing.assert_close(lean[0].loss, full[0].loss, atol=0, rtol=0)
    for x, y in zip(lean[1], full[1], strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_bf16_head_gradient_adds_up_in_fp32_over_many_chunks():
    torch.manual_seed(0)
    V, H, B, T = 512, 32, 8, 128  # N = 1024 rows: 64 chunks of 16
    weight = (torch.randn(V, H) * 0.5).to(torch.bfloat16)
    hidden = torch.randn(B, T, H).to(torch.bfloat16)
    teacher = torch.log_softmax(torch.randn(B, T, V) * 2, -1)
    mask = torch.ones(B, T, dtype=torch.bool)

    def head_grad(chunk_size, reference=False):
        w = (weight.double() if reference else weight.clone()).requires_grad_()
        x = hidden.double() if reference else hidden
        t = teacher.double() if reference else teacher
        with torch.autocast("cpu", torch.bfloat16, enabled=not reference):
            out = get_loss("jsd")(
                StudentHidden(x, w), TeacherTargets(logprobs_B_T_V=t), mask,
                num_tokens=B * T, chunk_size=chunk_size,
            )  # fmt: skip
        out.loss.backward()
        assert w.grad.dtype == w.dtype
        return w.grad.double()

    ref = head_grad(None, reference=True)

    def err(g):
        return ((g - ref).norm() / ref.norm()).item()

    one_chunk, many = err(head_grad(None)), err(head_grad(16))
    # bf16 accumulation over 64 chunks: 0.0108 against 0.0064 for one chunk; fp32: 0.0065
    assert many < 1.1 * one_chunk, (many, one_chunk)


@pytest.mark.parametrize("name", ["sampled_reverse_kl", "sft"])
def test_diagnostics_off_drops_the_entropy_of_the_other_losses(name):
    hidden, weight, bias, _, mask, labels = make_case("dense")
    teacher = torch.log_softmax(torch.randn(*mask.shape, weight.shape[0]), -1)
    tokens = teacher.gather(-1, labels[..., None])[..., 0]
    targets = TeacherTargets(logprobs_B_T_V=teacher, token_logprobs_B_T=tokens)
    case = (hidden, weight, bias, targets, mask, labels)
    full = run(case, name=name, chunk_size=4)
    lean = run(case, name=name, chunk_size=4, diagnostics=False)
    assert "student_entropy_sum" in full[0].metrics
    assert set(full[0].metrics) - set(lean[0].metrics) == {"student_entropy_sum"}
    torch.testing.assert_close(lean[0].loss, full[0].loss, atol=0, rtol=0)
    for x, y in zip(lean[1], full[1], strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


@pytest.mark.parametrize("trained", [True, False])  # a trained head; a frozen one (LoRA)
def test_a_bf16_head_is_never_cast_per_chunk(trained):
    """gpu-review-2 finding 6: the fp32 view of the head was re-cast to bf16 by autocast in
    every chunk's forward and recompute, and every chunk's dW cast to fp32 and added. Now no
    (V, H) tensor is cast but the fp32 sum, rounded once into the bf16 gradient; a frozen head
    gets no buffer at all. Seen as the ops that run (a TorchDispatchMode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    V, H, B, T = 512, 32, 4, 16  # 64 rows: 4 chunks of 16
    torch.manual_seed(0)
    weight = (torch.randn(V, H) * 0.5).to(torch.bfloat16).requires_grad_(trained)
    hidden = torch.randn(B, T, H).to(torch.bfloat16).requires_grad_()
    teacher = torch.log_softmax(torch.randn(B, T, V) * 2, -1)
    mask = torch.ones(B, T, dtype=torch.bool)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.vh = []  # (op, dtype) of every op writing a (V, H) tensor

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == (V, H):
                self.vh.append((func.__name__, out.dtype))
            return out

    with Ops() as ops:
        with torch.autocast("cpu", torch.bfloat16):
            out = get_loss("jsd")(
                StudentHidden(hidden, weight), TeacherTargets(logprobs_B_T_V=teacher), mask,
                num_tokens=B * T, chunk_size=16,
            )  # fmt: skip
        out.loss.backward()
    casts = [op for op, _ in ops.vh if op.startswith("_to_copy")]
    assert casts == (["_to_copy.default"] if trained else [])  # the one final rounding
    if trained:
        assert weight.grad.dtype == torch.bfloat16
        adds = [op for op, dtype in ops.vh if op.startswith("add") and dtype == torch.bfloat16]
        assert adds == []  # no per-chunk bf16 sum
        assert [op for op, _ in ops.vh if op.startswith("addmm")] == ["addmm_.default"] * 4
    assert torch.isfinite(hidden.grad).all()


@pytest.mark.slow
def test_compiled_bf16_chunks_under_autocast_equal_eager_chunks():
    """What the GPU tier checks at V = 151,936 (tests/gpu/test_chunked_gpu.py), small and on
    the CPU: inductor-compiled chunks of a bf16 head under autocast, whose dW adds up in the
    fp32 buffer, equal the eager chunks (and are close to an fp32 run)."""
    import torch._dynamo

    torch._dynamo.reset()
    V, H, B, T = 256, 32, 3, 11  # 33 rows: chunks of 8, the last padded
    torch.manual_seed(1)
    weight = torch.randn(V, H) * 0.5
    hidden = torch.randn(B, T, H)
    teacher = torch.log_softmax(torch.randn(B, T, V) * 2, -1)
    mask = torch.rand(B, T) > 0.1

    def grads(dtype, backend):
        w = weight.to(dtype).requires_grad_()
        x = hidden.to(dtype).requires_grad_()
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = get_loss("jsd")(
                StudentHidden(x, w), TeacherTargets(logprobs_B_T_V=teacher), mask,
                num_tokens=int(mask.sum()), chunk_size=8, compile_backend=backend,
            )  # fmt: skip
        out.loss.backward()
        return out.loss.detach().float(), w.grad.float(), x.grad.float()

    eager, compiled = grads(torch.bfloat16, None), grads(torch.bfloat16, "inductor")
    fp32 = grads(torch.float32, None)
    for a, b, c in zip(eager, compiled, fp32, strict=True):
        torch.testing.assert_close(b, a, atol=2e-3, rtol=2e-2)
        assert (a - c).norm() <= 0.05 * c.norm() + 1e-3


def test_the_fp32_buffer_is_handed_over_once_and_freed_with_the_graph():
    """ChunkedHead alone: two chunks' dW summed in fp32 equal one fp64 matmul of all rows
    (rounded once to bf16), the buffer is dropped once handed over, and nothing holds the
    head after backward (no reference cycle through the token: freed without gc)."""
    import weakref

    from distil.losses.head import ChunkedHead

    torch.manual_seed(0)
    weight = (torch.randn(64, 16) * 0.5).to(torch.bfloat16).requires_grad_()
    x = torch.randn(10, 16).to(torch.bfloat16)
    g = torch.randn(10, 64)
    head = ChunkedHead(weight, None, fp32_grad=True)
    sums = weakref.ref(head.sums)
    with torch.autocast("cpu", torch.bfloat16):
        out = torch.cat([head(x[:6]), head(x[6:])])
    (out.float() * g).sum().backward()
    g16 = g.to(torch.bfloat16).double()  # the gradient reaching the bf16 logits is bf16
    want = (g16.t() @ x.double()).to(torch.bfloat16)  # exact sum, rounded once
    # bit-exact: bf16 x bf16 products are exact in fp32 and the fp32 sum of these 10 rows is
    # within 2^-24 of the exact one, so rounding it once to bf16 gives the same bits (bar a
    # tie). Summed in bf16 chunk by chunk instead, 340 of the 1,024 entries are off by up to
    # 0.06, which the former bound (2^-7 of the largest entry: 0.084) let through.
    assert torch.equal(weight.grad, want)
    assert head.sums.acc_w is None  # handed over
    del head, out
    assert sums() is None


def test_the_fp32_addmm_falls_back_once_with_a_warning_and_never_on_oom(monkeypatch):
    """`_addmm_fp32` tries addmm(out_dtype=fp32) where it is enabled (CUDA): tried here on the
    CPU, whose torch has no such kernel (NotImplementedError), it warns once and adds through
    fp32 copies; an out-of-memory error is raised, not taken for a missing kernel."""
    import warnings

    from distil.losses import head

    monkeypatch.setattr(head, "_FUSED", ("cpu",))
    monkeypatch.setattr(head, "_OUT_DTYPE", [True])
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(5, 7, generator=g).bfloat16(), torch.randn(7, 3, generator=g).bfloat16())
    want = a.double() @ b.double()
    with pytest.warns(RuntimeWarning, match="out_dtype") as seen:
        acc = head._addmm_fp32(torch.zeros(5, 3), a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second call goes straight to fp32
        acc = head._addmm_fp32(acc, a, b)
    assert len(seen) == 1 and head._OUT_DTYPE == [False]
    torch.testing.assert_close(acc.double(), 2 * want, rtol=1e-6, atol=1e-6)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(head, "_OUT_DTYPE", [True])
    monkeypatch.setattr(torch, "addmm", oom)
    with pytest.raises(torch.OutOfMemoryError):
        head._addmm_fp32(torch.zeros(5, 3), a, b)
    assert head._OUT_DTYPE == [True]  # still tried next time
