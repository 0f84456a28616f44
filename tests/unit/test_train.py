"""The training step and loop: accumulation invariance, chunked path, resume, guards."""

import json
import sys

import pytest
import torch

from distil.config import build_config
from distil.data.collate import collate
from distil.errors import ConfigError, DistilError
from distil.losses import get_loss, list_losses
from distil.models.load import load_model
from distil.teacher.live import LiveTeacher
from distil.testing import read_metrics, train_killed_after_checkpoint
from distil.train import loop
from distil.train.setup import enable_activation_checkpointing
from distil.train.step import micro_step
from distil.types import Sample

SAME_TOKENIZER_LOSSES = ["forward_kl", "reverse_kl", "jsd", "sampled_reverse_kl"]


def test_every_registered_same_tokenizer_loss_is_covered():
    assert set(SAME_TOKENIZER_LOSSES) <= set(list_losses())


def ragged_samples(tok, n=8):
    """n samples with prompts and completions of different lengths (2..9 completion tokens)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = tok(f"nums: {i} {i + 3} target: {2 * i}", add_special_tokens=False)["input_ids"]
        length = 2 + (i * 5) % 8
        completion = torch.randint(10, len(tok) - 10, (length,), generator=g).tolist()
        out.append(Sample(i, prompt, [*completion, tok.eos_token_id], "on_policy"))
    return out


@pytest.fixture(scope="module")
def models(pair_dirs):
    teacher_dir, student_dir = pair_dirs
    teacher = load_model(str(teacher_dir))
    student = load_model(str(student_dir)).train()
    return teacher, student


def grads_for(student, teacher, samples, pad_id, micro, loss, top_k, opts):
    student.zero_grad(set_to_none=True)
    scorer = LiveTeacher(teacher, top_k=top_k, temperature=opts["temperature"])
    batches = [collate(samples[s : s + micro], pad_id) for s in range(0, len(samples), micro)]
    num_tokens = sum(b.num_loss_tokens for b in batches)
    total = 0.0
    for b in batches:
        out = micro_step(
            student,
            student,
            b,
            scorer.score(b),
            get_loss(loss),
            num_tokens=num_tokens,
            loss_opts=opts,
        )
        out.loss.backward()
        total += out.loss.item()
    return total, {n: p.grad.clone() for n, p in student.named_parameters()}


@pytest.mark.parametrize("loss", SAME_TOKENIZER_LOSSES)
@pytest.mark.parametrize("top_k", [None, 6])
def test_micro2_x_accum4_equals_micro8_x_accum1_on_gradients(models, bpe_tokenizer, loss, top_k):
    if loss == "sampled_reverse_kl" and top_k:
        pytest.skip("the sampled loss reads token log-probs, not the top-k")
    teacher, student = models
    samples = ragged_samples(bpe_tokenizer)
    opts = {
        "temperature": 1.5,
        "targets_temperature": 1.5,
        "beta": 0.3,
        "chunk_size": None,
        "ce_weight": 0.0,
    }
    pad = bpe_tokenizer.pad_token_id
    loss_a, grads_a = grads_for(student, teacher, samples, pad, 2, loss, top_k, opts)
    loss_b, grads_b = grads_for(student, teacher, samples, pad, 8, loss, top_k, opts)
    assert loss_a == pytest.approx(loss_b, rel=1e-4)  # padded widths differ: float noise only
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-4)
    # negative control: per-micro-batch means (the bug the global count prevents) differ
    bad = sum(b.num_loss_tokens for b in [collate(samples[:2], pad)])
    assert bad != sum(len(s.completion_ids) for s in samples)


@pytest.mark.parametrize("loss", ["jsd", "sampled_reverse_kl"])
def test_chunked_student_head_equals_full_logits_through_the_model(models, bpe_tokenizer, loss):
    teacher, student = models
    samples = ragged_samples(bpe_tokenizer)
    base = {"temperature": 1.0, "targets_temperature": 1.0, "beta": 0.5, "ce_weight": 0.0}
    pad = bpe_tokenizer.pad_token_id
    full = grads_for(student, teacher, samples, pad, 4, loss, None, {**base, "chunk_size": None})
    chunked = grads_for(student, teacher, samples, pad, 4, loss, None, {**base, "chunk_size": 5})
    assert full[0] == pytest.approx(chunked[0], rel=1e-5)
    for name in full[1]:
        torch.testing.assert_close(full[1][name], chunked[1][name], atol=1e-6, rtol=1e-4)
    # the head was restored after the forward
    assert isinstance(student.get_output_embeddings(), torch.nn.Linear)


def test_resumed_run_matches_uninterrupted_run(tmp_path, make_train_config, monkeypatch):
    overrides = {"train": {"max_steps": 6, "save_every": 3, "lambda": 0.5}}
    full_cfg = build_config(make_train_config(**overrides))
    loop.train(full_cfg)
    full = read_metrics(tmp_path / "run")

    raw = make_train_config(**overrides)
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    cfg = build_config(raw)
    train_killed_after_checkpoint(monkeypatch, cfg, step=3)
    resumed = read_metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    assert [m["policy/on_policy_share"] for m in resumed] == [
        m["policy/on_policy_share"] for m in full
    ]
    for a, b in zip(full[3:], resumed[3:], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6, (a["step"], a["loss"], b["loss"])
        assert abs(a["kl"] - b["kl"]) < 1e-6
    assert full[3]["loss"] != full[2]["loss"]  # the compared steps are not trivially equal
    wa = load_model(str(tmp_path / "run" / "final")).state_dict()
    wb = load_model(str(tmp_path / "killed" / "final")).state_dict()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)


def nan_on_windows(real, windows):
    """micro_step whose loss is NaN in the given (1-based) windows of 2 micro-batches."""
    calls = {"n": 0}

    def step(*args, **kwargs):
        calls["n"] += 1
        out = real(*args, **kwargs)
        if windows == "all" or (calls["n"] + 1) // 2 in windows:
            out.loss = out.loss * float("nan")
            out.metrics["loss_sum"] = out.metrics["loss_sum"] * float("nan")
        return out

    return step


def checkpoints(run_dir):
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").iterdir())


def test_non_finite_steps_are_skipped_and_never_checkpointed(
    tmp_path, make_train_config, monkeypatch, capsys
):
    monkeypatch.setattr(loop, "micro_step", nan_on_windows(loop.micro_step, (2, 3)))
    cfg = make_train_config(train={"max_steps": 5, "save_every": 1, "keep_last": 10})
    loop.train(build_config(cfg))
    metrics = read_metrics(tmp_path / "run")
    assert [m["skipped"] for m in metrics] == [0, 1, 1, 0, 0]
    assert checkpoints(tmp_path / "run") == [1, 4, 5]  # nothing inside the streak
    err = capsys.readouterr().err
    assert "step 2: non-finite loss or gradient (non-finite loss on rank 0)" in err


@pytest.mark.parametrize("clip", [1.0, None])
def test_non_finite_abort_names_the_last_good_checkpoint(
    tmp_path, make_train_config, monkeypatch, clip
):
    calls = {"n": 0}
    real = loop.micro_step

    def nan_after_first_window(*args, **kwargs):
        calls["n"] += 1
        return nan_on_windows(real, "all" if calls["n"] > 2 else ())(*args, **kwargs)

    monkeypatch.setattr(loop, "micro_step", nan_after_first_window)
    cfg = make_train_config(
        train={"max_consecutive_skips": 2, "max_steps": 5, "save_every": 1, "max_grad_norm": clip}
    )
    with pytest.raises(DistilError, match="2 consecutive steps had a non-finite") as info:
        loop.train(build_config(cfg))
    msg = str(info.value)
    good = tmp_path / "run" / "checkpoints" / "step-00000001"
    assert f"train.resume={good}" in msg and "train.resume=never" in msg
    assert ("enable train.max_grad_norm" in msg) == (clip is None)  # not when already on
    assert checkpoints(tmp_path / "run") == [1]


@pytest.mark.parametrize("logs_reward", [False, True])
def test_a_dead_model_with_zero_gradients_stops(tmp_path, make_train_config, logs_reward):
    # lr=1e6 saturates the tiny student after one step: grad_norm is exactly 0 from step 2 on.
    # Logging the reward (its dead samples' groups all flat) does not excuse it: only grpo's.
    train = {"lr": 1e6, "max_steps": 30, "save_every": 1, "max_zero_grad_steps": 3}
    reward = {"train": {"lambda": 1.0}, "reward": {"log": True}} if logs_reward else {}
    cfg = make_train_config(**{**reward, "train": {**train, **reward.get("train", {})}})
    with pytest.raises(DistilError, match="gradient norm was exactly 0 for 3 steps") as info:
        loop.train(build_config(cfg))
    assert "step-00000001" in str(info.value) and "lower train.lr" in str(info.value)
    metrics = read_metrics(tmp_path / "run")
    assert [m["grad_norm"] for m in metrics][1:] == [0.0, 0.0, 0.0]
    assert metrics[0]["grad_norm"] > 0 and checkpoints(tmp_path / "run") == [1]
    if logs_reward:
        assert [m["reward/no_signal_groups"] for m in metrics][1:] == [1.0, 1.0, 1.0]


def nan_at(model, row, pos):
    """The teacher's final hidden state (its decoder's output, which the head reads) made NaN
    at one (row, position); returns the hook's handle."""

    def hook(module, args, out):
        out.last_hidden_state[row, pos] = float("nan")
        return out

    return model.get_decoder().register_forward_hook(hook)


