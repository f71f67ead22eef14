"""Particles beside the density (``workflows.density_particles``): on the left, each label's density
at the start (dashed) and at the end (solid) with the histogram of one particle run's angles at the
end (steps), in the label's colour (:mod:`attnflow.viz.colours`); on the right, the W1 distance
between the particle law and the density against n (each seed a dot, the mean a line) with its
fitted slope and the ``n^{-1/2}`` reference."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.colours import LABEL_CMAP
from attnflow.viz.plotting import save_figure

__all__ = ["plot_comparison"]

BINS = 64


def plot_comparison(f0: np.ndarray, f_end: np.ndarray, index: np.ndarray, theta: np.ndarray, result,
                    path: str | Path) -> Path:  # fmt: skip
    """Write the figure (module docstring) at ``path``: densities ``f0, f_end (L, M)`` on the uniform
    grid, one particle run's label indices and final angles ``(n,)``, and a ``Comparison``."""
    labels, grid = f_end.shape
    angles = 2.0 * np.pi * np.arange(grid) / grid
    colours = mpl.colormaps[LABEL_CMAP](np.linspace(0.0, 0.9, labels))
    fig = Figure(figsize=(10.0, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=(1.6, 1.0))
    edges = np.linspace(0.0, 2.0 * np.pi, BINS + 1)
    for label in range(labels):
        colour = colours[label]
        left.plot(angles, f0[label], ls="--", lw=0.9, color=colour)
        left.plot(angles, f_end[label], lw=1.6, color=colour, label=f"label {label + 1} of {labels}")
        mine = np.mod(theta[index == label], 2.0 * np.pi)
        counts, _ = np.histogram(mine, bins=edges, density=True)
        left.stairs(counts, edges, color=colour, lw=0.8, alpha=0.7)
    n = len(theta)
    left.set(xlabel="angle θ", ylabel="density per label", xlim=(0.0, 2.0 * np.pi),
             title=f"density (dashed t = 0, solid t = end) and {n:,} particles (steps)")  # fmt: skip
    left.title.set_fontsize(9)
    left.legend(fontsize=7, loc="upper right")
    sizes = np.asarray(result.sizes, dtype=float)
    for k, size in enumerate(sizes):
        right.scatter(np.full(result.distances.shape[1], size), result.distances[k], s=8, color="0.5")
    means = result.distances.mean(axis=1)
    right.plot(sizes, means, "o-", color=colours[0], label=f"mean: slope {result.slope:.2f}")
    right.plot(sizes, means[0] * (sizes / sizes[0]) ** -0.5, ls=":", color="0.3", label="n^-1/2")
    right.set(xscale="log", yscale="log", xlabel="tokens n", ylabel="W1 to the density (per label)")
    right.set_xticks(sizes, labels=[f"{int(size):,}" for size in sizes], minor=False)
    right.set_xticks([], minor=True)
    right.legend(fontsize=7)
    right.set_title("particle law → density", fontsize=9)
    return save_figure(fig, path)
