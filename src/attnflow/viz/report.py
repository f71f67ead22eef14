"""The reproduce report: ``results.json``, ``report.md``, a self-contained ``report.html``, figures.

:func:`write_report` takes the :class:`~attnflow.io.outcomes.Outcome` of a run and writes, into
``out_dir``:

- ``results.json``: for every experiment, variant, n and seed the measured values (at the end and
  at each report time), per-job timings, aggregates over seeds (min / median / max), and every
  expectation row with its measured value and PASS / FAIL / SKIP;
- ``figures/``: ``comparison.png`` (each experiment's first seed at the largest n, content and
  gauge frame at τ = 0 and τ = 20, side by side), ``final_states.png`` (the content at the end of
  each run: collapse, latitude circle, wavy curve, clusters, great circle at a glance),
  ``mean_cosine.png`` and ``energy.png`` (all experiments on one plot each),
  ``metastability.png`` (E6: clusters in the gauge frame over time, energy against the rescaled
  time ``t e^β``), ``realisation_orbit.png`` / ``realisation_sphere.png`` (E7 / E8);
- ``report.md`` (figures linked) and ``report.html`` (the same content, figures embedded as
  base64 PNG, inline CSS, no script: opens offline).

:func:`summary_table` and :func:`failure_lines` are what the command line prints.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.table import Table

from attnflow.io.atomic import write_json, write_text
from attnflow.io.outcomes import METRICS, JobResult, Outcome, time_label
from attnflow.io.version import __version__
from attnflow.viz import plotting
from attnflow.viz.expectation_table import bound_text, fmt, measured_text, write_table

# --------------------------------------------------------------------------- results.json


def _aggregates(job: JobResult) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    labels = {label for seed in job.values for label in seed if label != "seed"}
    for label in sorted(labels):
        keys = {k for seed in job.values for k in seed.get(label, {})}
        table = {}
        for key in sorted(keys):
            values = [seed.get(label, {}).get(key) for seed in job.values]
            numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if numbers and len(numbers) == len(values):
                arr = np.asarray(numbers, dtype=float)
                table[key] = {
                    "min": float(arr.min()),
                    "median": float(np.median(arr)),
                    "max": float(arr.max()),
                }
        out[label] = table
    return out


def _status(rows: list[dict[str, Any]]) -> str:
    statuses = {row["status"] for row in rows}
    return "FAIL" if "FAIL" in statuses else ("PASS" if "PASS" in statuses else "SKIP")


def results_dict(outcome: Outcome, figures: list[Path]) -> dict[str, Any]:
    counts = defaultdict(int)
    for row in outcome.rows:
        counts[row["status"]] += 1
    experiments = {}
    for experiment in outcome.experiments:
        rows = [r for r in outcome.rows if r["experiment"] == experiment.id]
        jobs = [j for j in outcome.jobs if j.experiment == experiment.id]
        experiments[experiment.id] = {
            "title": experiment.title,
            "setting": experiment.setting,
            "shape": experiment.shape,
            "kind": experiment.kind,
            "source": f"attnflow/experiments/{experiment.source}",
            "status": _status(rows),
            "runs": [
                {
                    "variant": j.variant,
                    "label": j.label,
                    "n": j.n,
                    "seeds": list(j.seeds),
                    "status": j.status,
                    "reason": j.reason,
                    "timing": j.timing,
                    "per_seed": j.values,
                    "aggregates": _aggregates(j),
                }
                for j in jobs
            ],
            "expectations": rows,
        }
    return {
        "attnflow_version": __version__,
        "backend": jax.default_backend(),
        "quick": outcome.quick,
        "wall_time_s": outcome.wall_s,
        "passed": not outcome.failures,
        "counts": {k: counts[k] for k in ("PASS", "FAIL", "SKIP")},
        "metrics": METRICS,
        "experiments": experiments,
        "figures": [str(p.name) for p in figures],
    }


# --------------------------------------------------------------------------- figures


def _figure_jobs(outcome: Outcome) -> list[JobResult]:
    """Per experiment and variant, the job at the largest size that has states to draw (curves
    and circles read best with many points)."""
    chosen: dict[tuple[str, str], JobResult] = {}
    for job in outcome.jobs:
        key = (job.experiment, job.variant)
        if job.figure.states and (key not in chosen or job.n > chosen[key].n):
            chosen[key] = job
    return list(chosen.values())


def _shape(outcome: Outcome, job: JobResult) -> str:
    experiment = next(e for e in outcome.experiments if e.id == job.experiment)
    variant = next((v for v in experiment.variants if v.name == job.variant), None)
    return (variant.shape if variant is not None and variant.shape else "") or experiment.shape


def _color(job: JobResult, n: int) -> np.ndarray:
    color = job.figure.color
    return np.arange(n, dtype=float) if color is None or len(color) != n else color


def _comparison(path: Path, jobs: list[JobResult]) -> Path | None:
    rows = [("content", time_label(0.0)), ("gauge frame", time_label(0.0)),
            ("content", time_label(20.0)), ("gauge frame", time_label(20.0))]  # fmt: skip
    jobs = [j for j in jobs if all(label in j.figure.states for _, label in rows)]
    if not jobs:
        return None
    panels = []
    for frame, label in rows:
        for job in jobs:
            x, u = job.figure.states[label]
            shown, note = (x, "") if frame == "content" else (u, "") if u is not None else (x, " (Q = I)")
            if frame == "gauge frame" and u is None and job.figure.target is not None:
                note = " (n/a: content)"
            title = f"{job.label}, n={job.n}\n{frame}{note}, τ = {label.removeprefix('t=')}"
            panels.append({"x": shown, "color": _color(job, len(x)), "title": title})
    return plotting.write_comparison_figure(path, panels, ncols=len(jobs))


def _final_states(path: Path, jobs: list[JobResult], outcome: Outcome) -> Path | None:
    panels = []
    for job in jobs:
        x, _ = job.figure.states[time_label(None)]
        t_end = job.figure.series["t"][-1] if "t" in job.figure.series else None
        when = f"τ = {t_end:g}" if t_end is not None else "end"
        title = f"{job.label}: {_shape(outcome, job)}\nn={job.n}, content, {when}"
        panels.append({"x": x, "color": _color(job, len(x)), "title": title})
    return plotting.write_comparison_figure(path, panels, ncols=min(len(panels), 7)) if panels else None


def _series(path: Path, jobs: list[JobResult], key: str, ylabel: str) -> Path | None:
    curves = [(f"{j.label}, n={j.n}", j.figure.series["t"], j.figure.series[key])
              for j in jobs if key in j.figure.series]  # fmt: skip
    if not curves:
        return None
    title = f"{ylabel} over time (first seed, largest n)"
    return plotting.write_series_figure(path, curves, ylabel=ylabel, title=title)


def _metastability(path: Path, outcome: Outcome) -> Path | None:
    jobs = [j for j in outcome.jobs if "gauge_n_clusters" in j.figure.seed_series]
    if not jobs:
        return None
    # The size where most seeds are still clustered at the end: the staircase is most visible there.
    held = defaultdict(int)
    for j in jobs:
        held[j.n] += int(np.sum(j.figure.seed_series["gauge_n_clusters"][:, -1] >= 2))
    n = max(held, key=lambda size: (held[size], -size))
    jobs = [j for j in jobs if j.n == n]
    fig = Figure(figsize=(11.0, 4.0))
    FigureCanvasAgg(fig)
    # fixed margins (room for the tick and axis labels): the figure is drawn once, by savefig
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.13, top=0.91, wspace=0.22)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for c, job in enumerate(jobs):
        ts, beta = job.figure.series["t"], job.figure.beta
        counts, energies = job.figure.seed_series["gauge_n_clusters"], job.figure.seed_series["energy"]
        for b in range(len(job.seeds)):
            label = job.label if b == 0 else None
            style = {"color": f"C{c}", "linewidth": 0.9, "alpha": 0.8}
            left.plot(
                job.figure.series["gauge_n_clusters_t"],
                counts[b],
                drawstyle="steps-post",
                label=label,
                **style,
            )
            # The "rescaled" time scale (c = e^{−β}): time t e^β, energy E e^{−β}.
            right.plot(ts[1:] * np.exp(beta), energies[b, 1:] * np.exp(-beta), label=label, **style)
    left.set(xlabel="t (plain time)", ylabel="clusters in the gauge frame", yscale="log")
    right.set(xlabel="rescaled time t·e^β (log)", ylabel="energy, rescaled convention E·e^(−β)", xscale="log")
    # titles at a fixed height: no automatic placement (it measures every tick)
    left.set_title(f"E6, β = {jobs[0].figure.beta:g}, n = {n}: clusters per seed", y=1.0)
    right.set_title("energy staircase in rescaled time", y=1.0)
    for ax in (left, right):
        ax.grid(True, linewidth=0.3, alpha=0.5)
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=plotting.DPI, format="png")
    return path


def write_figures(out_dir: Path, outcome: Outcome) -> list[Path]:
    folder = out_dir / "figures"
    jobs = _figure_jobs(outcome)
    written = [
        _comparison(folder / "comparison.png", jobs),
        _final_states(folder / "final_states.png", jobs, outcome),
        _series(folder / "mean_cosine.png", jobs, "mean_cosine", "mean cosine"),
        _series(folder / "energy.png", jobs, "energy", "energy E"),
        _metastability(folder / "metastability.png", outcome),
    ]
    for job in jobs:
        if job.figure.target is not None:
            kind, target, realised = job.figure.target
            path = folder / f"realisation_{kind}.png"
            written.append(plotting.write_target_figure(path, target, realised, kind=kind))
    return [p for p in written if p is not None]


# --------------------------------------------------------------------------- report.md / .html


def _summary_rows(outcome: Outcome) -> list[list[str]]:
    table = []
    for experiment in outcome.experiments:
        rows = [r for r in outcome.rows if r["experiment"] == experiment.id]
        jobs = [j for j in outcome.jobs if j.experiment == experiment.id]
        sizes = sorted({j.n for j in jobs}) + (["some"] if any(r["n"] == "some" for r in rows) else [])
        for n in sizes:
            mine = [r for r in rows if r["n"] == n]
            wall = sum(j.timing.get("wall_s", 0.0) for j in jobs if j.n == n)
            passed = sum(r["status"] == "PASS" for r in mine)
            skipped = sum(r["status"] == "SKIP" for r in mine)
            counts = f"{passed}/{len(mine)}" + (f" ({skipped} skipped)" if skipped else "") if mine else "—"
            wall_text = f"{wall:.1f}" if n != "some" else "—"
            table.append([experiment.id, str(n), counts, wall_text, _status(mine) if mine else "—"])
    return table


SUMMARY_HEADER = ["experiment", "n", "passed/total", "wall time (s)", "status"]


def summary_table(outcome: Outcome) -> Table:
    """The end-of-run table: experiment, n, passed/total, wall time."""
    table = Table(title=f"attnflow reproduce ({outcome.wall_s:.0f} s)")
    for name in SUMMARY_HEADER:
        table.add_column(name)
    for row in _summary_rows(outcome):
        table.add_row(*row)
    return table


def failure_lines(outcome: Outcome) -> list[str]:
    return [
        f"FAIL {r['experiment']} {r['variant'] or ''} n={r['n']}: {r['text']} — measured "
        f"{measured_text(r)}, expected {bound_text(r)}".replace("  ", " ")
        for r in outcome.failures
    ]


def _value_table(outcome: Outcome, experiment) -> tuple[list[str], list[list[str]]]:
    """Median [min, max] over seeds of each metric an expectation names, per job and time."""
    named = [e.metric for e in experiment.expect] + [
        e.bound_metric for e in experiment.expect if e.bound_metric
    ]
    keys = list(dict.fromkeys([*named, *experiment.report_metrics]))
    labels = [time_label(t) for t in experiment.report_times if t > 0] + [time_label(None)]
    header = ["run", "n", "time", *keys]
    body = []
    for job in (j for j in outcome.jobs if j.experiment == experiment.id and j.values):
        aggregates, shown = _aggregates(job), []
        for label in labels:
            if label not in aggregates or any(aggregates[label] == aggregates[seen] for seen in shown):
                continue  # the final snapshot is usually also the last report time
            shown.append(label)
            cells = [_cell([seed.get(label, {}).get(key) for seed in job.values]) for key in keys]
            body.append([job.label, str(job.n), label, *cells])
    return header, body


def _cell(values: list) -> str:
    """``median [min, max]`` over seeds, or the distinct values (booleans), noting undefined ones."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    missing = sum(v is None for v in values)
    if not numbers:
        text = ", ".join(sorted({fmt(v) for v in values if v is not None}))
    else:
        arr = np.asarray(numbers, dtype=float)
        text = f"{np.median(arr):.3g} [{arr.min():.3g}, {arr.max():.3g}]"
    return text + (f" (n/a for {missing} seed{'s' if missing > 1 else ''})" if missing else "")


