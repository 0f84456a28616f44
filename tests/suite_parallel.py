"""How the suite shares two cores (issue #45): a pytest plugin loaded by tests/conftest.py.

`make test` runs pytest-xdist with two single-threaded workers, `--dist loadgroup` (a test
with an `xdist_group` mark runs on the worker that runs the rest of its group) and
`--no-loadscope-reorder` (work is handed out in collection order). This plugin:

- groups the tests of a module that use a module- or class-scoped fixture of that module (a
  model trained for the module, a server it starts), so that the fixture is built once, on one
  worker, not once per worker; a test that names its group itself keeps it;
- on a worker, collects the slow tests first, so that the long ones start first and the many
  short ones fill both workers up to the end (a long test handed out last would run alone).

Tests that start two ranks on fixed ports (torchrun, accelerate launch) name one group,
"processes": they run one after another, beside the other worker's tests.
Without xdist (a plain `pytest`) the order is the usual one and the groups mean nothing.
"""

from __future__ import annotations

import importlib.util

import pytest

SHARED_SCOPES = ("module", "class")


def pytest_configure(config: pytest.Config) -> None:
    if importlib.util.find_spec("xdist") is None:  # the mark is xdist's; known without it too
        config.addinivalue_line("markers", "xdist_group(name): run with its group (xdist)")


def module_group(item: pytest.Item) -> str | None:
    """The item's module path when it uses a module- or class-scoped fixture defined in that
    module (the fixture is then built once per worker that runs one of these tests)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::")[0]
    for defs in info.name2fixturedefs.values():
        fixture = defs[-1]
        if fixture.scope in SHARED_SCOPES and fixture.baseid.split("::")[0] == module:
            return module
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # no xdist worker: nothing is scheduled
    for item in items:
        group = module_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
