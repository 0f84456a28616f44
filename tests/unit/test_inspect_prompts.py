"""`distil inspect pair --config CONFIG`: the first rows' prompts side by side, the teacher's
with its privileged context (teacher.context / teacher.system), the student's without; the
tokenizer comparison of `--student/--teacher` is unchanged. The command runs through the
CLI's entry point in this process (its arguments and output are what is tested)."""

from __future__ import annotations

import json

import pytest
import yaml

from distil.cli import main
from distil.config import build_config
from distil.inspect_prompts import prompt_pairs
from distil.models.load import load_tokenizer

HINT = "{prompt} (a solution: {solution})"
RENDER = {"tokenize": False, "add_generation_prompt": True}


@pytest.fixture
def rows(countdown_dir):
    return [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]


def test_the_teachers_prompt_carries_the_context_and_the_students_does_not(
    make_train_config, pair_dirs, rows
):
    raw = make_train_config(teacher={"context": HINT, "system": "Think."})
    tok = load_tokenizer(str(pair_dirs[1]))
    pairs = prompt_pairs(build_config(raw), 3, tok)
    assert [p.row for p in pairs] == [0, 1, 2]
    for p, row in zip(pairs, rows, strict=False):
        assert p.privileged and p.teacher is None
        assert row["solution"] not in p.student and "Think." not in p.student
        (user,) = row["prompt"]  # by hand: a system message, the hint after the user's text
        hinted = f"{user['content']} (a solution: {row['solution']})"
        teacher = [{"role": "system", "content": "Think."}, {"role": "user", "content": hinted}]
        assert p.student == tok.apply_chat_template(row["prompt"], **RENDER)
        assert p.teacher_prompt == tok.apply_chat_template(teacher, **RENDER)


def test_without_context_the_teacher_reads_the_students_prompt(make_train_config, pair_dirs):
    pairs = prompt_pairs(build_config(make_train_config()), 2, load_tokenizer(str(pair_dirs[1])))
    assert all(not p.privileged and p.teacher_prompt == p.student for p in pairs)


def test_verbatim_prompts_show_each_side_as_training_reads_it(
    make_train_config, pair_dirs, tmp_path
):
    # data.text_prompts=verbatim: each row's student prompt is its own text, whole
    texts = ["What is 2+3?", "Name a prime number larger than 10.", "Write a haiku about rain."]
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    data = {"train": str(path), "template": None, "text_prompts": "verbatim"}
    tok = load_tokenizer(str(pair_dirs[1]))
    pairs = prompt_pairs(build_config(make_train_config(data=data)), 3, tok)
    assert [p.student for p in pairs] == texts == [p.teacher_prompt for p in pairs]


@pytest.fixture
def run_inspect(capsys, monkeypatch):
    """run_inspect(*args) -> (exit status, stdout, stderr) of `distil inspect pair *args`
    through the CLI's entry point, 400 columns wide (no line is wrapped)."""
    monkeypatch.setenv("COLUMNS", "400")

    def run(*args):
        capsys.readouterr()
        try:
            code = main(["inspect", "pair", *args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_inspect_pair_with_a_config_prints_both_prompts(
    make_train_config, pair_dirs, rows, tmp_path, run_inspect
):
    raw = make_train_config(teacher={"system": "Think."})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run_inspect(
        "--config", str(path), "teacher.context=" + json.dumps(HINT), "--rows", "2"
    )
    assert code == 0, err
    assert "the student sees" in out and "the teacher sees" in out
    assert "shared by bytes" in out  # the tokenizer comparison still runs first
    for row in rows[:2]:
        assert f"(a solution: {row['solution']})" in out
    assert rows[2]["solution"] not in out
    # the --student/--teacher form is unchanged and prints no prompts
    code, plain, _ = run_inspect(f"--student={pair_dirs[1]}", f"--teacher={pair_dirs[0]}")
    assert code == 0 and "shared by bytes" in plain
    assert "the teacher sees" not in plain
    code, _, err = run_inspect(f"--student={pair_dirs[1]}")
    assert code != 0 and "--config CONFIG" in err


def test_each_routed_row_shows_its_own_teachers_prompt(
    make_train_config, pair_dirs, rows, tmp_path
):
    data = tmp_path / "routed.jsonl"
    data.write_text(
        "".join(json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows))
    )
    raw = make_train_config(data={"train": str(data)}, teacher={"path": None})
    models = {"a": {"path": str(pair_dirs[0]), "context": HINT}, "b": {"path": str(pair_dirs[0])}}
    raw["teachers"] = {"models": models, "column": "src"}
    pairs = prompt_pairs(build_config(raw), 4, load_tokenizer(str(pair_dirs[1])))
    assert [p.teacher for p in pairs] == ["a", "b", "a", "b"]
    for p, row in zip(pairs, rows, strict=False):
        assert p.privileged == (p.teacher == "a")
        assert (f"(a solution: {row['solution']})" in p.teacher_prompt) == (p.teacher == "a")
        assert row["solution"] not in p.student