def _blocks(outcome: Outcome, figures: list[Path]) -> list[tuple[str, Any]]:
    """The report as a list of blocks: ("h1"/"h2"/"p", text), ("table", (header, rows)), ("img", path)."""
    counts = defaultdict(int)
    for row in outcome.rows:
        counts[row["status"]] += 1
    verdict = "all expectations pass" if not outcome.failures else f"{counts['FAIL']} expectation rows FAIL"
    blocks: list[tuple[str, Any]] = [
        ("h1", "attnflow reproduce — the paper's experiments"),
        ("p", f"attnflow {__version__}, backend {jax.default_backend()}, "
              f"{'--quick' if outcome.quick else 'full run'}, wall time {outcome.wall_s:.1f} s: "
              f"{verdict} ({counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP)."),
        ("h2", "Summary"),
        ("table", (SUMMARY_HEADER, _summary_rows(outcome))),
        ("h2", "Figures"),
    ]  # fmt: skip
    blocks += [("img", path) for path in figures]
    for experiment in outcome.experiments:
        blocks += [("h2", f"{experiment.id} — {experiment.title}"), ("p", experiment.setting)]
        for job in (j for j in outcome.jobs if j.experiment == experiment.id and j.status != "ok"):
            blocks.append(("p", f"{job.label} n={job.n}: {job.status} — {job.reason}"))
        rows = [r for r in outcome.rows if r["experiment"] == experiment.id]
        table = [[r["text"], r["variant"] or "", str(r["n"]), measured_text(r), bound_text(r), r["status"]]
                 for r in rows]  # fmt: skip
        blocks.append(("table", (["expectation", "variant", "n", "measured", "expected", "status"], table)))
        header, body = _value_table(outcome, experiment)
        if body:
            blocks += [("p", "Measured values, median [min, max] over seeds:"), ("table", (header, body))]
    parts = ("build_s", "compile_s", "run_s", "measure_s", "wall_s")
    timing = [[j.label, str(j.n), str(len(j.seeds)), *(f"{j.timing.get(k, 0.0):.2f}" for k in parts)]
              for j in outcome.jobs]  # fmt: skip
    header = ["run", "n", "seeds", "build", "compile", "run", "measure", "wall"]
    blocks += [("h2", "Timing (s)"), ("table", (header, timing))]
    return blocks


