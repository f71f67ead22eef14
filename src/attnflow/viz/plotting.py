"""Figures of a run and of the reproduce report (matplotlib only, NumPy inputs).

Two layers:

- ``draw_*`` functions draw on an Axes the caller gives them (or, for ``draw_state``, one they add
  to a given Figure) and return that Axes: ``draw_sphere``, ``draw_projection`` and ``draw_state``
  (:mod:`attnflow.viz.sphere_panels`: points of ``S^2`` on a faint wireframe sphere, or of
  ``S^{d-1}``, ``d != 3``, on their two leading principal directions) and ``draw_series``
  (:mod:`attnflow.viz.series_panels`: a line over time).
- ``write_*`` functions assemble such panels into a figure and save it as a PNG (their spheres
  drawn flat, an orthographic view on a 2-D Axes, which costs a fraction of a 3-D Axes). Here:
  :func:`write_run_figures` (the ``figures/`` folder of a run), :func:`write_comparison_figure`
  and :func:`write_target_figure` (the reproduce and realise reports), built on the grid of state
  panels of :mod:`attnflow.viz.state_grid`; the series figures ``write_series_figure`` and
  ``write_series_panels`` are in :mod:`attnflow.viz.series_panels`. This module's ``__all__``
  names all of them, so ``attnflow.viz.plotting`` stays the one place to import a figure from.

Figures are built as :class:`matplotlib.figure.Figure` objects with an explicit Agg canvas
(matplotlib is imported when the first one is made, not with this module): no pyplot, no global
backend switch, nothing is displayed, and nothing stays registered after a ``write_*`` function
returns. Each figure is drawn once, by ``savefig``: grids of states, series panels and a run's
energy and collapse plots are placed in inches, with room sized for their titles, tick labels,
axis labels and colour bars (no layout pass); the figures whose text can be any length (one
series plot, the orbit histogram) use matplotlib's constrained layout. Whatever the placement, no
text overlaps another panel or leaves the figure, for any number of panels, ``d`` and ``n``
(``tests/test_figure_layout.py`` checks the bounding boxes from the renderer). Grids of states get
smaller panels than a run's own figure, and scatters are rasterised. Array names follow the rest
of attnflow: ``x (n, d)`` content positions, ``u (n, d)`` gauge frame, ``xs``/``us (T, n, d)``
snapshots, ``ts (T,)`` times.

Colour: a scatter coloured by values (the label ``ξ``, a position, a prompt id) uses the one colour
map of the label (:data:`attnflow.viz.colours.LABEL_CMAP`, also that of the movie and the viewer)
and gets a colour bar named by ``color_label``, so a reader knows what the colour is. Curves of
different runs on one Axes get distinct colours (:func:`curve_colours`: ``tab10``, then ``tab20``
past ten curves).

Vector output (:mod:`attnflow.viz.figure_files`, which makes and saves every figure): every
``write_*`` function writes a PNG (the reports embed it) and, on request, the same figure as SVG
and/or PDF next to it. Ask through ``formats=("png", "svg")`` on the write
functions, or for every figure of a process through the environment variable
``ATTNFLOW_FIGURE_FORMAT`` (a comma-separated list, e.g. ``ATTNFLOW_FIGURE_FORMAT=svg,pdf``); the
PNG is always written. The returned path is the PNG's.
"""

from __future__ import annotations

import difflib
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from attnflow.viz.figure_files import DPI, FORMAT_ENV, FORMATS, figure_formats, new_figure, save_figure
from attnflow.viz.series_panels import (
    _CHAR_INCHES_PER_POINT,
    _series,
    _times,
    curve_colours,
    draw_series,
    write_series_figure,
    write_series_panels,
)
from attnflow.viz.sphere_panels import _points, draw_projection, draw_sphere, draw_state
from attnflow.viz.state_grid import TITLE_INCHES, StateGrid

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    pass

