"""Figures of a run and of the reproduce report (matplotlib only, NumPy inputs).

Two layers:

- ``draw_*`` functions draw on an Axes the caller gives them (or, for :func:`draw_state`, one
  they add to a given Figure) and return that Axes: :func:`draw_sphere` (points of ``S^2`` on a
  faint wireframe sphere), :func:`draw_projection` (points of ``S^{d-1}``, ``d != 3``, projected
  onto their two leading principal directions), :func:`draw_state` (picks one of the two by
  ``d``) and :func:`draw_series` (a line over time).
- ``write_*`` functions assemble such panels into a figure and save it as a PNG (their spheres
  drawn flat, an orthographic view on a 2-D Axes, which costs a fraction of a 3-D Axes):
  :func:`write_run_figures` (the ``figures/`` folder of a run),
  :func:`write_comparison_figure`, :func:`write_series_figure` and :func:`write_target_figure`
  (the reproduce and realise reports).

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

Vector output: every ``write_*`` function writes a PNG (the reports embed it) and, on request, the
same figure as SVG and/or PDF next to it. Ask through ``formats=("png", "svg")`` on the write
functions, or for every figure of a process through the environment variable
``ATTNFLOW_FIGURE_FORMAT`` (a comma-separated list, e.g. ``ATTNFLOW_FIGURE_FORMAT=svg,pdf``); the
PNG is always written. The returned path is the PNG's.
"""

from __future__ import annotations

import difflib
import functools
import io
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from attnflow.viz.colours import LABEL_CMAP

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "draw_projection",
    "draw_series",
    "draw_sphere",
    "draw_state",
    "curve_colours",
    "figure_formats",
    "save_figure",
    "write_comparison_figure",
    "write_run_figures",
    "write_series_figure",
    "write_series_panels",
    "write_target_figure",
]

DPI = 110
"""Resolution of every PNG written here."""

_PANEL_INCHES = 3.6  # a run's own states figure
_GRID_PANEL_INCHES = 2.4  # each panel of a grid of states (the reproduce report's comparisons)
_TITLE_INCHES = 0.45  # room for a two-line panel title at fontsize 10
_MARKER_SIZE = 10.0
_TARGET_KINDS = ("sphere", "orbit")
FORMATS = ("png", "svg", "pdf")
"""The file formats the ``write_*`` functions can write (PNG always; the others on request)."""
FORMAT_ENV = "ATTNFLOW_FIGURE_FORMAT"
E_MAX_LABEL = "E_max (closed form)"

# The figures written by :func:`write_run_figures`, and the series keys each one reads.
_ENERGY_KEYS = ("energy",)
_COSINE_KEYS = ("mean_cosine", "gauge_mean_cosine")
_N_EFF_KEY = "n_eff"


# --------------------------------------------------------------------------- validation


