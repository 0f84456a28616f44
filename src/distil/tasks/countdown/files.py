"""Countdown dataset files (JSONL + parquet): `generate_dataset` writes disjoint train/test
splits with their prompts (templates.py) and reference solutions (solver.py); `read_rows` reads
problems back, naming the file and line of a bad row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from distil.data.datasets import read_jsonl_rows
from distil.errors import DataError
from distil.files import atomic_write
from distil.paths import path_problem
from distil.tasks.countdown.generate import parse_numbers, paused_gc, split_set
from distil.tasks.countdown.solver import Problem
from distil.tasks.countdown.templates import Template, get_template


def to_rows(problems: Iterable[Problem], template: str | Template) -> list[dict[str, Any]]:
    """Dataset rows: nums, target, prompt (chat messages), solution (spaced), completion."""
    tmpl = get_template(template)
    return [
        {
            "nums": list(p.nums),
            "target": p.target,
            "prompt": tmpl.messages(p.nums, p.target),
            "solution": p.solution,
            "completion": tmpl.completion(p),
        }
        for p in problems
    ]


def write_rows(rows: list[dict[str, Any]], out_dir: str | os.PathLike, name: str) -> list[Path]:
    """Write `{name}.jsonl` and `{name}.parquet` under out_dir; returns both paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encode = json.JSONEncoder(ensure_ascii=False).encode  # = json.dumps(row, ensure_ascii=False)
    text = "".join([encode(row) + "\n" for row in rows])
    jsonl, parquet = out / f"{name}.jsonl", out / f"{name}.parquet"
    atomic_write(jsonl, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    atomic_write(parquet, lambda tmp: pq.write_table(pa.Table.from_pylist(rows), tmp))
    return [jsonl, parquet]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []  # read_jsonl_rows: decoding, JSON and text checks per line
    for where, row in read_jsonl_rows(path):
        _check_row(row, path, where["line"])
        rows.append(row)
    return rows


def _check_row(row: Any, path: Path, line: int) -> None:
    nums = row.get("nums") if isinstance(row, dict) else None
    target = row.get("target") if isinstance(row, dict) else None
    if (
        not isinstance(nums, list)
        or not nums
        or any(type(x) is not int or x < 1 for x in nums)
        or type(target) is not int
    ):
        raise DataError(
            "a Countdown row needs 'nums' (a list of positive ints) and 'target' (an int), "
            f"got {str(row)[:200]}",
            path=str(path),
            line=line,
        )


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read rows back from a .jsonl or .parquet file written by `write_rows` (or any file with
    `nums` and `target` columns). Bad rows raise DataError naming the file and 1-based line/row."""
    if problem := path_problem(path, "problems file"):
        raise DataError(problem)
    path = Path(path)
    if not path.is_file():
        raise DataError("no such file; pass a .jsonl or .parquet Countdown file", path=str(path))
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix != ".parquet":
        raise DataError("expected a .jsonl or .parquet file", path=str(path))
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"cannot read parquet: {exc}", path=str(path)) from exc
    for i, row in enumerate(rows, 1):
        _check_row(row, path, i)
    return rows


def generate_dataset(
    out_dir: str | os.PathLike,
    *,
    n: int,
    test_n: int = 500,
    numbers: str | Sequence[int] = (3,),
    max_number: int = 99,
    max_target: int | None = None,
    seed: int = 0,
    template: str = "countdown_chat",
    dev_n: int = 0,
) -> dict[str, Any]:
    """Write train.{jsonl,parquet}, test.{jsonl,parquet}, with `dev_n` > 0 dev.{jsonl,parquet}
    (a second held-out split, `split_set`), and meta.json under out_dir.

    Returns the settings, counts and file paths (what meta.json holds, plus the paths).
    """
    numbers = parse_numbers(numbers)
    tmpl = get_template(template)  # fail on a bad name before generating anything
    splits = split_set(
        n, test_n, dev_n, numbers=numbers, max_number=max_number, max_target=max_target, seed=seed
    )
    if not dev_n:
        del splits["dev"]
    out = Path(out_dir)
    files: list[Path] = []
    with paused_gc():  # rows are many small dicts and lists; see paused_gc
        for name, problems in splits.items():
            files += write_rows(to_rows(problems, tmpl), out, name)
    meta = {
        "task": "countdown",
        "template": tmpl.name,
        "numbers": list(numbers),
        "max_number": max_number,
        "max_target": max_number if max_target is None else max_target,
        "seed": seed,
        "target_sampling": "reachable targets weighted by number of expression trees",
        "counts": {name: len(problems) for name, problems in splits.items()},
    }
    text = json.dumps(meta, indent=2) + "\n"
    atomic_write(out / "meta.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return {**meta, "out_dir": str(out), "files": [str(p) for p in [*files, out / "meta.json"]]}