__all__ = [
    "DPI",
    "FORMATS",
    "FORMAT_ENV",
    "curve_colours",
    "draw_projection",
    "draw_series",
    "draw_sphere",
    "draw_state",
    "figure_formats",
    "save_figure",
    "write_comparison_figure",
    "write_run_figures",
    "write_series_figure",
    "write_series_panels",
    "write_target_figure",
]

_PANEL_INCHES = 3.6  # a run's own states figure
_GRID_PANEL_INCHES = 2.4  # each panel of a grid of states (the reproduce report's comparisons)
_TARGET_KINDS = ("sphere", "orbit")
E_MAX_LABEL = "E_max (closed form)"

# The figures written by :func:`write_run_figures`, and the series keys each one reads.
_ENERGY_KEYS = ("energy",)
_COSINE_KEYS = ("mean_cosine", "gauge_mean_cosine")
_N_EFF_KEY = "n_eff"

# A run's energy and collapse plots: linear axes with short tick labels (energies, cosines, counts),
# so fixed margins in inches hold them (tests/test_figure_layout.py checks the boxes).
_RUN_PLOT_MARGINS = (0.85, 0.2, 0.55, 0.35)
_TWIN_PLOT_MARGINS = (0.85, 0.95, 0.55, 0.35)  # with the n_eff axis on the right


def _has_data(series: Mapping[str, Any], key: str) -> bool:
    if key not in series or series[key] is None:
        return False
    return bool(np.any(np.isfinite(np.asarray(series[key], dtype=float))))


