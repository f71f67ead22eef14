"""Progress of the long commands: a bar on a terminal, plain lines with a stage label otherwise."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from attnflow.cli import console


class ProgressReport:
    """A command's progress: a stage label and ``done/total``, with the time since it started.

    On a terminal, a rich bar on stderr (its count blank until the total is known). Off a terminal
    (CI, a SLURM log), plain lines on stdout from the library's first call on (bad input found
    before it stays the command's only line): one when a stage first appears and one each tenth of
    the total (stages that alternate, simulating and measuring job after job, print no line each
    time). ``report(done, total, stage=...)`` is called with the library's progress (``stage`` the
    label from then on); ``report.stage(name)`` changes only the label.
    """

    def __init__(self, command: str, stage: str, bar: Progress | None) -> None:
        self.command, self.bar, self.start = command, bar, time.perf_counter()
        self.label, self.done, self.total, self.tenths = stage, 0, None, 0
        self.seen = {stage}
        self.task = None if bar is None else bar.add_task(f"{command}: {stage}", total=None, count="")

    def __call__(self, done: int, total: int, *, stage: str | None = None) -> None:
        first, self.done, self.total = self.total is None, done, total
        tenths = 10 * done // total if total else 0
        new = stage is not None and stage not in self.seen
        self.label = stage or self.label
        self.seen.add(self.label)
        self._show(line=first or new or tenths > self.tenths)
        self.tenths = max(tenths, self.tenths)

    def stage(self, name: str) -> None:
        """The label only (``measuring``), at the count reached."""
        if self.total is not None:
            self(self.done, self.total, stage=name)

    def _count(self) -> str:
        return "" if not self.total else f"{self.done}/{self.total} ({100 * self.done // self.total}%)"

    def _show(self, *, line: bool) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.command}: {self.label}", count=self._count(),
                            completed=self.done, total=self.total or None)  # fmt: skip
        elif line:
            count = f" {self._count()}" if self.total else ""
            text = f"{self.command}: {self.label}{count} [{time.perf_counter() - self.start:.1f} s]"
            console.stdout.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_report(command: str, stage: str) -> Iterator[ProgressReport]:
    """The progress of ``command``, from ``stage`` on: a bar on a terminal, plain lines otherwise."""
    if not console.stderr.is_terminal:
        yield ProgressReport(command, stage, None)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"))
    with Progress(*columns, TimeElapsedColumn(), console=console.stderr, transient=True) as bar:
        yield ProgressReport(command, stage, bar)


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
