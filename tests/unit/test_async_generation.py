"""generation.async: seeded sampling, the weight snapshot, the one-ahead window source, and
whole runs (staleness, resume = uninterrupted, errors from the background thread)."""

import threading

import pytest
import torch
from buffer_fakes import EOS, make_buffer

import warm
from distil.config import build_config
from distil.errors import ConfigError
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.seeded import GumbelMaxSampler, sampling_seed
from distil.testing import read_metrics, train_killed_after_checkpoint
from distil.train import loop
from distil.train.async_gen import SAMPLER_FILE, AsyncWindows, weight_snapshot
from distil.train.buffer import ON, SEQ_KD
from distil.types import Rollout

# ----------------------------------------------------------------------------- seeded sampling


def test_gumbel_max_draws_follow_the_softmax():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]]).expand(20000, 5)
    draws = GumbelMaxSampler(seed=5, device="cpu")(None, scores).argmax(dim=1)
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    want = torch.softmax(scores[0], dim=0)
    assert freq[4] == 0.0  # a masked token is never drawn
    torch.testing.assert_close(freq, want, atol=0.015, rtol=0)


def test_seeded_generate_is_a_function_of_the_seed_and_leaves_the_global_rng(
    tiny_llama_model, bpe_tokenizer
):
    gen = HFGenerator(tiny_llama_model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[EOS])
    prompts = [[5, 6, 7], [8, 9]]
    params = SamplingParams(10, 0.8, 0.95, 40, 2, seed=11)
    before = torch.get_rng_state()
    a = gen.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), before)  # nothing drawn from the global RNG
    torch.manual_seed(1234)
    b = gen.generate(prompts, params)
    c = gen.generate(prompts, SamplingParams(10, 0.8, 0.95, 40, 2, seed=12))
    assert torch.equal(a.completion_ids_B_C, b.completion_ids_B_C)
    assert torch.equal(a.logprobs_B_C, b.logprobs_B_C)
    assert not torch.equal(a.completion_ids_B_C, c.completion_ids_B_C)


def test_seeded_logprobs_are_those_of_the_warped_distribution(tiny_llama_model, bpe_tokenizer):
    """The recorder runs before the Gumbel noise: teacher-force the samples and compare."""
    model = tiny_llama_model
    gen = HFGenerator(model, pad_id=bpe_tokenizer.pad_token_id, stop_ids=[EOS])
    prompt, temp = [5, 6, 7], 0.7
    r = gen.generate([prompt], SamplingParams(8, temp, 1.0, 0, 3, seed=3))
    for row in range(3):
        ids = r.completion_ids_B_C[row][r.completion_mask_B_C[row]].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits.float() / temp, -1).gather(1, torch.tensor(ids)[:, None])
        got = r.logprobs_B_C[row, : len(ids)]
        torch.testing.assert_close(got, want[:, 0], atol=1e-4, rtol=0)


def test_sampling_seed_separates_its_parts():
    seeds = {sampling_seed(0, r, w, p) for r in (0, 1) for w in range(50) for p in ("a", "b")}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert sampling_seed(0, 1, 2, "a") == sampling_seed(0, 1, 2, "a")


# ----------------------------------------------------------------------------- snapshot


def test_snapshot_copies_trainable_weights_and_shares_frozen_ones(tiny_llama_model):
    model = tiny_llama_model
    frozen = model.model.embed_tokens.weight
    frozen.requires_grad_(False)
    snap = weight_snapshot(model)
    snap_params = dict(snap.named_parameters())
    assert snap_params["model.embed_tokens.weight"] is frozen  # shared, no copy
    q = "model.layers.0.self_attn.q_proj.weight"
    assert snap_params[q].data_ptr() != dict(model.named_parameters())[q].data_ptr()
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = snap(x).logits.clone()
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.5)  # an optimizer step on the live model
        after = snap(x).logits
        moved = model(x).logits
    assert torch.equal(before, after)  # the sampler does not see the step
    assert not torch.allclose(moved, after)


def test_lora_run_with_async_copies_only_the_adapters(tmp_path, make_train_config):
    pytest.importorskip("peft")
    raw = make_train_config(
        student={"lora": {"enabled": True, "r": 4, "alpha": 8}},
        train={"max_steps": 3, "lr": 1e-2, "lambda": 1.0, "save_every": 1},
        generation={"async": True},
    )
    loop.train(build_config(raw))
    from safetensors.torch import load_file

    ckpts = tmp_path / "run" / "checkpoints"
    saved = load_file(ckpts / "step-00000002" / SAMPLER_FILE)  # window 2 in flight
    names = set(saved) - {"__version__"}
    assert names and all("lora_" in n for n in names)  # the frozen base is shared, not copied
    assert int(saved["__version__"][0]) == 1  # sampled from the weights step 2 started with
    assert not (ckpts / "step-00000003" / SAMPLER_FILE).exists()  # the last: nothing in flight
    m = read_metrics(tmp_path / "run")
    assert [x["policy/staleness"] for x in m] == [0.0, 1.0, 1.0]


