"""Read prompts (and reference completions) from JSONL, parquet, a saved dataset or the hub.

Every row becomes an `Example`: chat messages (or plain text) as the prompt, the reference
completion if the data has one, and the remaining columns as `meta` (Countdown's nums/target).
A conversation (`messages` ending in an assistant turn) is split at its last turn: the turns
before it are the prompt, that turn the completion (docs/data.md has every format).
A malformed row raises a `DataError` that names the file and the 1-based line (JSONL) or row.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distil.errors import DataError
from distil.types import Example, Messages

# render(row, where) -> (prompt, completion): a prompt built from the row's columns
Render = Callable[[dict[str, Any], dict[str, Any]], "tuple[Messages | str, str | None]"]


def load_examples(
    source: str,
    *,
    split: str = "train",
    subset: str | None = None,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    render: Render | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Load `source` (a .jsonl/.json/.parquet file, a `save_to_disk` dir, or a hub id).

    Without `render`, the prompt is the `prompt_field` column and the completion the
    `completion_field` column. `render(row, where) -> (prompt, completion)` builds both from the
    row instead (`distil.tasks.prompts.renderer` makes one for a `data.template`: a Countdown
    template or a task's prompts), raising DataError(..., **where) for a row it cannot use.
    """
    rows = read_rows(source, split, limit, subset)
    if not rows:
        raise DataError("the dataset holds no rows", path=source)
    examples = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"row is a {type(row).__name__}, expected an object", **where)
        field = prompt_column(row, prompt_field)
        if render is not None:
            prompt, completion = render(row, where)
        else:
            prompt, completion = prompt_and_completion(row, field, completion_field, where)
        used = (field, completion_field)
        meta = {k: v for k, v in row.items() if k not in used}
        meta["_where"] = f"{where['path']}:{where['line']}"  # for messages about this row
        # the prompt and completion columns as read, for what carries the row on (`source_row`)
        meta["_used"] = {k: row[k] for k in used if k in row}
        examples.append(Example(len(examples), prompt, completion, meta))
    return examples


def read_rows(
    source: str, split: str = "train", limit: int | None = None, subset: str | None = None
) -> list[tuple[dict[str, Any], Any]]:
    """[(where, row)] of a local .jsonl/.json/.parquet file, a `save_to_disk` directory (`split`
    picks a split of a saved DatasetDict) or a hub dataset (`subset` is its config name, e.g.
    "main" for openai/gsm8k), with `where` = dict(path=..., line=...) for error messages."""
    from distil.paths import DATA_SUFFIXES, looks_local, path_problem

    if problem := path_problem(source, "data"):
        raise DataError(problem)
    path = Path(os.path.expanduser(source))
    if path.is_file():
        if path.suffix in (".jsonl", ".json"):
            return read_jsonl_rows(path, limit)
        if path.suffix == ".parquet":
            return _read_parquet(path, limit)
        raise DataError(
            f"unsupported file type '{path.suffix}'; distil reads .jsonl/.json (one JSON object "
            "per line), .parquet, or a directory written by Dataset.save_to_disk",
            path=source,
        )
    if path.is_dir():
        return _read_saved(path, split, limit)
    if path.exists():
        raise DataError("not a regular file or directory", path=source)
    if looks_local(source):
        raise DataError(
            "no such local file or directory (taken as a local path, not a hub id, because it "
            f"starts with '.', '/' or '~', has a directory part or ends in "
            f"{'/'.join(DATA_SUFFIXES)}). Fix: check the path",
            path=source,
        )
    return read_hub(source, split, subset)


def _read_parquet(path: Path, limit: int | None) -> list[tuple[dict[str, Any], Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if limit is None:
            rows = pq.read_table(path).to_pylist()
        else:  # the first `limit` rows, not the whole file
            rows = []
            for batch in pq.ParquetFile(path).iter_batches(batch_size=max(limit, 1)):
                if len(rows) >= limit:
                    break
                rows += batch.to_pylist()
            rows = rows[:limit]
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"cannot read as parquet ({_one_line(exc)})", path=str(path)) from exc
    out = []
    for i, row in enumerate(rows):
        where = {"path": str(path), "line": i + 1}
        _check_text(row, where)
        out.append((where, row))
    return out


def _read_saved(path: Path, split: str, limit: int | None) -> list[tuple[dict[str, Any], Any]]:
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError, KeyError) as exc:
        raise DataError(
            "a directory, but not a dataset written by Dataset.save_to_disk "
            f"({_one_line(exc)}). Fix: point to a .jsonl/.parquet file inside it, or to a "
            "saved dataset directory",
            path=str(path),
        ) from exc
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise DataError(
                f"the saved DatasetDict has no split {split!r} (splits: {', '.join(ds)}). "
                "Fix: set data.split",
                path=str(path),
            )
        ds = ds[split]
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    out = []
    for i, row in enumerate(ds):
        where = {"path": str(path), "line": i + 1}
        _check_text(row, where)
        out.append((where, row))
    return out


