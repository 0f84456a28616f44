"""A task's reward in training (train/reward.py): the checker's outcome categories and a user's
function scored per completion, advantages and metrics per window, bad rewards stopped naming
the row, the config rules, and runs: reward_weight 0 bit-identical to distillation, GRPO
without a teacher, the reward on the sampler's thread with generation.async."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from distil.config import EvalConfig, build_config
from distil.data.collate import collate
from distil.data.datasets import load_examples
from distil.errors import ConfigError, DataError
from distil.losses import get_loss, group_advantages
from distil.tasks.countdown import Countdown
from distil.tasks.reward import FunctionReward, TaskReward
from distil.train import loop
from distil.train.logging import ProgressLine
from distil.train.reward import WindowRewards
from distil.train.step import micro_step
from distil.types import Sample


@pytest.fixture
def examples(countdown_dir):
    return load_examples(str(countdown_dir / "train.jsonl"))


def _answer(example, correct: bool) -> str:
    """A completion of example's problem: its solution, or a well-formed wrong one."""
    nums = example.meta["nums"]
    if correct:
        return example.completion or ""
    wrong = " * ".join(map(str, nums))  # every number once, a value other than the target
    assert eval(wrong) != example.meta["target"]
    return f"<answer>{wrong}</answer>"


def test_countdown_reward_per_outcome_category(examples):
    task = Countdown(EvalConfig())
    reward = TaskReward(task, {"correct": 1.0, "missing_answer_tags": 0.0}, default=0.1)
    e = examples[0]
    assert "<answer>" in e.completion  # the tests' data holds solutions
    assert reward(e, _answer(e, True)) == (1.0, "correct")
    assert reward(e, _answer(e, False)) == (0.1, "wrong_value")  # right format, wrong value
    assert reward(e, "I do not know") == (0.0, "missing_answer_tags")  # no answer
    with pytest.raises(ConfigError, match=r"not outcomes of task 'countdown'.*wrong_value"):
        TaskReward(task, {"right": 1.0}, default=0.0)