def write_run_figures(
    out_dir: str | os.PathLike[str],
    *,
    ts: ArrayLike,
    xs: ArrayLike,
    us: ArrayLike | None,
    color: ArrayLike | None,
    series: Mapping[str, Any],
    color_label: str | None = "label ξ",
    title: str | None = None,
    energy_max: float | None = None,
    formats: Sequence[str] | None = None,
    states: bool = True,
) -> list[Path]:
    """Write the ``figures/`` PNGs of a run into ``out_dir`` (created if missing).

    - ``states.png``: the state at the first and last saved time, coloured by ``color (n,)``;
      top row the content frame (``xs[0]``, ``xs[-1]``), bottom row the gauge frame (``us[0]``,
      ``us[-1]``). Spheres for ``d = 3``, principal-plane projections otherwise. With
      ``us=None`` (no gauge) only the content row is drawn.
    - ``energy.png``: ``series["energy"]`` over ``ts``, with a dashed horizontal line at
      ``energy_max`` labelled "E_max (closed form)" when the theory gives one.
    - ``collapse.png``: ``series["mean_cosine"]`` and ``series["gauge_mean_cosine"]`` over
      ``ts``, with ``series["n_eff"]`` on a second y-axis when present.

    ``ts (T,)``, ``xs``/``us (T, n, d)``; ``series`` maps names to ``(T,)`` arrays aligned with
    ``ts`` (other keys, such as ``"t"``, are ignored). A missing key, or one whose values are all
    undefined (``None``/NaN), is skipped; a figure with nothing to draw is not written.
    ``color_label`` names the colour bar of the state panels (what ``color`` is: ``"label ξ"``,
    ``"position i"``, ``"prompt id"``); ``title`` (e.g. the config name and seed) heads every
    figure; ``formats`` as in :func:`figure_formats`; ``states=False`` leaves ``states.png`` out
    (a caller that draws it from other snapshots). Returns the PNG paths written, in the order
    above.
    """
    where = "write_run_figures"
    out = Path(out_dir)
    times = _times(ts, where)
    content = np.asarray(xs, dtype=float)
    if content.ndim != 3 or content.shape[0] != times.shape[0]:
        raise ValueError(
            f"{where}: `xs` must be a (T, n, d) array with T = len(ts) = {times.shape[0]}; "
            f"got shape {content.shape!r}."
        )
    gauge = None if us is None else np.asarray(us, dtype=float)
    if gauge is not None and gauge.shape != content.shape:
        raise ValueError(
            f"{where}: `us` must be None or have the shape of `xs` {content.shape!r}; "
            f"got shape {gauge.shape!r}."
        )
    for key in (*_ENERGY_KEYS, *_COSINE_KEYS, _N_EFF_KEY):
        if _has_data(series, key):
            _series(series[key], times.shape[0], where, f"series[{key!r}]")

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    t0, t1 = times[0], times[-1]
    head = "" if title is None else f"{title}: "
    bar = None if color is None else color_label

    rows = [("content", content)] + ([] if gauge is None else [("gauge frame", gauge)])
    if states:
        # one colour key per row, right of the last state (both panels of a row share the labels)
        grid = StateGrid(len(rows), 2, _PANEL_INCHES, bar_columns={1} if bar is not None else False)
        for r, (frame, snapshots) in enumerate(rows):
            for c, (k, t) in enumerate(((0, t0), (-1, t1))):
                panel = f"{head if r == c == 0 else ''}{frame}, t = {t:g}"
                key = bar if c == 1 else None
                grid.draw(2 * r + c, snapshots[k], color=color, title=panel, color_label=key)
        written.append(grid.save(out / "states.png", formats))

    if _has_data(series, "energy"):
        fig = new_figure(5.5, 3.6, margins=_RUN_PLOT_MARGINS)
        ax = draw_series(fig.add_subplot(1, 1, 1), times, series["energy"], ylabel="energy E", label="E(t)")
        if energy_max is not None and math.isfinite(energy_max):
            ax.axhline(energy_max, color="0.3", linestyle="--", linewidth=1.0, label=E_MAX_LABEL)
            ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{head}energy", fontsize=10, y=1.0)
        written.append(save_figure(fig, out / "energy.png", formats))

    cosines = [key for key in _COSINE_KEYS if _has_data(series, key)]
    has_n_eff = _has_data(series, _N_EFF_KEY)
    if cosines or has_n_eff:
        fig = new_figure(5.5, 3.6, margins=_TWIN_PLOT_MARGINS if has_n_eff else _RUN_PLOT_MARGINS)
        ax = fig.add_subplot(1, 1, 1)
        for key in cosines:
            draw_series(ax, times, series[key], label=key, ylabel="mean cosine")
        axes = [ax]
        if has_n_eff:
            ax_n = ax.twinx() if cosines else ax
            n_eff = _series(series[_N_EFF_KEY], times.shape[0], where, "series['n_eff']")
            ax_n.plot(
                times,
                n_eff,
                color="0.35",
                linestyle="--",
                linewidth=1.0,
                drawstyle="steps-post",
                label="n_eff",
            )
            ax_n.set_ylabel("n_eff")
            ax.set_xlabel("t")
            if ax_n is not ax:
                axes.append(ax_n)
        handles, labels = [], []
        for a in axes:
            h, lab = a.get_legend_handles_labels()
            handles, labels = handles + h, labels + lab
        ax.legend(handles, labels, fontsize=8, loc="best")
        ax.set_title(f"{head}collapse", fontsize=10, y=1.0)
        written.append(save_figure(fig, out / "collapse.png", formats))
    return written


