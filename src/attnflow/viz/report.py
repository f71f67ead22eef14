"""The reproduce report: ``results.json``, ``report.md``, a self-contained ``report.html``, figures.

:func:`write_report` takes the :class:`~attnflow.io.outcomes.Outcome` of a run and writes, into
``out_dir``:

- ``results.json``: for every experiment, variant, n and seed the measured values (at the end and
  at each report time), per-job timings, aggregates over seeds (min / median / max), and every
  expectation row with its measured value and PASS / FAIL / SKIP;
- ``figures/``: ``E0.png``, ``E1.png``, ... (per experiment: each variant's first seed at the
  largest n: the content at τ = 0 and at the experiment's own horizon, the gauge frame at that
  horizon, coloured by the label with a named colour key), ``final_states.png`` (the content at
  the end of each run: collapse, latitude circle, wavy curve, clusters, great circle at a glance),
  ``mean_cosine.png`` and ``energy.png`` (one panel per experiment, each to its own horizon,
  distinct colours, at most five ticks per axis; the energy as the relative gap
  ``(E_max − E)/E_max`` on a log axis where the closed-form maximum ``E_max`` is known),
  ``metastability.png`` (E6: clusters in the gauge frame over time, energy against the rescaled
  time ``t e^β``), ``realisation_orbit.png`` / ``realisation_sphere.png`` (E7 / E8);
- ``report.md`` (figures linked) and ``report.html`` (the same content, self-contained: figures
  embedded as palette-compressed base64 PNG, inline CSS, no script: opens offline). Both start
  with a table of contents and hold one section per experiment: its setting, why it matters
  (:data:`attnflow.viz.why.WHY`), its figures, its expectation rows and its measured values.
  Each figure is also written as SVG/PDF when asked (:func:`attnflow.viz.plotting.figure_formats`).

The pages are rendered from a list of blocks by :mod:`attnflow.viz.report_page`.
:func:`summary_table` and :func:`failure_lines` are what the command line prints.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
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
from attnflow.viz.report_page import html_page, markdown_page
from attnflow.viz.series_panels import _power_of_ten
from attnflow.viz.why import WHY

NOT_MEASURED = "not measured"
"""The text of a report cell whose quantity was not measured (never a misleading 0.00)."""

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


def _color_label(outcome: Outcome, job: JobResult, n: int) -> str:
    """What the colour of ``job``'s scatters is (the name of the colour bar)."""
    color = job.figure.color
    if color is None or len(color) != n:
        return "token index i"
    experiment = next(e for e in outcome.experiments if e.id == job.experiment)
    aux = (experiment.config or {}).get("aux", {})
    return {"positions": "position i", "prompts": "prompt id"}.get(aux.get("kind"), "label ξ")


def _horizon(job: JobResult) -> str:
    t = job.figure.series.get("t")
    return f"{float(t[-1]):g}" if t is not None and len(t) else "end"


def _state_panels(
    outcome: Outcome, job: JobResult, *, start_shown: bool = False
) -> list[dict[str, Any] | None]:
    """One row for ``job``: the content at τ = 0 and at the run's own horizon, and the gauge frame
    at that horizon (at τ = 0 it is the same uniform cloud as the content, turned by the labels:
    nothing a reader needs, a panel fewer to draw). ``start_shown``: an earlier row shows this
    very initial state (variants of one experiment usually share it); its cell is left empty."""
    start, end = time_label(0.0), time_label(None)
    if not all(label in job.figure.states for label in (start, end)):
        return []
    seed = job.seeds[0] if job.seeds else 0
    panels: list[dict[str, Any] | None] = [None] if start_shown else []
    shown_at = (("content", start, "0"), ("content", end, _horizon(job)), ("gauge frame", end, _horizon(job)))
    for frame, label, when in shown_at[1:] if start_shown else shown_at:
        last = frame == "gauge frame"  # one colour bar per row, on its right
        x, u = job.figure.states[label]
        shown, note = (x, "") if frame == "content" else (u, "") if u is not None else (x, " (Q = I)")
        if frame == "gauge frame" and u is None and job.figure.target is not None:
            note = " (n/a: content)"
        # the run is named once, over the first panel of its row (fewer glyphs to lay out and draw)
        head = f"{job.label}, n={job.n}, seed {seed}\n" if not any(panels) else ""
        title = f"{head}{frame}{note}, τ = {when}"
        bar = _color_label(outcome, job, len(x)) if last else None
        panels.append({"x": shown, "color": _color(job, len(x)), "title": title, "color_label": bar})
    return panels