@pytest.mark.parametrize("chunk_rows", [None, 2])  # one chunk, several
def test_nan_teacher_logits_stop_before_the_loss(models, bpe_tokenizer, chunk_rows):
    from distil.teacher.live import TeacherOutputError

    teacher, _ = models
    batch = collate(ragged_samples(bpe_tokenizer, 4), bpe_tokenizer.pad_token_id)
    real = batch.attention_mask_B_L[1].nonzero()[-1].item() - 1  # a real token of row 1
    scorer = LiveTeacher(teacher, chunk_rows=chunk_rows)
    hook = nan_at(teacher, 1, real)
    with pytest.raises(TeacherOutputError, match=f"at 1 of the .* row 1, position {real}"):
        scorer.score(batch)
    hook.remove()
    pad = (batch.attention_mask_B_L == 0).nonzero()
    assert len(pad), "the batch has padding"
    row, pos = pad[0].tolist()
    hook = nan_at(teacher, row, pos)  # NaN on a padding position is not used: no error
    try:
        assert torch.isfinite(scorer.score(batch).logprobs_B_T_V[batch.mask_B_T]).all()
    finally:
        hook.remove()


def test_teacher_with_another_tokenizer_is_an_error_for_same_tokenizer_losses(
    tmp_path, make_train_config, tiny_qwen2_dir
):
    cfg = build_config(make_train_config(teacher={"path": str(tiny_qwen2_dir)}))
    with pytest.raises(ConfigError, match="cross-tokenizer loss") as info:
        loop.train(cfg)
    assert "never resizes embeddings" in str(info.value)


