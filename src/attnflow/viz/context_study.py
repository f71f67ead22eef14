"""Llama-3's RoPE against the context length (``workflows.context_study``), in four panels: the
final law's spread ``1 − |m|`` against n, with the typical spread of an orbit of a uniform ``u*``
(dotted, one curve per scaling); the final orbit residual against n; the collapse time against n
(of the content ``x`` for plain values, of the gauge frame ``u`` for rotated values, where each
collapses); and ``1 − mean cosine`` of that frame against t at the largest n. The colour is the
scaling, the line and marker the values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.figure_files import save_figure

__all__ = ["plot_context_study"]

COLOURS = {"none": "tab:blue", "preset": "tab:red"}
STYLES = {"plain": ("o", "-"), "rotated": ("s", "--")}
SCALING_NAMES = {"none": "no scaling", "preset": "llama3 scaling"}
FRAME = {"plain": ("collapse_x", "mean_cosine", "x"), "rotated": ("collapse_u", "gauge_mean_cosine", "u")}


def _line(ax, xs, ys, values: str, scaling: str, *, label: bool = True) -> None:
    marker, style = STYLES[values]
    name = f"{values}, {SCALING_NAMES[scaling]}" if label else None
    ax.plot(xs, ys, marker=marker, linestyle=style, color=COLOURS[scaling], label=name, markersize=4)


def plot_context_study(
    runs: Sequence, rows: Sequence[Mapping], typical: Mapping[str, Sequence], path: str | Path
) -> Path:
    """Write the figure (module docstring) at ``path``: ``runs`` are ``ContextRun`` records,
    ``rows`` the study's summary rows, ``typical[scaling]`` pairs ``(n, typical orbit spread)``."""
    fig = Figure(figsize=(12.5, 3.3), layout="constrained")
    FigureCanvasAgg(fig)
    spread, orbit, collapse, series = fig.subplots(1, 4)
    for values in STYLES:
        for scaling in COLOURS:
            mine = [row for row in rows if (row["values"], row["scaling"]) == (values, scaling)]
            if not mine:
                continue
            n = np.array([row["n"] for row in mine], dtype=float)
            _line(spread, n, [row["spread"] for row in mine], values, scaling)
            _line(orbit, n, [row["orbit_residual"] for row in mine], values, scaling, label=False)
            times = [row[FRAME[values][0]] for row in mine]
            times = [np.nan if t is None else t for t in times]
            _line(collapse, n, times, values, scaling, label=False)
    for scaling, curve in typical.items():
        if curve:
            n, value = np.asarray(curve, dtype=float).T
            spread.plot(n, value, ":", color=COLOURS[scaling], linewidth=1.2)
    largest = max((run.n for run in runs), default=None)
    for run in runs:
        if run.n == largest and run.seed == min(r.seed for r in runs if r.n == largest):
            _, key, frame = FRAME[run.values]
            gap = np.maximum(1.0 - np.asarray(getattr(run, key)), 1e-16)
            style = STYLES[run.values][1]
            name = f"{run.values}, {SCALING_NAMES[run.scaling]}: {frame}"
            series.semilogy(run.ts, gap, style, color=COLOURS[run.scaling], label=name)
    for ax in (spread, orbit, collapse):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length n")
    orbit.set_yscale("log")
    spread.set_title("final spread 1 − |m| (dotted: orbit of a uniform u*)", fontsize=9)
    orbit.set_title("final orbit residual max |x − Qᵀu*|", fontsize=9)
    collapse.set_title("collapse time (plain: of x; rotated: of u = Qx)", fontsize=9)
    series.set_title(f"n = {largest:,}: 1 − mean cosine" if largest else "", fontsize=9)
    series.set_xlabel("t")
    spread.legend(fontsize=7)
    if series.lines:
        series.legend(fontsize=7)
    return save_figure(fig, path)
