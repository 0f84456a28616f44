"""Countdown prompt templates and dataset files (JSONL + parquet).

Templates turn a problem into chat messages and a reference completion; `generate_dataset`
writes disjoint train/test splits. The solver and the generator are in `countdown_solver.py`;
`countdown.py` re-exports both.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distil.data.countdown_solver import (
    Problem,
    compact,
    generate_splits,
    parse_numbers,
    solution_steps,
)
from distil.errors import ConfigError, DataError

# --- prompt templates ---------------------------------------------------------------------------

_SYSTEM = (
    "You are a helpful assistant. You first think about the reasoning process in the mind "
    "and then provide the user with the answer."
)


@dataclass(frozen=True)
class CountdownChat:
    """System + user prompt in the style of the public mini-R1/TinyZero Countdown prompts; the
    reference completion shows the steps in <think> and the equation in <answer>."""

    name: str = "countdown_chat"

    def messages(self, nums: Sequence[int], target: int) -> list[dict[str, str]]:
        user = (
            f"Here are some numbers: {list(nums)}. Write an equation that uses each of them "
            f"exactly once and evaluates to {target}; you may use +, -, * and /. Reason step by "
            "step inside <think> </think> tags, then put only the final equation inside "
            "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
        )
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]

    def completion(self, problem: Problem) -> str:
        steps = ", ".join(solution_steps(problem.solution))
        return f"<think>{steps}</think>\n<answer>{problem.solution}</answer>"


@dataclass(frozen=True)
class CountdownPlain:
    """Compact prompt and answer for small models trained from scratch: few tokens, no prose."""

    name: str = "countdown_plain"

    def messages(self, nums: Sequence[int], target: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"nums: {' '.join(map(str, nums))} target: {target}"}]

    def completion(self, problem: Problem) -> str:
        return f"<answer>{compact(problem.solution)}</answer>"


Template = CountdownChat | CountdownPlain
TEMPLATES: dict[str, Template] = {t.name: t for t in (CountdownChat(), CountdownPlain())}


def get_template(name: str | Template) -> Template:
    """A template by name (a template object passes through); unknown names list the valid ones."""
    if not isinstance(name, str):
        return name
    if name not in TEMPLATES:
        raise ConfigError(f"unknown Countdown template {name!r}; valid: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


# --- dataset files ------------------------------------------------------------------------------


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


def _atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same directory and rename it, so readers never see a
    half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_rows(rows: list[dict[str, Any]], out_dir: str | os.PathLike, name: str) -> list[Path]:
    """Write `{name}.jsonl` and `{name}.parquet` under out_dir; returns both paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    jsonl, parquet = out / f"{name}.jsonl", out / f"{name}.parquet"
    _atomic_write(jsonl, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    _atomic_write(parquet, lambda tmp: pq.write_table(pa.Table.from_pylist(rows), tmp))
    return [jsonl, parquet]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from distil.data.datasets import read_jsonl_rows  # decoding, JSON and text checks per line

    rows = []
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
    from distil.paths import path_problem

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
) -> dict[str, Any]:
    """Write train.{jsonl,parquet}, test.{jsonl,parquet} and meta.json under out_dir.

    Returns the settings, counts and file paths (what meta.json holds, plus the paths).
    """
    numbers = parse_numbers(numbers)
    tmpl = get_template(template)  # fail on a bad name before generating anything
    train, test = generate_splits(
        n, test_n, numbers=numbers, max_number=max_number, max_target=max_target, seed=seed
    )
    out = Path(out_dir)
    files = write_rows(to_rows(train, tmpl), out, "train") + write_rows(
        to_rows(test, tmpl), out, "test"
    )
    meta = {
        "task": "countdown",
        "template": tmpl.name,
        "numbers": list(numbers),
        "max_number": max_number,
        "max_target": max_number if max_target is None else max_target,
        "seed": seed,
        "target_sampling": "reachable targets weighted by number of expression trees",
        "counts": {"train": len(train), "test": len(test)},
    }
    text = json.dumps(meta, indent=2) + "\n"
    _atomic_write(out / "meta.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return {**meta, "out_dir": str(out), "files": [str(p) for p in [*files, out / "meta.json"]]}
