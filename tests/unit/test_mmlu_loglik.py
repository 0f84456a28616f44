"""MMLU scored by log-likelihood (eval.mmlu_scoring=loglik) means what lm-evaluation-harness's
MMLU means: on the same tiny model and rows, distil's per-choice log-likelihoods and accuracy
equal lm-eval's (run on a local task file with MMLU's own template); and each log-likelihood
equals a plain unbatched forward pass."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import distil
from distil.cli import main
from distil.errors import ConfigError, DataError
from distil.eval.loglik import encode_pair
from distil.testing import load_tokenizer

SUBJECT = "abstract_algebra"


def _row(i: int) -> dict:
    choices = [f"{2 * i}", f"{2 * i + 1}", f"{i} and {i}", "none of these"]
    return {
        "question": f"What is {i} + {i + 1}? ",
        "choices": choices,
        "answer": i % 4,
        "subject": SUBJECT,
    }


# lm-eval's MMLU task (lm_eval/tasks/mmlu/default) over local JSON files
TASK = """task: tiny_mmlu
dataset_path: json
dataset_kwargs:
  data_files:
    test: {test}
    dev: {dev}
test_split: test
fewshot_split: dev
fewshot_config:
  sampler: first_n
output_type: multiple_choice
description: "The following are multiple choice questions (with answers) about abstract algebra.\\n\\n"
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\nC. {{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
num_fewshot: 2
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture
def mmlu_files(tmp_path):
    test, dev = tmp_path / "test.jsonl", tmp_path / "dev.jsonl"
    test.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(12)))
    dev.write_text("".join(json.dumps(_row(100 + i)) + "\n" for i in range(3)))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mmlu.yaml").write_text(TASK.format(test=test, dev=dev))
    return test, dev, tasks


def _distil_loglik(model, test, dev, **kw):
    return distil.evaluate(
        model,
        task="mmlu",
        mmlu_scoring="loglik",
        data=str(test),
        fewshot_data=str(dev),
        fewshot_split="train",  # a local file's rows are its "train" split
        num_fewshot=2,
        **kw,
    )


@pytest.fixture(params=["bpe", "unigram_bos"])
def student_dir(request, pair_dirs):
    """A tiny model over a tokenizer that adds no BOS (bpe), and one that adds <bos>
    (unigram): lm-eval before 0.4.10 encoded without BOS, which only the second can catch."""
    if request.param == "bpe":
        return str(pair_dirs[1])
    path = request.getfixturevalue("tiny_qwen2_dir")
    ids = load_tokenizer(path)("Answer:")["input_ids"]
    assert ids[0] == load_tokenizer(path).bos_token_id  # the tokenizer's default adds BOS
    return str(path)


def test_loglik_mmlu_equals_lm_evaluation_harness(mmlu_files, student_dir):
    pytest.importorskip("lm_eval")
    test, dev, tasks = mmlu_files
    student = student_dir
    ours = _distil_loglik(student, test, dev)
    theirs = distil.evaluate(
        student, lm_eval="tiny_mmlu", include_path=str(tasks), log_samples=True
    )
    samples = sorted(theirs["samples"]["tiny_mmlu"], key=lambda s: s["doc_id"])
    assert len(samples) == len(ours.rows) == 12
    for row, sample in zip(ours.rows, samples, strict=True):
        assert row["logliks"] == pytest.approx([r[0][0] for r in sample["resps"]], abs=1e-4)
        assert (row["correct"] == 1) == (sample["acc"] == 1.0)
    assert ours.summary["accuracy"] == theirs["results"]["tiny_mmlu"]["acc,none"]


def test_each_loglik_is_a_plain_forward_pass(mmlu_files, pair_dirs):
    test, dev, _ = mmlu_files
    tok = load_tokenizer(pair_dirs[1])
    model = AutoModelForCausalLM.from_pretrained(pair_dirs[1]).eval()
    result = _distil_loglik(model, test, dev, tokenizer=tok, batch_size=5)  # ragged batches
    from distil.config import EvalConfig
    from distil.tasks import make_task

    task = make_task(
        EvalConfig(
            task="mmlu", num_fewshot=2, fewshot_data=str(dev), fewshot_split="train", data=str(test)
        )
    )
    problems = task.load()[0]
    for row, problem in zip(result.rows, problems, strict=True):
        context, options = task.choice_prompt(problem)
        assert (
            context.endswith("D. none of these\nAnswer:") and "about abstract algebra." in context
        )
        expected = []
        for continuation, _ in options:
            head, cont = encode_pair(tok, context, continuation)
            with torch.no_grad():
                logp = model(torch.tensor([head + cont])).logits[0].log_softmax(-1)
            expected.append(sum(float(logp[len(head) - 1 + j, t]) for j, t in enumerate(cont)))
        assert row["logliks"] == pytest.approx(expected, abs=1e-4)
        best = "ABCD"[max(range(4), key=lambda i: expected[i])]
        assert row["samples"][0]["completion"] == best