def test_window_rewards_set_advantages_and_metrics(examples):
    task = Countdown(EvalConfig())
    reward = TaskReward(task, {"correct": 1.0}, default=0.0)
    # two prompts x 4 samples: prompt 0 one correct of four, prompt 1 none (a flat group)
    texts = [True, False, False, False, False, False, False, False]
    samples = [Sample(i // 4, [1], [2], "on_policy") for i in range(8)]
    for s, ok in zip(samples, texts, strict=True):
        s.completion_text = _answer(examples[s.example_id], ok)
    window = WindowRewards(reward, examples, decode=None, group_size=4, normalize_std=True,
                           outcomes=task.outcomes)  # fmt: skip
    metrics = window(samples)
    want = group_advantages(torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.float64), 4)
    assert [s.advantage for s in samples] == pytest.approx(want.tolist())
    assert [s.reward for s in samples] == [1.0] + [0.0] * 7
    assert metrics["reward/mean"] == 1 / 8
    assert metrics["reward/no_signal_groups"] == 0.5
    assert metrics["reward/share/correct"] == 1 / 8
    assert metrics["reward/share/wrong_value"] == 7 / 8
    assert metrics["reward/share/missing_answer_tags"] == 0.0  # every outcome gets a share


def _module(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_user_reward_function_by_import_path(tmp_path, monkeypatch, examples):
    mod = _module(tmp_path, monkeypatch, "rw_user_ok", """
        def score(row, completion):
            return float(row["target"] in [int(x) for x in completion.split() if x.isdigit()])

        def with_category(row, completion):
            return (0.5, "half") if "half" in completion else (0, "none")
        """)  # fmt: skip
    e = examples[3]
    fn = FunctionReward(f"{mod}:score")
    assert fn(e, f"the answer is {e.meta['target']}") == (1.0, "scored")
    assert fn(e, "no number") == (0.0, "scored")
    assert FunctionReward(f"{mod}:with_category")(e, "half of it") == (0.5, "half")
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        FunctionReward(f"{mod}:nope")
    with pytest.raises(ConfigError, match="cannot import module 'rw_missing_mod'"):
        FunctionReward("rw_missing_mod:score")


def test_numpy_numbers_are_rewards(tmp_path, monkeypatch, examples):
    mod = _module(tmp_path, monkeypatch, "rw_numpy", """
        import numpy as np

        def f32(row, completion):
            return np.float32(0.5)

        def i64(row, completion):
            return (np.int64(2), "two")
        """)  # fmt: skip
    e = examples[0]
    got = FunctionReward(f"{mod}:f32")(e, "x")
    assert got == (0.5, "scored") and type(got[0]) is float
    got = FunctionReward(f"{mod}:i64")(e, "x")
    assert got == (2.0, "two") and type(got[0]) is float


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("def score(row, completion)\n    return 1.0\n", r"failed with SyntaxError"),
        ("raise RuntimeError('no GPU here')\n", r"failed with RuntimeError: no GPU here"),
    ],
)
def test_a_module_that_fails_to_import_is_a_config_error(tmp_path, monkeypatch, body, what):
    name = f"rw_broken_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=rf"importing module '{name}' {what}.*Fix: the error"):
        FunctionReward(f"{name}:score")


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("raise KeyError('answer')", r"raised KeyError: 'answer'"),
        ("return float('nan')", r"returned nan"),
        ("return 'good'", r"returned 'good'"),
        ("return True", r"returned True"),
        ("import numpy\n    return numpy.bool_(True)", r"returned np.True_"),
        ("import numpy\n    return numpy.float32('inf')", r"returned np.float32\(inf\)"),
        ("return (1.0, 2)", r"returned the category 2, not a str"),
    ],
)
def test_a_bad_reward_stops_naming_the_row(tmp_path, monkeypatch, examples, body, what):
    name = f"rw_bad_{abs(hash(body)) % 10**8}"
    mod = _module(tmp_path, monkeypatch, name, f"def score(row, completion):\n    {body}\n")
    e = examples[5]
    with pytest.raises(DataError, match=what) as err:
        FunctionReward(f"{mod}:score")(e, "<answer>1+2</answer>")
    msg = str(err.value)
    path, line = e.meta["_where"].rsplit(":", 1)
    assert msg.startswith(f"{path}:{line}: data row 5: reward.function {mod}:score")
    assert "'<answer>1+2</answer>'" in msg and "Fix: return a finite number" in msg


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"loss": {"name": "grpo"}, "train": {"lambda": 0.5}}, "grpo.*train.lambda=1"),
        ({"loss": {"name": "sft", "reward_weight": 1.0}, "train": {"lambda": 0.0}},
         "reward_weight = 1.0 adds a reward"),
        ({"loss": {"reward_weight": 1.0}, "train": {"lambda": 0.0}}, "draws none"),
        ({"loss": {"name": "grpo"}, "train": {"lambda": 1.0},
          "generation": {"num_generations": 1}}, "num_generations = 1"),
        ({"loss": {"reward_weight": 0.5}, "train": {"lambda": 1.0},
          "generation": {"async": True, "top_k": 5}}, "ratio is biased"),
        ({"reward": {"function": "not a path"}}, "is not an import path"),
        ({"reward": {"log": True}, "train": {"lambda": 1.0},
          "generation": {"num_generations": 1}}, r"reward.log = true with .*num_generations = 1"),
        ({"loss": {"name": "grpo"}, "train": {"lambda": 1.0},
          "teacher": {"context": "{prompt}"}}, "grpo' reads no teacher"),
    ],
)  # fmt: skip
def test_config_rules(make_train_config, sections, match):
    with pytest.raises(ConfigError, match=match):
        build_config(make_train_config(**sections))


def test_the_configs_teacherless_losses_are_the_registrys():
    # the config layer sits below losses/ and keeps its own copy of the names
    from distil.config.rules_reward import TEACHERLESS
    from distil.losses import TEACHERLESS_LOSSES

    assert TEACHERLESS == TEACHERLESS_LOSSES


def _final_state(out) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def test_reward_weight_zero_is_bit_identical_to_distillation(tmp_path, make_train_config):
    sections = {"train": {"lambda": 1.0, "max_steps": 2}}
    plain = make_train_config(**sections)
    plain["train"]["output_dir"] = str(tmp_path / "plain")
    logged = make_train_config(**sections, reward={"log": True}, loss={"reward_weight": 0.0})
    logged["train"]["output_dir"] = str(tmp_path / "logged")
    m_plain = loop.train(build_config(plain))
    m_logged = loop.train(build_config(logged))
    a, b = _final_state(tmp_path / "plain"), _final_state(tmp_path / "logged")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert m_logged["loss"] == m_plain["loss"] and m_logged["grad_norm"] == m_plain["grad_norm"]
    assert "reward/mean" not in m_plain and 0.0 <= m_logged["reward/mean"] <= 1.0
    assert "reward/share/correct" in m_logged and "reward/no_signal_groups" in m_logged