def test_eval_and_checkpoints_on_schedule(tmp_path, make_train_config):
    cfg = build_config(
        make_train_config(train={"max_steps": 4, "save_every": 2, "eval_every": 2, "keep_last": 1})
    )
    loop.train(cfg)
    metrics = read_metrics(tmp_path / "run")
    assert ["eval/accuracy" in m for m in metrics] == [False, True, False, True]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000004"]
    state = json.loads(
        (tmp_path / "run" / "checkpoints" / "step-00000004" / "trainer_state.json").read_text()
    )
    assert state["step"] == 4 and state["buffer"]["windows"] == 4
    resolved = (tmp_path / "run" / "config.yaml").read_text()
    assert "generation_batch_size: 4" in resolved  # derived value written


def test_bf16_autocast_on_cpu_trains(tmp_path, make_train_config):
    cfg = build_config(make_train_config(train={"bf16": True, "max_steps": 2}))
    metrics = loop.train(cfg)
    assert metrics["step"] == 2 and metrics["skipped"] == 0
    assert 0 < metrics["loss"] < 1


def test_gradient_checkpointing_gives_the_same_gradients(models, bpe_tokenizer, pair_dirs):
    teacher, _ = models
    samples = ragged_samples(bpe_tokenizer)
    opts = {
        "temperature": 1.0,
        "targets_temperature": 1.0,
        "beta": 0.5,
        "chunk_size": None,
        "ce_weight": 0.0,
    }
    pad = bpe_tokenizer.pad_token_id
    plain = load_model(str(pair_dirs[1])).train()
    ckpt = load_model(str(pair_dirs[1])).train()
    enable_activation_checkpointing(ckpt)
    assert ckpt.is_activation_checkpointing and not plain.is_activation_checkpointing
    _, ga = grads_for(plain, teacher, samples, pad, 4, "jsd", None, opts)
    _, gb = grads_for(ckpt, teacher, samples, pad, 4, "jsd", None, opts)
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-6, rtol=1e-5)