def _experiment_states(path: Path, outcome: Outcome, jobs: list[JobResult]) -> Path | None:
    """The rows of ``jobs`` (:func:`_state_panels`), an initial state drawn once for the rows that
    start from it."""
    panels, starts = [], []
    for job in jobs:
        start = job.figure.states.get(time_label(0.0))
        x0 = None if start is None else np.asarray(start[0])
        seen = x0 is not None and any(x0.shape == s.shape and np.array_equal(x0, s) for s in starts)
        panels += _state_panels(outcome, job, start_shown=seen)
        if x0 is not None and not seen:
            starts.append(x0)
    if not any(panels):
        return None
    return plotting.write_comparison_figure(path, panels, ncols=3)


def _final_states(path: Path, jobs: list[JobResult], outcome: Outcome) -> Path | None:
    panels = []
    for job in jobs:
        x, _ = job.figure.states[time_label(None)]
        title = f"{job.label}: {_shape(outcome, job)}\nn={job.n}, content, τ = {_horizon(job)}"
        color = _color(job, len(x))
        bar = _color_label(outcome, job, len(x)) if np.ptp(color) > 0 else None  # one per range of labels
        panels.append({"x": x, "color": color, "title": title, "color_label": bar})
    return plotting.write_comparison_figure(path, panels, ncols=min(len(panels), 7)) if panels else None


def _energy_max(job: JobResult) -> float | None:
    e_max = job.values[0].get(time_label(None), {}).get("energy_max") if job.values else None
    return float(e_max) if isinstance(e_max, int | float) and e_max > 0 else None


def _series_panels(path: Path, outcome: Outcome, jobs: list[JobResult], key: str) -> Path | None:
    """One panel per experiment (to its own horizon). For ``key = "energy"`` the relative gap
    ``(E_max − E)/E_max`` on a log axis when every run of the experiment knows ``E_max``."""
    groups, logy, ylabels = [], [], []
    for experiment in outcome.experiments:
        mine = [j for j in jobs if j.experiment == experiment.id and key in j.figure.series]
        if not mine:
            continue
        gap = key == "energy" and all(_energy_max(j) is not None for j in mine)
        curves = []
        for j in mine:
            values = np.asarray(j.figure.series[key], dtype=float)
            if gap:
                e_max = _energy_max(j)
                values = (e_max - values) / e_max
            curves.append((f"{j.label}, n={j.n}", j.figure.series["t"], values))
        name = {"energy": "(E_max − E)/E_max" if gap else "energy E", "mean_cosine": "mean cosine"}[key]
        groups.append((f"{experiment.id}: {name}", curves))
        logy.append(gap)
        ylabels.append(name)
    if not groups:
        return None
    return plotting.write_series_panels(path, groups, ylabel=ylabels, logy=logy, ncols=4)


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
    # placed in inches (no layout pass): room left of each panel for its tick labels and y label,
    # below for the x label, above for the title (tests/test_report.py checks the boxes)
    fig = Figure(figsize=(11.0, 4.0))
    FigureCanvasAgg(fig)
    left = fig.add_axes((0.85 / 11, 0.6 / 4, 4.45 / 11, 2.95 / 4))
    right = fig.add_axes((6.35 / 11, 0.6 / 4, 4.45 / 11, 2.95 / 4))
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
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    for ax in (left, right):
        ax.grid(True, linewidth=0.4, color="0.88")  # opaque: it survives the palette of the PNG
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":  # decades only: minor ticks cost more than they tell
                axis.set_major_locator(LogLocator(base=10.0, numticks=6))
                axis.set_minor_locator(NullLocator())
                # "10¹" in plain text: matplotlib's default label is mathtext, whose parser (built
                # on its first use in a process) cost more than the rest of this figure
                axis.set_major_formatter(FuncFormatter(_power_of_ten))
        ax.legend(fontsize=8)
    return plotting.save_figure(fig, path)


