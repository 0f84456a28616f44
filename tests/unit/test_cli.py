"""The CLI: config show/validate/diff, countdown generate, eval of completion files, errors."""

import json

import pytest
import yaml

from distil.cli import main


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse rejects malformed arguments with exit code 2
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_config_show_prints_every_resolved_value(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: 0.001\n")
    code, out, _ = run(capsys, "config", "show", str(cfg), "loss.beta=0.2")
    shown = yaml.safe_load(out)
    assert code == 0
    assert shown["train"]["lr"] == 0.001 and shown["loss"]["beta"] == 0.2
    assert shown["generation"]["generation_batch_size"] == 8  # derived value filled in


def test_config_validate_reports_all_problems_without_traceback(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lrr: 1\n  bf16: true\n  fp16: true\nloss:\n  beta: 2\n")
    code, out, err = run(capsys, "config", "validate", str(cfg))
    assert code == 2 and out == ""
    assert "Traceback" not in err
    assert "3 problems" in err
    assert "did you mean 'train.lr'" in err
    assert "'loss.beta' = 2" in err
    assert "train.bf16 and train.fp16 are both true" in err
    cfg.write_text("train:\n  lr: 0.001\n")
    code, _, err = run(capsys, "config", "validate", str(cfg))
    assert code == 2 and "is valid but cannot train" in err
    assert "student.path is not set" in err and "data.train is not set" in err
    assert "loss.name = 'jsd' needs a teacher" in err
    cfg.write_text(
        "train:\n  lr: 0.001\n  lambda: 0\nloss:\n  name: sft\n"
        "student:\n  path: s\ndata:\n  train: d.jsonl\n"
    )
    code, _, err = run(capsys, "config", "validate", str(cfg))  # sft needs no teacher, but ...
    assert code == 2 and "student.path = 's': no such local directory" not in err  # a hub id
    assert "data.train = 'd.jsonl': no such local file" in err


def test_config_validate_ok_only_when_train_would_start(tmp_path, capsys, tiny_model_dir):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "2 + 2 =", "completion": " 4"}\n')
    cfg = tmp_path / "c.yaml"
    base = (
        f"train:\n  lambda: 0\n  output_dir: {tmp_path}/run\nloss:\n  name: sft\n"
        f"data:\n  train: {data}\n"
    )
    cfg.write_text(base + f"student:\n  path: {tiny_model_dir}\n")
    code, out, err = run(capsys, "config", "validate", str(cfg))
    assert code == 0 and out.strip().endswith(": ok"), err
    cfg.write_text(base + "student:\n  path: org/some-model\n")
    code, out, err = run(capsys, "config", "validate", str(cfg))
    assert code == 0 and "student.path = 'org/some-model' is taken as a hub id; not checked" in out
    data.write_text('{"prompt": "2 + 2 =", "completion": " 4"}\n{"prompt": 7}\n')
    cfg.write_text(base + f"student:\n  path: {tiny_model_dir}\n")
    code, out, err = run(capsys, "config", "validate", str(cfg))
    assert code == 2 and f"{data}:2: column 'prompt'" in err and ": ok" not in out
    assert not (tmp_path / "run").exists()


def test_config_diff_two_runs_differing_only_in_bf16(tmp_path, capsys):
    for name, bf16 in (("a", False), ("b", True)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        data = {"train": {"output_dir": str(run_dir), "bf16": bf16, "lr": 3e-4}}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
    code, out, _ = run(capsys, "config", "diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0
    assert out.splitlines() == ["train.bf16  false  true"]
    code, out, _ = run(capsys, "config", "diff", str(tmp_path / "a"), str(tmp_path / "a"))
    assert out.strip() == "no differences"


def test_countdown_generate_writes_disjoint_splits(tmp_path, capsys):
    out_dir = tmp_path / "cd"
    code, _out, _ = run(
        capsys,
        "countdown",
        "generate",
        "--n",
        "50",
        "--test-n",
        "20",
        "--numbers",
        "3-4",
        "--seed",
        "5",
        "--out",
        str(out_dir),
    )
    assert code == 0
    train = [json.loads(x) for x in (out_dir / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (out_dir / "test.jsonl").read_text().splitlines()]
    assert len(train) == 50 and len(test) == 20
    key = lambda r: (tuple(sorted(r["nums"])), r["target"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert (out_dir / "train.parquet").exists() and (out_dir / "meta.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["countdown", "generate", "--n", "5", "--numbers", "7-9", "--out", "x"], "numbers"),
        (["countdown", "generate", "--n", "0", "--out", "x"], "positive integer"),
        (["countdown", "generate", "--n", "abc", "--out", "x"], "positive integer"),
        (["eval"], "--model DIR or --completions FILE"),
        (["eval", "--completions", "missing.jsonl"], "missing.jsonl: no such file"),
        (["eval", "--completions", "x.jsonl", "eval.nope=1"], "unknown key 'eval.nope'"),
    ],
)
def test_bad_cli_input_gives_a_clear_message(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text(
        '{"nums": [1, 2], "target": 3, "completion": "<answer>1+2</answer>"}\n'
    )
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_eval_completions_file_writes_table_json_and_verdicts(tmp_path, capsys):
    rows = [
        {"nums": [1, 2, 3], "target": 6, "completion": "<answer>1 + 2 + 3</answer>"},
        {"nums": [1, 2, 3], "target": 6, "completion": "no tags"},
        {
            "metadata": {"nums": [4, 5], "target": 9},
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<answer>4*5</answer>"},
            ],
        },
        {
            "nums": [4, 5],
            "target": 20,
            "completions": ["<answer>4*5</answer>", "<answer>4+5</answer>"],
        },
    ]
    path = tmp_path / "outs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = run(capsys, "eval", "--completions", str(path), "--out", str(tmp_path / "rep"))
    assert code == 0
    header, _, line = out.strip().splitlines()
    assert header == (
        "| Model | Correct | Accuracy | Missing Answer Tags | Eqn Not Balanced | "
        "Invalid Number Usage | LHS Parse/Eval Error | RHS Parse/Eval Error | "
        "Wrong Value |"
    )  # pass@k columns need >= 2 samples for every problem
    # 5 completions: 2 correct, 1 missing tags, 2 wrong value (4*5 for 9, 4+5 for 20)
    assert line.startswith("| outs | 2/5 | 40.00% | 1 | 0 | 0 | 0 | 0 | 2 |")
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["models"][0]["correct"] == 2 and report["models"][0]["wrong_value"] == 2
    verdicts = [
        json.loads(x) for x in (tmp_path / "rep" / "verdicts-outs.jsonl").read_text().splitlines()
    ]
    assert [v["correct"] for v in verdicts] == [1, 0, 0, 1]
    assert verdicts[3]["samples"][1]["outcome"] == "wrong_value"


def test_malformed_completion_row_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"nums": [1, 2], "target": 3, "completion": "x"}\n\n{"nums": "12", "target": 3}\n'
    )
    code, _, err = run(capsys, "eval", "--completions", str(path))
    assert code == 2
    assert f"{path}:3: 'nums' must be a list of integers" in err
    path.write_text('{"nums": [1, 2], "target": 3}\n')
    code, _, err = run(capsys, "eval", "--completions", str(path))
    assert f"{path}:1: no completion found" in err
    path.write_text('{"nums": [1, 2], "target": 3, \n')
    code, _, err = run(capsys, "eval", "--completions", str(path))
    assert f"{path}:1: not valid JSON" in err


def test_pass_at_k_columns_when_every_problem_has_several_samples():
    from distil.eval.runner import format_table, score
    from distil.tasks.countdown import Countdown

    problems = [
        {"nums": [1, 2], "target": 3, "completions": ["<answer>1+2</answer>", "x", "x", "x"]},
        {"nums": [1, 2], "target": 2, "completions": ["x", "x", "x", "x"]},
    ]
    result = score("m", problems, task=Countdown())
    # pass@2 for (n=4, c=1) is 1 - C(3,2)/C(4,2) = 0.5; the other problem 0 -> mean 0.25
    assert result.summary["pass_at_k"] == {"1": 0.125, "2": 0.25, "4": 0.5}
    header, _, row = format_table([result]).splitlines()
    assert header.endswith("| pass@2 | pass@4 |")
    assert row == "| m | 1/8 | 12.50% | 7 | 0 | 0 | 0 | 0 | 0 | 25.00% | 50.00% |"
