"""The sizes the style sets, held by a test: a file about one idea stays under 450 lines and a
function under 80, so a module that grows past them is split instead of left to sprawl."""

from __future__ import annotations

import ast
from pathlib import Path

import distil

SRC = Path(distil.__file__).resolve().parent
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def oversized(root: Path = SRC) -> list[str]:
    """'path: N lines' for each file, and 'path:line name(): N lines' for each function, past
    the limits."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            out.append(f"{where}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{where}:{node.lineno} {node.name}(): {n} lines")
    return out


def test_no_file_or_function_past_the_style_limits():
    assert oversized() == []


def test_the_size_check_reports_what_it_finds(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"def f():\n{body}\n" + "\n" * MAX_FILE_LINES)
    assert oversized(pkg) == [
        f"pkg/long.py: {MAX_FUNCTION_LINES + 1 + MAX_FILE_LINES} lines",
        f"pkg/long.py:1 f(): {MAX_FUNCTION_LINES + 1} lines",
    ]
