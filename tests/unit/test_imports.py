"""The import graph of distil, read statically from the source:

- no circle among the imports that run when a module loads (module level, not under
  `if TYPE_CHECKING:`), anywhere in distil;
- no circle at all, imports inside functions included (a lazy import hides a circle from the
  interpreter, not from a reader), inside the demo package and among the Countdown modules
  (the two circles of issue 15: demo <-> demo_stages <-> demo_report, countdown <-> countdown_io);
- the product never imports the test helpers in distil.testing.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

import distil

SRC = Path(distil.__file__).resolve().parent
TEST_ONLY = {"distil.testing"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _import_nodes(tree: ast.AST, lazy: bool):
    """Import statements of a module: all of them, or (lazy=False) those that run at load."""
    if lazy:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _import_nodes(ast.Module(body=node.orelse, type_ignores=[]), lazy)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _import_nodes(node, lazy)


def imports_of(name: str, path: Path, known: set[str], *, lazy: bool = True) -> set[str]:
    """distil modules that `path` imports (lazy: anywhere, else at load time); `from a import b`
    counts as a.b when that is a module, else as a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_nodes(_parse(path), lazy):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                root = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{root}.{base}" if base else root
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph(*, lazy: bool = True, only: str | None = None) -> dict[str, set[str]]:
    """Module -> the distil modules it imports; `only`: modules whose name starts with it."""
    mods = {n: p for n, p in modules().items() if only is None or n.startswith(only)}
    return {name: imports_of(name, path, set(mods), lazy=lazy) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles_at_load_time():
    cycle = find_cycle(graph(lazy=False))
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("only", ["distil.demo", "distil.data.countdown"])
def test_no_import_circles_even_through_lazy_imports(only):
    edges = graph(only=only)
    assert len(edges) >= 3  # the package's modules were found
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_circles():
    # the two circles this test was written against: demo <-> demo_stages, countdown <-> io
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    for only, back_edge in (
        ("distil.data.countdown", ("distil.data.countdown_solver", "distil.data.countdown_io")),
        ("distil.demo", ("distil.demo.run", "distil.demo")),
    ):
        edges = graph(only=only)
        assert find_cycle(edges) is None
        edges[back_edge[0]].add(back_edge[1])
        assert find_cycle(edges) is not None


def test_lazy_imports_are_seen_only_when_asked():
    mods = modules()
    path = mods["distil.demo"]  # imports its stages inside run_demo
    assert "distil.demo.stages" in imports_of("distil.demo", path, set(mods))
    assert "distil.demo.stages" not in imports_of("distil.demo", path, set(mods), lazy=False)
    assert "distil.data.countdown_io" in graph(lazy=False)["distil.data.countdown"]


def test_the_product_never_imports_the_test_helpers():
    users = {name for name, deps in graph().items() if deps & TEST_ONLY and name not in TEST_ONLY}
    assert users == set(), f"product modules importing distil.testing: {sorted(users)}"
