"""GPU tier: `teacher.url` against servers on CUDA. `distil serve-teacher --device cuda` and, when
vllm is installed, a real `vllm serve` give the live top-k teacher's targets for the same batch
(vLLM's kernels differ from transformers', hence the looser tolerance there). vLLM serves in
bf16 (its FlashAttention backends do not run fp32: gpu-readiness finding 9) and is compared
with the live teacher in bf16: 5e-2 on log-probs (two bf16 kernel stacks)."""

import os
import subprocess
import sys
import time

import httpx
import pytest
import torch

from distil.data.collate import collate
from distil.serve.process import free_port, teacher_server
from distil.teacher.live import LiveTeacher
from distil.teacher.remote import RemoteTeacher, probe
from distil.teacher.remote_client import RemoteClient
from distil.types import Sample

pytestmark = pytest.mark.gpu
K = 8


def _batch(tok):
    rows = [[5, 17, 230, 4, 99, 12, 7], [40, 41, 42], [300, 2, 3, 4, 5]]
    samples = [Sample(i, r[:2], r[2:], "off_policy") for i, r in enumerate(rows)]
    return collate(samples, tok.pad_token_id)


def _compare(url, model_dir, tok, atol, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    remote = RemoteTeacher(RemoteClient(url), model=str(model_dir), top_k=K)
    probe(remote, tok)
    batch = _batch(tok)
    got = remote.score(batch)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to("cuda")
    want = LiveTeacher(model, top_k=K).score(batch.to("cuda")).to("cpu")
    want = type(want)(**{k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
                         for k, v in vars(want).items()})  # fmt: skip
    m = batch.mask_B_T
    torch.testing.assert_close(
        got.topk_logprobs_B_T_K[m].sort(-1).values,
        want.topk_logprobs_B_T_K[m].sort(-1).values,
        atol=atol,
        rtol=0,
    )
    torch.testing.assert_close(got.rest_logprob_B_T[m], want.rest_logprob_B_T[m], atol=atol, rtol=0)
    torch.testing.assert_close(
        got.token_logprobs_B_T[m], want.token_logprobs_B_T[m], atol=atol, rtol=0
    )


def test_serve_teacher_on_cuda_gives_the_live_targets(pair_dirs, bpe_tokenizer, tmp_path):
    teacher = pair_dirs[0]
    args = ("--device", "cuda", "--dtype", "float32", "--max-logprobs", str(K))
    with teacher_server(teacher, *args, log_path=tmp_path / "server.log") as (url, _):
        _compare(url, teacher, bpe_tokenizer, atol=1e-4)


def test_vllm_server_gives_the_live_targets(pair_dirs, bpe_tokenizer, tmp_path):
    pytest.importorskip("vllm")
    teacher, port = pair_dirs[0], free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(teacher),
        "--port",
        str(port),
        "--max-logprobs",
        str(K),
        "--dtype",
        "bfloat16",
        "--gpu-memory-utilization",
        "0.3",
        "--enforce-eager",
    ]
    log = open(tmp_path / "vllm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ})
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "vllm did not start in 10 minutes"
            time.sleep(1)
        _compare(f"http://127.0.0.1:{port}/v1", teacher, bpe_tokenizer, 5e-2, torch.bfloat16)
    finally:
        proc.kill()
        proc.wait()
        log.close()