# ----------------------------------------------------------------------------- window source


class WeightProbe:
    """A generator that records, per call, its prompts and one weight of the model it samples."""

    def __init__(self, model=None):
        self.model, self.calls, self.seen_weight, self.threads = model, [], [], []
        self.idents: list[int] = []
        self.thread_objects: list[threading.Thread] = []  # kept alive: idents may be reused

    def sync_weights(self, model):
        self.model = model

    def generate(self, prompt_ids, params):
        self.calls.append(([list(p) for p in prompt_ids], params.seed))
        self.seen_weight.append(float(next(self.model.parameters()).detach().flatten()[0]))
        self.threads.append(threading.current_thread().name)
        self.idents.append(threading.get_ident())
        self.thread_objects.append(threading.current_thread())
        rows = [[10 + p[0], 20 + j, EOS] for p in prompt_ids for j in range(params.n)]
        ids = torch.tensor(rows)
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        return Rollout(
            index, ids, torch.ones_like(ids, dtype=torch.bool), torch.full(ids.shape, -0.5), None
        )


def small_buffer(generator, lam=1.0, seed=0):
    return make_buffer(batch=2, accum=2, n=2, lam=lam, seed=seed, generator=generator)[0]


def rows(window):
    return [
        (s.example_id, tuple(s.completion_ids)) for b in window.micro_batches for s in b.samples
    ]


def test_async_windows_are_the_sync_windows_sampled_one_step_stale():
    model = torch.nn.Linear(2, 2)
    init = float(model.weight.detach()[0, 0])
    sync = small_buffer(WeightProbe(model), lam=0.5, seed=3)
    probe = WeightProbe(model)
    source = AsyncWindows(small_buffer(probe, lam=0.5, seed=3), model, max_steps=6)
    for step in range(6):
        want = sync.next_window()
        got = source.next_window()
        assert rows(got) == rows(want) and got.policies == want.policies  # same data order
        staleness = (1.0 if step else 0.0) if ON in got.policies else 0.0
        assert got.metrics["policy/staleness"] == staleness
        with torch.no_grad():
            model.weight[0, 0] = step + 1.0  # the optimizer step on the live weights
    # window w >= 1 was sampled while step w-1 trained, from the weights step w-1 started with
    # (w-1 after the updates above; the initial weight for windows 0 and 1)
    on_windows = [w for w in range(6) if ON in sync.policies(w)]
    assert len(on_windows) >= 3  # seed 3 draws enough on-policy windows to compare
    assert probe.seen_weight == [init if w <= 1 else float(w - 1) for w in on_windows]
    assert all(name == "distil-async-generation" for name in probe.threads)
    assert all(seed is not None for _, seed in probe.calls)
    assert source.state.windows == 6 and source._in_flight is None  # nothing past the last step


def test_a_writer_that_is_the_student_samples_the_snapshot_not_the_live_weights():
    """teacher.from_student=current with seq-KD: the teacher's writer samples the same
    snapshot as the student's sampler (one step stale), never the live module the optimizer is
    writing meanwhile (gpu-review-2 finding 4)."""
    model = torch.nn.Linear(2, 2)
    init = float(model.weight.detach()[0, 0])
    writer = WeightProbe(model)
    buffer = make_buffer(
        batch=2, accum=2, n=2, lam=0.0, seed=3, seq_kd=True, generator=WeightProbe(model),
        teacher_gen=writer,
    )[0]  # fmt: skip
    source = AsyncWindows(buffer, model, max_steps=6, teacher_is_student=True)
    assert source.buffer.teacher.generator.model is source.snapshot
    for step in range(6):
        assert SEQ_KD in source.next_window().policies
        with torch.no_grad():
            model.weight[0, 0] = step + 1.0  # the optimizer step on the live weights
    assert writer.seen_weight == [init, init, 1.0, 2.0, 3.0, 4.0]
    assert all(name == "distil-async-generation" for name in writer.threads)


def test_an_async_run_whose_student_writes_its_seq_kd_slices(tmp_path, make_train_config):
    raw = make_train_config(
        teacher={"path": None, "from_student": "current", "context": "{prompt} (hint)"},
        train={"lambda": 0.5, "seq_kd": True, "max_steps": 3, "seed": 3},
        generation={"async": True},
    )
    loop.train(build_config(raw))
    m = read_metrics(tmp_path / "run")
    assert {x["policy/seq_kd_share"] for x in m} > {0.0} and all(x["skipped"] == 0 for x in m)