def _points(x: ArrayLike, where: str, name: str = "x", *, d: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
        raise ValueError(
            f"{where}: `{name}` must be an (n, d) array with n >= 1 and d >= 2; got shape {arr.shape!r}."
        )
    if d is not None and arr.shape[1] != d:
        hint = " Use draw_projection (or draw_state) for d != 3." if d == 3 else ""
        raise ValueError(f"{where}: `{name}` must have d = {d} columns; got shape {arr.shape!r}.{hint}")
    return arr


def _colour(color: ArrayLike | None, n: int, where: str) -> np.ndarray | None:
    if color is None:
        return None
    arr = np.asarray(color, dtype=float)
    if arr.shape != (n,):
        raise ValueError(
            f"{where}: `color` must be None or an (n,) = ({n},) array of values; got shape {arr.shape!r}."
        )
    return arr


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


def _is_3d(ax: Axes) -> bool:
    return getattr(ax, "name", None) == "3d"


# --------------------------------------------------------------------------- draw_*


def draw_sphere(
    ax: Axes,
    x: ArrayLike,
    *,
    color: ArrayLike | None = None,
    cmap: str = LABEL_CMAP,
    title: str | None = None,
    axis_limits: float = 1.05,
    color_label: str | None = None,
) -> Axes:
    """Scatter points ``x (n, 3)`` of the unit sphere on a faint wireframe sphere.

    ``ax`` must be a 3-D Axes (``fig.add_subplot(..., projection="3d")``). Points are coloured
    by ``color (n,)`` (e.g. the auxiliary label ``xi`` or a prompt id) through ``cmap``, or drawn
    in one colour when ``color`` is None. With ``color`` and ``color_label`` (what the colour is:
    ``"label ξ"``, ``"position i"``, ``"prompt id"``) a colour bar of that name is added beside
    ``ax``. The box aspect is equal and the axes are hidden, so the sphere reads as a sphere. For
    ``d != 3`` use :func:`draw_projection` or :func:`draw_state`. Returns ``ax``.
    """
    where = "draw_sphere"
    if not _is_3d(ax):
        raise TypeError(
            f"{where}: `ax` must be a 3-D Axes; got {type(ax).__name__!r}. "
            "Create it with fig.add_subplot(..., projection='3d'), or use draw_projection."
        )
    if not axis_limits > 0:
        raise ValueError(f"{where}: `axis_limits` must be > 0; got {axis_limits!r}.")
    pts = _points(x, where, d=3)
    values = _colour(color, pts.shape[0], where)

    theta, phi = np.meshgrid(np.linspace(0.0, np.pi, 7), np.linspace(0.0, 2.0 * np.pi, 13))
    frame = ax.plot_wireframe(
        np.sin(theta) * np.cos(phi),
        np.sin(theta) * np.sin(phi),
        np.cos(theta),
        color="0.6",
        linewidth=0.3,
        alpha=0.35,
        rasterized=True,
    )
    frame.set_in_layout(False)  # inside the Axes' limits: the layout measures only the text
    style = {"s": _MARKER_SIZE, "depthshade": False, "rasterized": True}
    if values is None:
        dots = ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], color="C0", **style)
    else:
        dots = ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], c=values, cmap=cmap, **style)
        _one_label_first_colour(dots, values)
        _colour_bar(ax, dots, color_label)
    dots.set_in_layout(False)
    lim = (-axis_limits, axis_limits)
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)
    ax.set_zlim(*lim)
    ax.set_box_aspect((1, 1, 1), zoom=1.3)  # hidden axes leave room: let the sphere fill the panel
    ax.set_axis_off()
    if title is not None:
        # a fixed position (y = 1): no automatic placement, which measures every tick of the Axes
        ax.set_title(title, fontsize=10, y=1.0)
    return ax


def _one_label_first_colour(mappable: Any, values: np.ndarray) -> None:
    """Every token with the same label: the colour map's first colour, with or without a colour bar
    (as :func:`attnflow.viz.colours.label_scale` maps it), not whatever a degenerate range gives."""
    finite = values[np.isfinite(values)]
    if finite.size and np.ptp(finite) == 0:
        mappable.set_clim(float(finite[0]), float(finite[0]) + 1.0)


# The view of a sphere drawn flat (:func:`_draw_sphere_flat`): from azimuth -60°, elevation 20°.
_AZIM, _ELEV = np.deg2rad(-60.0), np.deg2rad(20.0)
_TOWARD = np.array([np.cos(_ELEV) * np.cos(_AZIM), np.cos(_ELEV) * np.sin(_AZIM), np.sin(_ELEV)])
_SCREEN = np.array(
    [
        [-np.sin(_AZIM), np.cos(_AZIM), 0.0],
        [-np.sin(_ELEV) * np.cos(_AZIM), -np.sin(_ELEV) * np.sin(_AZIM), np.cos(_ELEV)],
    ]
)