def test_grpo_trains_without_a_teacher_on_a_user_reward(tmp_path, monkeypatch, make_train_config):
    # a reward that varies within groups: the completion's length mod 3
    mod = _module(tmp_path, monkeypatch, "rw_length", """
        def score(row, completion):
            return float(len(completion) % 3)
        """)  # fmt: skip
    raw = make_train_config(loss={"name": "grpo"}, train={"lambda": 1.0, "max_steps": 2},
                            reward={"function": f"{mod}:score"})  # fmt: skip
    raw["teacher"] = {}
    metrics = loop.train(build_config(raw))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["reward/share/scored"] == 1.0 and m["reward/no_signal_groups"] < 1.0
        assert m["grad_norm"] > 0 and m["skipped"] == 0
        assert m["ratio_clipped"] == 0.0  # synchronous: ρ = 1, the loss is -A per token
        assert m["loss"] == pytest.approx(-m["advantage"], abs=1e-7)
    assert metrics["cost/teacher_flops"] == 0.0  # no teacher ran


def test_async_reward_scores_on_the_sampler_thread(tmp_path, monkeypatch, make_train_config):
    import threading

    mod = _module(tmp_path, monkeypatch, "rw_thread", """
        import threading
        THREADS = []

        def score(row, completion):
            THREADS.append(threading.current_thread().name)
            return float(len(completion) % 2)
        """)  # fmt: skip
    raw = make_train_config(
        loss={"name": "jsd", "reward_weight": 0.5},
        train={"lambda": 1.0, "max_steps": 3},
        generation={"async": True, "temperature": 0.7},  # ρ at the sampler's temperature
        reward={"function": f"{mod}:score"},
    )
    metrics = loop.train(build_config(raw))
    import importlib

    threads = set(importlib.import_module(mod).THREADS)
    assert threads == {"distil-async-generation"} and threading.current_thread().name not in threads
    assert metrics["policy/staleness"] == 1.0  # the ratio corrects a one-step lag
    assert 0.0 <= metrics["ratio_clipped"] < 1.0 and "reward_loss" in metrics
    # reward loss = -mean over tokens of min(ρ A, clip(ρ) A): -advantage exactly when ρ = 1.
    # Step 1's window was sampled by the weights it trains (no lag): the sampler's log-probs
    # equal the learner's and ρ = 1 up to float noise; later windows lag a step and ρ != 1.
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    gaps = [abs(m["reward_loss"] + m["advantage"]) for m in lines]
    assert [m["policy/staleness"] for m in lines] == [0.0, 1.0, 1.0]
    assert gaps[0] < 1e-6 and min(gaps[1:]) > 1e-5


def test_grpo_micro_batch_split_does_not_change_gradients(pair_dirs, bpe_tokenizer):
    from distil.models.load import load_model

    student = load_model(str(pair_dirs[1])).train()
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(8):
        length = 2 + (i * 5) % 8
        completion = torch.randint(10, len(bpe_tokenizer) - 10, (length,), generator=g).tolist()
        prompt = bpe_tokenizer(f"nums: {i} {i + 3}", add_special_tokens=False)["input_ids"]
        s = Sample(i // 4, prompt, completion, "on_policy", advantage=float((i * 7) % 5 - 2))
        samples.append(s)
    pad = bpe_tokenizer.pad_token_id

    def grads(micro: int):
        student.zero_grad(set_to_none=True)
        batches = [collate(samples[s : s + micro], pad) for s in range(0, 8, micro)]
        n = sum(b.num_loss_tokens for b in batches)
        for b in batches:
            micro_step(student, student, b, None, get_loss("grpo"), num_tokens=n,
                       loss_opts={"chunk_size": None}).loss.backward()  # fmt: skip
        return {k: p.grad.clone() for k, p in student.named_parameters()}

    whole, split = grads(8), grads(2)
    assert any(v.abs().sum() > 0 for v in whole.values())
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], atol=1e-6, rtol=1e-4)


