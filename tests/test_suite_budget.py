"""The time-budget guard (tests/suite_budget.py) fails a run whose slowest test is over 60 s
without a budget mark: on synthetic records, and end to end on an inner pytest run whose
report durations are set by its conftest (in this process, and across two xdist workers)."""

from __future__ import annotations

import pytest

from suite_budget import Record, over_budget

pytest_plugins = ["pytester"]


def test_over_budget_lists_exactly_the_tests_over_their_allowance():
    records = [
        Record("t.py::fast", 1.0),
        Record("t.py::just_under", 60.0),
        Record("t.py::unmarked_slow", 61.0),
        Record("t.py::marked_slow", 119.0, allowance=120.0),
        Record("t.py::over_its_mark", 130.0, allowance=120.0),
    ]
    assert over_budget(records) == [
        "t.py::over_its_mark took 130.0 s, over its budget mark's 120 s",
        "t.py::unmarked_slow took 61.0 s, over its 60 s default",
    ]
    assert over_budget(records[:2] + records[3:4]) == []
    assert over_budget([Record("t.py::a", 30.0)], default=20.0) == [
        "t.py::a took 30.0 s, over its 20 s default"
    ]
    assert over_budget(records, scale=2.0) == []  # 130 s <= 2 x 120 s, 61 s <= 2 x 60 s
    assert over_budget(records, scale=1.05) == [
        "t.py::over_its_mark took 130.0 s, over its budget mark's 120 s x 1.05"
    ]


# the inner run's tests say how long their reports claim they took; the phases add up
INNER_CONFTEST = """
import pytest

def pytest_configure(config):
    config.addinivalue_line("markers", "takes(setup, call): the durations reported")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    mark = item.get_closest_marker("takes")
    if mark is not None and report.when in ("setup", "call"):
        report.duration = mark.args[0 if report.when == "setup" else 1]
"""
INNER_TESTS = """
import pytest

def test_fast():
    pass

@pytest.mark.takes(31.0, 30.0)
def test_slow_without_a_mark():
    pass

@pytest.mark.budget(120, "trains a model for the claim")
@pytest.mark.takes(1.0, 70.0)
def test_slow_with_a_mark():
    pass

@pytest.mark.budget(100, "says 100 s, takes more")
@pytest.mark.takes(1.0, 150.0)
def test_over_its_mark():
    pass
"""


@pytest.fixture(autouse=True)
def bare(monkeypatch, request):
    """Inner runs load only the plugins they name (the installed ones take seconds to load);
    suite_budget is importable in xdist's workers too."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", str(request.path.parent))


@pytest.fixture
def inner(pytester):
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester


def outcome_lines(result) -> list[str]:
    return [x for x in result.outlines if " took " in x]


def test_a_slow_unmarked_test_fails_a_run_whose_tests_all_passed(inner):
    result = inner.runpytest("-p", "suite_budget")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcome_lines(result) == [
        "test_inner.py::test_over_its_mark took 151.0 s, over its budget mark's 100 s",
        "test_inner.py::test_slow_without_a_mark took 61.0 s, over its 60 s default",
    ]
    # the same run with a wider default: only the test over its own mark
    wider = inner.runpytest("-p", "suite_budget", "--test-budget", "90")
    assert wider.ret == pytest.ExitCode.TESTS_FAILED
    assert [x.split(" took")[0] for x in outcome_lines(wider)] == [
        "test_inner.py::test_over_its_mark"
    ]
    busy = inner.runpytest("-p", "suite_budget", "--test-budget-scale", "1.6")
    assert busy.ret == pytest.ExitCode.OK and outcome_lines(busy) == []
    off = inner.runpytest("-p", "suite_budget", "--test-budget", "0")
    assert off.ret == pytest.ExitCode.OK and outcome_lines(off) == []


def test_the_marks_reach_the_xdist_controller(inner):
    pytest.importorskip("xdist")
    result = inner.runpytest_subprocess("-p", "xdist", "-p", "suite_budget", "-n", "2")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcome_lines(result) == [
        "test_inner.py::test_over_its_mark took 151.0 s, over its budget mark's 100 s",
        "test_inner.py::test_slow_without_a_mark took 61.0 s, over its 60 s default",
    ]


@pytest.mark.parametrize("mark", ["budget(90)", "budget(0, 'why')", "budget(90, ' ')"])
def test_a_budget_mark_without_seconds_and_a_reason_is_a_usage_error(pytester, mark):
    pytester.makepyfile(f"import pytest\n@pytest.mark.{mark}\ndef test_x():\n    pass\n")
    result = pytester.runpytest("-p", "suite_budget")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "needs positive seconds and a reason" in "\n".join(result.errlines + result.outlines)