def _flat_points(pts: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The drawing order (far side first), screen positions and sizes/alphas of points of ``S^2``
    in the view of :func:`_draw_sphere_flat`."""
    depth = pts @ _TOWARD
    order = np.argsort(depth, kind="stable")  # far side first: the near side is drawn over it
    xy, near = (pts @ _SCREEN.T)[order], depth[order] >= 0
    return (
        order,
        xy,
        {"s": np.where(near, _MARKER_SIZE, 0.6 * _MARKER_SIZE), "alpha": np.where(near, 1.0, 0.35)},
    )


@functools.cache  # a constant of the view: computed once, never changed (callers only read it)
def _wireframe() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flat sphere's lines in the view of :func:`_draw_sphere_flat`, as ``(m, 2)`` polylines
    whose pieces are separated by NaN rows: the far and near halves of six meridians and five
    parallels, and the outline."""
    angle = np.linspace(0.0, 2.0 * np.pi, 97)
    lines = [
        np.stack([np.cos(angle) * np.cos(lon), np.cos(angle) * np.sin(lon), np.sin(angle)], axis=1)
        for lon in np.linspace(0.0, np.pi, 7)[:-1]  # meridians
    ] + [
        np.stack([np.cos(lat) * np.cos(angle), np.cos(lat) * np.sin(angle),
                  np.full_like(angle, np.sin(lat))], axis=1)
        for lat in np.linspace(-np.pi / 2, np.pi / 2, 7)[1:-1]  # parallels
    ]  # fmt: skip
    gap = np.full((1, 2), np.nan)
    halves: dict[bool, list[np.ndarray]] = {False: [], True: []}
    for line in lines:
        near = line @ _TOWARD >= 0
        flat = line @ _SCREEN.T
        # runs of points on one side; each run keeps the next point, so the halves meet
        cuts = np.flatnonzero(np.diff(near.astype(int))) + 1
        for start, stop in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(line)]]), strict=True):
            halves[bool(near[start])] += [flat[start : min(stop + 1, len(line))], gap]
    outline = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    lines = (np.concatenate(halves[False]), np.concatenate(halves[True]), outline)
    for line in lines:
        line.flags.writeable = False  # shared by every panel
    return lines


def _draw_sphere_flat(ax: Axes, pts: np.ndarray, *, color: Any, cmap: str, title: str | None) -> Axes:
    """Points of ``S^2`` on a 2-D Axes, as :func:`draw_sphere` shows them on a 3-D one: an
    orthographic view of the sphere (its outline, a faint wireframe of meridians and parallels),
    the near side drawn over the far side, the far side faded. A 2-D Axes costs a fraction of a
    3-D one to make and draw: the movie's frames use it (the grids of states draw the same
    picture on one Axes shared by every panel, :class:`_StateGrid`)."""
    values = _colour(color, pts.shape[0], "draw_state")
    for line, style in zip(_wireframe(), _WIRE_STYLES, strict=True):
        (wires,) = ax.plot(line[:, 0], line[:, 1], **style)
        wires.set_in_layout(False)
    _flat_scatter(ax, pts, values, cmap=cmap, centre=(0.0, 0.0), radius=1.0)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_aspect("equal")
    ax.set_axis_off()
    if title is not None:
        ax.set_title(title, fontsize=10, y=1.0)
    return ax


# far side, near side, outline of the flat sphere
_WIRE_STYLES = (
    {"color": "0.6", "linewidth": 0.3, "alpha": 0.2},
    {"color": "0.6", "linewidth": 0.3, "alpha": 0.5},
    {"color": "0.6", "linewidth": 0.5, "alpha": 0.6},
)


def _flat_scatter(
    ax: Axes,
    pts: np.ndarray,
    values: np.ndarray | None,
    *,
    cmap: str,
    centre: tuple[float, float],
    radius: float,
) -> Any:
    """The points of :func:`_draw_sphere_flat`, of a sphere drawn at ``centre`` with ``radius``
    (data units of ``ax``): one rasterised scatter, far side first. Returns it."""
    order, xy, style = _flat_points(pts)
    xy = np.asarray(centre) + radius * xy
    return _dots(ax, xy, None if values is None else values[order], cmap=cmap, **style)


