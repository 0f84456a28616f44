"""`distil eval --completions`: every completion gets a verdict, every malformed row is a
DataError naming file:line (exit 2, no traceback, no report written)."""

from __future__ import annotations

import json

import pytest

from distil.cli import main
from distil.errors import DataError
from distil.eval.runner import load_completions
from distil.tasks.countdown import Countdown


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _row(completion, nums=(44, 19, 35), target=28) -> str:
    return json.dumps({"nums": list(nums), "target": target, "completion": completion}) + "\n"


def _balanced_product(factors: list[str]) -> str:
    if len(factors) == 1:
        return factors[0]
    half = len(factors) // 2
    return f"({_balanced_product(factors[:half])} * {_balanced_product(factors[half:])})"


def test_degenerate_completions_each_get_a_verdict(tmp_path, capsys):
    product = _balanced_product(["99"] * 2200)  # a value of 4,391 digits
    rows = [
        _row("<answer>44 + 19 - 35</answer>"),
        _row(f"<answer>{product}</answer>", nums=[99] * 2200, target=1),
        _row("<answer>" * 10_000),
        _row("<answer>" + "9" * 5000 + "</answer>"),
        _row("\ud800 lone surrogate <answer>\udfff</answer>"),
        _row("I put it inside <answer> tags.\n<answer>44 + 19 - 35</answer>"),
        _row("<answer>" + "(" * 3000 + "44 + 19 - 35" + ")" * 3000 + "</answer>"),
        _row(""),
    ]
    path = tmp_path / "outs.jsonl"
    path.write_text("".join(rows))
    code, _, err = run(capsys, "eval", "--completions", str(path), "--out", str(tmp_path / "r"))
    assert code == 0, err
    report = json.loads((tmp_path / "r" / "report.json").read_text())["models"][0]
    assert (report["total"], report["correct"], report["wrong_value"]) == (8, 3, 1)
    assert (report["missing_answer_tags"], report["lhs_parse_or_eval_error"]) == (2, 2)
    verdicts = (tmp_path / "r" / "verdicts-outs.jsonl").read_text().splitlines()
    assert json.loads(verdicts[1])["samples"][0]["detail"] == (
        "<a number of about 4391 digits> != 1"
    )
    assert json.loads(verdicts[4])["samples"][0]["completion"].startswith("\ud800")


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (
            _row("x").encode() + b'{"nums": [1], "target": 1, "completion": "\xff\xfe"}\n',
            2,
            "UTF-8",
        ),
        (b'{"nums": [1], "target": 1, "completion": "caf\xe9"}\n', 1, "bytes e9 22 7d"),
        (_row("x").encode() + b"[" * 100_000 + b"\n", 2, "nested too deeply"),
        (b'{"nums": [' + b"9" * 5000 + b'], "target": 1, "completion": "x"}\n', 1, "JSON value"),
        (_row(None).encode(), 1, "'completion' must be a string, got NoneType null"),
        (_row("x").encode()[:-2] + b', "completions": ["a", 3]}\n', 1, "'completions' must be"),
        (b'{"nums": [1], "target": 1, "completions": []}\n', 1, "non-empty list of strings"),
        (b'{"nums": [true, 2], "target": 1, "completion": "x"}\n', 1, "'nums' must be a list"),
        (b'{"nums": [1, 2], "target": 3.0, "completion": "x"}\n', 1, "'target' must be an int"),
        (b'"just a string"\n', 1, "expected a JSON object"),
        (b"\n\n{oops\n", 3, "not valid JSON"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, capsys, content, line, message):
    path = tmp_path / "outs.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_completions(path, Countdown())
    assert str(info.value).startswith(f"{path}:{line}: ") and message in str(info.value)
    code, out, err = run(capsys, "eval", "--completions", str(path), "--out", str(tmp_path / "r"))
    assert code == 2 and f"{path}:{line}: " in err and "Traceback" not in err
    assert out == "" and not (tmp_path / "r").exists()


def test_utf8_bom_and_crlf_are_fine(tmp_path):
    path = tmp_path / "outs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _row("<answer>44+19-35</answer>").encode() + b"\r\n")
    assert load_completions(path, Countdown())[0]["completions"] == ["<answer>44+19-35</answer>"]


def test_a_directory_is_not_a_completions_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        load_completions(tmp_path, Countdown())
