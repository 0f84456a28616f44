"""read_jsonl_rows skips `_check_text`'s walk only for lines that cannot fail it; rows that
must fail still do (a lone surrogate escape in any case, nesting deeper than MAX_DEPTH)."""

from __future__ import annotations

import json

import pytest

from distil.data import datasets
from distil.data.datasets import MAX_DEPTH, read_jsonl_rows
from distil.errors import DataError


def _nested(depth: int) -> str:
    return json.dumps({"prompt": "p", "x": json.loads("[" * depth + "1" + "]" * depth)})


BAD = {
    "surrogate-lower": '{"prompt": "a\\ud800b"}',
    "surrogate-upper": '{"prompt": "a\\uDFFFb"}',
    "surrogate-in-messages": '{"messages": [{"role": "user", "content": "\\uDbFf"}]}',
    "surrogate-in-key": '{"\\udc00": 1, "prompt": "p"}',
    "deep": _nested(MAX_DEPTH + 1),
}


@pytest.mark.parametrize("name", BAD)
def test_rows_that_must_fail_still_fail(tmp_path, name):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "fine"}\n' + BAD[name] + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lone surrogate|nests deeper") as err:
        read_jsonl_rows(path)
    assert "d.jsonl:2" in str(err.value)


GOOD = [
    '{"prompt": "plain text, \\u00e9 and a pair \\ud83d\\ude00", "completion": "x"}',
    '{"messages": [{"role": "user", "content": "hi"}]}',
    _nested(MAX_DEPTH - 2),
    '{"prompt": "' + "[" * 100 + '"}',  # brackets in text: walked, and nothing to reject
]


def test_the_walk_runs_only_where_a_row_could_fail(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    walked = []
    real = datasets._check_text
    monkeypatch.setattr(
        datasets, "_check_text", lambda row, where: (walked.append(where["line"]), real(row, where))
    )
    rows = read_jsonl_rows(path)
    assert [json.loads(x) for x in GOOD] == [r for _, r in rows]
    # the pair of surrogate escapes makes a valid character, yet the line is walked (to be safe)
    assert walked == [1, 4]
    assert not datasets._may_fail_check(GOOD[1]) and datasets._may_fail_check(GOOD[3])