def _dots(
    ax: Axes, xy: np.ndarray, values: np.ndarray | None, *, cmap: str, s: Any, alpha: Any = None
) -> Any:
    """What ``ax.scatter(x, y, c=values, s=s, alpha=alpha, cmap=cmap, rasterized=True)`` draws (a
    collection of round markers, coloured by ``values`` or in one colour when None), made directly:
    ``Axes.scatter`` spends more on parsing its arguments than on these few points. Returns it."""
    from matplotlib.collections import PathCollection
    from matplotlib.markers import MarkerStyle

    marker = MarkerStyle("o")
    dots = PathCollection(
        [marker.get_path().transformed(marker.get_transform())],
        sizes=np.broadcast_to(np.asarray(s, dtype=float), (xy.shape[0],)),
        offsets=xy,
        offset_transform=ax.transData,
        edgecolors="face",
        linewidths=1.5,  # as scatter draws: the edge in the face's colour
        rasterized=True,
    )
    if values is None:
        dots.set_facecolor("C0")
    else:
        dots.set_array(np.asarray(values, dtype=float))
        dots.set_cmap(cmap)
        dots.autoscale()
        _one_label_first_colour(dots, np.asarray(values, dtype=float))
    if alpha is not None:
        dots.set_alpha(alpha)
    from matplotlib.transforms import IdentityTransform

    dots.set_transform(IdentityTransform())  # marker sizes in points², placed by the offsets (as scatter)
    ax.add_collection(dots, autolim=False)
    dots.set_in_layout(False)
    return dots


def _colour_bar(ax: Axes, mappable: Any, label: str | None, *, cax: Axes | None = None) -> None:
    """A slim colour bar named ``label`` beside ``ax``, or in ``cax`` (none when ``label`` is None)."""
    if label is None:
        return
    if cax is None:
        bar = ax.figure.colorbar(mappable, ax=ax, shrink=0.6, fraction=0.05, pad=0.02)
    else:
        bar = ax.figure.colorbar(mappable, cax=cax)
    values = np.unique(np.asarray(mappable.get_array(), dtype=float))
    if values.size <= 12 and np.all(values == np.round(values)):  # a few ids: one tick each, no 0.5
        bar.set_ticks(values, labels=[f"{v:g}" for v in values])
    else:  # at most five ticks: labels of a narrow bar never touch
        from matplotlib.ticker import MaxNLocator

        bar.locator = MaxNLocator(nbins=4)
    bar.set_label(label, fontsize=7)
    bar.ax.tick_params(labelsize=6)


def _principal_directions(pts: np.ndarray, count: int = 2) -> np.ndarray:
    """The ``count`` leading principal directions of the rows of ``pts``, as a ``(d, count)`` matrix.

    Directions of the centred finite rows (right singular vectors); when the centred cloud is a
    single point (a collapsed state), the uncentred second moment is used instead so that the
    projection still shows where the point is. Signs are fixed (largest entry positive) so the
    picture does not flip between calls.
    """
    d = pts.shape[1]
    finite = pts[np.all(np.isfinite(pts), axis=1)]
    if finite.shape[0] == 0:
        return np.eye(d)[:, :count]
    centred = finite - finite.mean(axis=0)
    # A cloud whose centred spread is at round-off level has no meaningful principal plane.
    basis = centred if np.linalg.norm(centred) > 1e-12 * max(1.0, np.linalg.norm(finite)) else finite
    _, _, vt = np.linalg.svd(basis, full_matrices=True)
    directions = vt[:count].T.copy()
    for k in range(count):
        if directions[np.argmax(np.abs(directions[:, k])), k] < 0:
            directions[:, k] *= -1.0
    return directions


