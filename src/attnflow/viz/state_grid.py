"""A grid of state panels placed in inches (:class:`StateGrid`): square panels under two-line
titles, each with room for a colour bar, its ticks and its name, drawn flat on one shared Axes
(wireframes as NaN-separated lines, colour keys drawn on it instead of colour-bar Axes), so that
no layout pass is needed and a grid of many panels draws in one go."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.viz.colours import LABEL_CMAP
from attnflow.viz.figure_files import save_figure
from attnflow.viz.sphere_panels import (
    _MARKER_SIZE,
    _WIRE_STYLES,
    _colour,
    _dots,
    _flat_points,
    _points,
    _principal_directions,
    _wireframe,
)

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    from matplotlib.axes import Axes

__all__ = ["TITLE_INCHES", "StateGrid"]

TITLE_INCHES = 0.45  # room for a two-line panel title at fontsize 10
# Explicit layout of a grid of state panels, in inches: each cell is a square panel under a
# two-line title, with room on its right for a colour bar, its tick labels and its name. The room
# is fixed by the fonts used (ticks 6 pt, at most 5 ticks of at most 7 characters; name 7 pt), so
# no layout pass is needed (tests/test_figure_layout.py checks the boxes at d = 2 ... 128).
_BAR_GAP, _BAR_WIDTH, _BAR_ROOM = 0.06, 0.11, 0.62  # colour bar: gap, width, room for ticks + name
_LABEL_ROOM = 0.28  # a projection's axis labels (8 pt) left of and below its square


class StateGrid:
    """A figure of ``nrows × ncols`` state panels of ``panel`` inches (:func:`draw_state`'s
    pictures), with room for a colour bar right of the panels of the columns in ``bar_columns``
    (every column when True); :meth:`draw` fills cell ``k``.

    Spheres (``d = 3``) are drawn flat on one Axes shared by every panel (``<panels>``: the whole
    figure, in inches, axes hidden): their wireframes are three lines for the whole figure, each
    panel adds one rasterised scatter and its title. An Axes per panel cost more than the picture
    on it. The Axes records each sphere's square in ``panel_boxes`` (figure fractions), so that
    the layout test can tell a panel from the space between panels. Projections (``d != 3``) keep
    an Axes each, for their axis labels."""

    def __init__(
        self,
        nrows: int,
        ncols: int,
        panel: float,
        *,
        bar_columns: bool | set[int],
        title_room: float = TITLE_INCHES,
    ) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.nrows, self.ncols, self.panel = nrows, ncols, panel
        room = _BAR_GAP + _BAR_WIDTH + _BAR_ROOM
        widths = [panel + (room if bar_columns is True or (bar_columns and c in bar_columns) else 0.0)
                  for c in range(ncols)]  # fmt: skip
        self.lefts = np.concatenate([[0.0], np.cumsum(widths)])
        self.cell_h = panel + title_room
        self.width, self.height = float(self.lefts[-1]), nrows * self.cell_h
        self.fig = Figure(figsize=(self.width, self.height))
        FigureCanvasAgg(self.fig)
        self._canvas: Axes | None = None
        self._wires: list[Any] = []
        self._pieces: dict[Any, list[np.ndarray]] = {}
        # the panels' points by colour range (None: one colour), drawn by `save` as one scatter
        # per range: a collection per panel cost more to make and draw than its few points
        self._points: dict[tuple[float, float] | None, list[tuple[np.ndarray, ...]]] = {}

    def save(self, path: Path, formats: Sequence[str] | None) -> Path:
        """Join each shared line's pieces (NaN between them: one path each, set once, not grown
        panel by panel), draw the panels' points (one scatter per colour range, in the order each
        panel queued them: panels do not overlap) and save the figure (:func:`_save`)."""
        gap = np.full((1, 2), np.nan)
        for wires, pieces in self._pieces.items():
            if pieces:
                joined = np.concatenate([part for piece in pieces for part in (piece, gap)][:-1])
                wires.set_data(joined[:, 0], joined[:, 1])
        for limits, pieces in self._points.items():
            xy, values, sizes, alphas = (np.concatenate(part) for part in zip(*pieces, strict=True))
            dots = _dots(self._shared(), xy, None if limits is None else values, cmap=LABEL_CMAP, s=sizes,
                         alpha=alphas)  # fmt: skip
            if limits is not None:
                dots.set_clim(*limits)
        return save_figure(self.fig, path, formats)

    def _queue_points(self, xy: np.ndarray, values: np.ndarray | None, sizes, alphas) -> Any:
        """Queue points at ``xy`` (inches, in drawing order) for the scatter of their colour range
        (:meth:`save`); returns what keys their colours (a mappable of that range and of
        ``values``), or None for one colour, or a scatter drawn now for undefined colours."""
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        sizes = np.broadcast_to(np.asarray(sizes, dtype=float), (xy.shape[0],))
        alphas = np.broadcast_to(np.asarray(1.0 if alphas is None else alphas, dtype=float), (xy.shape[0],))
        if values is not None and not np.all(np.isfinite(values)):  # undefined colours: drawn alone
            return _dots(self._shared(), xy, values, cmap=LABEL_CMAP, s=sizes, alpha=alphas)
        limits = None
        if values is not None:  # as the scatter's autoscale sets them, one label as its first colour
            low, high = float(values.min()), float(values.max())
            limits = (low, high if high > low else low + 1.0)
        shown = np.zeros(xy.shape[0]) if values is None else values
        self._points.setdefault(limits, []).append((xy, shown, sizes, alphas))
        if limits is None:
            return None
        key = ScalarMappable(norm=Normalize(*limits), cmap=LABEL_CMAP)
        key.set_array(values)
        return key

    def _rect(self, left: float, bottom: float, width: float, height: float) -> list[float]:
        return [left / self.width, bottom / self.height, width / self.width, height / self.height]

    def _shared(self) -> Axes:
        """The Axes of every sphere panel (made with the first one)."""
        if self._canvas is None:
            ax = self.fig.add_axes((0.0, 0.0, 1.0, 1.0), label="<panels>")
            ax.set_xlim(0.0, self.width)
            ax.set_ylim(0.0, self.height)
            ax.set_axis_off()
            ax.patch.set_visible(False)  # under or over other Axes, it hides nothing
            ax.panel_boxes = []
            self._wires = [ax.plot([], [], **style)[0] for style in _WIRE_STYLES]
            (self._frames,) = ax.plot([], [], color="black", linewidth=0.8)  # projections' squares
            for wires in (*self._wires, self._frames):
                wires.set_in_layout(False)
            self._pieces = {wires: [] for wires in (*self._wires, self._frames)}  # joined by `save`
            self._canvas = ax
        return self._canvas

    def _projection(
        self, ax: Axes, pts: np.ndarray, values: np.ndarray | None, left: float, bottom: float
    ) -> Any:
        """:func:`draw_projection`'s picture on the shared Axes: the points in the plane of their
        two leading principal directions, in a framed square with the unit circle and the axis
        names; returns the scatter."""
        from matplotlib.patches import Rectangle

        d = pts.shape[1]
        coords = pts if d == 2 else pts @ _principal_directions(pts)
        side = self.panel - _LABEL_ROOM
        x0, y0 = left + _LABEL_ROOM, bottom + _LABEL_ROOM
        radius, centre = side / 2 / 1.05, np.array([x0 + side / 2, y0 + side / 2])
        circle = np.linspace(0.0, 2.0 * np.pi, 200)
        ring = centre + radius * np.stack([np.cos(circle), np.sin(circle)], axis=1)
        frame = np.array([[x0, y0], [x0 + side, y0], [x0 + side, y0 + side], [x0, y0 + side], [x0, y0]])
        self._pieces[self._wires[2]].append(ring)
        self._pieces[self._frames].append(frame)
        if np.all(np.abs(coords) <= 1.0):  # inside the square: with the spheres' points
            dots = self._queue_points(centre + radius * coords, values, _MARKER_SIZE, None)
        else:  # not a unit vector's: clipped to the square
            dots = _dots(ax, centre + radius * coords, values, cmap=LABEL_CMAP, s=_MARKER_SIZE)
            dots.set_clip_path(Rectangle((x0, y0), side, side, transform=ax.transData))
        ax.panel_boxes.append(self._rect(x0, y0, side, side))
        names = ("x₁", "x₂") if d == 2 else (f"PC 1 (d = {d})", "PC 2")
        ax.text(x0 + side / 2, y0 - 0.05, names[0], fontsize=8, ha="center", va="top")
        ax.text(x0 - 0.05, y0 + side / 2, names[1], fontsize=8, ha="right", va="center", rotation=90,
                rotation_mode="anchor")  # fmt: skip
        return dots

    def draw(
        self,
        k: int,
        x: np.ndarray,
        *,
        color: Any,
        title: str | None,
        color_label: str | None,
        title_size: float = 10,
    ) -> Axes:
        """Draw the state ``x`` in cell ``k``; returns the Axes it is on (the shared one for a
        sphere)."""
        row, col = divmod(k, self.ncols)
        left, bottom = float(self.lefts[col]), (self.nrows - 1 - row) * self.cell_h
        pts = _points(x, "draw_state")
        if pts.shape[1] == 3:
            ax = self._shared()
            values = _colour(color, pts.shape[0], "draw_state")
            inset = 0.08 * self.panel  # the sphere's outline a little inside its cell, as in 3-D
            radius = (self.panel - 2 * inset) / 2 / 1.05  # as on an Axes of limits ±1.05
            centre = (left + self.panel / 2, bottom + self.panel / 2)
            for wires, line in zip(self._wires, _wireframe(), strict=True):
                self._pieces[wires].append(np.asarray(centre) + radius * line)
            order, xy, style = _flat_points(pts)  # as _flat_scatter draws them
            shown = None if values is None else values[order]
            dots = self._queue_points(np.asarray(centre) + radius * xy, shown, style["s"], style["alpha"])
            ax.panel_boxes.append(self._rect(centre[0] - radius, centre[1] - radius, 2 * radius, 2 * radius))
            if title is not None:  # at the top of the cell, where a 3-D panel's title sits
                ax.text(centre[0], bottom + self.panel + 0.06, title, fontsize=title_size,
                        ha="center", va="bottom", multialignment="center")  # fmt: skip
        else:
            ax = self._shared()
            dots = self._projection(ax, pts, _colour(color, pts.shape[0], "draw_state"), left, bottom)
            if title is not None:
                middle = left + _LABEL_ROOM + (self.panel - _LABEL_ROOM) / 2
                ax.text(middle, bottom + self.panel + 0.06, title, fontsize=title_size,
                        ha="center", va="bottom", multialignment="center")  # fmt: skip
        if dots is not None and color is not None and color_label is not None:
            height = 0.6 * self.panel
            box = (left + self.panel + _BAR_GAP, bottom + (self.panel - height) / 2, _BAR_WIDTH, height)
            _colour_key(self._shared(), dots, color_label, box)
        return ax


def _key_ticks(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """The ticks of a colour key over ``[low, high]``: one per value for a few integer ids, else
    at most five round numbers (as :func:`_colour_bar` places them)."""
    from matplotlib.ticker import MaxNLocator

    distinct = np.unique(values[np.isfinite(values)])
    if distinct.size <= 12 and np.all(distinct == np.round(distinct)):
        return distinct
    ticks = MaxNLocator(nbins=4).tick_values(low, high)
    span = high - low
    return ticks[(ticks >= low - 1e-9 * span) & (ticks <= high + 1e-9 * span)]


def _colour_key(ax: Axes, mappable: Any, label: str, box: tuple[float, float, float, float]) -> None:
    """A colour bar drawn on ``ax`` (the shared Axes of a grid, data units inches) in ``box``
    (left, bottom, width, height): the colour map's gradient as an image over the range of
    ``mappable``, tick marks and labels (6 pt) on its right, the name ``label`` (7 pt) beside
    them. What a matplotlib colour bar shows, without the Axes, axis and tick objects that made
    it cost more than the panel it keys. The image has gid ``"colour key"`` (and the norm of
    ``mappable``), so the layout test finds it; its texts are texts of ``ax``."""
    left, bottom, width, height = box
    norm, cmap = mappable.norm, mappable.get_cmap()
    low, high = float(norm.vmin), float(norm.vmax)
    image = ax.imshow(
        np.linspace(low, high, 256)[:, None],
        cmap=cmap,
        norm=norm,
        extent=(left, left + width, bottom, bottom + height),
        origin="lower",
        aspect="auto",
        interpolation="nearest",
    )
    image.set_gid("colour key")
    image.set_in_layout(False)
    ax.set_xlim(0.0, ax.figure.get_figwidth())  # imshow widens the limits to its image
    ax.set_ylim(0.0, ax.figure.get_figheight())
    ticks = _key_ticks(np.asarray(mappable.get_array(), dtype=float), low, high)
    ys = bottom + (ticks - low) / (high - low) * height if high > low else np.full(ticks.shape, bottom)
    marks = np.full((3 * len(ys), 2), np.nan)
    marks[0::3] = np.stack([np.full_like(ys, left + width), ys], axis=1)
    marks[1::3] = np.stack([np.full_like(ys, left + width + 0.035), ys], axis=1)
    ax.plot(marks[:, 0], marks[:, 1], color="black", linewidth=0.6)
    ax.plot(  # the frame of the bar
        [left, left + width, left + width, left, left],
        [bottom, bottom, bottom + height, bottom + height, bottom],
        color="black",
        linewidth=0.6,
    )
    texts = [f"{tick:g}" for tick in ticks]
    for text, y in zip(texts, ys, strict=True):
        ax.text(left + width + 0.05, y, text, fontsize=6, ha="left", va="center")
    longest = max((len(text) for text in texts), default=0)  # 6 pt digits: about 0.05 in each
    ax.text(left + width + 0.16 + 0.05 * longest, bottom + height / 2, label, fontsize=7,
            rotation=90, ha="center", va="center", rotation_mode="anchor")  # fmt: skip
