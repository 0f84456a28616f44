"""`distil train` with teacher.url against a real `distil serve-teacher` child process: the
server killed mid-run ends the run in bounded time with the retries logged and one clear
message (exit 2, no traceback); a soak of concurrent clients sees no failed request and a
bounded growth of the server's memory."""

import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
import yaml

import warm
from distil.serve.process import teacher_server
from distil.teacher.remote import RemoteTeacher
from distil.teacher.remote_client import RemoteClient

pytestmark = pytest.mark.slow

# Server RSS growth allowed over the soak, after a warm-up (allocator caches, lru of decoded
# tokens). Measured: see docs/scaling-out.md ("A teacher on its own server").
SOAK_RSS_GROWTH_MIB = 64
# the longest sequence (prompt + completion + 1) within the tiny teacher's 512 positions, which
# serve-teacher sends as max_model_len and connect() checks
FITS = {"max_prompt_tokens": 192}


@pytest.mark.budget(
    120, "a teacher server and a training run, the server killed and its retries waited out"
)
def test_server_killed_mid_run_retries_then_exits_2_with_the_message(
    tmp_path, make_train_config, pair_dirs
):
    teacher = pair_dirs[0]
    env = {"OMP_NUM_THREADS": "1"}
    with teacher_server(teacher, env=env, log_path=tmp_path / "server.log") as (url, server):
        raw = make_train_config(
            teacher={"top_k": 5, "url": url},
            train={"max_steps": 1000, "save_every_minutes": None},
            data=FITS,
        )
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        child = warm.popen(  # a real process, forked from the warm interpreter (tests/warm.py)
            [sys.executable, "-m", "distil", "train", str(cfg)],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        metrics = Path(raw["train"]["output_dir"]) / "metrics.jsonl"
        deadline = time.monotonic() + 600
        while not (metrics.exists() and metrics.read_text().strip()):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no training step within 10 minutes"
            time.sleep(0.2)
        server.kill()  # mid-run: training steps are being scored
        # 0.5 + 1 + 2 + 4 + 8 s of waits, plus the step in flight; a retry loop without its
        # bounds would end in TimeoutExpired here
        _, err = child.communicate(timeout=300)
    assert child.returncode == 2, err
    assert "Traceback" not in err, err
    assert f"the teacher server at {url} did not answer POST /completions after 6 tries" in err
    assert "retry 1 of 5" in err and "retry 5 of 5" in err  # the retries were logged


def test_soak_concurrent_clients_no_failed_request_and_bounded_memory(pair_dirs, tmp_path):
    teacher = pair_dirs[0]
    vocab = 400  # below the bpe tokenizer's size
    rng = random.Random(0)
    batches = [
        [[rng.randrange(vocab) for _ in range(rng.randint(16, 96))] for _ in range(4)]
        for _ in range(20)
    ]
    env = {"OMP_NUM_THREADS": "1"}
    args = ("--max-batch", "4", "--max-logprobs", "8")
    with teacher_server(teacher, *args, env=env, log_path=tmp_path / "server.log") as (url, proc):
        client = RemoteClient(url, connections=4)
        scorer = RemoteTeacher(client, model=str(teacher), top_k=8)
        reference = [scorer.score_rows(b) for b in batches]  # warm-up, and the expected answers
        rss_before = psutil.Process(proc.pid).memory_info().rss

        def one(i: int) -> bool:
            got = scorer.score_rows(batches[i % len(batches)])
            want = reference[i % len(batches)]
            return all(
                torch.equal(g[0], w[0]) and torch.allclose(g[1], w[1], atol=1e-5)
                for g, w in zip(got, want, strict=True)
            )

        with ThreadPoolExecutor(max_workers=4) as pool:  # 4 concurrent clients
            results = list(pool.map(one, range(300)))
        rss_after = psutil.Process(proc.pid).memory_info().rss
    growth_mib = (rss_after - rss_before) / 2**20
    print(f"soak: 300 requests, server RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert all(results), f"{results.count(False)} of 300 answers differ from the first answer"
    assert growth_mib < SOAK_RSS_GROWTH_MIB, growth_mib