def test_distil_eval_lm_eval_writes_lm_evals_numbers(mmlu_files, pair_dirs, tmp_path, capsys):
    pytest.importorskip("lm_eval")
    _, _, tasks = mmlu_files
    out = tmp_path / "report"
    argv = ["eval", "--lm-eval", "tiny_mmlu", "--lm-eval-include", str(tasks)]
    assert main([*argv, "--model", str(pair_dirs[1]), "--n", "4", "--out", str(out)]) == 0
    report = json.loads((out / "lm_eval.json").read_text())
    assert report["results"]["tiny_mmlu"]["sample_len"] == 4
    assert "tiny_mmlu" in capsys.readouterr().out  # lm-eval's own table


def test_in_training_mmlu_scores_by_loglik_as_the_final_model_does(
    mmlu_files, make_train_config, tmp_path
):
    test, dev, _ = mmlu_files
    eval_keys = {
        "task": "mmlu",
        "mmlu_scoring": "loglik",
        "data": str(test),
        "fewshot_data": str(dev),
        "fewshot_split": "train",
        "num_fewshot": 2,
    }
    raw = make_train_config(train={"max_steps": 2, "eval_every": 2}, eval=eval_keys)
    result = distil.Distiller(raw).train()
    again = distil.evaluate(result.final_model, **eval_keys, n=8)
    assert result.metrics["eval/problems"] == again.summary["problems"] == 8
    for outcome in ("correct", "wrong_choice", "no_choice"):
        assert result.metrics[f"eval/{outcome}"] == again.summary[outcome]
    assert result.metrics["eval/no_choice"] == 0  # a letter for every problem: none generated


def _full_log_softmax_logliks(model, pairs):
    """The reference: each pair alone, log_softmax over every position of its forward."""
    out = []
    for head, cont in pairs:
        with torch.no_grad():
            logp_L_V = model(torch.tensor([head + cont])).logits[0]
        logp_L_V = logp_L_V.float().log_softmax(-1)
        out.append(sum(float(logp_L_V[len(head) - 1 + j, t]) for j, t in enumerate(cont)))
    return out


def test_only_the_continuation_positions_are_normalized(pair_dirs, monkeypatch):
    """log_softmax sees the continuations' N positions, not the batch's B x L x V logits, and
    the log-likelihoods equal a full log_softmax's."""
    from distil.eval.loglik import logliks

    tok = load_tokenizer(pair_dirs[1])
    model = AutoModelForCausalLM.from_pretrained(pair_dirs[1]).eval()
    requests = [
        (f"Question {i}: what is {i} + {i}? " * (1 + i % 3) + "Answer:", " A") for i in range(5)
    ]
    requests += [("Pick one:", " B or C"), ("x", " y z w")]
    seen = []
    real = torch.log_softmax

    def spy(t, *args, **kwargs):
        seen.append(tuple(t.shape))
        return real(t, *args, **kwargs)

    monkeypatch.setattr(torch, "log_softmax", spy)
    ours = logliks(model, tok, requests, batch_size=4)
    pairs = [encode_pair(tok, c, x) for c, x in requests]
    monkeypatch.setattr(torch, "log_softmax", real)
    assert ours == pytest.approx(_full_log_softmax_logliks(model, pairs), abs=1e-5)
    vocab = model.config.vocab_size
    n = [sum(len(c) for _, c in pairs[s : s + 4]) for s in (0, 4)]
    assert seen == [(n[0], vocab), (n[1], vocab)]  # one call per batch, continuations only


def test_distil_eval_lm_eval_refuses_what_it_would_ignore(
    mmlu_files, pair_dirs, tmp_path, monkeypatch, capsys
):
    """Options an lm-eval run cannot honour, and an unusable --out, stop before lm-eval runs."""
    import distil.eval.lm_eval as lm_eval_module

    def not_run(*args, **kwargs):
        raise AssertionError("lm-eval ran")

    monkeypatch.setattr(lm_eval_module, "run_lm_eval", not_run)
    _, _, tasks = mmlu_files
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("eval:\n  n: 3\n")
    argv = ["eval", "--lm-eval", "tiny_mmlu", "--lm-eval-include", str(tasks)]
    argv += ["--model", str(pair_dirs[1])]
    for extra, named in [
        (["--config", str(cfg)], "--config does not apply"),
        (["eval.n=3"], "overrides does not apply"),
        (["--template", "mmlu_plain"], "--template does not apply"),
        (["--temperature", "0"], "--temperature does not apply"),
        (["--template", "x", "--samples", "2"], "--samples, --template do not apply"),
    ]:
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert named in err and "lm-eval takes --model, --n" in err, extra
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main([*argv, "--out", str(blocker / "report")]) == 2
    assert "report directory sits under" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="mmlu_scoring does not apply"):
        distil.evaluate(pair_dirs[1], lm_eval="tiny_mmlu", mmlu_scoring="loglik")
    with pytest.raises(ConfigError, match="task, temperature do not apply"):
        distil.evaluate(pair_dirs[1], "mmlu", lm_eval="tiny_mmlu", temperature=0)
    with pytest.raises(DataError, match="report directory"):
        distil.evaluate(pair_dirs[1], lm_eval="tiny_mmlu", out=str(blocker / "r"))
    model = AutoModelForCausalLM.from_pretrained(pair_dirs[1])
    with pytest.raises(ConfigError, match="without its tokenizer"):
        distil.evaluate(model, lm_eval="tiny_mmlu")