def draw_projection(
    ax: Axes,
    x: ArrayLike,
    *,
    color: ArrayLike | None = None,
    cmap: str = LABEL_CMAP,
    title: str | None = None,
    color_label: str | None = None,
) -> Axes:
    """Scatter points ``x (n, d)`` in the plane of their two leading principal directions.

    For ``d = 2`` the points are drawn as they are. Otherwise the directions are the two leading
    right singular vectors of the centred points (principal component analysis; the uncentred
    second moment when all points coincide), and each point is drawn at its coordinates
    ``(⟨x_i, v_1⟩, ⟨x_i, v_2⟩)`` — the uncentred points are projected, so unit rows land in the
    unit disk, drawn faintly for reference. The plane depends on the snapshot: two panels of
    different snapshots are generally different projections. ``ax`` is a 2-D Axes; ``color``,
    ``cmap`` and ``color_label`` as in :func:`draw_sphere`. Returns ``ax``.
    """
    where = "draw_projection"
    if _is_3d(ax):
        raise TypeError(f"{where}: `ax` must be a 2-D Axes; got a 3-D Axes. Use draw_sphere for 3-D Axes.")
    pts = _points(x, where)
    values = _colour(color, pts.shape[0], where)
    d = pts.shape[1]
    coords = pts if d == 2 else pts @ _principal_directions(pts)

    circle = np.linspace(0.0, 2.0 * np.pi, 200)
    (ring,) = ax.plot(np.cos(circle), np.sin(circle), color="0.6", linewidth=0.5, alpha=0.6)
    if values is None:
        dots = ax.scatter(coords[:, 0], coords[:, 1], s=_MARKER_SIZE, color="C0", rasterized=True)
    else:
        dots = ax.scatter(coords[:, 0], coords[:, 1], s=_MARKER_SIZE, c=values, cmap=cmap, rasterized=True)
        _one_label_first_colour(dots, values)
        _colour_bar(ax, dots, color_label)
    for artist in (ring, dots):  # inside the Axes' limits: the layout measures only the text
        artist.set_in_layout(False)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    if d == 2:
        ax.set_xlabel("$x_1$", fontsize=8)
        ax.set_ylabel("$x_2$", fontsize=8)
    else:
        ax.set_xlabel(f"PC 1 (d = {d})", fontsize=8)
        ax.set_ylabel("PC 2", fontsize=8)
    if title is not None:
        # a fixed position (y = 1): no automatic placement, which measures every tick of the Axes
        ax.set_title(title, fontsize=10, y=1.0)
    return ax


def draw_state(
    fig: Figure,
    position: int | tuple[int, int, int] | Any,
    x: ArrayLike,
    *,
    color: ArrayLike | None = None,
    title: str | None = None,
    cmap: str = LABEL_CMAP,
    color_label: str | None = None,
) -> Axes:
    """Add a subplot at ``position`` to ``fig`` and draw the state ``x (n, d)`` on it.

    ``position`` is a subplot spec: a tuple ``(nrows, ncols, index)``, a three-digit int such as
    ``141``, or a ``SubplotSpec``. For ``d = 3`` the subplot is 3-D and :func:`draw_sphere` draws
    on it; otherwise it is 2-D and :func:`draw_projection` draws on it (``color_label``: the name
    of the colour bar, as in :func:`draw_sphere`). Returns the new Axes.
    """
    pts = _points(x, "draw_state")
    args = tuple(position) if isinstance(position, tuple) else (position,)
    if pts.shape[1] == 3:
        ax = fig.add_subplot(*args, projection="3d")
        return draw_sphere(ax, pts, color=color, cmap=cmap, title=title, color_label=color_label)
    ax = fig.add_subplot(*args)
    return draw_projection(ax, pts, color=color, cmap=cmap, title=title, color_label=color_label)


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


# --------------------------------------------------------------------------- write_*