def test_progress_line_shows_the_reward(capsys):
    line = ProgressLine(10, 0, every=1, enabled=True)
    shares = {"correct": 0.25, "wrong_value": 0.625, "missing_answer_tags": 0.125, "x": 0.0}
    line.update(
        1,
        {
            "loss": 0.5,
            "reward/mean": 0.375,
            "reward/no_signal_groups": 0.25,
            **{f"reward/share/{k}": v for k, v in shares.items()},
        },
    )
    err = capsys.readouterr().err
    assert "reward 0.375 | wrong_value 62% correct 25% missing_answer_tags 12% | " in err
    assert "flat groups 25%" in err and " x " not in err


class _Ranks:
    """An accelerator of `n` ranks seen from rank `me`, whose sum all-reduce adds the other
    ranks' tensors (`others`)."""

    def __init__(self, me: int, n: int, others: list[torch.Tensor] = ()):
        self.process_index, self.num_processes, self.device = me, n, torch.device("cpu")
        self.others, self.sent = list(others), []

    def reduce(self, t, reduction):
        assert reduction == "sum"
        self.sent.append(t.clone())
        return t + sum(self.others)


def _flags(no_signal_share: float | None, me: int = 0, n: int = 1, others=()):
    from distil.train.guard import rank_flags

    window = {} if no_signal_share is None else {"reward/no_signal_groups": no_signal_share}
    acc = _Ranks(me, n, others)
    return rank_flags(acc, 0, False, torch.tensor(True), window), acc


def test_a_grpo_window_without_signal_is_not_a_dead_model():
    from distil.config import TrainConfig
    from distil.errors import DistilError
    from distil.train.guard import Guard

    def guard(reward_only: bool) -> Guard:
        return Guard(TrainConfig(max_zero_grad_steps=2), {}, None, reward_only=reward_only)

    flat = {"grad_norm": 0.0, "tokens/loss": 100, "reward/no_signal_groups": 1.0}
    no_signal, _ = _flags(1.0)
    grpo = guard(reward_only=True)
    for step in range(1, 5):  # every group's rewards equal: zero gradient by design
        grpo.after_step(step, True, flat, no_signal, last=False)
    assert grpo.zeros == 0 and grpo.healthy
    signal, _ = _flags(0.5)  # a signal, and still no gradient: dead
    grpo.after_step(5, True, {**flat, "reward/no_signal_groups": 0.5}, signal, last=False)
    with pytest.raises(DistilError, match="exactly 0 for 2 steps"):
        grpo.after_step(6, True, {**flat, "reward/no_signal_groups": 0.5}, signal, last=False)
    # a distillation run that logs (or adds) the reward: flat groups excuse nothing
    opd = guard(reward_only=False)
    opd.after_step(1, True, flat, no_signal, last=False)
    with pytest.raises(DistilError, match="exactly 0 for 2 steps"):
        opd.after_step(2, True, flat, no_signal, last=False)


def test_the_reward_signal_is_decided_over_all_ranks():
    # rank 0's window is flat, rank 1's has a signal: both ranks see a signal (one decision)
    _, rank1 = _flags(0.5, me=1, n=2)
    rank0, acc = _flags(1.0, me=0, n=2, others=rank1.sent)
    assert rank0["reward_signal"] and len(acc.sent) == 1  # the one all-reduce of the step
    flat, _ = _flags(1.0, me=0, n=2, others=_flags(1.0, me=1, n=2)[1].sent)
    assert not flat["reward_signal"] and flat["bad_ranks"] == []
    assert not _flags(None)[0]["reward_signal"]  # a run that scores no reward


def test_the_preflight_names_a_bad_reward_before_any_weights_load(make_train_config):
    from distil.preflight import check

    on = {"loss": {"reward_weight": 0.5}, "train": {"lambda": 1.0}}
    cfg = build_config(make_train_config(**on, reward={"values": {"right": 1.0}}))
    with pytest.raises(ConfigError, match=r"reward.values names \['right'\]"):
        check(cfg, "train")
    cfg = build_config(make_train_config(**on, reward={"function": "rw_nowhere_mod:score"}))
    with pytest.raises(ConfigError, match="cannot import module 'rw_nowhere_mod'"):
        check(cfg, "train")
    check(build_config(make_train_config(**on)), "train")  # the default: Countdown's correct
