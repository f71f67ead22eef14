"""What the figures cost: a run's figures against the whole run, the reproduce report against the
whole ``reproduce --quick``, both as CPU-time ratios measured in this one run.

Each measurement is a fresh child process running the command in-process (the ``attnflow`` command
line's own code), with the drawing wrapped to add up the process CPU time spent inside it:

- **a run** (``attnflow run examples/rope.toml``: n = 64, d = 3, RK4, 201 snapshots, the run's
  ``states.png``, ``energy.png`` and ``collapse.png``): the CPU time inside
  ``attnflow.workflows.run.write_figures`` (matplotlib's import included: it is imported by the
  first figure) over the CPU time of the whole process (its start, JAX's import, the build, the
  solve, the store, the metrics, the figures, the viewer). The first child warms the program
  cache, as a user's second run finds it; the others are measured; the median is reported.
- **the report** (``attnflow reproduce --quick``): the CPU time of importing
  ``attnflow.viz.report`` (matplotlib and the viz modules; JAX, which it also imports, is imported
  first and counted as the command's) and inside ``attnflow.viz.report.write_report`` (the
  figures, ``results.json``, ``table.md``, ``report.md`` and ``report.html``) over the whole
  process's. ``--quick`` runs every job in this one process, so the process's CPU time is the
  command's. A first reproduce warms the program cache; the second is measured (the smaller
  denominator: the harder target).

Targets (issue 28, item 10): at most a fifth for a run, at most a quarter for the report.

``python benchmarks/figures.py`` (about 3 min on 2 cores) prints the numbers; ``--write`` also puts
them in ``benchmarks/RESULTS.md`` (its ``figures`` section, replaced on each write by
``engine.replace_section``). ``--json PATH`` keeps the raw numbers, ``--from PATH`` writes the
section of such saved numbers without measuring; ``--before PATH --before-label TEXT`` adds those
of an earlier run (another tree's figures, say: run this script from a copy of the tree with
``PYTHONPATH`` on its ``src``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import replace_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN_CONFIG = ROOT / "examples" / "rope.toml"
BEGIN, END = "<!-- figures: begin -->", "<!-- figures: end -->"
RUN_TARGET, REPORT_TARGET = 0.2, 0.25


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def _timed(spent: list[float], function):
    """``function`` that adds the CPU time spent inside it to ``spent[0]``."""

    def wrapper(*args, **kwargs):
        start = _cpu_s()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += _cpu_s() - start

    return wrapper


def _command(argv: list[str]) -> int:
    """The ``attnflow`` command line in this process; its exit code."""
    from attnflow.cli import app

    try:
        app(argv, standalone_mode=False)
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def child_run(out: Path) -> dict:
    """One ``attnflow run examples/rope.toml`` in this process: CPU of the figures and in all."""
    from attnflow.workflows import run

    spent = [0.0]
    run.write_figures = _timed(spent, run.write_figures)
    code = _command(["run", str(RUN_CONFIG), "--out", str(out)])
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    return {"exit": code, "figures_cpu_s": spent[0], "total_cpu_s": _cpu_s(), "figures": figures}


def child_report(out: Path) -> dict:
    """One ``attnflow reproduce --quick`` in this process: CPU of the report and in all."""
    spent = [0.0]
    import jax  # noqa: F401 - what the report module imports besides the drawing: the command's
    import rich.table  # noqa: F401

    import attnflow.io.outcomes  # noqa: F401

    start = _cpu_s()
    from attnflow.viz import report  # matplotlib with it: part of the drawing's cost

    spent[0] += _cpu_s() - start
    drawing = [spent[0]]  # the import, then the figures alone (write_report calls write_figures)
    report.write_report = _timed(spent, report.write_report)
    report.write_figures = _timed(drawing, report.write_figures)
    code = _command(["reproduce", "--quick", "--out", str(out)])
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    return {
        "exit": code,
        "report_cpu_s": spent[0],
        "drawing_cpu_s": drawing[0],
        "total_cpu_s": _cpu_s(),
        "figures": figures,
    }


def _child(kind: str, out: Path) -> dict:
    """Run ``kind`` ("run" or "report") in a fresh process; its measurements."""
    result = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--child-out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark child {kind} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def measure(runs: int) -> dict:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="attnflow-figures-") as tmp:
        _child("run", Path(tmp) / "warm")  # fills the program cache, as a user's first run does
        run = [_child("run", Path(tmp) / f"run{i}") for i in range(runs)]
        _child("report", Path(tmp) / "report-warm")  # the same for reproduce's programs
        report = _child("report", Path(tmp) / "report")
    load_after = os.getloadavg()
    run_ratios = [r["figures_cpu_s"] / r["total_cpu_s"] for r in run]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_before": load_before,
        "load_after": load_after,
        "run": run,
        "run_ratio": statistics.median(run_ratios),
        "report": report,
        "report_ratio": report["report_cpu_s"] / report["total_cpu_s"],
        "drawing_ratio": report["drawing_cpu_s"] / report["total_cpu_s"],
    }


def _before_lines(before: dict, label: str) -> list[str]:
    """The earlier run ``before`` (:func:`measure`'s numbers) in a sentence, named ``label``."""
    load = ", ".join(f"{v:.2f}" for v in before["load_before"])
    report = before["report"]
    return [
        "",
        f"Before ({label}; run of {before['date']}, load {load}): the report's drawing "
        f"{report['drawing_cpu_s']:.2f} of {report['total_cpu_s']:.2f} CPU-s "
        f"(**{before['drawing_ratio']:.3f}**), a run's figures a median share of {before['run_ratio']:.3f}.",
    ]


def section(result: dict, before: dict | None = None, before_label: str = "an earlier run") -> str:
    """The Markdown section of ``RESULTS.md`` (with the numbers of an earlier run ``before``)."""
    load = ", ".join(f"{v:.2f}" for v in result["load_before"])
    after = ", ".join(f"{v:.2f}" for v in result["load_after"])
    run, report = result["run"], result["report"]
    rows = [
        f"| run {i + 1} | {r['figures_cpu_s']:.2f} | {r['total_cpu_s']:.2f} | "
        f"{r['figures_cpu_s'] / r['total_cpu_s']:.3f} |"
        for i, r in enumerate(run)
    ]
    lines = [
        BEGIN,
        "## What the figures cost (`python benchmarks/figures.py`)",
        "",
        f"Run of {result['date']} on {result['machine']}; load average (1, 5, 15 min) {load} before, "
        f"{after} after (a shared machine: the ratios are of CPU time, each within one process).",
        "",
        f"A warm `attnflow run examples/rope.toml` (n = 64, d = 3, 201 snapshots; figures "
        f"{', '.join(run[0]['figures'])}): CPU seconds inside the figures (matplotlib's import "
        "included) against the whole process's.",
        "",
        "| process | figures CPU s | whole run CPU s | figures / run |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Median share: **{result['run_ratio']:.3f}** (target at most {RUN_TARGET}).",
        "",
        f"A warm `attnflow reproduce --quick` ({len(report['figures'])} figures): CPU seconds of the "
        "report's drawing (importing `attnflow.viz.report` with matplotlib, then `write_figures`) and "
        "of the whole report (the drawing, then results.json, table.md, report.md, report.html) "
        "against the whole process's.",
        "",
        "| drawing CPU s | whole report CPU s | whole reproduce CPU s | drawing / reproduce "
        "| report / reproduce |",
        "|---|---|---|---|---|",
        f"| {report['drawing_cpu_s']:.2f} | {report['report_cpu_s']:.2f} | {report['total_cpu_s']:.2f} "
        f"| **{result['drawing_ratio']:.3f}** | {result['report_ratio']:.3f} |",
        "",
        f"Target for the drawing at most {REPORT_TARGET}.",
        *(_before_lines(before, before_label) if before is not None else []),
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="measured runs (after one warm-up)")
    parser.add_argument("--write", action="store_true", help="put the section in benchmarks/RESULTS.md")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--before", type=Path, help="the raw numbers (--json) of an earlier run, shown too")
    parser.add_argument("--before-label", default="an earlier run", help="what the earlier run measured")
    parser.add_argument("--child", choices=("run", "report"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--from", dest="source", type=Path, help="saved raw numbers (--json): no measuring")
    args = parser.parse_args()
    if args.child:
        measured = child_run(args.child_out) if args.child == "run" else child_report(args.child_out)
        print(json.dumps(measured))
        return
    before = json.loads(args.before.read_text()) if args.before else None
    result = json.loads(args.source.read_text()) if args.source else measure(args.runs)
    text = section(result, before, args.before_label)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.write:
        replace_section(ROOT / "benchmarks" / "RESULTS.md", BEGIN, END, text.rstrip("\n"))


if __name__ == "__main__":
    main()
