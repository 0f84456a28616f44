"""The import graph of distil, read statically from the source, and the layers it must keep.

Every import of a distil module counts: module level, inside a function, under
`if TYPE_CHECKING:` (a lazy import hides a circle or an upward reach from the interpreter, not
from a reader). The tests hold:

- no import circle anywhere in distil;
- every import points to the same layer or a lower one (LAYERS, as in the design's layout):
  within the kernels (L2) siblings import only models/ and align/, and the services (L4) do not
  import each other; a violation is reported with its file and line;
- the product never imports the test helpers in distil.testing.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

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


def import_sites(name: str, path: Path, known: set[str], *, lazy: bool = True) -> dict[str, int]:
    """{distil module that `path` imports: the line of its first import} (lazy: anywhere, else
    at load time); `from a import b` counts as a.b when that is a module, else as a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in _import_nodes(_parse(path), lazy):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                root = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{root}.{base}" if base else root
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for m in targets:
            if m in known and m != name:
                found[m] = min(found.get(m, node.lineno), node.lineno)
    return found


def imports_of(name: str, path: Path, known: set[str], *, lazy: bool = True) -> set[str]:
    return set(import_sites(name, path, known, lazy=lazy))


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


# Ground to top (the design's layout). A module's layer is that of its longest matching prefix;
# the argparse wiring of each command (`*.cli`) belongs to the application, whatever its folder.
LAYERS = {
    "distil.errors": 0,
    "distil.types": 0,
    "distil.progress": 0,
    "distil.paths": 0,
    "distil.files": 0,
    "distil.ranks": 0,
    "distil.config": 1,
    "distil.models": 2,
    "distil.align": 2,
    "distil.losses": 2,
    "distil.generation": 2,
    "distil.data": 2,
    "distil.tasks": 3,
    "distil.eval": 4,
    "distil.teacher": 4,
    "distil.serve": 4,
    "distil.preflight": 5,
    "distil.plan": 5,
    "distil.train": 6,
    "distil": 7,
    "distil.cli": 7,
    "distil.__main__": 7,
    "distil.demo": 7,
    "distil.testing": 7,
    "distil.teacher.cli": 7,
    "distil.serve.cli": 7,
    "distil.plan.cli": 7,
    "distil.eval.cli": 7,
}
SHARED_KERNELS = {"distil.models", "distil.align"}  # the L2 rooms their siblings may import


def room(module: str) -> str:
    """The LAYERS key that `module` belongs to (its longest matching prefix)."""
    keys = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(keys, key=len)


def layer_violations(sites: dict[str, dict[str, int]], paths: dict[str, Path]) -> list[str]:
    """'file:line: a (Ln) imports b (Lm): why' for every import against the layer rule."""
    out = []
    for a, targets in sorted(sites.items()):
        ra = room(a)
        for b, line in sorted(targets.items()):
            rb = room(b)
            la, lb = LAYERS[ra], LAYERS[rb]
            why = None
            if lb > la:
                why = "an import points up"
            elif la == lb == 2 and ra != rb and rb not in SHARED_KERNELS:
                why = f"kernel siblings import only {' and '.join(sorted(SHARED_KERNELS))}"
            elif la == lb == 4 and ra != rb:
                why = "the services do not import each other"
            if why:
                where = paths[a].relative_to(SRC.parent)
                out.append(f"{where}:{line}: {a} (L{la}) imports {b} (L{lb}): {why}")
    return out


def all_sites(extra: dict[str, Path] | None = None) -> tuple[dict, dict[str, Path]]:
    paths = {**modules(), **(extra or {})}
    known = set(paths)
    return {n: import_sites(n, p, known) for n, p in paths.items()}, paths


def test_no_import_circles_anywhere():
    cycle = find_cycle(graph())  # every import, lazy and TYPE_CHECKING ones included
    assert cycle is None, " -> ".join(cycle or [])


def test_every_import_points_down_the_layers():
    sites, paths = all_sites()
    assert len(sites) > 100 and {room(m) for m in sites} == set(LAYERS)  # every room was found
    assert layer_violations(sites, paths) == []


def test_a_planted_upward_import_is_reported_with_its_file_and_line(tmp_path):
    planted = tmp_path / "distil" / "config" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "from __future__ import annotations\n\n\ndef f():\n    from distil.train import loop\n"
    )
    name = "distil.config.planted"
    sites, paths = all_sites({name: planted})
    paths[name] = SRC / "config" / "planted.py"  # as if it sat in the package
    assert sites[name] == {"distil.train.loop": 5}
    (msg,) = [m for m in layer_violations(sites, paths) if "planted" in m]
    assert msg == (
        "distil/config/planted.py:5: distil.config.planted (L1) imports distil.train.loop "
        "(L6): an import points up"
    )
    # sideways in the kernels and across the services, too
    sites = {"distil.data.x": {"distil.losses.jsd": 3}, "distil.eval.y": {"distil.teacher.z": 9}}
    paths = {"distil.data.x": SRC / "data" / "x.py", "distil.eval.y": SRC / "eval" / "y.py"}
    assert [m.split(": ", 2)[2] for m in layer_violations(sites, paths)] == [
        "kernel siblings import only distil.align and distil.models",
        "the services do not import each other",
    ]


def test_the_cycle_finder_finds_circles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    edges = graph()
    assert find_cycle(edges) is None
    edges["distil.tasks.countdown.solver"].add("distil.tasks.countdown")  # a planted back edge
    assert find_cycle(edges) is not None


def test_lazy_imports_are_seen_only_when_asked():
    mods = modules()
    path = mods["distil.demo"]  # imports its stages inside run_demo
    assert "distil.demo.stages" in imports_of("distil.demo", path, set(mods))
    assert "distil.demo.stages" not in imports_of("distil.demo", path, set(mods), lazy=False)
    assert "distil.tasks.countdown.files" in graph(lazy=False)["distil.tasks.countdown"]


def test_the_product_never_imports_the_test_helpers():
    users = {name for name, deps in graph().items() if deps & TEST_ONLY and name not in TEST_ONLY}
    assert users == set(), f"product modules importing distil.testing: {sorted(users)}"


def test_the_command_line_and_the_data_commands_start_without_torch():
    """`distil --help`, `distil countdown generate` and `distil tokenizer train` need neither
    torch nor transformers' model classes (each costs seconds of start-up): the modules they
    import load both only in the functions that build or run a model."""
    code = (
        "import sys\n"
        "import distil.cli, distil.plan, distil.plan.cli, distil.tasks, distil.data.datasets\n"
        "import distil.models.scratch, distil.tasks.countdown\n"
        "from distil.cli import build_parser\n"
        "build_parser()\n"
        "heavy = sorted(m for m in ('torch', 'transformers.modeling_utils') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
