"""The suite's time budget (issue #45): a test may take at most 60 s (setup, call and teardown
together) unless it carries `@pytest.mark.budget(seconds, "why it needs them")`.

A pytest plugin, loaded by tests/conftest.py: each test's allowance rides on its reports (as a
user property, so it reaches the xdist controller), the controller sums each test's phases,
and at the end of the session a test over its allowance is listed and the run fails, even when
every assertion passed. `--test-budget SECONDS` changes the default (0 turns the check off,
e.g. to step through one test in a debugger); `--test-budget-scale X` multiplies every
allowance, on a machine slower or busier than the 2-core CI machine the budgets are set for. The check itself is `over_budget`, a pure
function over (test, seconds, allowance) records, tested on synthetic reports in
tests/test_suite_budget.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

DEFAULT_SECONDS = 60.0
PROPERTY = "budget_seconds"


@dataclass
class Record:
    nodeid: str
    seconds: float = 0.0  # setup + call + teardown
    allowance: float | None = None  # from the test's budget mark; None: the default


def over_budget(
    records: list[Record], default: float = DEFAULT_SECONDS, scale: float = 1.0
) -> list[str]:
    """One line per test that took longer than its allowance (its budget mark's seconds, else
    `default`; times `scale`), slowest first; [] when every test kept to its allowance."""
    late = [r for r in records if r.seconds > scale * (r.allowance or default)]
    late.sort(key=lambda r: -r.seconds)
    times = "" if scale == 1 else f" x {scale:g}"
    return [
        f"{r.nodeid} took {r.seconds:.1f} s, over its "
        + (f"budget mark's {r.allowance:g} s" if r.allowance else f"{default:g} s default")
        + times
        for r in late
    ]


def budget_of(item: pytest.Item) -> float | None:
    """The seconds of the item's closest budget mark, None without one; a mark without
    positive seconds and a reason is a usage error."""
    mark = item.get_closest_marker("budget")
    if mark is None:
        return None
    seconds = mark.args[0] if mark.args else mark.kwargs.get("seconds")
    reason = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("reason")
    if not isinstance(seconds, int | float) or seconds <= 0 or not (reason or "").strip():
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.budget needs positive seconds and a reason, "
            f"got args={mark.args!r} kwargs={mark.kwargs!r}. Fix: "
            '@pytest.mark.budget(120, "what the test runs that needs the time")'
        )
    return float(seconds)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--test-budget",
        type=float,
        default=DEFAULT_SECONDS,
        metavar="SECONDS",
        help="fail the run when a test without a budget mark takes longer than this "
        f"(default {DEFAULT_SECONDS:g}; 0: no check)",
    )
    parser.addoption(
        "--test-budget-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every test's allowance (the default and the budget marks') by X, on a "
        "machine slower or busier than the 2-core CI machine the budgets are set for",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "budget(seconds, reason): this test may take up to `seconds` instead of the default "
        "60 (tests/suite_budget.py)",
    )
    budget = Budget(config.getoption("--test-budget"), config.getoption("--test-budget-scale"))
    config.pluginmanager.register(budget, "suite_budget_check")


class Budget:
    """Sums each test's phases from its reports; the session fails on a test over budget."""

    def __init__(self, default: float, scale: float = 1.0):
        self.default, self.scale = default, scale
        self.records: dict[str, Record] = {}
        self.late: list[str] = []

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            seconds = budget_of(item)
            if seconds is not None:
                item.user_properties.append((PROPERTY, seconds))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        r = self.records.setdefault(report.nodeid, Record(report.nodeid))
        r.seconds += report.duration
        for name, value in report.user_properties:  # tuples; lists after xdist's transport
            if name == PROPERTY:
                r.allowance = float(value)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.default:
            return  # an xdist worker: the controller, which sees every report, decides
        self.late = over_budget(list(self.records.values()), self.default, self.scale)
        if self.late and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.late:
            return
        terminalreporter.section("tests over their time budget (tests/suite_budget.py)", red=True)
        for line in self.late:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            "Fix: make the test faster, or mark it @pytest.mark.budget(seconds, reason)"
        )
