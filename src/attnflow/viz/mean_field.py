"""The empirical laws of one setting at growing n, and their distances (``workflows.mean_field``). One
row per setting: the final tokens at each size as (azimuth, height) of a token subsample, coloured
by the label (the colour map of every attnflow picture, :mod:`attnflow.viz.colours`), and a last
panel with the sliced W1 distance between successive sizes against the smaller size, with the
``m^{-1/2}`` slope of independent samples for reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.colours import LABEL_CMAP, label_scale
from attnflow.viz.figure_files import save_figure

__all__ = ["plot_laws"]

SUBSAMPLE = 3000  # tokens drawn per panel


def _panel(ax, law, rng) -> object:
    keep = np.sort(rng.choice(law.n, size=min(SUBSAMPLE, law.n), replace=False))
    x, phase = law.x[keep], label_scale(law.xi)[keep]
    azimuth = np.arctan2(x[:, 1], x[:, 0])
    dots = ax.scatter(azimuth, x[:, 2], c=phase, cmap=LABEL_CMAP, vmin=0, vmax=1, s=2, rasterized=True)
    ax.set_xlim(-np.pi, np.pi)
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(f"{law.setting}, n = {law.n:,}", fontsize=9)
    return dots


def plot_laws(laws: Sequence, rows: Sequence[Mapping], path: str | Path) -> Path:
    """Write the figure (module docstring) at ``path``; ``laws`` are ``FinalLaw`` records."""
    settings = list(dict.fromkeys(law.setting for law in laws))
    sizes = sorted({law.n for law in laws})
    fig = Figure(figsize=(2.6 * (len(sizes) + 1), 2.4 * len(settings)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(settings), len(sizes) + 1, squeeze=False)
    rng = np.random.default_rng(0)
    dots = None
    for r, setting in enumerate(settings):
        mine = {law.n: law for law in laws if law.setting == setting}
        for c, n in enumerate(sizes):
            ax = grid[r, c]
            if n in mine:
                dots = _panel(ax, mine[n], rng)
            else:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("azimuth of x" if r == len(settings) - 1 else "")
            ax.set_ylabel("x_3" if c == 0 else "")
        ax = grid[r, -1]
        chain = sorted((row for row in rows if row["setting"] == setting), key=lambda row: row["n"])
        if chain:
            m = np.array([row["n"] for row in chain], dtype=float)
            ax.loglog(m, [row["to_next"] for row in chain], "o-", label="to next size")
            ax.loglog(m, chain[0]["to_next"] * np.sqrt(m[0] / m), "k:", label="∝ n^{-1/2}")
            ax.legend(fontsize=7)
        ax.set_title(f"{setting}: sliced W1", fontsize=9)
        ax.set_xlabel("n (smaller size)" if r == len(settings) - 1 else "")
    if dots is not None:
        fig.colorbar(
            dots, ax=grid[:, :-1], label="label ξ, from its smallest (0) to its largest (1) value", shrink=0.8
        )
    return save_figure(fig, path)
