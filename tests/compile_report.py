"""``pytest --compile-report N``: where the suite's time goes, compilation counted apart.

Each test's phases (setup, call, teardown) run inside :func:`attnflow.numerics.program_cache.compile_clock`,
which sums JAX's own duration events (tracing, lowering, XLA's compile) in the test's process, as
JAX reports them: a program traced inside another's trace counts at both levels, and programs
compiled on several threads at once each count, so a test can show more seconds compiling than it
lasted (test_kernels' blocked = dense: 23 s of events in 12 s). The seconds travel to the
controller with the test's report (xdist workers included). After the run:
the suite's total test time and the part spent compiling, and the N tests that compiled longest.
Programs compiled by a process that a test starts (a command run with ``subprocess``, a worker
pool) are not counted: that time shows as test time with no compilation."""

from __future__ import annotations

import pytest

from attnflow.numerics import program_cache

_KEY = "compile_s"


class CompileReport:
    def __init__(self, top: int) -> None:
        self.top = top
        self.tests: dict[str, list[float]] = {}  # nodeid -> [seconds, compile seconds]

    def _timed(self, item):
        with program_cache.compile_clock() as clock:
            yield
        item.user_properties.append((_KEY, clock.seconds))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._timed(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._timed(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._timed(item)

    def pytest_runtest_logreport(self, report):
        seconds = sum(value for name, value in report.user_properties if name == _KEY)
        total = self.tests.setdefault(report.nodeid, [0.0, 0.0])
        total[0] += report.duration
        total[1] = seconds  # the properties accumulate over the phases: the last report has them all

    def pytest_terminal_summary(self, terminalreporter):
        if not self.tests:
            return
        spent = sum(t for t, _ in self.tests.values())
        compiling = sum(c for _, c in self.tests.values())
        write = terminalreporter.write_line
        terminalreporter.section("compilation")
        write(
            f"{len(self.tests)} tests: {spent:.0f} s of test time, {compiling:.0f} s of it compiling "
            f"({compiling / max(spent, 1e-9):.0%}: JAX's tracing, lowering and compile events, summed, "
            "in the tests' own processes)"
        )
        ranked = sorted(self.tests.items(), key=lambda entry: -entry[1][1])[: self.top]
        for nodeid, (seconds, compile_seconds) in ranked:
            write(f"{compile_seconds:8.2f}s compiling of {seconds:8.2f}s  {nodeid}")


def register(config) -> None:
    """Register the report in this process when ``--compile-report N`` asks for it (N > 0)."""
    top = config.getoption("--compile-report")
    if top > 0:
        config.pluginmanager.register(CompileReport(top), "compile_report")