def test_an_ema_writer_is_refused_with_async(make_train_config):
    raw = make_train_config(
        teacher={"path": None, "from_student": "ema", "context": "{prompt} (hint)"},
        train={"lambda": 0.5, "seq_kd": True},
        generation={"async": True},
    )
    with pytest.raises(ConfigError, match=r"generation\.async = true with teacher\.from_student"):
        build_config(raw)
    raw["generation"]["async"] = False
    build_config(raw)


def test_every_window_is_sampled_on_one_long_lived_worker_thread():
    """One thread for the whole run (a compiled generator's CUDA graphs are kept per host
    thread): many windows, one thread ident, not the training thread's; it ends at close."""
    model = torch.nn.Linear(2, 2)
    probe = WeightProbe(model)
    source = AsyncWindows(small_buffer(probe, lam=1.0), model, max_steps=12)
    for _ in range(12):
        source.next_window()
    assert len(probe.idents) == 12 and len(set(probe.idents)) == 1
    worker = probe.thread_objects[0]
    assert all(t is worker for t in probe.thread_objects)
    assert worker is not threading.current_thread()
    source.close()
    worker.join()  # returns: close() ended the thread (a hang here is the failure)
    assert not worker.is_alive()


def test_checkpoint_state_is_the_one_before_the_window_in_flight_and_resumes_it():
    model = torch.nn.Linear(2, 2)
    a = AsyncWindows(small_buffer(WeightProbe(model), seed=1), model, max_steps=8)
    ref = []
    for step in range(8):
        ref.append(rows(a.next_window()))
        if step == 3:
            state, tensors = a.state.to_dict(), a.checkpoint_tensors()
        with torch.no_grad():
            model.weight.add_(1.0)
    assert state["windows"] == 4  # window 4 was in flight, not consumed
    assert int(tensors[SAMPLER_FILE]["__version__"][0]) == 3

    fresh = torch.nn.Linear(2, 2)
    probe = WeightProbe()
    b = AsyncWindows(small_buffer(probe, seed=1), fresh, max_steps=8)
    b.load_state(state)
    from safetensors.torch import save_file

    return_dir = _tmp_dir()
    save_file(tensors[SAMPLER_FILE], str(return_dir / SAMPLER_FILE))
    b.load_sampler(return_dir)
    got = rows(b.next_window())
    assert got == ref[4]
    assert probe.seen_weight[0] == pytest.approx(float(tensors[SAMPLER_FILE]["weight"][0, 0]))
    assert probe.calls[0][1] == sampling_seed(1, 0, 4, ON)  # the uninterrupted run's seed


def _tmp_dir():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp())


def test_a_background_error_is_raised_in_the_training_thread_with_its_traceback():
    class Broken(WeightProbe):
        def generate(self, prompt_ids, params):
            if len(self.calls) == 1:
                raise ValueError("sampler exploded")
            return super().generate(prompt_ids, params)

    model = torch.nn.Linear(2, 2)
    source = AsyncWindows(small_buffer(Broken(model)), model, max_steps=5)
    source.next_window()  # window 0; window 1 fails in the background
    with pytest.raises(ValueError, match="sampler exploded") as info:
        source.next_window()
    names = [entry.name for entry in info.traceback]
    assert "generate" in names and "next_window" in names  # the worker's frames are kept
    source.close()


# ----------------------------------------------------------------------------- whole runs


def test_async_off_logs_no_staleness_and_async_on_logs_it(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 3, "lambda": 1.0}, generation={"async": True})
    loop.train(build_config(raw))
    m = read_metrics(tmp_path / "run")
    assert [x["policy/staleness"] for x in m] == [0.0, 1.0, 1.0]
    assert all(x["loss"] > 0 for x in m)


def test_async_run_evaluates_without_disturbing_training(tmp_path, make_train_config):
    """eval_every under async: the eval samples the live weights with its own generator after
    the window in flight is done, and the losses are those of the same run without evals."""
    train = {"max_steps": 4, "lambda": 1.0}
    raw = make_train_config(train=train, generation={"async": True})
    loop.train(build_config(raw))
    raw["train"].update(output_dir=str(tmp_path / "eval"), eval_every=2)
    loop.train(build_config(raw))
    plain, evaluated = read_metrics(tmp_path / "run"), read_metrics(tmp_path / "eval")
    assert [m["loss"] for m in plain] == [m["loss"] for m in evaluated]
    assert [m["step"] for m in evaluated if any(k.startswith("eval/") for k in m)] == [2, 4]


