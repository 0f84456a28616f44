"""Do the carried wheels and the GPU image's packages satisfy what distil and the GPU check need?

A resolver check without an index. The roots are distil's requirements (pyproject.toml:
dependencies and the extras in EXTRAS) and every pin of bench/gpu/wheels.txt. Each root is
followed through the Requires-Dist of the wheel that provides it (markers evaluated for CPython
3.12 on x86-64 Linux, requested extras included). A requirement is met by a wheel of the folder
(its version must match) or by a package of the image (its version is checked where known).

    python bench/gpu/deps.py --wheels .whl              # here: wheels + bench/gpu/image.txt
    python bench/gpu/deps.py --installed                # there: what this Python imports

`--installed` checks the distributions this interpreter sees (PYTHONPATH included: the wheels
installed with --target), with their real versions and requirements. Exit 1 names every
requirement that nothing satisfies, every version conflict and every wheel that does not fit
the platform; exit 0 prints what was checked.
"""

from __future__ import annotations

import argparse
import email.parser
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("liger", "serve", "math", "remote")  # what the GPU tier and the benchmarks import
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
PY_TAGS = {"py3", "py312", "cp312", "py2.py3"}
ABI_TAGS = {"none", "abi3", "cp312"}


@dataclass
class Dist:
    name: str
    version: Version | None  # None: an image package whose version is not known here
    source: str  # "wheel <file>", "image" or "installed"
    requires: list[str] = field(default_factory=list)
    carried: bool = False  # one of our wheels (not the image's own package)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    unchecked: set[str] = field(default_factory=set)  # met by name only (version unknown)
    notes: list[str] = field(default_factory=list)  # the image's own packages' requirements
    used: dict[str, Dist] = field(default_factory=dict)


def read_wheel(path: Path) -> Dist:
    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8"))
    requires = msg.get_all("Requires-Dist") or []
    return Dist(str(name), version, f"wheel {path.name}", requires, carried=True)


def wheel_fits(path: Path) -> bool:
    """Whether the wheel installs on CPython 3.12, manylinux x86-64."""
    _, _, _, tags = parse_wheel_filename(path.name)
    for t in tags:
        plat_ok = t.platform == "any" or (
            t.platform.startswith("manylinux") and t.platform.endswith("x86_64")
        )
        if t.interpreter in PY_TAGS and t.abi in ABI_TAGS and plat_ok:
            return True
    return False


def wheel_dists(folder: Path, report: Report) -> dict[str, Dist]:
    out: dict[str, Dist] = {}
    for path in sorted(folder.glob("*.whl")):
        d = read_wheel(path)
        if not wheel_fits(path):
            report.problems.append(f"{path.name}: not for CPython 3.12 on manylinux x86-64")
        if d.name in out:
            report.problems.append(
                f"two wheels of {d.name}: {out[d.name].source} and {d.source} (keep one)"
            )
        out[d.name] = d
    return out


def image_dists(listing: Path) -> dict[str, Dist]:
    out: dict[str, Dist] = {}
    for line in listing.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            key = canonicalize_name(name)
            out[key] = Dist(key, Version(version) if version else None, "image")
    return out


def installed_dists(carried: Path | None) -> dict[str, Dist]:
    """The first distribution of each name on sys.path, as `import` would find it; those
    under `carried` (the --target folder of the wheels) are ours."""
    from importlib.metadata import distributions

    out: dict[str, Dist] = {}
    for d in distributions():
        key = canonicalize_name(d.metadata["Name"] or "")
        if key and key not in out:
            where = Path(str(d.locate_file(""))).resolve()
            ours = carried is not None and where.is_relative_to(carried.resolve())
            out[key] = Dist(key, Version(d.version), "installed", d.requires or [], ours)
    return out


def roots(pins: Path, *, exact: bool = True) -> list[tuple[str, str]]:
    """(requirement, where from): distil's requirements (with EXTRAS) and the pins
    (`exact=False`: their names only)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [(r, "pyproject.toml") for r in project["dependencies"]]
    for extra in EXTRAS:
        reqs += [(r, f"distil[{extra}]") for r in project["optional-dependencies"][extra]]
    for line in pins.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            reqs.append((line if exact else Requirement(line).name, pins.name))
    return reqs


def unpinned(wheels: dict[str, Dist], pins: Path) -> list[str]:
    """Wheels of the folder that wheels.txt does not name (left from an older pin)."""
    named = {canonicalize_name(Requirement(r).name) for r, why in roots(pins) if why == pins.name}
    return [f"{d.source}: not in {pins.name} (stale? `make gpu-wheels` starts afresh)"
            for k, d in wheels.items() if k not in named]  # fmt: skip


def check(requirements: list[tuple[str, str]], available: dict[str, Dist], env: dict) -> Report:
    """Follow `requirements` ((requirement, needed by) pairs) through `available` (name ->
    Dist); the report of what failed."""
    report = Report()
    todo = [(r, why, False) for r, why in requirements]  # (requirement, needed by, the image's)
    seen: set[tuple[str, str]] = set()
    while todo:
        text, why, image_own = todo.pop()
        problems = report.notes if image_own else report.problems
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        key = canonicalize_name(req.name)
        extras = tuple(sorted(canonicalize_name(e) for e in req.extras))
        if (str(req), extras) in seen:
            continue
        seen.add((str(req), extras))
        dist = available.get(key)
        if dist is None:
            problems.append(f"{req} (needed by {why}): no wheel and not in the image")
            continue
        report.used[key] = dist
        if dist.version is None:
            report.unchecked.add(key)
        elif req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{req} (needed by {why}): {dist.source} has {key} {dist.version}")
        for sub in dist.requires:
            sub_req = Requirement(sub)
            wanted = ("", *extras)
            if sub_req.marker is None or any(
                sub_req.marker.evaluate({**env, "extra": e}) for e in wanted
            ):
                sub_text = str(sub_req).split(";")[0].strip()
                todo.append((sub_text, f"{key} {dist.version}", not dist.carried))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="folder of .whl files")
    p.add_argument("--image", type=Path, default=ROOT / "bench/gpu/image.txt")
    p.add_argument("--pins", type=Path, default=ROOT / "bench/gpu/wheels.txt")
    p.add_argument("--installed", action="store_true", help="check this interpreter's packages")
    p.add_argument("--carried", type=Path, default=None, help="--installed: the wheels' folder")
    args = p.parse_args(argv)
    if args.installed:
        env, available = default_environment(), installed_dists(args.carried)
        report = Report()
    else:
        env, report = TARGET_ENV, Report()
        if not args.wheels.is_dir():
            print(f"deps: no wheel folder {args.wheels} (run `make gpu-wheels`)")
            return 1
        wheels = wheel_dists(args.wheels, report)
        report.problems += unpinned(wheels, args.pins)
        available = {**image_dists(args.image), **wheels}
    result = check(roots(args.pins, exact=not args.installed), available, env)
    problems = report.problems + result.problems
    from_wheels = [k for k, d in result.used.items() if d.source.startswith("wheel")]
    where = "this interpreter" if args.installed else f"{args.wheels} + {args.image.name}"
    for line in problems:
        print(f"deps: MISSING OR CONFLICT: {line}")
    for line in result.notes:  # not ours to fix, and not counted: the image runs as it is
        print(f"deps: note, the image's own requirement: {line}")
    print(
        f"deps: {len(result.used)} distributions checked against {where}; "
        f"{len(from_wheels)} from wheels; {len(problems)} problem(s)"
    )
    if result.unchecked:
        print(f"deps: versions not known here (checked on the GPU machine): "
              f"{', '.join(sorted(result.unchecked))}")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
