"""The empirical law of a large run: density and mean label of the tokens on the sphere.

For ``n`` in the tens of thousands and beyond a scatter plot of every token is a solid blot (and
slow to draw); the mean-field object is the law ``μ_t = (1/n) Σ_i δ_{x_i}``. :func:`law_histogram`
bins points of ``S^{d-1}`` on an equal-area map and returns, per cell, the density relative to the
uniform law and the mean of a label colour; :func:`write_law_figure` draws both for the content
frame and the gauge frame (``law.png`` of a run folder).

Maps, by dimension:

- ``d = 3``: longitude ``φ ∈ (−π, π]`` against ``z = sin(latitude) ∈ [−1, 1]`` (Lambert's
  cylindrical equal-area projection: equal cells hold equal area, so the uniform law is flat 1);
- ``d = 2``: the angle ``θ ∈ (−π, π]`` (a one-row map);
- ``d > 3``: the two leading principal directions of the points, ``(⟨x, e₁⟩, ⟨x, e₂⟩)`` in the
  unit disc (not equal-area: the density is then relative to the mean cell count).

The caller passes a token subsample (``attnflow.analysis.summary.subsample``) when ``n`` is large;
the histogram's cost is ``O(n)`` either way. Matplotlib only here, NumPy inputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["LAW_BINS", "law_histogram", "write_law_figure"]

LAW_BINS = (72, 36)  # (longitude, sin-latitude) cells of the d = 3 map
_DPI = 110


def _coordinates(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple, tuple[str, str]]:
    """The two map coordinates of each point, their ranges, and the axis names."""
    d = x.shape[1]
    if d == 2:
        return np.arctan2(x[:, 1], x[:, 0]), np.zeros(len(x)), ((-np.pi, np.pi), (-1, 1)), ("angle θ", "")
    if d == 3:
        lon = np.arctan2(x[:, 1], x[:, 0])
        return lon, np.clip(x[:, 2], -1, 1), ((-np.pi, np.pi), (-1, 1)), ("longitude φ", "z = sin(latitude)")
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    a, b = x @ vt[0], x @ vt[1]
    return a, b, ((-1, 1), (-1, 1)), ("⟨x, e₁⟩", "⟨x, e₂⟩")


def law_histogram(
    x: ArrayLike, *, color: ArrayLike | None = None, bins: tuple[int, int] = LAW_BINS
) -> dict[str, np.ndarray]:
    """Bin the points ``x (n, d)`` of ``S^{d-1}`` on the equal-area map of the module doc.

    Returns ``density (bins)``: the fraction of points per cell divided by the fraction the uniform
    law puts there (``d ≤ 3``; mean 1 over the map) or by the mean cell fraction (``d > 3``), so 1
    everywhere for a uniform law; ``mean_color (bins)``: the mean of ``color (n,)`` over each
    cell (NaN where empty); ``edges``: the two edge arrays. ``d = 2`` uses one row.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError(f"law_histogram: `x` must be an (n, d) array with n >= 1, d >= 2; got {x.shape}.")
    bins = (bins[0], 1) if x.shape[1] == 2 else tuple(bins)
    a, b, ranges, _ = _coordinates(x)
    counts, ea, eb = np.histogram2d(a, b, bins=bins, range=ranges)
    density = counts / counts.sum() * counts.size  # equal cells: the uniform law puts 1/size in each
    mean_color = np.full(counts.shape, np.nan)
    if color is not None:
        color = np.asarray(color, dtype=float).reshape(-1)
        if color.shape[0] != x.shape[0]:
            raise ValueError(
                f"law_histogram: `color` must have one value per point ({x.shape[0]}); got {color.shape[0]}."
            )
        sums, _, _ = np.histogram2d(a, b, bins=bins, range=ranges, weights=color)
        np.divide(sums, counts, out=mean_color, where=counts > 0)
    return {"density": density, "mean_color": mean_color, "edges": (ea, eb)}


def write_law_figure(
    path: str | os.PathLike[str],
    *,
    x: ArrayLike,
    u: ArrayLike | None = None,
    color: ArrayLike | None = None,
    t: float | None = None,
    n_total: int | None = None,
) -> Path:
    """Write ``path`` (PNG): for the content frame ``x (n, d)`` and, if given, the gauge frame
    ``u (n, d)``, the density of the empirical law (log colour scale) and the mean label colour
    per cell. ``t``: the time shown in the titles; ``n_total``: the run's token count when ``x``
    is a subsample of it (said in the title)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: only when a law is drawn
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    frames = [("content", np.asarray(x, dtype=float))]
    if u is not None:
        frames.append(("gauge frame", np.asarray(u, dtype=float)))
    fig = Figure(figsize=(10.0, 3.4 * len(frames)))
    FigureCanvasAgg(fig)
    n = frames[0][1].shape[0]
    sample = f"{n} tokens" if n_total in (None, n) else f"{n} of {n_total} tokens"
    when = "" if t is None else f", t = {t:g}"
    for row, (name, points) in enumerate(frames):
        law = law_histogram(points, color=color)
        _, _, ranges, labels = _coordinates(points[:1])
        extent = (*ranges[0], *ranges[1])
        ax = fig.add_subplot(len(frames), 2, 2 * row + 1)
        positive = law["density"][law["density"] > 0]
        norm = LogNorm(vmin=max(positive.min(), 1e-3), vmax=positive.max()) if positive.size else None
        shown = np.where(law["density"] > 0, law["density"], np.nan).T
        image = ax.imshow(shown, origin="lower", extent=extent, aspect="auto", norm=norm, cmap="magma")
        fig.colorbar(image, ax=ax, label="density / uniform")
        ax.set(title=f"{name}: law ({sample}{when})", xlabel=labels[0], ylabel=labels[1])
        ax = fig.add_subplot(len(frames), 2, 2 * row + 2)
        if color is not None:
            image = ax.imshow(
                law["mean_color"].T, origin="lower", extent=extent, aspect="auto", cmap="viridis"
            )
            fig.colorbar(image, ax=ax, label="mean label")
        ax.set(title=f"{name}: mean label per cell", xlabel=labels[0], ylabel=labels[1])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    fig.clear()
    return path