def read_jsonl_rows(path: Path, limit: int | None = None) -> list[tuple[dict[str, Any], Any]]:
    out = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            where = {"path": str(path), "line": line_no}
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1]
                raise DataError(
                    f"not UTF-8 text (byte {bad!r} at column {exc.start + 1}). Fix: save the "
                    "file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
                    **where,
                ) from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"not valid JSON: {exc.msg}", **where) from exc
            except RecursionError as exc:
                raise DataError("JSON nested too deeply to read", **where) from exc
            except ValueError as exc:  # an integer over Python's 4,300-digit limit
                raise DataError(
                    f"a JSON number is too long to read (Python reads at most 4,300 digits; "
                    f"{_one_line(exc)[:60]}...). Fix: remove or quote it",
                    **where,
                ) from exc
            if _may_fail_check(line):
                _check_text(row, where)
            out.append((where, row))
    return out


MAX_DEPTH = 64  # a data row is a few levels deep (chat messages in a list of objects)


def _check_text(row: Any, where: dict[str, Any]) -> None:
    """Reject what every later step would choke on: lone surrogates (JSON allows the escape
    \\ud800, UTF-8 cannot encode it) and nesting far deeper than any real row."""
    stack = [(row, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise DataError(f"the row nests deeper than {MAX_DEPTH} levels", **where)
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DataError(
                    f"text holds a lone surrogate {node[exc.start]!r} (not a character; "
                    "UTF-8 cannot encode it). Fix: repair the text's escapes",
                    **where,
                ) from exc
        elif isinstance(node, dict):
            stack.extend((k, depth + 1) for k in node)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _may_fail_check(line: str) -> bool:
    """Whether `_check_text` can reject the row parsed from this JSON line. Valid UTF-8 holds
    no surrogate, so a lone one comes only from an escape \\ud800-\\udfff; a row nests deeper
    than MAX_DEPTH only with more opening brackets than that. (Both counts include text inside
    strings, so a row is at worst walked when it need not be.)"""
    if line.count("[") + line.count("{") >= MAX_DEPTH:
        return True
    return "\\u" in line and _SURROGATE_ESCAPE.search(line) is not None


def _one_line(exc: BaseException) -> str:
    return short(" ".join(str(exc).split()), 300)


def read_hub(
    source: str, split: str, subset: str | None = None, *, fix: str = ""
) -> list[tuple[dict[str, Any], Any]]:
    """[(where, row)] of a hub dataset; `fix` ends the message when it cannot be loaded."""
    from datasets import load_dataset

    try:
        ds = load_dataset(source, subset, split=split)
    except Exception as exc:  # datasets raises many types for unreachable/unknown ids
        shown = f"'{source}'" + (f" (subset '{subset}')" if subset else "")
        raise DataError(
            f"could not load {shown}, split '{split}', as a hub dataset (no local file or "
            f"directory has this name): {_one_line(exc)}" + (f". Fix: {fix}" if fix else "")
        ) from exc
    return [({"path": source, "line": i + 1}, r) for i, r in enumerate(ds)]


CONVERSATION_FIELD = "messages"  # TRL's "conversational" column


def prompt_column(row: dict[str, Any], field: str) -> str:
    """The column a row's prompt is read from: `field`, or, when `field` is the default
    "prompt" and the row has no such column, its `messages` conversation."""
    if field == "prompt" and field not in row and CONVERSATION_FIELD in row:
        return CONVERSATION_FIELD
    return field


def prompt_and_completion(
    row: dict[str, Any], field: str, completion_field: str, where: dict[str, Any]
) -> tuple[Messages | str, str | None]:
    """(prompt, completion) of a row: the prompt column as text or messages; a conversation
    ending in an assistant turn is split there (the turns before it are the prompt, that turn
    the completion), so the answer is never inside the prompt."""
    prompt = _prompt(row, field, where)
    if isinstance(prompt, list) and prompt[-1]["role"] == "assistant":
        if row.get(completion_field) is not None and completion_field != field:
            raise DataError(
                f"column '{field}' is a conversation ending in an assistant turn (its answer) and "
                f"the row also has a '{completion_field}' column: which one is the completion is "
                f"ambiguous. Fix: drop the last assistant turn from '{field}', or set "
                "data.completion_field to a column the data does not have",
                **where,
            )
        if len(prompt) == 1:
            raise DataError(
                f"column '{field}' holds only an assistant turn, so there is no prompt before "
                "it. Fix: start each conversation with a user (or system) turn",
                **where,
            )
        return prompt[:-1], prompt[-1]["content"]
    return prompt, completion_text(row.get(completion_field), completion_field, where)


# the roles every chat template knows; another (ShareGPT's "human"/"gpt", a typo) is dropped
# by some templates without a word (Qwen3's renders the turn as nothing) and rendered as a
# header by others, so it is refused
ROLES = ("system", "user", "assistant", "tool")


def _prompt(row: dict[str, Any], field: str, where: dict[str, Any]) -> Messages | str:
    value = row.get(field)
    if isinstance(value, str) and value.strip():
        return value
    if _is_messages(value):
        _check_roles(value, field, where)
        return [{"role": m["role"], "content": m["content"]} for m in value]
    columns = ", ".join(map(repr, list(row)[:8]))
    why = _message_problem(value) if isinstance(value, list) else None
    raise DataError(
        f"column '{field}' must be a non-empty string or a list of chat messages "
        f"({{'role', 'content'}}), got {short(value)}"
        + (f" ({why})" if why else "")
        + f"; the row's columns: {columns}. Fix: set data.prompt_field to the prompt column "
        "(docs/data.md lists the formats)",
        **where,
    )


def _check_roles(messages: list[dict], field: str, where: dict[str, Any]) -> None:
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            sharegpt = {"human": "user", "gpt": "assistant"}.get(m["role"])
            hint = f" (ShareGPT's {m['role']!r} is {sharegpt!r})" if sharegpt else ""
            raise DataError(
                f"column '{field}', message {i}: role {m['role']!r} is not one of "
                f"{', '.join(ROLES)}{hint}; a chat template drops or mangles a role it does not "
                "know. Fix: rename the roles in the data",
                **where,
            )


def _message_problem(value: list) -> str | None:
    """What is wrong with the first message of `value` that is not a text chat turn."""
    if not value:
        return "an empty list"
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return f"message {i} is not a dict"
        if not isinstance(m.get("role"), str):
            return f"message {i} has no 'role' string"
        if not isinstance(m.get("content"), str):
            extra = " (tool calls are not trained on: keep text turns)" if "tool_calls" in m else ""
            return f"message {i} ({m['role']}) has no text 'content'{extra}"
    return None


def completion_text(value: Any, field: str, where: dict[str, Any]) -> str | None:
    """A completion column's text: a string, or the last assistant turn of chat messages (an
    empty one is read, and counted in a warning when trained on: data/lengths.py)."""
    if value is None or isinstance(value, str):
        return value
    if _is_messages(value):
        _check_roles(value, field, where)
        turns = [m["content"] for m in value if m["role"] == "assistant"]
        if turns:
            return turns[-1]
    why = _message_problem(value) if isinstance(value, list) else None
    raise DataError(
        f"column '{field}' must be text or chat messages with an assistant turn, got "
        f"{short(value)}" + (f" ({why})" if why else ""),
        **where,
    )


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(
            isinstance(m, dict)
            and isinstance(m.get("content"), str)
            and isinstance(m.get("role"), str)
            for m in value
        )
    )


def short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int over Python's 4,300-digit str limit
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def source_row(example: Example) -> dict[str, Any]:
    """The data row an example came from, every column as read (its prompt and completion
    columns included); the "_" keys distil adds are left out."""
    row = {k: v for k, v in example.meta.items() if not k.startswith("_")}
    return {**row, **example.meta.get("_used", {})}
