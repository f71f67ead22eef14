"""Lines over time: :func:`draw_series` (one line on a given Axes), :func:`write_series_figure`
(several runs' series on one Axes) and :func:`write_series_panels` (a grid of series panels, one
Axes each, placed in inches with room for their ticks and titles: no layout pass), with few
ticks and decades in plain text (no math-text parser); :func:`curve_colours` for curves of
different runs on one Axes (``tab10``, then ``tab20`` past ten curves)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from attnflow.viz.figure_files import new_figure, save_figure

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    from matplotlib.axes import Axes

__all__ = ["curve_colours", "draw_series", "write_series_figure", "write_series_panels"]

_SERIES_CELL_MARGINS = (0.85, 0.12, 0.5, 0.3)  # left, right, bottom, top of a series panel, inches
# The widest advance per character of the report's panel titles (DejaVu Sans, mixed text: 0.062 in
# at 8 pt), per point of font size.
_CHAR_INCHES_PER_POINT = 0.0625 / 8


def _series(values: Any, n_times: int, where: str, name: str) -> np.ndarray:
    # ``None`` entries (JSON ``null``: undefined at that snapshot) become NaN and are not drawn.
    arr = np.asarray(values, dtype=float)
    if arr.shape != (n_times,):
        raise ValueError(
            f"{where}: `{name}` must be a (T,) array aligned with `ts` (T = {n_times}); "
            f"got shape {arr.shape!r}."
        )
    return arr


def _times(ts: ArrayLike, where: str) -> np.ndarray:
    arr = np.asarray(ts, dtype=float)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"{where}: `ts` must be a non-empty (T,) array of times; got shape {arr.shape!r}.")
    return arr


def draw_series(
    ax: Axes,
    ts: ArrayLike,
    values: ArrayLike,
    *,
    label: str | None = None,
    ylabel: str | None = None,
    logy: bool = False,
    color: Any = None,
) -> Axes:
    """Draw ``values (T,)`` against ``ts (T,)`` as a line; NaN entries leave gaps.

    ``logy`` puts the y-axis on a log scale (non-positive values are then not drawn); ``color``
    is any matplotlib colour (None: the Axes' next colour). Returns ``ax``.
    """
    where = "draw_series"
    times = _times(ts, where)
    ys = _series(values, times.shape[0], where, "values")
    ax.plot(times, ys, label=label, linewidth=1.2, color=color)
    ax.set_xlabel("t")
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    return ax


def curve_colours(count: int) -> list[Any]:
    """``count`` distinct colours for curves on one Axes: ``tab10``, or ``tab20`` past ten."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]


def write_series_figure(
    path: str | os.PathLike[str],
    curves: Sequence[tuple[str, ArrayLike, ArrayLike]],
    *,
    ylabel: str,
    logy: bool = False,
    title: str | None = None,
    formats: Sequence[str] | None = None,
) -> Path:
    """Draw several curves ``(label, ts, values)`` on one Axes and save the PNG at ``path``.

    Each curve may have its own times, and the x-axis ends at the latest of them. Every curve
    has its own colour (:func:`curve_colours`). ``logy`` as in :func:`draw_series`; ``formats``
    as in :func:`figure_formats`. Returns ``Path(path)``.
    """
    where = "write_series_figure"
    if len(curves) == 0:
        raise ValueError(
            f"{where}: `curves` must hold at least one (label, ts, values) triple; got {list(curves)!r}."
        )
    fig = new_figure(5.5, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    colours = curve_colours(len(curves))
    for i, curve in enumerate(curves):
        if len(curve) != 3:
            raise ValueError(f"{where}: `curves[{i}]` must be a (label, ts, values) triple; got {curve!r}.")
        label, ts, values = curve
        draw_series(ax, ts, values, label=label, ylabel=ylabel, logy=logy, color=colours[i])
    if any(curve[0] for curve in curves):
        ax.legend(fontsize=7 if len(curves) > 8 else 8, loc="best", ncols=2 if len(curves) > 8 else 1)
    if title is not None:
        ax.set_title(title, fontsize=10, y=1.0)
    return save_figure(fig, Path(path), formats)


def write_series_panels(
    path: str | os.PathLike[str],
    groups: Sequence[tuple[str, Sequence[tuple[str, ArrayLike, ArrayLike]]]],
    *,
    ylabel: str | Sequence[str],
    logy: bool | Sequence[bool] = False,
    ncols: int = 4,
    formats: Sequence[str] | None = None,
) -> Path:
    """One panel per group ``(title, curves)``, each curve ``(label, ts, values)``; save the PNG.

    Each panel's x-axis ends at its own curves' last time (an experiment judged at τ = 100 and
    one judged at τ = 20 each fill their panel). Curves of a panel have distinct colours
    (:func:`curve_colours`). ``ylabel`` and ``logy`` (as in :func:`draw_series`) are one value
    for every panel or one per group; ``formats`` as in :func:`figure_formats`. Returns
    ``Path(path)``.
    """
    where = "write_series_panels"
    if len(groups) == 0:
        raise ValueError(
            f"{where}: `groups` must hold at least one (title, curves) pair; got {list(groups)!r}."
        )
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"{where}: `ncols` must be a positive int; got {ncols!r}.")
    ylabels = [ylabel] * len(groups) if isinstance(ylabel, str) else list(ylabel)
    logys = [logy] * len(groups) if isinstance(logy, bool) else list(logy)
    for name, given in (("ylabel", ylabels), ("logy", logys)):
        if len(given) != len(groups):
            raise ValueError(
                f"{where}: `{name}` must be one value or one per group ({len(groups)}); "
                f"got {len(given)} values."
            )
    cols = min(ncols, len(groups))
    nrows = math.ceil(len(groups) / cols)
    panel_w, panel_h = 3.4, 2.5
    # Every panel is drawn on one Axes spanning the figure (data units: inches), axes hidden: its
    # frame, ticks, grid and curves are lines, its labels texts. An Axes per panel, with its
    # axis and tick objects, cost more than the curves on it (about half the report's drawing).
    # Placed in inches: each cell keeps room on its left for the tick labels and the y label,
    # below for the t ticks and label, above for the title (tests/test_figure_layout.py checks
    # the boxes).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(cols * panel_w, nrows * panel_h))
    FigureCanvasAgg(fig)
    width, height = cols * panel_w, nrows * panel_h
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0), label="<panels>")
    ax.set_xlim(0.0, width)
    ax.set_ylim(0.0, height)
    ax.set_axis_off()
    ax.panel_boxes, ax.panel_limits = [], []
    left, right, bottom, top = _SERIES_CELL_MARGINS
    frames, marks, grids = [], [], []
    for g, (title, curves) in enumerate(groups):
        row, col = divmod(g, cols)
        box = (col * panel_w + left, (nrows - 1 - row) * panel_h + bottom,
               panel_w - left - right, panel_h - bottom - top)  # fmt: skip
        data = []
        for label, ts, values in curves:
            times = _times(ts, where)
            data.append((label, times, _series(values, times.shape[0], where, "values")))
        only = curves[0][0] if len(curves) == 1 else ""
        short = bool(only) and len(title) + len(only) <= 46  # one line over the panel at 9 pt
        panel = _SeriesPanel(ax, box, data, logy=logys[g], index=g)
        panel.draw(frames, marks, grids, ylabel=ylabels[g], title=f"{title} ({only})" if short else title)
        if any(label for label, _, _ in data) and not short:  # one curve: the title names it
            panel.legend()
    styles = (  # the grid under the curves (opaque grey: it survives the PNG's palette), the rest over
        (grids, {"color": "0.88", "linewidth": 0.4, "zorder": 1}),
        (marks, {"color": "black", "linewidth": 0.6, "zorder": 3}),
        (frames, {"color": "black", "linewidth": 0.8, "zorder": 3}),
    )
    for lines, style in styles:
        if lines:
            joined = np.concatenate([np.vstack([line, [[np.nan, np.nan]]]) for line in lines])
            (drawn,) = ax.plot(joined[:, 0], joined[:, 1], **style)
            drawn.set_in_layout(False)
    return save_figure(fig, Path(path), formats)