def write_figures(out_dir: Path, outcome: Outcome) -> dict[str, list[Path]]:
    """Draw the report's figures; returns them by section: ``"overview"``, ``"files"`` (written,
    linked, not embedded) and one key per experiment id."""
    folder = out_dir / "figures"
    jobs = _figure_jobs(outcome)
    figures: dict[str, list[Path | None]] = {
        "overview": [
            _final_states(folder / "final_states.png", jobs, outcome),
            _series_panels(folder / "mean_cosine.png", outcome, jobs, "mean_cosine"),
            _series_panels(folder / "energy.png", outcome, jobs, "energy"),
        ],
    }
    for experiment in outcome.experiments:
        mine = [j for j in jobs if j.experiment == experiment.id]
        figures[experiment.id] = [_experiment_states(folder / f"{experiment.id}.png", outcome, mine)]
    figures["files"] = []  # written, linked, not embedded: none today (each E*.png is embedded)
    meta = _metastability(folder / "metastability.png", outcome)
    if meta is not None:
        experiment_id = next(j.experiment for j in outcome.jobs if "gauge_n_clusters" in j.figure.seed_series)
        figures.setdefault(experiment_id, []).append(meta)
    for job in jobs:
        if job.figure.target is not None:
            kind, target, realised = job.figure.target
            path = folder / f"realisation_{kind}.png"
            figures.setdefault(job.experiment, []).append(
                plotting.write_target_figure(path, target, realised, kind=kind, density=job.figure.density)
            )
    return {key: [p for p in paths if p is not None] for key, paths in figures.items()}


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
            if not mine:  # runs at this size, judged only at another: not a missing result
                counts = "none at this n"
            # an expectation on some size (any n of the experiment): its runs are timed in the rows above
            wall_text = f"{wall:.1f}" if n != "some" else "(rows above)"
            size = "any n" if n == "some" else str(n)
            table.append([experiment.id, size, counts, wall_text, _status(mine) if mine else "ran"])
    return table


SUMMARY_HEADER = ["experiment", "n", "passed/total", "wall time (s)", "status"]


def summary_table(outcome: Outcome) -> Table:
    """The end-of-run table: experiment, n, passed/total, wall time."""
    table = Table(title=f"attnflow reproduce (wall time {outcome.wall_s:.1f} s)")
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
    """Median [min, max] over seeds of each metric an expectation names, per job and time.

    A column equal to an earlier one in every row is not repeated: the earlier column's header
    names both (``circular_ks = distance_reported``)."""
    named = [e.metric for e in experiment.expect] + [
        e.bound_metric for e in experiment.expect if e.bound_metric
    ]
    keys = list(dict.fromkeys([*named, *experiment.report_metrics]))
    labels = [time_label(t) for t in experiment.report_times if t > 0] + [time_label(None)]
    body = []
    for job in (j for j in outcome.jobs if j.experiment == experiment.id and j.values):
        aggregates, shown = _aggregates(job), []
        for label in labels:
            if label not in aggregates or any(aggregates[label] == aggregates[seen] for seen in shown):
                continue  # the final snapshot is usually also the last report time
            shown.append(label)
            cells = [_cell([seed.get(label, {}).get(key) for seed in job.values]) for key in keys]
            body.append([job.label, str(job.n), label, *cells])
    columns: list[tuple[str, list[str]]] = []
    for k, key in enumerate(keys):
        column = [row[3 + k] for row in body]
        same = next((c for c in columns if c[1] == column), None)
        if same is None:
            columns.append((key, column))
        else:
            columns[columns.index(same)] = (f"{same[0]} = {key}", column)
    header = ["run", "n", "time", *(name for name, _ in columns)]
    rows = [[*row[:3], *(column[r] for _, column in columns)] for r, row in enumerate(body)]
    return header, rows