def write_comparison_figure(
    path: str | os.PathLike[str],
    panels: Sequence[Mapping[str, Any]],
    *,
    ncols: int | None = None,
    formats: Sequence[str] | None = None,
) -> Path:
    """Draw several states side by side and save the PNG at ``path`` (parents created).

    ``panels`` is a list of dicts ``{"x": (n, d) array, "color": (n,) array or None, "title":
    str, "color_label": str}`` (all but ``x`` may be omitted), or None for an empty cell; each is drawn with
    :func:`draw_state`, with a colour bar named ``color_label`` when it and ``color`` are given
    (once per name and range of colours: a later panel of the same is keyed by the first's).
    ``ncols`` defaults to ``len(panels)`` (one row); a smaller value wraps onto more rows.
    ``formats`` as in :func:`figure_formats`. Returns ``Path(path)``.
    """
    where = "write_comparison_figure"
    if len(panels) == 0:
        raise ValueError(f"{where}: `panels` must hold at least one panel; got {list(panels)!r}.")
    for i, panel in enumerate(panels):
        if panel is not None and (not isinstance(panel, Mapping) or "x" not in panel):
            raise ValueError(f"{where}: `panels[{i}]` must be a dict with key 'x' or None; got {panel!r}.")
    if all(panel is None for panel in panels):
        raise ValueError(
            f"{where}: `panels` must hold at least one panel that is not None; got {list(panels)!r}."
        )
    cols = len(panels) if ncols is None else ncols
    if isinstance(cols, bool) or not isinstance(cols, int) or cols < 1:
        raise ValueError(f"{where}: `ncols` must be None or a positive int; got {ncols!r}.")
    cols = min(cols, len(panels))
    nrows = math.ceil(len(panels) / cols)
    labels = _distinct_keys(panels)
    bars = {i % cols for i, label in enumerate(labels) if label is not None}
    size = 8  # small panels: titles of about 36 characters a line fit
    titles = [None if p is None else _wrapped(p.get("title"), _GRID_PANEL_INCHES, size) for p in panels]
    lines = max((title.count("\n") + 1 for title in titles if title), default=0)
    room = max(TITLE_INCHES, 0.08 + lines * size * 1.4 / 72)  # a third line of title: a taller row
    grid = StateGrid(nrows, cols, _GRID_PANEL_INCHES, bar_columns=bars, title_room=room)
    for i, panel in enumerate(panels):
        if panel is None:  # an empty cell
            continue
        grid.draw(
            i, panel["x"], color=panel.get("color"), title=titles[i], color_label=labels[i], title_size=size
        )
    return grid.save(Path(path), formats)


