"""GPU tier: `cache-teacher` on CUDA stores the live teacher's top-k (fp32 codec), and training
from the cache logs the live teacher's losses. On CUDA the cache is written with one padding
width and the live teacher scores with another, so the kernels differ: values within 2e-3
(TF32 may be on for fp32 matmuls), and a top-k set may swap only entries within 2e-3 of each
other. Skipped automatically without a CUDA device (tests/conftest.py)."""

import pytest
import torch

from distil.data.collate import collate
from distil.models.load import load_model, load_tokenizer
from distil.teacher import cache as fmt
from distil.teacher.cached import CachedTeacher
from distil.teacher.live import LiveTeacher
from distil.teacher.writer import cache_teacher, prepare_rows
from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.types import Sample

pytestmark = pytest.mark.gpu
K, TOL = 8, 2e-3


@pytest.fixture
def raw(make_train_config):
    return make_train_config(
        teacher={"top_k": K},
        loss={"name": "forward_kl"},
        train={"lambda": 0.0, "max_steps": 3, "per_device_batch_size": 4, "grad_accum_steps": 2},
    )


def _dense(ids, vals, rest, v):
    """Top-k + rest spread over the vocabulary (rest shared evenly), to compare sets loosely."""
    out = (
        (rest - torch.log(torch.tensor(float(v - ids.shape[-1]))))[..., None]
        .expand(*ids.shape[:-1], v)
        .clone()
    )
    return out.scatter(-1, ids, vals)


def test_cached_targets_on_cuda_equal_the_live_teachers(tmp_path, raw, pair_dirs):
    out = tmp_path / "cache"
    cache_teacher(config_with(raw), out, values="fp32", shard_rows=24, batch_size=8)
    manifest = fmt.read_manifest(out)
    tok = load_tokenizer(str(pair_dirs[1]))
    _, prompts, completions = prepare_rows(config_with(raw), tok)
    rows = [0, 23, 24, 63, 40]
    batch = collate([Sample(i, prompts[i], completions[i], "off_policy") for i in rows], 0)
    model = load_model(str(pair_dirs[0]), device="cuda")
    live = LiveTeacher(model, top_k=K)
    want = live.score(batch.to("cuda")).to("cpu")
    got = CachedTeacher(out, manifest).score(batch)
    m, v = batch.mask_B_T, model.get_output_embeddings().weight.shape[0]
    g = _dense(got.topk_ids_B_T_K[m], got.topk_logprobs_B_T_K[m], got.rest_logprob_B_T[m], v)
    w = _dense(want.topk_ids_B_T_K[m], want.topk_logprobs_B_T_K[m], want.rest_logprob_B_T[m], v)
    torch.testing.assert_close(g.exp(), w.exp(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.rest_logprob_B_T[m], want.rest_logprob_B_T[m], atol=TOL, rtol=0)
    torch.testing.assert_close(
        got.token_logprobs_B_T[m], want.token_logprobs_B_T[m], atol=TOL, rtol=0
    )


def test_training_from_the_cache_on_cuda_logs_the_live_losses(tmp_path, raw):
    out = tmp_path / "cache"
    cache_teacher(config_with(raw), out, values="fp32", shard_rows=24)
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "live")}))
    loop.train(
        config_with(raw, teacher={"cache": str(out)}, train={"output_dir": str(tmp_path / "c")})
    )
    live = [m["loss"] for m in read_metrics(tmp_path / "live")]
    cached = [m["loss"] for m in read_metrics(tmp_path / "c")]
    assert len(live) == len(cached) == 3
    assert cached == pytest.approx(live, rel=TOL, abs=TOL)
