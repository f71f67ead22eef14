"""An animation of a run: the tokens moving on the sphere, the content ``x`` beside the gauge frame
``u = Q(xi) x`` (when the run has a gauge), coloured by the label on the colour map of every attnflow
picture (:mod:`attnflow.viz.colours`, with its colour bar), one frame per shown snapshot. The panels
are drawn as the run's figures draw their spheres (an orthographic view on 2-D Axes, the near side
over the faded far side; laid out once, each frame only moves the points); dimensions above 3
are projected as the viewer projects them (:func:`attnflow.viz.viewer.viewed`: the three leading
principal directions of the last frame, PC 1 and PC 2 being the figures' plane of that
snapshot). GIF through Pillow (matplotlib's own dependency); MP4 needs ``ffmpeg`` on the PATH.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.animation import FFMpegWriter, FuncAnimation, PillowWriter
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.io.store import spread
from attnflow.viz.colours import LABEL_CMAP
from attnflow.viz.sphere_panels import _draw_sphere_flat, _flat_points
from attnflow.viz.viewer import viewed

__all__ = ["FORMATS", "check_format", "write_animation"]

FORMATS = (".gif", ".mp4")


def check_format(path: str | Path) -> Path:
    """``path`` if its format can be written here, else a ValueError saying why."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"animate: `--out` must end in one of {list(FORMATS)}; got {str(path)!r}.")
    if path.is_dir() or not (path.parent.is_dir() and os.access(path.parent, os.W_OK | os.X_OK)):
        raise ValueError(
            f"animate: `--out` must be a file in an existing, writable folder; got {str(path)!r}."
        )
    if path.suffix == ".mp4" and shutil.which("ffmpeg") is None:
        raise ValueError(
            f"animate: `--out` {str(path)!r} needs ffmpeg on the PATH; none found (write a .gif)."
        )
    return path


def write_animation(
    stored,
    path: str | Path,
    *,
    title: str,
    fps: int = 12,
    max_tokens: int = 1000,
    max_frames: int = 100,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write the animation of a ``StoredTrajectory`` at ``path`` (``.gif`` or ``.mp4``).
    ``progress(done, total)``: called with 0 before the first frame is drawn and after each frame
    (the command line's progress line: frames drawn of the movie's)."""
    path = check_format(path)
    frames, tokens = spread(len(stored.ts), max_frames), spread(stored.xs.shape[1], max_tokens)
    x = np.asarray(stored.xs[frames][:, tokens], dtype=np.float64)
    panels = [("content x", viewed(x))]
    if stored.stored_gauge is not None:
        u = stored.gauge_frame(x, tokens)
        panels.append(("gauge frame u = Q(ξ) x", viewed(u)))
    labels = np.asarray(stored.xi).reshape(len(stored.xi), -1)[:, 0][tokens]
    fig = Figure(figsize=(3.6 * len(panels) + 0.9, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    dots, axes = [], []
    for k, (name, points) in enumerate(panels):
        ax = _draw_sphere_flat(
            fig.add_subplot(1, len(panels), k + 1), points[0], color=labels, cmap=LABEL_CMAP, title=name
        )
        axes.append(ax)
        dots.append(ax.collections[-1])
        if np.ptp(labels) > 0:
            dots[-1].set_clim(float(labels.min()), float(labels.max()))
    fig.colorbar(dots[-1], ax=axes, shrink=0.7, label="label ξ")  # one bar: the panels share it
    heading = fig.suptitle(f"{title}   t = {stored.ts[frames[-1]]:.4g}")
    fig.canvas.draw()
    fig.set_layout_engine("none")  # laid out once: every frame has the same text boxes

    def show(k: int):
        for dot, (_, points) in zip(dots, panels, strict=True):
            order, xy, style = _flat_points(points[k])
            dot.set_offsets(xy)
            dot.set_array(labels[order])
            dot.set_sizes(style["s"])
            dot.set_alpha(style["alpha"])
        heading.set_text(f"{title}   t = {stored.ts[frames[k]]:.4g}")
        return dots

    writer = PillowWriter(fps=fps) if path.suffix == ".gif" else FFMpegWriter(fps=fps)
    if progress is not None:
        progress(0, len(frames))
    done = None if progress is None else (lambda k, total: progress(k + 1, total))
    FuncAnimation(fig, show, frames=len(frames), blit=False).save(
        path, writer=writer, dpi=80, progress_callback=done
    )
    return path
