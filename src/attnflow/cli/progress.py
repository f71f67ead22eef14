"""Progress of the long commands: a bar on a terminal, plain lines with a stage label otherwise."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from attnflow.cli import console


def duration(seconds: float) -> str:
    """A time left as a reader wants it: ``"40 s"``, ``"3 min"``, ``"1.5 h"``."""
    if seconds < 60:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class ProgressReport:
    """A command's progress: a stage label and ``done/total`` in ``unit`` (snapshots, frames, runs),
    with the time since it started and, once the count has run for a second, an estimate of the
    time left at the rate since the latest new stage began (a compilation before it is not taken
    for the rate).

    On a terminal, a rich bar on stderr (its count blank until the total is known). Off a terminal
    (CI, a SLURM log), plain lines on stdout from the library's first call on (bad input found
    before it stays the command's only line): one when a stage first appears and one each tenth of
    the total (stages that alternate, simulating and measuring job after job, print no line each
    time). ``report(done, total, stage=...)`` is called with the library's progress (``stage`` the
    label from then on); ``report.stage(name)`` changes only the label.
    """

    def __init__(self, command: str, stage: str, bar: Progress | None, unit: str = "") -> None:
        self.command, self.bar, self.start, self.unit = command, bar, time.perf_counter(), unit
        self.label, self.done, self.total, self.tenths = stage, 0, None, 0
        self.seen = {stage}
        self.since = None  # (time, done) of the current stage's first count: the rate's origin
        self.task = None if bar is None else bar.add_task(f"{command}: {stage}", total=None, count="")

    def __call__(self, done: int, total: int, *, stage: str | None = None) -> None:
        first, self.done, self.total = self.total is None, done, total
        tenths = 10 * done // total if total else 0
        new = stage is not None and stage not in self.seen
        if self.since is None or new:
            self.since = (time.perf_counter(), done)
        self.label = stage or self.label
        self.seen.add(self.label)
        self._show(line=first or new or tenths > self.tenths)
        self.tenths = max(tenths, self.tenths)

    def stage(self, name: str) -> None:
        """The label only (``measuring``), at the count reached."""
        if self.total is not None:
            self(self.done, self.total, stage=name)

    def _count(self) -> str:
        if not self.total:
            return ""
        unit = f" {self.unit}" if self.unit else ""
        text = f"{self.done}/{self.total}{unit} ({100 * self.done // self.total}%)"
        return text + (f", about {self.left} left" if self.left else "")

    @property
    def left(self) -> str | None:
        """The time left at the current stage's rate, once it has counted for a second."""
        if self.since is None or not self.total or self.done >= self.total:
            return None
        start, done0 = self.since
        elapsed = time.perf_counter() - start
        if elapsed < 1.0 or self.done <= done0:
            return None
        return duration(elapsed * (self.total - self.done) / (self.done - done0))

    def _show(self, *, line: bool) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.command}: {self.label}", count=self._count(),
                            completed=self.done, total=self.total or None)  # fmt: skip
        elif line:
            count = f" {self._count()}" if self.total else ""
            text = f"{self.command}: {self.label}{count} [{time.perf_counter() - self.start:.1f} s]"
            console.stdout.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_report(command: str, stage: str, unit: str = "") -> Iterator[ProgressReport]:
    """The progress of ``command``, from ``stage`` on, counted in ``unit``: a bar on a terminal,
    plain lines otherwise."""
    if not console.stderr.is_terminal:
        yield ProgressReport(command, stage, None, unit)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"))
    with Progress(*columns, TimeElapsedColumn(), console=console.stderr, transient=True) as bar:
        yield ProgressReport(command, stage, bar, unit)


def snapshot_stages(report: ProgressReport):
    """The progress callback of a run (``attnflow.workflows.run``): its first call comes before the
    solve compiles, the next ones as snapshots are stored, the last before the figures are drawn."""

    def call(done: int, total: int) -> None:
        stage = "compiling" if report.label == "building" else "drawing" if done == total else "simulating"
        report(done, total, stage=stage)

    return call


def job_stages(report: ProgressReport):
    """The progress callback of ``reproduce``: called as snapshots (jobs in this process) or whole
    tasks (in worker processes) finish; a call with nothing done yet means the jobs are compiling.
    ``reproduce`` names the other stages itself (``on_stage``: measuring, drawing)."""

    def call(done: int, total: int) -> None:
        report(done, total, stage="compiling" if done == 0 else "simulating")

    return call
