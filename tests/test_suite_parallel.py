"""How `make test` shares the tests between two xdist workers (tests/suite_parallel.py): the
tests of an xdist group, and the tests of a module that use its module-scoped fixture, run on
one worker (so the fixture is built once); on an inner `pytest -n 2 --dist loadgroup` run."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

pytest_plugins = ["pytester"]

# each test sleeps a little, so that both workers are busy while the tests are handed out
GROUPED = """
import time
import pytest

pytestmark = pytest.mark.xdist_group("g")

@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    time.sleep(0.1)
"""
SHARED = """
import time
import pytest

@pytest.fixture(scope="module")
def built():
    return object()

@pytest.mark.parametrize("i", range(6))
def test_uses_the_module_fixture(built, i):
    time.sleep(0.1)

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    time.sleep(0.1)
"""


def workers_of(lines: list[str]) -> dict[str, set[str]]:
    """test function name -> the workers that ran its cases, from `-v` output lines."""
    out = defaultdict(set)
    for line in lines:
        m = re.match(r"\[(gw\d)\] .*PASSED \S+::(\w+)\[", line)
        if m:
            out[m.group(2)].add(m.group(1))
    return out


def test_groups_and_module_fixture_users_stay_on_one_worker(pytester, monkeypatch, request):
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", str(request.path.parent))  # suite_parallel
    pytester.makepyfile(test_grouped=GROUPED, test_shared=SHARED)
    result = pytester.runpytest_subprocess(
        "-p", "xdist", "-p", "suite_parallel", "-n", "2", "--dist", "loadgroup",
        "--no-loadscope-reorder", "-v",
    )  # fmt: skip
    result.assert_outcomes(passed=18)
    ran = workers_of(result.outlines)
    assert len(ran["test_grouped"]) == 1, result.outlines
    assert len(ran["test_uses_the_module_fixture"]) == 1, result.outlines
    # the others are shared out one by one: both workers ran tests
    assert set().union(*ran.values()) == {"gw0", "gw1"}, result.outlines
