"""What a window's reward does besides its advantages: a completion cut at max_new_tokens gets
reward.truncated (the sampler's stop flag carried on each sample), and a grpo window whose
groups are all flat on every rank is skipped (reward.skip_flat): no forward, backward or
optimizer step, its generation alone charged, so the weights stay exactly as they were."""

from __future__ import annotations

import importlib
import json
import textwrap

import pytest
import torch

from distil.config import EvalConfig, build_config
from distil.data.datasets import load_examples
from distil.tasks.countdown import Countdown
from distil.tasks.reward import TaskReward
from distil.train import loop
from distil.train.reward import WindowRewards, flat_everywhere
from distil.types import Sample


def _module(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _lines(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def test_a_completion_cut_at_max_new_tokens_gets_reward_truncated(countdown_dir):
    examples = load_examples(str(countdown_dir / "train.jsonl"))
    task = Countdown(EvalConfig())
    reward = TaskReward(task, {"correct": 1.0}, default=0.1)
    # one group of four correct answers: ended, cut, unknown (a sampler without the flag), ended
    stopped = [True, False, None, True]

    def window(truncated):
        samples = [Sample(0, [1], [2], "on_policy", stopped=s) for s in stopped]
        for s in samples:
            s.completion_text = examples[0].completion
        rewards = WindowRewards(reward, examples, decode=None, group_size=4,
                                normalize_std=False, outcomes=task.outcomes,
                                truncated=truncated)  # fmt: skip
        return samples, rewards(samples)

    samples, metrics = window(truncated=-0.5)
    assert [s.reward for s in samples] == [1.0, -0.5, 1.0, 1.0]
    assert [s.advantage for s in samples] == pytest.approx([0.375, -1.125, 0.375, 0.375])
    assert metrics["reward/share/truncated"] == 0.25 and metrics["reward/share/correct"] == 0.75
    samples, metrics = window(truncated=None)  # the default: the checker reads the text as is
    assert [s.reward for s in samples] == [1.0] * 4 and "reward/share/truncated" not in metrics
    assert metrics["reward/no_signal_groups"] == 1.0


def test_the_truncated_share_is_the_share_the_sampler_cut(tmp_path, monkeypatch, make_train_config):
    mod = _module(tmp_path, monkeypatch, "rw_trunc", """
        def score(row, completion):
            return float(len(completion) % 2)
        """)  # fmt: skip
    raw = make_train_config(loss={"name": "grpo"}, generation={"max_new_tokens": 3},
                            train={"lambda": 1.0, "max_steps": 2},
                            reward={"function": f"{mod}:score", "truncated": -1.0})  # fmt: skip
    raw["teacher"] = {}
    loop.train(build_config(raw))
    lines = _lines(tmp_path / "run")
    for m in lines:  # every completion the sampler cut, and only those, is `truncated`
        assert m["reward/share/truncated"] == pytest.approx(1.0 - m["on_policy/stopped_share"])
    assert max(m["reward/share/truncated"] for m in lines) > 0  # 3 tokens: most are cut


_FIRST_WINDOW_ONLY = """
    CALLS = []

    def score(row, completion):
        CALLS.append(1)
        # the first window's 8 samples (4 groups of 2) alternate 0, 1: a signal in every
        # group; every later sample gets 0.5: flat groups, no gradient
        return float(len(CALLS) % 2) if len(CALLS) <= 8 else 0.5
    """


def test_flat_windows_are_skipped_and_leave_the_weights_exactly(
    tmp_path, monkeypatch, make_train_config
):
    mod = _module(tmp_path, monkeypatch, "rw_first_window", _FIRST_WINDOW_ONLY)

    def run(name: str, steps: int, skip_flat: bool):
        importlib.import_module(mod).CALLS.clear()
        raw = make_train_config(loss={"name": "grpo"},
                                train={"lambda": 1.0, "max_steps": steps, "schedule": "constant",
                                       "output_dir": str(tmp_path / name)},
                                reward={"function": f"{mod}:score", "skip_flat": skip_flat})  # fmt: skip
        raw["teacher"] = {}
        loop.train(build_config(raw))
        return _weights(tmp_path / name), _lines(tmp_path / name)

    one, one_lines = run("one", 1, True)
    skipped, lines = run("skipped", 3, True)
    stepped, stepped_lines = run("stepped", 3, False)
    # windows 2 and 3 had no signal: skipped, the weights exactly those after window 1
    assert [m["reward/skipped_flat"] for m in lines] == [0, 1, 1]
    assert all(torch.equal(one[k], skipped[k]) for k in one)
    assert [m["grad_norm"] for m in lines[1:]] == [0.0, 0.0] and lines[0]["grad_norm"] > 0
    assert [m["loss"] for m in lines[1:]] == [0.0, 0.0]
    assert [m["tokens/input_local"] for m in lines[1:]] == [0, 0] and lines[0]["tokens/input_local"]
    # a skipped window costs its generation only: no training tokens after window 1
    train, gen = "cost/student_train_tokens", "cost/student_generated_tokens"
    assert lines[-1][train] == one_lines[0][train] and lines[-1][gen] > one_lines[0][gen]
    # stepped, AdamW's moments move the weights on windows of zero gradient (the drift
    # reward.skip_flat avoids); its windows are charged as trained
    assert [m["grad_norm"] for m in stepped_lines[1:]] == [0.0, 0.0]
    assert any(not torch.equal(one[k], stepped[k]) for k in one)
    assert stepped_lines[-1][train] > one_lines[0][train]
    assert "reward/skipped_flat" not in stepped_lines[0]


class _Ranks:
    """Two ranks seen from one: the sum all-reduce adds the other rank's value."""

    def __init__(self, other: float):
        self.num_processes, self.device, self.other, self.calls = 2, torch.device("cpu"), other, 0

    def reduce(self, t, reduction):
        assert reduction == "sum"
        self.calls += 1
        return t + self.other


def test_a_window_is_skipped_only_when_flat_on_every_rank(make_train_config):
    grpo = build_config({**make_train_config(loss={"name": "grpo"}, train={"lambda": 1.0}),
                         "teacher": {}})  # fmt: skip
    flat, signal = {"reward/no_signal_groups": 1.0}, {"reward/no_signal_groups": 0.75}
    assert flat_everywhere(grpo, _Ranks(other=0.0), flat)  # neither rank has a signal
    assert not flat_everywhere(grpo, _Ranks(other=1.0), flat)  # the other rank has one
    assert not flat_everywhere(grpo, _Ranks(other=0.0), signal)
    # a distillation loss (a reward logged or added) is never skipped: no all-reduce either
    opd = build_config(make_train_config(loss={"reward_weight": 0.5}, train={"lambda": 1.0}))
    ranks = _Ranks(other=0.0)
    assert not flat_everywhere(opd, ranks, flat) and ranks.calls == 0
    off = grpo.model_copy(update={"reward": grpo.reward.model_copy(update={"skip_flat": False})})
    assert not flat_everywhere(off, ranks, flat) and ranks.calls == 0


_ROW_SIGNAL = """
    def score(row, completion):
        # a signal only for targets divisible by 3: windows of other rows are flat
        return float(len(completion) % 2) if row["target"] % 3 == 0 else 0.5
    """


@pytest.mark.parametrize("killed_at", [2, 5])
def test_a_run_killed_inside_skipped_windows_resumes_as_if_uninterrupted(
    tmp_path, monkeypatch, make_train_config, killed_at
):
    """Killed right after the checkpoint of a skipped window (step 2: before any optimizer
    step; step 5: after two trained windows), the resumed run skips and trains the same windows
    and ends with the uninterrupted run's weights, reward and cost."""
    from distil.testing import train_killed_after_checkpoint

    mod = _module(tmp_path, monkeypatch, "rw_row_signal", _ROW_SIGNAL)

    def raw(name):
        r = make_train_config(loss={"name": "grpo"},
                              train={"lambda": 1.0, "max_steps": 6, "save_every": 1,
                                     "keep_last": 10, "output_dir": str(tmp_path / name)},
                              reward={"function": f"{mod}:score"})  # fmt: skip
        r["teacher"] = {}
        return build_config(r)

    loop.train(raw("full"))
    full = _lines(tmp_path / "full")
    pattern = [m["reward/skipped_flat"] for m in full]
    # as designed: the checkpoint is a skipped window's; step 2 before any trained window,
    # step 5 after some
    assert pattern[killed_at - 1] == 1, pattern
    assert (0 not in pattern[:2] and 0 in pattern[2:]) if killed_at == 2 else (0 in pattern[:5])
    train_killed_after_checkpoint(monkeypatch, raw("killed"), step=killed_at)
    resumed = _lines(tmp_path / "killed")
    assert [m["step"] for m in resumed] == list(range(1, 7))
    for a, b in zip(full, resumed, strict=True):
        for key in ("reward/skipped_flat", "reward/mean", "cost/student_flops", "grad_norm"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    want, got = _weights(tmp_path / "full"), _weights(tmp_path / "killed")
    for k in want:
        torch.testing.assert_close(want[k], got[k], atol=1e-6, rtol=0)
