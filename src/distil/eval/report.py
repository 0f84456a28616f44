"""The evaluation report: distinct model names, the Markdown table (the task's failure columns,
pass@k, per-group accuracy), the sources of each row, and the files written atomically
(verdicts per model, report.json, report.md)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distil.errors import ConfigError, DataError
from distil.eval.scoring import EvalResult
from distil.files import atomic_write

# ----------------------------------------------------------------------------- names


def unique_names(sources: Sequence[tuple[str, str]]) -> list[str]:
    """A distinct display name per (kind, path): the last path component (a completions file
    without its suffix), lengthened by parent directories until no two names clash, so
    runs/a/final and runs/b/final become "a/final" and "b/final". A directory distil's training
    writes is named with its run even alone: "a/final", "a/checkpoints/step-00000010"."""
    parts_of, seen = [], {}
    for kind, path in sources:
        absolute = os.path.abspath(path)
        if absolute in seen:
            flag = "--model" if kind == "model" else "--completions"
            raise ConfigError(f"{flag} {path} is given twice (as {seen[absolute]!r}); give it once")
        seen[absolute] = path
        parts = list(Path(absolute).parts[1:]) or [absolute]
        if kind == "completions":
            parts[-1] = Path(parts[-1]).stem or parts[-1]
        parts_of.append(parts)
    depth = [min(_run_depth(parts), len(parts)) for parts in parts_of]
    while True:
        names = ["/".join(parts[-d:]) for parts, d in zip(parts_of, depth, strict=True)]
        by_name: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            by_name.setdefault(name, []).append(i)
        # lengthen a name while it clashes with a path that differs from its own
        grow = [
            i
            for i, name in enumerate(names)
            if depth[i] < len(parts_of[i])
            and any(parts_of[j] != parts_of[i] for j in by_name[name])
        ]
        if not grow:
            break
        for i in grow:
            depth[i] += 1
    # a completions file "x/a.jsonl" and a model "x/a" have the same parts: number the repeats
    counts, taken = Counter(names), Counter()
    for i, name in enumerate(names):
        if counts[name] > 1:
            taken[name] += 1
            names[i] = f"{name} #{taken[name]}"
    return names


# ----------------------------------------------------------------------------- report


def format_table(results: Sequence[EvalResult]) -> str:
    """The Markdown table, one row per model: correct, accuracy, one column per failure category
    of the task, pass@k columns when several samples were drawn; then, for tasks with groups
    (MMLU's subjects), a second table of accuracy per group."""
    columns = results[0].columns if results else []
    ks = sorted({k for r in results for k in r.summary.get("pass_at_k", {}) if k != "1"}, key=int)
    head = ["Model", "Correct", "Accuracy"] + [c for c, _ in columns] + [f"pass@{k}" for k in ks]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        s = r.summary
        cells = [_cell(r.name), f"{s['correct']}/{s['total']}", f"{100 * s['accuracy']:.2f}%"]
        cells += [str(s.get(key, 0)) for _, key in columns]
        cells += [f"{100 * s['pass_at_k'].get(k, float('nan')):.2f}%" for k in ks]
        lines.append("| " + " | ".join(cells) + " |")
    groups = sorted({g for r in results for g in r.summary.get("groups", {})})
    if groups:
        lines += ["", "| Group | " + " | ".join(_cell(r.name) for r in results) + " |"]
        lines.append("|" + "|".join("---" for _ in range(len(results) + 1)) + "|")
        for g in groups:
            cells = [_group_cell(r.summary.get("groups", {}).get(g)) for r in results]
            lines.append(f"| {_cell(g)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _group_cell(group: dict[str, Any] | None) -> str:
    if group is None:
        return ""
    return f"{100 * group['accuracy']:.2f}% ({group['correct']}/{group['total']})"


def _run_depth(parts: list[str]) -> int:
    """Path components a name starts with: a run's final model or checkpoint is named with its
    run directory, so two reports of two runs do not both say "final"."""
    if parts[-1] == "final":
        return 2
    if len(parts) > 1 and parts[-2] == "checkpoints" and re.fullmatch(r"step-\d+", parts[-1]):
        return 3
    return 1


def format_sources(results: Sequence[EvalResult], files: dict[str, str]) -> str:
    """One Markdown line per model: what was evaluated, on which problems, where its verdicts are."""
    lines = []
    for r in results:
        data = r.data or {}
        said = r.kind == "completions" and "sha256" in data  # the path comes with its rows
        line = f"- **{_cell(r.name)}**: {r.kind}" + (f" `{r.path}`" if r.path and not said else "")
        if "sha256" in data:
            what = "completions" if r.kind == "completions" else "problems"
            used = f"{data['used']} of " if "used" in data else ""
            line += (
                f"; {what} `{data['path']}` ({used}{data['rows']} rows, sha256 `{data['sha256']}`)"
            )
        elif "hub" in data:
            subset = f", subset {data['subset']}" if data.get("subset") else ""
            line += f"; problems hub dataset `{data['hub']}`{subset}, split {data['split']}"
            line += f" ({data['used']} of {data['rows']} rows)" if "used" in data else ""
        elif "generated" in data:
            gen = data["generated"]
            line += (
                f"; problems generated (n={gen['n']}, numbers={gen['numbers']}, seed={gen['seed']})"
            )
        if r.name in files:
            line += f"; verdicts `{files[r.name]}`"
        lines.append(line)
    return "\n".join(lines)


def check_out_dir(out_dir: str | Path) -> None:
    """Raise DataError unless `out_dir` is, or can be created as, a writable directory. Called
    before any evaluation runs, so a bad --out never costs the results."""
    out = Path(out_dir)
    fix = "pass --out a directory (new or existing)"
    if out.is_symlink() and not out.exists():
        raise DataError(f"the report directory is a broken symbolic link; {fix}", path=str(out))
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        where = "is a file" if existing == out else f"sits under {existing}, which is a file"
        raise DataError(f"the report directory {where}; {fix}", path=str(out))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DataError(f"cannot write to {existing} (permission denied); {fix}", path=str(out))


def write_report(results: Sequence[EvalResult], out_dir: str | Path) -> dict[str, Path]:
    """verdicts-<name>.jsonl per model (one file each, names made distinct), then report.json
    and report.md, each written atomically. Returns {"markdown", "json", "verdicts:<name>"}."""
    check_out_dir(out_dir)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the report directory: {exc}", path=str(out)) from exc
    paths = {"markdown": out / "report.md", "json": out / "report.json"}
    files: dict[str, str] = {}
    for r in results:
        stem, n = f"verdicts-{_safe(r.name)}", 1
        while f"{stem}.jsonl" in files.values():
            n += 1
            stem = f"verdicts-{_safe(r.name)}-{n}"
        files[r.name] = f"{stem}.jsonl"
        _atomic_write(out / files[r.name], "".join(json.dumps(row) + "\n" for row in r.rows))
        paths[f"verdicts:{r.name}"] = out / files[r.name]
    models = [
        {"name": r.name, "kind": r.kind, "path": r.path, "data": r.data, "verdicts": files[r.name]}
        | r.summary
        for r in results
    ]
    outcomes = list(results[0].outcomes) if results else []
    task = results[0].task if results else None
    payload = {"task": task, "outcomes": outcomes, "models": models}
    _atomic_write(paths["json"], json.dumps(payload, indent=2) + "\n")
    markdown = format_table(results) + "\n\n" + format_sources(results, files) + "\n"
    _atomic_write(paths["markdown"], markdown)
    return paths


def _cell(name: str) -> str:
    return name.replace("|", "\\|")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _atomic_write(path: Path, text: str) -> None:
    def write(tmp: str) -> None:  # backslashreplace: a name from a non-UTF-8 path never stops it
        Path(tmp).write_text(text, encoding="utf-8", errors="backslashreplace")

    try:
        atomic_write(path, write)
    except OSError as exc:
        raise DataError(f"cannot write the report: {exc}", path=str(path)) from exc