def test_async_resumed_run_matches_uninterrupted_async_run(
    tmp_path, make_train_config, monkeypatch
):
    # lambda 1: the window in flight at the checkpoint is on-policy (its weights matter)
    overrides = {"train": {"max_steps": 6, "save_every": 3, "lambda": 1.0}}
    raw = make_train_config(**overrides, generation={"async": True})
    loop.train(build_config(raw))
    full = read_metrics(tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "step-00000003" / SAMPLER_FILE).exists()

    raw["train"]["output_dir"] = str(tmp_path / "killed")
    cfg = build_config(raw)
    train_killed_after_checkpoint(monkeypatch, cfg, step=3)
    resumed = read_metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(full[3:], resumed[3:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
        assert a["policy/staleness"] == b["policy/staleness"]
    assert [m["policy/staleness"] for m in full] != [0.0] * 6
    assert full[3]["loss"] != full[2]["loss"]


def test_async_runs_are_deterministic_with_teacher_written_slices(tmp_path, make_train_config):
    """lambda < 1 with seq-KD: the teacher samples its slices in the background thread too, from
    its own seeds, so two runs log the same losses whatever the threads' timing."""
    raw = make_train_config(
        train={"max_steps": 4, "lambda": 0.5, "seq_kd": True, "seed": 3},
        generation={"async": True},
    )
    loop.train(build_config(raw))
    raw["train"]["output_dir"] = str(tmp_path / "again")
    loop.train(build_config(raw))
    a, b = read_metrics(tmp_path / "run"), read_metrics(tmp_path / "again")
    assert {x["policy/seq_kd_share"] for x in a} > {0.0}  # teacher-written slices were trained
    assert [x["loss"] for x in a] == [x["loss"] for x in b]


# The CLI in a child process: every micro-batch slowed down, and every generate call from the
# 4th on (window 3, sampled while step 3 trains) sleeps an hour.
SLOW_SAMPLER_CLI = """
import sys, time
sys.path.insert(0, sys.argv[1])
from distil.generation.hf import HFGenerator
from distil.train import loop
real_step, real_generate, calls = loop.micro_step, HFGenerator.generate, [0]
def slow_step(*a, **k):
    time.sleep(0.5)
    return real_step(*a, **k)
def slow_generate(*a, **k):
    calls[0] += 1
    if calls[0] >= 4:
        time.sleep(3600)
    return real_generate(*a, **k)
loop.micro_step, HFGenerator.generate = slow_step, slow_generate
from distil.cli import main
raise SystemExit(main(["train", sys.argv[2]]))
"""


@pytest.mark.slow  # a child process and three runs
def test_sigterm_does_not_wait_for_the_window_in_flight_and_resumes_exactly(
    tmp_path, make_train_config
):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    raw = make_train_config(train={"max_steps": 6, "lambda": 1.0}, generation={"async": True})
    loop.train(build_config(raw))  # the uninterrupted async run in tmp_path/run
    raw["train"]["output_dir"] = str(tmp_path / "stopped")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    src = str(Path(loop.__file__).parents[2])
    child = warm.popen(  # a real process, forked from the warm interpreter (tests/warm.py)
        [sys.executable, "-c", SLOW_SAMPLER_CLI, src, str(cfg_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "stopped" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)  # step 3 is training, window 3 is sleeping
    # the hour-long generate call is not waited for: waiting would end in TimeoutExpired here
    _, err = child.communicate(timeout=600)
    assert child.returncode == 143, err
    assert "training stopped by SIGTERM after step 3" in err and "Traceback" not in err
    ckpt = tmp_path / "stopped" / "checkpoints" / "step-00000003"
    assert (ckpt / SAMPLER_FILE).exists()
    loop.train(build_config(raw))  # resumes: window 3 sampled again, from the saved weights
    a, b = read_metrics(tmp_path / "run"), read_metrics(tmp_path / "stopped")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    assert [m["loss"] for m in a] == [m["loss"] for m in b]


@pytest.mark.parametrize("own_copy", [True, False])
def test_a_gathering_generators_worker_copy_still_gathers(own_copy):
    """A sharded sampler's GatheringGenerator once reached the worker thread through its
    attribute forwarding as the inner generator's bare worker copy (no `full_weights`)."""
    from distil.train.async_gen import _worker_copy
    from distil.train.fsdp import GatheringGenerator

    class Inner:
        copied_for_worker = False

        def generate(self, prompt_ids, params):
            return "sampled"

    if own_copy:

        def worker_copy(self):
            made = Inner()
            made.copied_for_worker = True
            return made

        Inner.worker_copy = worker_copy
    inner, model = Inner(), torch.nn.Linear(2, 2)
    copy = _worker_copy(GatheringGenerator(inner, model))
    assert type(copy) is GatheringGenerator and copy.model is model
    assert copy.inner is not inner and copy.inner.copied_for_worker == own_copy