def _new_figure(
    width: float, height: float, *, margins: tuple[float, float, float, float] | None = None
) -> Figure:
    """A figure of ``width × height`` inches with an Agg canvas: with ``margins`` (left, right,
    bottom, top; inches) its subplots leave that room, with no layout pass; without, constrained
    layout places them (the panels move so that their labels, titles and colour bars neither
    overlap nor leave the figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if margins is not None:
        fig = Figure(figsize=(width, height))
        left, right, bottom, top = margins
        fig.subplots_adjust(
            left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height
        )
    else:
        fig = Figure(figsize=(width, height), layout="constrained")
        fig.get_layout_engine().set(w_pad=0.04, h_pad=0.04, wspace=0.02, hspace=0.02)
    FigureCanvasAgg(fig)
    return fig


# A run's energy and collapse plots: linear axes with short tick labels (energies, cosines, counts),
# so fixed margins in inches hold them (tests/test_figure_layout.py checks the boxes).
_RUN_PLOT_MARGINS = (0.85, 0.2, 0.55, 0.35)
_TWIN_PLOT_MARGINS = (0.85, 0.95, 0.55, 0.35)  # with the n_eff axis on the right


# Explicit layout of a grid of state panels, in inches: each cell is a square panel under a
# two-line title, with room on its right for a colour bar, its tick labels and its name. The room
# is fixed by the fonts used (ticks 6 pt, at most 5 ticks of at most 7 characters; name 7 pt), so
# no layout pass is needed (tests/test_figure_layout.py checks the boxes at d = 2 ... 128).
_SERIES_CELL_MARGINS = (0.85, 0.12, 0.5, 0.3)  # left, right, bottom, top of a series panel, inches
_BAR_GAP, _BAR_WIDTH, _BAR_ROOM = 0.06, 0.11, 0.62  # colour bar: gap, width, room for ticks + name
_LABEL_ROOM = 0.28  # a projection's axis labels (8 pt) left of and below its square


class _StateGrid:
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
        title_room: float = _TITLE_INCHES,
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
        return _save(self.fig, path, formats)

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


def figure_formats(formats: Sequence[str] | None = None) -> tuple[str, ...]:
    """The formats to write: ``formats``, or else ``$ATTNFLOW_FIGURE_FORMAT`` (comma-separated),
    always with ``"png"`` first. Raises ``ValueError`` naming an unknown format."""
    if formats is None:
        formats = [f.strip() for f in os.environ.get(FORMAT_ENV, "").split(",") if f.strip()]
        where, name = "figure formats", FORMAT_ENV
    else:
        where, name = "figure formats", "formats"
    chosen = ["png"]
    for fmt in formats:
        key = str(fmt).lower().lstrip(".")
        if key not in FORMATS:
            close = difflib.get_close_matches(key, FORMATS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: `{name}` must name formats among {FORMATS!r}; got {fmt!r}.{hint}")
        if key not in chosen:
            chosen.append(key)
    return tuple(chosen)


def save_figure(fig: Figure, path: str | os.PathLike[str], formats: Sequence[str] | None = None) -> Path:
    """Save ``fig`` as the PNG ``path`` (parents created) and in the other requested formats
    beside it (:func:`figure_formats`). Returns ``Path(path)``."""
    return _save(fig, Path(path), formats)


def _save(fig: Figure, path: Path, formats: Sequence[str] | None = None) -> Path:
    """Save ``fig`` as the PNG ``path`` and in the other requested formats beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # registered nowhere, the figure is freed with its last reference (clearing it costs a redraw)
    for fmt in figure_formats(formats):
        if fmt == "png":
            _save_png(fig, path.with_suffix(".png"))
        else:
            fig.savefig(path.with_suffix(f".{fmt}"), dpi=DPI, format=fmt)
    return path


# Glyphs rasterised without FreeType's hinting (as matplotlib's own test images are): at 110 dpi
# the text looks the same, and Agg draws it in four fifths of the time (text is about half of
# the reproduce report's drawing: each glyph is loaded, hinted and rendered on its own).
_PNG_TEXT = {"text.hinting": "no_hinting"}


