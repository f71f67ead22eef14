"""What a reader of a figure sees, checked from matplotlib's renderer after the figure is drawn.

:func:`layout_problems` lists, for one drawn figure, each piece of text (titles, axis labels, tick
labels, colour bar labels, legend entries) that leaves the figure (clipped), overlaps another piece
of text, or lies on another panel (a colour bar's label over the next panel); and each colour
mapping (a scatter coloured by values, an image) without a key (a colour bar of the same colour map
and range, or a legend). :func:`capture_figures` records every figure saved while it is active, so
that a test can check the figures a ``write_*`` function makes without changing that function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

TOLERANCE_PX = 1.0  # boxes that touch within a pixel (anti-aliasing) do not count as overlapping


def _visible(artist) -> bool:
    return artist.get_visible() and bool(getattr(artist, "get_text", lambda: "x")().strip())


def _axis_texts(ax) -> list:
    """Every drawn text of ``ax``: title, axis labels, the tick labels drawn, legend entries."""
    if not ax.get_visible():
        return []
    texts = [ax.title, ax._left_title, ax._right_title]
    if ax.axison:
        for axis in ax._axis_map.values():
            if not axis.get_visible():
                continue
            texts.append(axis.label)
            for tick in axis._update_ticks():
                texts += [tick.label1, tick.label2] if tick.get_visible() else []
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        texts += list(legend.get_texts())
    texts += [t for t in ax.texts]
    return [t for t in texts if _visible(t)]


def _shrunk(box: Bbox) -> Bbox:
    return Bbox.from_extents(
        box.x0 + TOLERANCE_PX, box.y0 + TOLERANCE_PX, box.x1 - TOLERANCE_PX, box.y1 - TOLERANCE_PX
    )


def _overlap(a: Bbox, b: Bbox) -> bool:
    a, b = _shrunk(a), _shrunk(b)
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _name(ax) -> str:
    return f"{'colour bar' if hasattr(ax, '_colorbar') else 'axes'} {ax.get_title() or ax.get_ylabel()!r}"


def _mappables(ax) -> list:
    return [
        m for m in [*ax.collections, *ax.images] if m.get_array() is not None and np.size(m.get_array()) > 0
    ]


def _keyed(mappable, keys: list, has_legend: bool) -> bool:
    """Whether ``mappable`` has a key: its own colour bar, a legend, or a colour bar or colour key
    (an image of gid "colour key", as attnflow's grids draw them) of its colour map and range."""
    if getattr(mappable, "colorbar", None) is not None or has_legend:
        return True
    return (mappable.cmap.name, mappable.norm.vmin, mappable.norm.vmax) in keys


def layout_problems(fig: Figure) -> list[str]:
    """Clipped or overlapping text, text on another panel, and colour mappings without a key, of
    the figure ``fig`` as last drawn (draw it first: ``savefig`` or ``fig.canvas.draw()``)."""
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    problems: list[str] = []
    texts = [(ax, t, t.get_window_extent(renderer)) for ax in fig.axes for t in _axis_texts(ax)]
    for ax, text, box in texts:
        inside = _shrunk(box)
        if inside.x0 < page.x0 or inside.y0 < page.y0 or inside.x1 > page.x1 or inside.y1 > page.y1:
            problems.append(
                f"clipped: {text.get_text()!r} of {_name(ax)} at {box.bounds} outside {page.bounds}"
            )
    for i, (ax_a, a, box_a) in enumerate(texts):
        for ax_b, b, box_b in texts[i + 1 :]:
            if _overlap(box_a, box_b):
                problems.append(
                    f"overlap: {a.get_text()!r} of {_name(ax_a)} and {b.get_text()!r} of {_name(ax_b)}"
                )
    for ax_a, a, box_a in texts:
        for ax_b in fig.axes:
            boxes = getattr(ax_b, "panel_boxes", None)
            if boxes is not None:  # one Axes under several panels: each panel's own box counts
                for k, rect in enumerate(boxes):
                    panel = Bbox.from_bounds(*rect).transformed(fig.transFigure)
                    if getattr(a, "panel_index", None) == k:  # a legend inside its own panel: inside it
                        inside = _shrunk(box_a)
                        if not (panel.x0 <= inside.x0 and inside.x1 <= panel.x1 and panel.y0 <= inside.y0
                                and inside.y1 <= panel.y1):  # fmt: skip
                            problems.append(f"leaves its panel: {a.get_text()!r} of {_name(ax_a)}")
                    elif _overlap(box_a, panel):
                        problems.append(f"on another panel: {a.get_text()!r} of {_name(ax_a)} over a panel")
                continue
            if ax_b is ax_a or not ax_b.get_visible() or getattr(ax_b, "name", "") == "3d":
                continue  # a 3-D panel's box is its whole cell, drawn or not
            if ax_b.bbox.bounds == ax_a.bbox.bounds:
                continue  # a twin Axes shares the panel
            if _overlap(box_a, ax_b.bbox):
                problems.append(f"on another panel: {a.get_text()!r} of {_name(ax_a)} over {_name(ax_b)}")
    bars = [m.colorbar for ax in fig.axes for m in _mappables(ax) if getattr(m, "colorbar", None) is not None]
    drawn_keys = [m for ax in fig.axes for m in ax.images if m.get_gid() == "colour key"]
    keys = [(b.mappable.cmap.name, b.norm.vmin, b.norm.vmax) for b in bars] + [
        (m.cmap.name, m.norm.vmin, m.norm.vmax) for m in drawn_keys
    ]
    has_legend = any(ax.get_legend() is not None for ax in fig.axes) or bool(fig.legends)
    for ax in fig.axes:
        if hasattr(ax, "_colorbar"):
            continue
        for m in _mappables(ax):
            values = np.asarray(m.get_array(), dtype=float)
            if np.ptp(values[np.isfinite(values)]) > 0 if np.isfinite(values).any() else False:
                if not _keyed(m, keys, has_legend):
                    problems.append(
                        f"no key: a colour mapping ({m.cmap.name}) of {_name(ax)} without colour bar"
                    )
    return problems


@contextlib.contextmanager
def capture_figures(monkeypatch) -> Iterator[list[Figure]]:
    """Every figure saved (``Figure.savefig``, movie frames included) while active, each checked by
    the caller after it is drawn: the list holds ``(figure, problems)`` pairs."""
    saved: list = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        # savefig draws at its own dpi and restores the figure's: draw again at the figure's, so
        # that the cached label positions and the renderer agree
        self.canvas.draw()
        saved.append((self, layout_problems(self)))
        return out

    monkeypatch.setattr(Figure, "savefig", savefig)
    yield saved