def _markdown(blocks: list[tuple[str, Any]], out_dir: Path) -> str:
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = []
    for kind, content in blocks:
        if kind == "h1":
            lines += [f"# {content}", ""]
        elif kind == "h2":
            lines += [f"## {content}", ""]
        elif kind == "p":
            lines += [content, ""]
        elif kind == "img":
            lines += [f"![{content.stem}]({content.relative_to(out_dir).as_posix()})", ""]
        else:
            header, rows = content
            lines.append("| " + " | ".join(cell(h) for h in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.PASS{color:#176f2c;font-weight:bold}td.FAIL{color:#b00020;font-weight:bold}
td.SKIP{color:#8a6d00}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}"""


def _html(blocks: list[tuple[str, Any]]) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>attnflow reproduce</title>", f"<style>{CSS}</style></head><body>"]  # fmt: skip
    for kind, content in blocks:
        if kind in ("h1", "h2"):
            parts.append(f"<{kind}>{esc(content)}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{esc(content)}</p>")
        elif kind == "img":
            data = base64.b64encode(content.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{esc(content.stem)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{esc(content.name)}</figcaption></figure>")  # fmt: skip
        else:
            header, rows = content
            parts.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
            for row in rows:
                cells = "".join(
                    f'<td class="{c}">{esc(c)}</td>'
                    if c in ("PASS", "FAIL", "SKIP")
                    else f"<td>{esc(c)}</td>"
                    for c in row
                )
                parts.append(f"<tr>{cells}</tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out_dir: Path, outcome: Outcome) -> list[Path]:
    """Write figures, ``results.json``, ``table.md`` (every expectation row), ``report.md`` and
    ``report.html`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = write_figures(out_dir, outcome)
    results = results_dict(outcome, figures)
    write_json(out_dir / "results.json", results, indent=1)
    table = write_table(out_dir, results)
    blocks = _blocks(outcome, figures)
    write_text(out_dir / "report.md", _markdown(blocks, out_dir))
    write_text(out_dir / "report.html", _html(blocks))
    return [out_dir / "results.json", table, out_dir / "report.md", out_dir / "report.html", *figures]
