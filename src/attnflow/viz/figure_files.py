"""Figures made and saved the one way every attnflow picture is: :func:`new_figure` (a matplotlib
``Figure`` with its own Agg canvas: no pyplot, no global backend, nothing displayed or left
registered) and :func:`save_figure` (a 256-colour palette PNG, and on request the same figure as
SVG and/or PDF beside it: ``formats=`` or ``$ATTNFLOW_FIGURE_FORMAT``, :func:`figure_formats`)."""

from __future__ import annotations

import difflib
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib itself is imported when a figure is made: `import attnflow` stays light
    from matplotlib.figure import Figure

__all__ = ["DPI", "FORMATS", "FORMAT_ENV", "figure_formats", "new_figure", "save_figure"]

DPI = 110
"""Resolution of every PNG written here."""
FORMATS = ("png", "svg", "pdf")
"""The file formats the ``write_*`` functions can write (PNG always; the others on request)."""
FORMAT_ENV = "ATTNFLOW_FIGURE_FORMAT"


def new_figure(
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
    path = Path(path)
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
