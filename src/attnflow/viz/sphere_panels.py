"""Panels of token states on an Axes the caller gives: :func:`draw_sphere` (points of ``S^2`` on a
faint wireframe sphere, in 3-D or drawn flat), :func:`draw_projection` (points of ``S^{d-1}``,
``d != 3``, on their two leading principal directions) and :func:`draw_state` (one of the two by
``d``), each colouring the tokens by a value through the label's colour map with a named colour
bar (:mod:`attnflow.viz.colours`). The flat sphere (an orthographic view on a 2-D Axes, a fraction
of the cost of a 3-D Axes) is what the written figures, grids and the movie use."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from attnflow.viz.colours import LABEL_CMAP

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw_projection", "draw_sphere", "draw_state"]

_MARKER_SIZE = 10.0


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


def _is_3d(ax: Axes) -> bool:
    return getattr(ax, "name", None) == "3d"


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