class _SeriesPanel:
    """One panel of :func:`write_series_panels` on the shared Axes ``ax`` (inches): ``box`` (left,
    bottom, width, height) holds the curves ``data`` [(label, ts, values)], the x-axis from 0 to
    the last time, the y-axis linear or (``logy``) logarithmic over the values drawn."""

    def __init__(
        self, ax: Axes, box: tuple[float, float, float, float], data: list, *, logy: bool, index: int
    ):
        self.ax, self.box, self.data, self.logy, self.index = ax, box, data, logy, index
        self.x_high = max(float(np.max(ts)) for _, ts, _ in data) or 1.0
        values = np.concatenate([ys for _, _, ys in data])
        shown = values[np.isfinite(values) & (values > 0)] if logy else values[np.isfinite(values)]
        if logy:
            shown = np.log10(shown)
        low, high = (float(shown.min()), float(shown.max())) if shown.size else (0.0, 1.0)
        pad = 0.05 * (high - low) if high > low else (0.5 if logy else max(0.5, 0.1 * abs(low)))
        self.low, self.high = low - pad, high + pad
        ax.panel_boxes.append([box[0] / ax.get_xlim()[1], box[1] / ax.get_ylim()[1],
                               box[2] / ax.get_xlim()[1], box[3] / ax.get_ylim()[1]])  # fmt: skip
        ax.panel_limits.append((0.0, self.x_high))

    def _x(self, t: np.ndarray) -> np.ndarray:
        return self.box[0] + np.asarray(t, dtype=float) / self.x_high * self.box[2]

    def _y(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        if self.logy:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)
        return self.box[1] + (v - self.low) / (self.high - self.low) * self.box[3]

    def _y_ticks(self) -> tuple[np.ndarray, list[str]]:
        """Tick positions (in the axis' own units: log10 for a log axis) and their labels."""
        from matplotlib.ticker import MaxNLocator

        if self.logy:
            decades = np.arange(math.ceil(self.low), math.floor(self.high) + 1)
            if decades.size >= 2:
                step = math.ceil(decades.size / 5)
                decades = decades[decades % step == 0] if decades.size > 5 else decades
                return decades.astype(float), [_power_of_ten(10.0**k) for k in decades]
            # within a decade: 1-2-3-5 steps, in plain text
            exponents = range(math.floor(self.low) - 1, math.ceil(self.high) + 1)
            candidates = np.array([m * 10.0**e for e in exponents for m in (1.0, 2.0, 3.0, 5.0)])
            inside = candidates[(np.log10(candidates) >= self.low) & (np.log10(candidates) <= self.high)]
            if inside.size < 2:  # a narrow range: round values between its ends
                inside = MaxNLocator(nbins=3).tick_values(10.0**self.low, 10.0**self.high)
                inside = inside[(inside > 0) & (inside >= 10.0**self.low) & (inside <= 10.0**self.high)]
            return np.log10(inside), [f"{v:.2g}" for v in inside]
        ticks = MaxNLocator(nbins=4).tick_values(self.low, self.high)
        ticks = ticks[(ticks >= self.low) & (ticks <= self.high)]
        return ticks, [f"{v:.4g}" for v in ticks]

    def draw(self, frames: list, marks: list, grids: list, *, ylabel: str, title: str) -> None:
        """Curves, frame, ticks, grid, labels and title; the lines of the frame, ticks and grid are
        added to ``frames``, ``marks`` and ``grids`` (drawn once for every panel)."""
        from matplotlib.patches import Rectangle
        from matplotlib.ticker import MaxNLocator

        ax, (x0, y0, w, h) = self.ax, self.box
        clip = Rectangle((x0, y0), w, h, transform=ax.transData)
        for i, (label, ts, ys) in enumerate(self.data):
            (line,) = ax.plot(self._x(ts), self._y(ys), label=label, linewidth=1.2,
                              color=curve_colours(len(self.data))[i], zorder=2)  # fmt: skip
            line.set_clip_path(clip)
            line.set_in_layout(False)
        frames.append(np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h], [x0, y0]]))
        x_ticks = MaxNLocator(nbins=4).tick_values(0.0, self.x_high)
        x_ticks = x_ticks[(x_ticks >= 0.0) & (x_ticks <= self.x_high * (1 + 1e-9))]
        for t in x_ticks:
            x = float(self._x(t))
            marks.append(np.array([[x, y0], [x, y0 - 0.04]]))
            grids.append(np.array([[x, y0], [x, y0 + h]]))
            ax.text(x, y0 - 0.06, f"{t:g}", fontsize=8, ha="center", va="top")
        positions, labels = self._y_ticks()
        for position, text in zip(positions, labels, strict=True):
            y = y0 + (position - self.low) / (self.high - self.low) * h
            marks.append(np.array([[x0, y], [x0 - 0.04, y]]))
            grids.append(np.array([[x0, y], [x0 + w, y]]))
            ax.text(x0 - 0.06, y, text, fontsize=8, ha="right", va="center")
        longest = max((len(text) for text in labels), default=1)
        ax.text(x0 + w / 2, y0 - 0.28, "t", fontsize=10, ha="center", va="top")
        # rotated about its anchor: "center" along the axis, its lower side (now its right) there
        ax.text(x0 - 0.12 - 0.062 * longest, y0 + h / 2, ylabel, fontsize=10, ha="center", va="bottom",
                rotation=90, rotation_mode="anchor")  # fmt: skip
        ax.text(x0 + w / 2, y0 + h + 0.05, title, fontsize=9, ha="center", va="bottom")

    def legend(self) -> None:
        """The curves' labels (6 pt) with a sample of each line, in the corner of the panel that
        the curves cross least (what ``loc="best"`` does, counted on the points drawn)."""
        ax, (x0, y0, w, h) = self.ax, self.box
        glyph = 6 * _CHAR_INCHES_PER_POINT  # the widest average advance of a 6 pt character
        fits = int((w - 0.36) / glyph)  # characters that fit in the panel beside the sample
        labels = [(label if len(label) <= fits else label[: fits - 1] + "…", i)
                  for i, (label, _, _) in enumerate(self.data) if label]  # fmt: skip
        rows = 0.11 * len(labels) + 0.08
        xs = np.concatenate([self._x(ts) for _, ts, _ in self.data])
        ys = np.concatenate([self._y(v) for _, _, v in self.data])
        corners = {}
        for right in (False, True):
            for upper in (True, False):
                side = (xs > x0 + w * 0.5) == right
                band = (ys > y0 + h - rows) if upper else (ys < y0 + rows)
                corners[(right, upper)] = int(np.sum(side & band))
        right, upper = min(corners, key=lambda corner: (corners[corner], not corner[1], corner[0]))
        colours = curve_colours(len(self.data))
        longest = max(len(label) for label, _ in labels)
        width = min(0.26 + glyph * longest, w - 0.1)  # the white ground: sample, gap, labels
        start = x0 + w - width if right else x0 + 0.06  # a right corner's box ends at the frame
        top_row = (y0 + h - 0.1) if upper else (y0 + 0.06 + 0.11 * (len(labels) - 1))
        from matplotlib.patches import Rectangle

        ground = Rectangle(  # white, so that the labels read over the curves they cover
            (start - 0.03, top_row - 0.11 * (len(labels) - 1) - 0.06),
            width,
            0.11 * len(labels) + 0.01,
            facecolor="white",
            edgecolor="0.8",
            linewidth=0.5,
            alpha=0.85,
            zorder=3.5,
        )
        ax.add_patch(ground)
        for k, (label, i) in enumerate(labels):
            y = top_row - 0.11 * k
            ax.plot([start, start + 0.16], [y, y], color=colours[i], linewidth=1.2, zorder=4)
            text = ax.text(start + 0.2, y, label, fontsize=6, ha="left", va="center", zorder=4)
            text.panel_index = self.index  # inside its own panel: not text over another panel


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power_of_ten(value: float, _position: Any = None) -> str:
    """``10⁻⁵`` for ``1e-5``: a log axis's label in plain text (no mathtext to parse and lay out)."""
    if not value > 0:
        return ""
    exponent = math.log10(value)
    if abs(exponent - round(exponent)) > 1e-9:
        return ""
    return "1" if round(exponent) == 0 else "10" + str(round(exponent)).translate(_SUPERSCRIPT)


def _few_ticks(ax: Axes, *, logy: bool, positive: np.ndarray) -> None:
    """At most five ticks per axis, and on a log axis spanning a decade or more (``positive``:
    the values drawn on it) decades only, labelled in plain text, no minor ticks: what a panel
    of a grid needs to be read, at a fraction of the cost of matplotlib's defaults (each tick is
    several artists, each log label a mathtext parse). A log axis within a decade keeps them."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    decades = (
        math.floor(math.log10(positive.max())) - math.ceil(math.log10(positive.min())) if positive.size else 0
    )
    if logy and decades < 1:  # within a decade: 1-2-5 steps, in plain text too
        ax.yaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 3.0, 5.0), numticks=6))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:.2g}"))
        ax.yaxis.set_minor_locator(NullLocator())
    elif logy:
        ax.yaxis.set_major_locator(LogLocator(base=10.0, numticks=5))
        ax.yaxis.set_major_formatter(FuncFormatter(_power_of_ten))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