def _wrapped(title: str | None, width: float, size: float) -> str | None:
    """``title`` with each of its lines wrapped between words to fit ``width`` inches at ``size``
    points, with room to spare: titles centred on neighbouring panels never meet. A wrapped line
    is cut after its first colon when the part before it fits ("E15 (h) RoPE, nGPT, alpha = 2:" /
    "Dirac (in the gauge frame)": the run, then its shape), and into pieces of even length
    ("E10 (a) random W_Q," / "W_K, n=32, seed 0", not a "0" alone on the second line)."""
    if not title:
        return title
    chars = max(int((width - 0.15) / (_CHAR_INCHES_PER_POINT * size)), 12)

    def wrap(line: str, width: int) -> list[str]:
        return textwrap.wrap(line, width=width, break_long_words=False, break_on_hyphens=False) or [line]

    lines = []
    for whole in title.split("\n"):
        head, colon, rest = whole.partition(": ")
        parts = [head + ":", rest] if len(whole) > chars and colon and len(head) + 1 <= chars else [whole]
        for line in parts:
            count = len(wrap(line, chars))
            shortest = -(-len(line) // count)  # the narrowest width that could give as few pieces
            lines += next(wrap(line, w) for w in range(shortest, chars + 1) if len(wrap(line, w)) <= count)
    return "\n".join(lines)


def _distinct_keys(panels: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """Each panel's ``color_label``, or None where an earlier panel already keys the same name
    over the same range of colours: one key per kind of colour in a figure, not one per row."""
    seen, labels = set(), []
    for panel in panels:
        label, color = (None, None) if panel is None else (panel.get("color_label"), panel.get("color"))
        if label is None or color is None:
            labels.append(None)
            continue
        values = np.asarray(color, dtype=float)
        finite = values[np.isfinite(values)]
        key = (label, float(finite.min()), float(finite.max())) if finite.size else (label, 0.0, 0.0)
        labels.append(None if key in seen else label)
        seen.add(key)
    return labels


def write_target_figure(
    path: str | os.PathLike[str],
    target: ArrayLike,
    realised: ArrayLike,
    *,
    kind: str,
    density: tuple[ArrayLike, ArrayLike] | None = None,
    formats: Sequence[str] | None = None,
) -> Path:
    """Compare a realisation target with what the dynamics realised; save the PNG at ``path``.

    - ``kind="sphere"``: ``target`` and ``realised`` are ``(n, d)`` points, drawn in two panels
      (spheres for ``d = 3``, projections otherwise). When both have the same ``n`` they are
      coloured by token index, so the point ``x_i`` can be matched to its target ``g(xi_i)``.
    - ``kind="orbit"``: ``target`` and ``realised`` are ``(n,)`` angles, reduced to ``[0, 2π)``
      and drawn as overlaid density histograms; with ``density = (angles, pdf)`` (the target
      law's density on a grid of ``[0, 2π)``) that curve is drawn over them, labelled
      "target density".

    ``formats`` as in :func:`figure_formats`. Returns ``Path(path)``.
    """
    where = "write_target_figure"
    if kind not in _TARGET_KINDS:
        close = difflib.get_close_matches(str(kind), _TARGET_KINDS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{where}: `kind` must be one of {_TARGET_KINDS!r}; got {kind!r}.{hint}")

    if kind == "sphere":
        tgt = _points(target, where, "target")
        got = _points(realised, where, "realised")
        if tgt.shape[1] != got.shape[1]:
            raise ValueError(
                f"{where}: `target` and `realised` must have the same d; "
                f"got shapes {tgt.shape!r} and {got.shape!r}."
            )
        same_n = tgt.shape[0] == got.shape[0]
        index = np.arange(tgt.shape[0], dtype=float) if same_n else None
        bar = None if index is None else "token index i"
        grid = StateGrid(1, 2, _PANEL_INCHES, bar_columns={1} if bar is not None else False)
        grid.draw(0, tgt, color=index, title=f"target (n = {tgt.shape[0]})", color_label=None)
        grid.draw(1, got, color=index, title=f"realised (n = {got.shape[0]})", color_label=bar)
        return grid.save(Path(path), formats)

    angles = []
    for name, values in (("target", target), ("realised", realised)):
        arr = np.asarray(values, dtype=float)
        if arr.ndim != 1 or arr.shape[0] == 0:
            raise ValueError(
                f"{where}: `{name}` must be a non-empty (n,) array of angles; got shape {arr.shape!r}."
            )
        angles.append(np.mod(arr, 2.0 * np.pi))
    n_max = max(a.shape[0] for a in angles)
    bins = np.linspace(0.0, 2.0 * np.pi, int(np.clip(np.sqrt(n_max) * 2, 12, 72)) + 1)
    # fixed margins (no layout pass): short tick labels (π/2, densities), as a run's energy plot
    fig = new_figure(5.5, 3.6, margins=_RUN_PLOT_MARGINS)
    ax = fig.add_subplot(1, 1, 1)
    # each histogram as one artist (``hist`` makes a patch per bar): what hist(density=True) shows
    for values, style in (
        (angles[0], {"fill": True, "alpha": 0.45, "color": "C0", "label": "target"}),
        (angles[1], {"linewidth": 1.5, "color": "C3", "label": "realised"}),
    ):
        heights, _ = np.histogram(values, bins=bins, density=True)
        ax.stairs(heights, bins, baseline=0.0, **style)
    if density is not None:
        grid, pdf = (np.asarray(a, dtype=float) for a in density)
        if grid.ndim != 1 or grid.shape != pdf.shape or grid.shape[0] < 2:
            raise ValueError(
                f"{where}: `density` must be a pair (angles, pdf) of equal (m,) arrays, m >= 2; "
                f"got shapes {grid.shape!r} and {pdf.shape!r}."
            )
        ax.plot(grid, pdf, color="black", linewidth=1.3, label="target density")
    ax.set_xlim(0.0, 2.0 * np.pi)
    ax.set_xticks(np.linspace(0.0, 2.0 * np.pi, 5), ["0", "π/2", "π", "3π/2", "2π"])
    ax.set_xlabel("angle")
    ax.set_ylabel("density")
    ax.legend(fontsize=8, loc="best")
    ax.set_title("orbit: target vs realised angles", fontsize=10, y=1.0)
    return save_figure(fig, Path(path), formats)
