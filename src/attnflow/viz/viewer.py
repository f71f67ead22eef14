"""A self-contained, offline HTML viewer of a run: the tokens on the sphere, rotatable, with a
time slider; the content ``x`` beside the gauge frame ``u = Q(xi) x`` when the run has a gauge.

The page holds everything it shows (no network, no library): positions of a token subsample at a
subsample of the snapshots, as 16-bit integers in base64, and a small canvas renderer. Colour is
the label's phase (position ``i/n`` or prompt ``k/K``) on a colour wheel. Dimensions above 3 show
the first three coordinates; ``d = 2`` lies on the equator.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from attnflow.analysis.distances import label_phase
from attnflow.io.atomic import write_text

__all__ = ["pick", "viewer_html", "write_viewer"]

MAX_TOKENS = 1000
MAX_FRAMES = 101


def pick(count: int, limit: int) -> np.ndarray:
    """At most ``limit`` indices of ``range(count)``, evenly spread, first and last included."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.round(np.linspace(0, count - 1, limit)).astype(np.int64))


def _three(xs: np.ndarray) -> np.ndarray:
    """``(..., d)`` -> ``(..., 3)``: the first three coordinates, zero-padded for ``d = 2``."""
    xs = xs[..., :3]
    if xs.shape[-1] < 3:
        xs = np.concatenate([xs, np.zeros((*xs.shape[:-1], 3 - xs.shape[-1]))], axis=-1)
    return xs


def viewer_html(
    ts: np.ndarray,
    xs: np.ndarray,
    xi: np.ndarray,
    gauge_frame: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
    *,
    title: str,
    max_tokens: int = MAX_TOKENS,
    max_frames: int = MAX_FRAMES,
) -> str:
    """The page for snapshots ``xs (T, n, d)`` at times ``ts`` with labels ``xi`` and the gauge frame
    ``gauge_frame(x, tokens)`` (``u_i = Q(xi_i) x_i`` of the positions ``x (T', k, d)`` of the tokens
    ``tokens``: ``StoredTrajectory.gauge_frame``), or None without a gauge."""
    frames, tokens = pick(len(ts), max_frames), pick(xs.shape[1], max_tokens)
    x = np.asarray(xs[frames][:, tokens], dtype=np.float64)
    panels, stacks = ["content x"], [x]
    if gauge_frame is not None:
        panels.append("gauge frame u = Q(ξ) x")
        stacks.append(gauge_frame(x, tokens))
    scaled = np.round(np.clip(_three(np.stack(stacks)), -1.0, 1.0) * 32767).astype("<i2")
    data = {
        "panels": panels,
        "times": [round(float(t), 10) for t in np.asarray(ts)[frames]],
        "phase": [round(float(p), 4) for p in label_phase(np.asarray(xi).reshape(len(xi), -1)[:, 0])[tokens]],
        "positions": base64.b64encode(scaled.tobytes()).decode("ascii"),
    }
    shown = f"{len(tokens)} of {xs.shape[1]} tokens, {len(frames)} of {len(ts)} snapshots"
    legend = (
        f"{html.escape(shown)}; colour: the label's phase (position i/n or prompt k/K) on a colour wheel."
        + (" d &gt; 3: the first three coordinates." if xs.shape[-1] > 3 else "")
    )
    template = resources.files("attnflow.viz").joinpath("viewer.html").read_text(encoding="utf-8")
    return (
        template.replace("__TITLE__", html.escape(title))
        .replace("__LEGEND__", legend)
        .replace("__DATA__", json.dumps(data).replace("</", "<\\/"))
    )


def write_viewer(stored, path: str | Path, *, title: str, **limits) -> Path:
    """Write the viewer of a ``StoredTrajectory`` (``attnflow.io.store.read_trajectory``) at ``path``."""
    frame = stored.gauge_frame if stored.stored_gauge is not None else None
    page = viewer_html(stored.ts, stored.xs, stored.xi, frame, title=title, **limits)
    write_text(Path(path), page)
    return Path(path)