def test_lora_student_trains_adapters_and_saves_a_plain_merged_model(
    tmp_path, make_train_config, pair_dirs
):
    pytest.importorskip("peft")
    cfg = build_config(
        make_train_config(
            student={"lora": {"enabled": True, "r": 4, "alpha": 8}},
            train={"max_steps": 2, "lr": 1e-2},
        )
    )
    loop.train(cfg)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(pair_dirs[1]).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final").state_dict()
    assert set(merged) == set(base)  # a plain model: no lora_A/lora_B keys
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all("proj" in k for k in changed)  # only adapted linear layers moved
    assert not any("embed" in k or "norm" in k for k in changed)


def test_missing_tracker_names_the_extra(tmp_path, make_train_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: import raises
    cfg = build_config(make_train_config(logging={"trackers": ["wandb"]}))
    with pytest.raises(DistilError, match=r"pip install 'distil\[trackers\]'"):
        loop.train(cfg)


def test_sft_needs_no_teacher_and_trains_on_the_dataset(tmp_path, make_train_config):
    raw = make_train_config(loss={"name": "sft"}, train={"lambda": 0.0, "max_steps": 3})
    raw["teacher"] = {}
    metrics = loop.train(build_config(raw))
    assert metrics["policy/on_policy_share"] == 0.0
    assert metrics["loss"] == pytest.approx(-metrics["student_logprob"], rel=1e-5)  # CE = -log p


def test_seq_kd_with_sft_trains_on_teacher_completions(tmp_path, make_train_config):
    cfg = build_config(
        make_train_config(
            loss={"name": "sft"}, train={"lambda": 0.0, "seq_kd": True, "max_steps": 2}
        )
    )
    metrics = loop.train(cfg)
    assert metrics["policy/seq_kd_share"] == 1.0 and "loss/seq_kd" in metrics


def test_wall_clock_budget_stops_the_run(tmp_path, make_train_config):
    cfg = build_config(make_train_config(train={"max_steps": 1000, "max_minutes": 1e-6}))
    metrics = loop.train(cfg)
    assert metrics["step"] == 1  # the first step already spends the budget
    assert metrics["time/train_clock"] > 0
    state = json.loads(
        (tmp_path / "run" / "checkpoints" / "step-00000001" / "trainer_state.json").read_text()
    )
    assert state["train_seconds"] == pytest.approx(metrics["time/train_clock"])


def test_tensorboard_tracker_writes_events(tmp_path, make_train_config):
    pytest.importorskip("tensorboard")
    cfg = build_config(
        make_train_config(logging={"trackers": ["tensorboard"]}, train={"max_steps": 2})
    )
    loop.train(cfg)
    events = list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_teacher_on_another_device_than_the_student(tmp_path, make_train_config):
    # on a CPU-only machine both are "cpu", but the explicit device path is exercised
    cfg = build_config(make_train_config(teacher={"device": "cpu"}, train={"max_steps": 1}))
    assert loop.train(cfg)["skipped"] == 0


def test_logging_only_metrics_are_computed_on_logged_steps(tmp_path, make_train_config):
    # kl and entropy cost full-vocabulary passes per chunk: only on steps the progress prints
    # (every log_every, and the last); the losses are those of a run that logs every step
    runs = {}
    for every in (1, 2):
        raw = make_train_config(train={"max_steps": 3, "log_every": every})
        raw["train"]["output_dir"] = str(tmp_path / f"every{every}")
        loop.train(build_config(raw))
        runs[every] = read_metrics(tmp_path / f"every{every}")
    assert ["kl" in m for m in runs[1]] == [True, True, True]
    assert ["kl" in m for m in runs[2]] == [False, True, True]
    assert ["student_entropy" in m for m in runs[2]] == [False, True, True]
    for a, b in zip(runs[1], runs[2], strict=True):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
