"""`distil eval` reports: a distinct name and verdicts file per model, the model path and the
problems file (path, rows, sha256) recorded, and a bad --out refused before anything runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from distil.cli import main
from distil.errors import ConfigError
from distil.eval import runner
from distil.eval.runner import unique_names
from distil.tasks.countdown import Countdown


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def problems_file(tmp_path) -> Path:
    rows = [{"nums": [1, 2, 3], "target": 6}, {"nums": [4, 5], "target": 20}]
    rows += [{"nums": [7, 8], "target": 15}]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def fake_generation(monkeypatch):
    """Replace the model's generation: a model directory whose name contains "good" answers
    every problem with "+" over its numbers, any other answers "no idea". Records the calls."""
    calls = []

    def generate(model_path, problems, cfg, **_):
        calls.append(model_path)
        good = "good" in str(model_path)
        return [
            {**p, "completions": ["<answer>" + " + ".join(map(str, p["nums"])) + "</answer>"]}
            if good
            else {**p, "completions": ["no idea"]}
            for p in problems
        ]

    monkeypatch.setattr(runner, "generate_for_model", generate)
    return calls


def test_two_models_named_final_get_two_rows_and_two_verdict_files(
    tmp_path, capsys, problems_file, fake_generation
):
    a, b = tmp_path / "runs" / "good" / "final", tmp_path / "runs" / "bad" / "final"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    out = tmp_path / "rep"
    argv = ["eval", "--model", str(a), "--model", str(b), "--data", str(problems_file)]
    code, stdout, err = run(capsys, *argv, "--n", "2", "--out", str(out))
    assert code == 0, err
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "/final" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| good/final", "| bad/final"]
    assert [r.split(" | ")[1] for r in rows] == ["1/2", "0/2"]  # 4 + 5 != 20

    report = json.loads((out / "report.json").read_text())
    digest = hashlib.sha256(problems_file.read_bytes()).hexdigest()
    data = {
        "path": str(problems_file),
        "rows": 3,
        "bytes": problems_file.stat().st_size,
        "sha256": digest,
        "used": 2,
    }
    assert [(m["name"], m["path"], m["kind"]) for m in report["models"]] == [
        ("good/final", str(a), "model"),
        ("bad/final", str(b), "model"),
    ]
    assert all(m["data"] == data for m in report["models"])
    files = [m["verdicts"] for m in report["models"]]
    assert files == ["verdicts-good_final.jsonl", "verdicts-bad_final.jsonl"]
    good = [json.loads(x) for x in (out / files[0]).read_text().splitlines()]
    bad = [json.loads(x) for x in (out / files[1]).read_text().splitlines()]
    assert [r["correct"] for r in good] == [1, 0] and [r["correct"] for r in bad] == [0, 0]
    markdown = (out / "report.md").read_text()
    assert f"- **good/final**: model `{a}`; problems `{problems_file}`" in markdown
    assert f"(2 of 3 rows, sha256 `{digest}`)" in markdown
    assert "verdicts `verdicts-bad_final.jsonl`" in markdown


def test_completions_files_record_their_own_fingerprint(tmp_path, capsys):
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "outs.jsonl").write_text(
            '{"nums": [1, 2], "target": 3, "completion": "<answer>1+2</answer>"}\n'
        )
    x, y = tmp_path / "x" / "outs.jsonl", tmp_path / "y" / "outs.jsonl"
    code, _, err = run(
        capsys, "eval", "--completions", str(x), "--completions", str(y), "--out", str(tmp_path)
    )
    assert code == 0, err
    models = json.loads((tmp_path / "report.json").read_text())["models"]
    assert [m["name"] for m in models] == ["x/outs", "y/outs"]
    assert models[0]["data"]["path"] == str(x) and models[0]["data"]["rows"] == 1
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.count(str(x)) == 1  # the completions path is said once
    assert models[0]["data"]["sha256"] == hashlib.sha256(x.read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.glob("verdicts-*")) == [
        "verdicts-x_outs.jsonl",
        "verdicts-y_outs.jsonl",
    ]


def test_generated_problems_are_recorded_by_their_settings(tmp_path, capsys, fake_generation):
    (tmp_path / "good").mkdir()
    argv = ["eval", "--model", str(tmp_path / "good"), "--n", "3", "--out", str(tmp_path / "r")]
    assert run(capsys, *argv)[0] == 0
    model = json.loads((tmp_path / "r" / "report.json").read_text())["models"][0]
    assert model["data"] == {"generated": {"n": 3, "numbers": "3", "seed": 1234}}


def test_unique_names():
    assert unique_names([("model", "runs/a/final"), ("model", "runs/b/final")]) == [
        "a/final",
        "b/final",
    ]
    # a run's final model or checkpoint is named with its run, even alone (two reports of two
    # runs do not both say "final")
    assert unique_names([("model", "x/final"), ("completions", "y/outs.jsonl")]) == [
        "x/final",
        "outs",
    ]
    assert unique_names([("model", "/r/run1/checkpoints/step-00000010")]) == [
        "run1/checkpoints/step-00000010"
    ]
    # clashes resolved only as far as needed; an unrelated name stays short
    sources = [("model", "/p/q/a/m"), ("model", "/p/r/a/m"), ("model", "/z/n")]
    sources += [("completions", "/s/a/m.jsonl")]
    assert unique_names(sources) == ["q/a/m", "r/a/m", "n", "s/a/m"]
    # a completions file x/a.jsonl and a model x/a: same components, numbered
    assert unique_names([("completions", "x/a.jsonl"), ("model", "x/a")]) == ["a #1", "a #2"]
    with pytest.raises(ConfigError, match="given twice"):
        unique_names([("model", "runs/a/final"), ("model", "runs/./a/final/")])


def test_same_sanitized_name_gets_two_verdict_files(tmp_path):
    results = [
        runner.score(name, [{"nums": [1], "target": 1, "completions": [text]}], task=Countdown())
        for name, text in [("a/b", "<answer>1</answer>"), ("a_b", "x")]
    ]
    paths = runner.write_report(results, tmp_path)
    assert paths["verdicts:a/b"].name == "verdicts-a_b.jsonl"
    assert paths["verdicts:a_b"].name == "verdicts-a_b-2.jsonl"
    assert json.loads(paths["verdicts:a_b"].read_text())["correct"] == 0
    assert json.loads(paths["verdicts:a/b"].read_text())["correct"] == 1


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_bad_out_fails_before_the_evaluation(tmp_path, capsys, fake_generation, where):
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory")
    out = blocker if where == "file" else blocker / "sub" / "report"
    (tmp_path / "good").mkdir()
    argv = ["eval", "--model", str(tmp_path / "good"), "--n", "2", "--out", str(out)]
    code, stdout, err = run(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    expected = "is a file" if where == "file" else f"sits under {blocker}, which is a file"
    assert f"{out}: the report directory {expected}" in err
    assert fake_generation == [] and stdout == ""  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "taken"]


def test_two_real_tiny_models_with_the_same_basename(tmp_path, capsys, tiny_model_dir):
    """The real generate path (no fake): two copies of a tiny model, both called `final`."""
    for sub in ("a", "b"):
        shutil.copytree(tiny_model_dir, tmp_path / "runs" / sub / "final")
    argv = ["eval", "--model", "runs/a/final", "--model", "runs/b/final", "--n", "2"]
    argv += ["--max-new-tokens", "4", "--no-progress", "--template", "countdown_plain"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        code, _, err = run(capsys, *argv)
    assert code == 0, err
    report = json.loads((tmp_path / "eval-report" / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["a/final", "b/final"]
    assert [m["path"] for m in report["models"]] == [
        str(tmp_path / "runs" / "a" / "final"),
        str(tmp_path / "runs" / "b" / "final"),
    ]
    a, b = (tmp_path / "eval-report" / m["verdicts"] for m in report["models"])
    # identical models, greedy: the same completions, in two files
    assert a.name != b.name and a.read_text() == b.read_text() and a.read_text()


def test_a_missing_second_model_stops_before_the_first_runs(tmp_path, capsys, fake_generation):
    (tmp_path / "good").mkdir()
    argv = ["eval", "--model", str(tmp_path / "good"), "--model", str(tmp_path / "runs/typo/x")]
    code, _, err = run(capsys, *argv, "--n", "2", "--out", str(tmp_path / "r"))
    assert code == 2 and "runs/typo/x" in err and "no such local directory" in err
    assert fake_generation == [] and not (tmp_path / "r").exists()