def _save_png(fig: Figure, path: Path) -> None:
    """``fig`` as a PNG with a 256-colour palette: drawn once by Agg into raw RGBA (glyphs
    unhinted: :data:`_PNG_TEXT`), quantised (PIL's fast octree) and written. The figures are flat
    colours on white: the palette file is a few times smaller than a true-colour one and encodes
    in half the time, and the reports embed it as it is (no second encoding)."""
    import matplotlib
    from PIL import Image

    raw = io.BytesIO()
    with matplotlib.rc_context(_PNG_TEXT):
        fig.savefig(raw, dpi=DPI, format="rgba")
    width, height = (int(v) for v in fig.get_size_inches() * DPI)  # as Agg sizes its canvas
    data = raw.getvalue()
    if len(data) != 4 * width * height:  # never seen; a rounding of the canvas size would land here
        with matplotlib.rc_context(_PNG_TEXT):
            fig.savefig(path, dpi=DPI, format="png")
        return
    image = Image.frombuffer("RGBA", (width, height), data, "raw", "RGBA", 0, 1).convert("RGB")
    # the palette from a quarter of the pixels (every other one of every other row: a figure's
    # colours are areas, or lines and glyph edges at least two pixels across), then every pixel
    # mapped to its nearest colour: the octree of the whole image costs twice as much, for the same
    # error (mean and largest difference from the drawn RGB, over the report's figures)
    sample = image.resize((max(width // 2, 1), max(height // 2, 1)), Image.Resampling.NEAREST)
    colours = sample.quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    palette = image.quantize(palette=colours, dither=Image.Dither.NONE)
    palette.save(path, format="PNG", compress_level=3)  # half the time of the default 6, 1.2x the bytes


def curve_colours(count: int) -> list[Any]:
    """``count`` distinct colours for curves on one Axes: ``tab10``, or ``tab20`` past ten."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]


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
        grid = _StateGrid(len(rows), 2, _PANEL_INCHES, bar_columns={1} if bar is not None else False)
        for r, (frame, snapshots) in enumerate(rows):
            for c, (k, t) in enumerate(((0, t0), (-1, t1))):
                panel = f"{head if r == c == 0 else ''}{frame}, t = {t:g}"
                key = bar if c == 1 else None
                grid.draw(2 * r + c, snapshots[k], color=color, title=panel, color_label=key)
        written.append(grid.save(out / "states.png", formats))

    if _has_data(series, "energy"):
        fig = _new_figure(5.5, 3.6, margins=_RUN_PLOT_MARGINS)
        ax = draw_series(fig.add_subplot(1, 1, 1), times, series["energy"], ylabel="energy E", label="E(t)")
        if energy_max is not None and math.isfinite(energy_max):
            ax.axhline(energy_max, color="0.3", linestyle="--", linewidth=1.0, label=E_MAX_LABEL)
            ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{head}energy", fontsize=10, y=1.0)
        written.append(_save(fig, out / "energy.png", formats))

    cosines = [key for key in _COSINE_KEYS if _has_data(series, key)]
    has_n_eff = _has_data(series, _N_EFF_KEY)
    if cosines or has_n_eff:
        fig = _new_figure(5.5, 3.6, margins=_TWIN_PLOT_MARGINS if has_n_eff else _RUN_PLOT_MARGINS)
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
        written.append(_save(fig, out / "collapse.png", formats))
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
    room = max(_TITLE_INCHES, 0.08 + lines * size * 1.4 / 72)  # a third line of title: a taller row
    grid = _StateGrid(nrows, cols, _GRID_PANEL_INCHES, bar_columns=bars, title_room=room)
    for i, panel in enumerate(panels):
        if panel is None:  # an empty cell
            continue
        grid.draw(
            i, panel["x"], color=panel.get("color"), title=titles[i], color_label=labels[i], title_size=size
        )
    return grid.save(Path(path), formats)


# The widest advance per character of the report's panel titles (DejaVu Sans, mixed text: 0.062 in
# at 8 pt), per point of font size.
_CHAR_INCHES_PER_POINT = 0.0625 / 8


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
    fig = _new_figure(5.5, 3.6)
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
    return _save(fig, Path(path), formats)


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
    return _save(fig, Path(path), formats)


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
        grid = _StateGrid(1, 2, _PANEL_INCHES, bar_columns={1} if bar is not None else False)
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
    fig = _new_figure(5.5, 3.6, margins=_RUN_PLOT_MARGINS)
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
    return _save(fig, Path(path), formats)
