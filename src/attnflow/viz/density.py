"""Figures of a density run (``attnflow run`` with a ``[density]`` section): the law itself.

- :func:`write_circle_figure` (S^1): ``f`` over angle × label as a heat map at a few times, and the
  marginal law ``Σ_l ρ_l f(·, ξ_l)`` at those times;
- :func:`write_sphere_figure` (S^2): maps of the marginal law (longitude × latitude, the
  Gauss–Legendre grid) at a few times;
- :func:`write_series_figure`: the metric series (energy, spreads, resolution, mass error).

Matplotlib only (no pyplot: figures are freed with their last reference), NumPy inputs read from
the store; nothing is simulated here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attnflow.viz.plotting import curve_colours, save_figure

__all__ = ["figure_times", "write_circle_figure", "write_series_figure", "write_sphere_figure"]

PANELS = 4  # snapshots drawn: the first, the last and evenly spaced ones between


def figure_times(count: int, panels: int = PANELS) -> np.ndarray:
    """Indices of at most ``panels`` snapshots among ``count``, evenly spaced, first and last included."""
    return np.unique(np.round(np.linspace(0, count - 1, min(panels, count))).astype(int))


def write_circle_figure(
    path: str | os.PathLike[str], *, theta, labels, weights, ts: Sequence[float], fs, title: str = ""
) -> Path:
    """``fs (K, L, M)`` at times ``ts (K,)``: one heat map per time (angle across, label node up;
    the colour is ``f`` w.r.t. ``dθ``) and a last panel with the marginal law at every time."""
    theta, labels, weights = (np.asarray(a, dtype=float) for a in (theta, labels, weights))
    fs = np.asarray(fs, dtype=float)
    count = fs.shape[0]
    fig = Figure(figsize=(3.2 * (count + 1), 3.4), layout="constrained")
    axes = fig.subplots(1, count + 1)
    low, top = float(np.min(fs)), float(np.max(fs))
    edges = np.append(theta, 2 * np.pi) - np.pi / theta.size  # cells centred on the grid angles
    rows = np.arange(labels.size + 1) - 0.5
    for ax, t, f in zip(axes[:-1], ts, fs, strict=True):
        image = ax.pcolormesh(edges, rows, f, vmin=low, vmax=top, cmap="magma", shading="flat")
        ax.set(title=f"t = {float(t):g}", xlabel="angle θ")
        ticks = np.unique(np.round(np.linspace(0, labels.size - 1, min(5, labels.size))).astype(int))
        ax.set_yticks(ticks, [f"{labels[k]:.3g}" for k in ticks])
    axes[0].set_ylabel("label node ξ")
    fig.colorbar(image, ax=axes[:-1], label="density f(θ, ξ)", shrink=0.9)
    marginal_ax = axes[-1]
    for colour, t, f in zip(curve_colours(count), ts, fs, strict=True):
        marginal_ax.plot(theta, weights @ f, color=colour, label=f"t = {float(t):g}")
    marginal_ax.axhline(1 / (2 * np.pi), color="0.6", linewidth=0.8, linestyle=":")
    marginal_ax.set(title="marginal law Σ ρ_ξ f(θ, ξ)", xlabel="angle θ", ylabel="density")
    marginal_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def write_sphere_figure(
    path: str | os.PathLike[str], *, lat, lon, weights, ts: Sequence[float], fs, title: str = ""
) -> Path:
    """``fs (K, L, nlat, nlon)`` at times ``ts``: a map of the marginal law ``Σ_l ρ_l f_l`` per time
    (longitude across, latitude up), on one colour scale."""
    lat, lon, weights = (np.asarray(a, dtype=float) for a in (lat, lon, weights))
    marginals = np.einsum("l,klab->kab", weights, np.asarray(fs, dtype=float))
    count = marginals.shape[0]
    fig = Figure(figsize=(4.2 * count, 3.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, count))
    top = float(np.max(marginals))
    order = np.argsort(lat)
    for ax, t, marginal in zip(axes, ts, marginals, strict=True):
        image = ax.pcolormesh(
            lon, lat[order], marginal[order], vmin=0.0, vmax=top, cmap="magma", shading="nearest"
        )
        ax.set(title=f"t = {float(t):g}", xlabel="longitude (°)", aspect="equal")
    axes[0].set_ylabel("latitude (°)")
    fig.colorbar(image, ax=list(axes), label="marginal density", shrink=0.9)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


_SERIES = {  # key: (panel title, log scale)
    "energy": ("energy E", False),
    "spread": ("spread of the marginal law", False),
    "slice_spread": ("mean spread of the slices", False),
    "resolution_tail": ("resolution: top-third spectral share", True),
    "mass_error": ("mass error (max over labels)", True),
}


def write_series_figure(
    path: str | os.PathLike[str], series: Mapping[str, Sequence[float]], *, title: str = ""
) -> Path:
    """The metric series over ``series["t"]``, one panel each (log scale for the small ones)."""
    ts = np.asarray(series["t"], dtype=float)
    shown = [key for key in _SERIES if key in series]
    fig = Figure(figsize=(3.4 * len(shown), 3.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(shown)))
    for ax, key in zip(axes, shown, strict=True):
        name, log = _SERIES[key]
        values = np.asarray(series[key], dtype=float)
        shown = np.where(values > 0, values, np.nan) if log else values  # a log scale leaves zeros out
        ax.plot(ts, shown, color="C0")
        if log:
            ax.set_yscale("log")
        ax.set(title=name, xlabel="t")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
