"""``attnflow animate RUN_DIR``: the motion of a finished (or stopped) run, from its store.

Writes ``viewer.html`` (rotatable 3-D view with a time slider, self-contained) and, unless only the
viewer is asked for, an animation (``movie.gif`` by default; ``.mp4`` where ffmpeg exists) into the
run folder, or where ``out`` says. Nothing is simulated again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from attnflow.io.config import ConfigError
from attnflow.viz.animation import check_format, write_animation
from attnflow.viz.viewer import read_run, write_viewer

__all__ = ["animate"]


def animate(
    run_dir: str | os.PathLike,
    *,
    out: str | os.PathLike | None = None,
    viewer_only: bool = False,
    fps: int = 12,
    max_tokens: int = 1000,
    max_frames: int = 100,
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Write the viewer and the animation of the run in ``run_dir``; return the written paths.
    ``progress(done, total)``: frames of the movie drawn, from 0 (for the command's progress line;
    the viewer is written first, in about a second)."""
    run_dir = Path(run_dir)
    if not (run_dir / "trajectory.zarr").exists():
        raise ConfigError(
            f"animate: `RUN_DIR` must be a run folder with trajectory.zarr; got {str(run_dir)!r}."
        )
    try:
        movie = check_format(out if out is not None else run_dir / "movie.gif")
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if fps < 1 or max_tokens < 1 or max_frames < 2:
        raise ConfigError(
            f"animate: `--fps`, `--max-tokens` must be >= 1 and `--max-frames` >= 2; "
            f"got {fps!r}, {max_tokens!r}, {max_frames!r}."
        )
    stored, n_tokens = read_run(run_dir, max_tokens)
    title = f"{run_dir.name} ({stored.status})"
    written = [
        write_viewer(stored, run_dir / "viewer.html", title=title, n_tokens=n_tokens, max_frames=max_frames)
    ]
    if not viewer_only:
        written.append(
            write_animation(
                stored,
                movie,
                title=title,
                fps=fps,
                max_tokens=max_tokens,
                max_frames=max_frames,
                progress=progress,
            )
        )
    return written