def _cell(values: list) -> str:
    """``median [min, max]`` over seeds (one value when they agree), the distinct values
    (booleans), or "not measured"; undefined seeds are noted."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    missing = sum(v is None for v in values)
    if not numbers:
        texts = sorted({fmt(v) for v in values if v is not None})
        if not texts:
            return NOT_MEASURED
        text = ", ".join(texts)
    else:
        arr = np.asarray(numbers, dtype=float)
        low, mid, high = (f"{v:.3g}" for v in (arr.min(), np.median(arr), arr.max()))
        text = mid if low == high else f"{mid} [{low}, {high}]"
    return text + (f" (n/a for {missing} seed{'s' if missing > 1 else ''})" if missing else "")


def measured_cell(row: dict[str, Any]) -> str:
    """The measured value of an expectation row in words: a bound checked on every seed reads
    "worst seed: circular_ks − ks_bound = 1.1e-09" rather than "max(value − ks_bound) = ..."."""
    text = measured_text(row)
    metric = row.get("metric") or "value"
    if row.get("scope") == "every seed" and row.get("op") == "~=":
        return re.sub(r"^max \|value − ", f"worst seed: |{metric} − ", text)
    return re.sub(r"^max\(value − ([^)]*)\) = ", rf"worst seed: {metric} − \1 = ", text)


def _anchor(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "section"


def _timing_cell(timing: dict[str, float], key: str) -> str:
    value = timing.get(key)
    return NOT_MEASURED if value is None else f"{value:.2f}"


def _blocks(outcome: Outcome, figures: dict[str, list[Path]]) -> list[tuple[str, Any]]:
    """The report as a list of blocks: ("h1"/"p"/"why", text), ("h2"/"h3", (anchor, text)),
    ("toc", [(anchor, text)]), ("table", (header, rows)), ("img", path), ("link", path)."""
    counts = defaultdict(int)
    for row in outcome.rows:
        counts[row["status"]] += 1
    verdict = "all expectations pass" if not outcome.failures else f"{counts['FAIL']} expectation rows FAIL"
    sections = [("summary", "Summary"), ("overview", "Overview figures")]
    sections += [(_anchor(e.id), f"{e.id} — {e.title}") for e in outcome.experiments]
    sections += [("timing", "Timing (s)")]
    blocks: list[tuple[str, Any]] = [
        ("h1", "attnflow reproduce — the paper's experiments"),
        ("p", f"attnflow {__version__}, backend {jax.default_backend()}, "
              f"{'--quick' if outcome.quick else 'full run'}, wall time {outcome.wall_s:.1f} s: "
              f"{verdict} ({counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP)."),
        ("toc", sections),
        ("h2", sections[0]),
        ("table", (SUMMARY_HEADER, _summary_rows(outcome))),
        ("h2", sections[1]),
    ]  # fmt: skip
    blocks += [("img", path) for path in figures.get("overview", [])]
    blocks += [("link", path) for path in figures.get("files", [])]
    for experiment, section in zip(outcome.experiments, sections[2:-1], strict=True):
        blocks += [("h2", section), ("p", f"Setting: {experiment.setting}.")]
        if experiment.shape:
            blocks.append(("p", f"Expected shape: {experiment.shape}."))
        if experiment.id in WHY:
            blocks.append(("why", WHY[experiment.id]))
        for job in (j for j in outcome.jobs if j.experiment == experiment.id and j.status != "ok"):
            blocks.append(("p", f"{job.label} n={job.n}: {job.status} — {job.reason}"))
        blocks += [("img", path) for path in figures.get(experiment.id, [])]
        rows = [r for r in outcome.rows if r["experiment"] == experiment.id]
        variants = any(r["variant"] for r in rows)
        header = ["expectation", *(["variant"] if variants else []), "n", "measured", "expected", "status"]
        table = [[r["text"], *([r["variant"] or ""] if variants else []), str(r["n"]), measured_cell(r),
                  bound_text(r), r["status"]] for r in rows]  # fmt: skip
        blocks.append(("table", (header, table)))
        header, body = _value_table(outcome, experiment)
        if body:
            blocks += [("p", "Measured values, median [min, max] over seeds:"), ("table", (header, body))]
    parts = ("build_s", "compile_s", "run_s", "measure_s", "wall_s")
    timing = [[j.label, str(j.n), str(len(j.seeds)), *(_timing_cell(j.timing, k) for k in parts)]
              for j in outcome.jobs]  # fmt: skip
    header = ["run", "n", "seeds", "build", "compile", "run", "measure", "wall"]
    blocks += [("h2", sections[-1]), ("p", "A compile time of 0.00 s: the compiled program was reused."),
               ("table", (header, timing))]  # fmt: skip
    return blocks


def write_report(out_dir: Path, outcome: Outcome, *, clock: Callable[[], float] | None = None) -> list[Path]:
    """Write figures, ``results.json``, ``table.md`` (every expectation row), ``report.md`` and
    ``report.html`` into ``out_dir``.

    ``clock()``: the run's wall time so far, read once the figures are drawn, into
    ``outcome.wall_s``: the one duration that results.json, table.md, the report and the console
    table then show (the run from its start to its report, drawing included)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_section = write_figures(out_dir, outcome)
    if clock is not None:
        outcome.wall_s = float(clock())
    embedded = [p for key, paths in by_section.items() if key != "files" for p in paths]
    results = results_dict(outcome, embedded)
    write_json(out_dir / "results.json", results, indent=1)
    table = write_table(out_dir, results)
    blocks = _blocks(outcome, by_section)
    write_text(out_dir / "report.md", markdown_page(blocks, out_dir))
    write_text(out_dir / "report.html", html_page(blocks, out_dir))
    files = by_section.get("files", [])
    return [
        out_dir / "results.json",
        table,
        out_dir / "report.md",
        out_dir / "report.html",
        *embedded,
        *files,
    ]
