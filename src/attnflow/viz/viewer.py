"""A self-contained, offline HTML viewer of a run: the tokens on the sphere, rotatable, with a
time slider; the content ``x`` beside the gauge frame ``u = Q(xi) x`` when the run has a gauge.

The page holds everything it shows (no network, no library): positions of a token subsample at a
subsample of the snapshots, as 16-bit integers in base64, and a small canvas renderer. Colour is
the label on the colour map of every attnflow picture (:mod:`attnflow.viz.colours`), with a key
naming the label's range; faint axes x1, x2, x3; under each panel the mean cosine of the shown
tokens at the shown time; play/pause (or the space bar), a speed control, and the arrow keys to
step. Dimensions above 3 show the first three coordinates (the legend says so); ``d = 2`` lies on
the equator.

The page is the template ``viewer.html`` with its three fields ``__TITLE__``, ``__LEGEND__`` and
``__DATA__`` filled in one pass over the template (:func:`fill_template`): text put into one field
is never searched for another, so a run folder named ``__DATA__`` stays a title.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

import numpy as np

from attnflow.io import store
from attnflow.io.atomic import write_text
from attnflow.viz.colours import LABEL_STOPS, label_scale

__all__ = ["fill_template", "first_three", "read_run", "viewer_html", "write_run_viewer", "write_viewer"]

MAX_TOKENS = 1000
MAX_FRAMES = 101
_FIELD = re.compile(r"__([A-Z]+)__")


def fill_template(template: str, fields: Mapping[str, str]) -> str:
    """``template`` with every ``__NAME__`` replaced by ``fields[NAME]``, in one pass: the values
    are inserted as they are and never searched again. Raises ``ValueError`` naming a field of the
    template that ``fields`` lacks."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in fields:
            raise ValueError(
                f"viewer: the template's field `__{name}__` must be given; got {sorted(fields)!r}."
            )
        return fields[name]

    return _FIELD.sub(value, template)


def first_three(xs: np.ndarray) -> np.ndarray:
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
    n_tokens: int | None = None,
    n_snapshots: int | None = None,
) -> str:
    """The page for snapshots ``xs (T, n, d)`` at times ``ts`` with labels ``xi`` and the gauge frame
    ``gauge_frame(x, tokens)`` (``u_i = Q(xi_i) x_i`` of the positions ``x (T', k, d)`` of the tokens
    ``tokens``: ``StoredTrajectory.gauge_frame``), or None without a gauge. ``n_tokens``,
    ``n_snapshots``: the run's counts when ``xs`` holds a subsample (the legend says how many are
    shown of how many)."""
    frames, tokens = store.spread(len(ts), max_frames), store.spread(xs.shape[1], max_tokens)
    x = np.asarray(xs[frames][:, tokens], dtype=np.float64)
    panels, stacks = ["content x"], [x]
    if gauge_frame is not None:
        panels.append("gauge frame u = Q(ξ) x")
        stacks.append(gauge_frame(x, tokens))
    scaled = np.round(np.clip(first_three(np.stack(stacks)), -1.0, 1.0) * 32767).astype("<i2")
    labels = np.asarray(xi).reshape(len(xi), -1)[:, 0][tokens]
    data = {
        "panels": panels,
        "times": [round(float(t), 10) for t in np.asarray(ts)[frames]],
        "phase": [round(float(p), 4) for p in label_scale(labels)],
        "stops": list(LABEL_STOPS),
        "positions": base64.b64encode(scaled.tobytes()).decode("ascii"),
        # per panel and frame: the mean cosine (1/k²) Σ_ij ⟨x_i, x_j⟩ = |mean of x_i|² of the shown tokens
        "mean_cosine": [
            [round(float(v), 4) for v in np.sum(np.mean(s, axis=1) ** 2, axis=-1)] for s in stacks
        ],
    }
    tokens_shown = f"{len(tokens)} of {n_tokens or xs.shape[1]} tokens"
    shown = f"{tokens_shown}, {len(frames)} of {n_snapshots or len(ts)} snapshots"
    legend = f"{html.escape(shown)}." + (
        f" d = {xs.shape[-1]} &gt; 3: the first three coordinates, as in the movie (the figures show"
        " instead the plane of the two leading principal directions of each snapshot)."
        if xs.shape[-1] > 3
        else ""
    )
    low, high = (float(np.min(labels)), float(np.max(labels))) if len(labels) else (0.0, 0.0)
    template = resources.files("attnflow.viz").joinpath("viewer.html").read_text(encoding="utf-8")
    return fill_template(
        template,
        {
            "TITLE": html.escape(title),
            "LEGEND": legend,
            "KEY": (
                f'<span>label ξ: {low:g}</span><span class="ramp" style="background: linear-gradient('
                f'to right, {", ".join(LABEL_STOPS)})"></span><span>{high:g}</span>'
            ),
            "DATA": json.dumps(data).replace("</", "<\\/"),
        },
    )


def write_viewer(stored, path: str | Path, *, title: str, n_tokens: int | None = None, **limits) -> Path:
    """Write the viewer of a ``StoredTrajectory`` (``attnflow.io.store.read_trajectory``) at ``path``;
    ``n_tokens``: the run's token count when ``stored`` holds a subsample of them."""
    frame = stored.gauge_frame if stored.stored_gauge is not None else None
    page = viewer_html(stored.ts, stored.xs, stored.xi, frame, title=title, n_tokens=n_tokens, **limits)
    write_text(Path(path), page)
    return Path(path)


def write_run_viewer(run_dir: str | Path, *, n_snapshots: int) -> Path:
    """Write ``viewer.html`` of the run in ``run_dir`` (what ``attnflow run`` leaves beside its
    figures) from its store, of which it reads only what it shows: ``MAX_FRAMES`` of its
    ``n_snapshots`` complete snapshots, ``MAX_TOKENS`` of its tokens."""
    run_dir = Path(run_dir)
    path = run_dir / "trajectory.zarr"
    frames = store.spread(n_snapshots, MAX_FRAMES)
    stored = store.read_trajectory(path, max_tokens=MAX_TOKENS, snapshots=frames)
    return write_viewer(
        stored,
        run_dir / "viewer.html",
        title=run_dir.name,
        n_tokens=store.token_count(path),
        n_snapshots=n_snapshots,
    )


def read_run(run_dir: Path, max_tokens: int):
    """The stored trajectory of the run in ``run_dir``, at most ``max_tokens`` of its tokens, and
    its token count."""
    path = Path(run_dir) / "trajectory.zarr"
    return store.read_trajectory(path, max_tokens=max_tokens), store.token_count(path)
