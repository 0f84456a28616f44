"""GPU tier: the chunked loss at the real Qwen3 vocabulary (151,936 rows) on CUDA gives the
unchunked loss and gradients: in fp32 exactly up to summation order (rtol 1e-5 on the loss,
1e-4 on the gradients, TF32 off), and with bf16 hidden states and head (train.bf16_weights)
within 2% of the fp32 reference in norm (finding 10: the head's gradient summed over ~13 chunks).

As training runs it (gpu-review-2 finding 8): under `torch.autocast("cuda", bf16)` with bf16
leaves, so the head's chunks add their dW in the fp32 buffer (`losses.head.ChunkedHead`, which
needs autocast on), eager and compiled (`loss.compile`: inductor, a fixed chunk shape, the
last chunk padded), each against the fp32 reference; and the compiled chunks against the eager
ones.

Skipped automatically without a CUDA device (tests/conftest.py).
"""

import pytest
import torch

from distil.losses import StudentHidden, get_loss
from distil.losses.chunked import auto_chunk_size
from distil.types import TeacherTargets

pytestmark = pytest.mark.gpu

V, H = 151_936, 1024  # Qwen3-0.6B's vocabulary and hidden size


@pytest.fixture
def no_tf32():
    """Exact fp32 matmuls here (distil's `enable_tf32` turns TF32 on for training runs)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


def _inputs(B: int, T: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(B, T, H, device="cuda", generator=g)
    weight = torch.randn(V, H, device="cuda", generator=g) * H**-0.5
    teacher = torch.log_softmax(torch.randn(B, T, V, device="cuda", generator=g) * 2, -1)
    mask = torch.rand(B, T, device="cuda", generator=g) > 0.3
    return hidden, weight, TeacherTargets(logprobs_B_T_V=teacher), mask


def _loss_and_grads(hidden, weight, targets, mask, chunk_size, *, autocast=False, backend=None):
    hidden = hidden.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    n = int(mask.sum())
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        out = get_loss("jsd")(
            StudentHidden(hidden, weight), targets, mask, num_tokens=n, chunk_size=chunk_size,
            compile_backend=backend,
        )  # fmt: skip
    out.loss.backward()
    return out.loss.detach().float(), hidden.grad.float(), weight.grad.float()


def test_chunked_equals_unchunked_at_151936_rows_fp32(no_tf32):
    # 2 x 400 positions, ~70% in the loss: ~560 rows, three chunks of 220. (2 x 300 gave ~420
    # on average, under the 440 this asks for: the test failed on an H100 on 2026-11-28 with
    # its message lost, and this precondition is the likely cause; bench/RESULTS.md)
    hidden, weight, targets, mask = _inputs(2, 400)
    chunk = auto_chunk_size(V)
    assert chunk == 220 and int(mask.sum()) > 2 * chunk  # several chunks
    full = _loss_and_grads(hidden, weight, targets, mask, None)
    chunked = _loss_and_grads(hidden, weight, targets, mask, chunk)
    torch.testing.assert_close(chunked[0], full[0], rtol=1e-5, atol=1e-7)
    for a, b in zip(chunked[1:], full[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_bf16_chunked_gradients_within_2_percent_of_fp32(no_tf32):
    hidden, weight, targets, mask = _inputs(4, 1024, seed=1)
    assert int(mask.sum()) // auto_chunk_size(V) >= 10
    ref = _loss_and_grads(hidden, weight, targets, mask, None)
    got = _loss_and_grads(hidden.bfloat16(), weight.bfloat16(), targets, mask, auto_chunk_size(V))
    assert got[0].item() == pytest.approx(ref[0].item(), rel=1e-2)
    for name, a, b in (("hidden", got[1], ref[1]), ("head", got[2], ref[2])):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 2e-2, f"{name} gradient: relative error {err:.4f}"


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_bf16_under_autocast_eager_and_compiled_within_2_percent_of_fp32(
    no_tf32, backend, monkeypatch
):
    """What a train.bf16_weights run computes: bf16 leaves under autocast (the fp32 dW buffer
    on), eager or loss.compile's inductor chunks (the last one padded). The buffer's adds ran
    as bf16 GEMMs writing fp32 (`addmm(out_dtype=fp32)`, no fallback to fp32 copies), and the
    head's gradient over ~13 chunks is as close to fp32 as a single chunk's (the CPU test's
    check, at the real vocabulary)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from distil.losses import head

    torch._dynamo.reset()
    counters.clear()
    fused, addmm = [], torch.addmm

    def counted(*args, **kwargs):
        fused.append(kwargs.get("out_dtype"))
        return addmm(*args, **kwargs)

    monkeypatch.setattr(torch, "addmm", counted)
    monkeypatch.setattr(head, "_OUT_DTYPE", [True])
    hidden, weight, targets, mask = _inputs(4, 1024, seed=2)
    chunk = auto_chunk_size(V)
    assert int(mask.sum()) % chunk != 0  # a padded last chunk when compiled
    ref = _loss_and_grads(hidden, weight, targets, mask, None)
    low = (hidden.bfloat16(), weight.bfloat16(), targets, mask, chunk)
    got = _loss_and_grads(*low, autocast=True, backend=backend)
    chunks = -(-int(mask.sum()) // chunk)
    assert head._OUT_DTYPE == [True], "addmm(out_dtype=fp32) failed: the fp32-copy fallback ran"
    assert fused == [torch.float32] * chunks  # one fused add per chunk's backward
    assert got[0].item() == pytest.approx(ref[0].item(), rel=1e-2)
    for name, a, b in (("hidden", got[1], ref[1]), ("head", got[2], ref[2])):
        err = _rel(a, b)
        assert err < 2e-2, f"{name} gradient ({backend}): relative error {err:.4f}"
    if backend is None:  # one chunk: one bf16 GEMM for dW, rounded once
        one = _loss_and_grads(*low[:4], None, autocast=True)
        assert _rel(got[2], ref[2]) < 1.1 * _rel(one[2], ref[2])
    if backend is not None:
        assert counters["stats"]["unique_graphs"] >= 1  # it compiled
        assert dict(counters["graph_break"]) == {}
        eager = _loss_and_grads(*low, autocast=True, backend=None)
        for a, b in zip(got, eager, strict=True):
            assert ((a - b).norm() / b.norm().clamp_min(1e-12)).item() < 1e-2
