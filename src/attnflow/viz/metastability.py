"""The figures of metastability: plateau lifetimes against β, and the noisy threshold in κ.

Both read plain rows (``attnflow.workflows.metastability.lifetime_rows`` and
``attnflow.workflows.noise_threshold.threshold_rows``); nothing is simulated here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.analysis.plateaus import LifetimeFits
from attnflow.viz.figure_files import save_figure

__all__ = ["write_lifetime_figure", "write_threshold_figure"]


def _save(fig: Figure, path: str | Path) -> Path:
    fig.tight_layout()
    return save_figure(fig, path)


def _completed(rows: Sequence[Mapping]) -> list[Mapping]:
    """The rows the fits use (``metastable``: completed, a few separated clusters)."""
    return [r for r in rows if r["metastable"]]


def write_lifetime_figure(path: str | Path, rows: Sequence[Mapping], fits: LifetimeFits) -> Path:
    """Left: ``log T`` against β (the metastable plateaus with ``fits.clusters`` clusters, the
    others grey) and the fitted line. Right: ``log T`` against ``β (1 − cos δ)``, every metastable
    plateau coloured by its cluster count, the fitted line and the slope-1 prediction."""
    fig = Figure(figsize=(8.4, 3.6))
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    done = _completed(rows)
    counts = sorted({int(r["n_clusters"]) for r in done})
    for count in counts:
        mine = [r for r in done if r["n_clusters"] == count]
        beta = np.array([r["beta"] for r in mine])
        log_t = np.log([r["lifetime"] for r in mine])
        barrier = beta * (1.0 - np.cos([r["closest_angle"] for r in mine]))
        colour = f"C{(count - 2) % 10}"
        if count == fits.clusters:
            left.plot(beta, log_t, "o", color=colour, markersize=4, label=f"{count} clusters")
        else:
            left.plot(beta, log_t, ".", color="0.7", markersize=3)
        right.plot(barrier, log_t, "o", color=colour, markersize=3.5, label=f"{count} clusters")
    b = np.linspace(min(r["beta"] for r in done), max(r["beta"] for r in done), 2)
    fit = fits.beta
    left.plot(b, fit.intercept + fit.slope * b, "-", color="k", linewidth=1,
              label=f"slope {fit.slope:.2f} ± {fit.slope_stderr:.2f}, r² {fit.r2:.2f}")  # fmt: skip
    left.plot([], [], ".", color="0.7", label="other counts")
    left.set_xlabel("β")
    left.set_ylabel("log lifetime (rescaled time t e^β)")
    left.set_title(f"plateaus with {fits.clusters} clusters", fontsize=9)
    fit = fits.barrier
    x = np.linspace(0.0, max(r["beta"] * (1 - math.cos(r["closest_angle"])) for r in done), 2)
    right.plot(x, fit.intercept + fit.slope * x, "-", color="k", linewidth=1,
               label=f"slope {fit.slope:.2f} ± {fit.slope_stderr:.2f}, r² {fit.r2:.2f}")  # fmt: skip
    right.plot(x, fit.intercept + x, ":", color="k", linewidth=1, label="slope 1 (prediction)")
    right.set_xlabel("β (1 − cos δ),  δ: angle of the closest clusters")
    right.set_title("every completed metastable plateau", fontsize=9)
    for ax in (left, right):
        ax.grid(True, linewidth=0.3, alpha=0.5)
        ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def write_threshold_figure(path: str | Path, rows: Sequence[Mapping]) -> Path:
    """The measured rate of the density mode against ``κ/κ_c`` (one colour per β), in units of
    ``k² I_k(β)/β``, with the prediction ``1 − κ_c/κ``; the measured thresholds in the legend."""
    fig = Figure(figsize=(5.6, 3.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    betas = sorted({r["beta"] for r in rows})
    top = 1.0
    for i, beta in enumerate(betas):
        mine = [r for r in rows if r["beta"] == beta]
        kappa_c, measured = mine[0]["kappa_c_predicted"], mine[0]["kappa_c_measured"]
        unit = mine[0]["k"] ** 2 / kappa_c  # k² I_k(β)/β
        f = np.array([r["kappa"] for r in mine]) / kappa_c
        top = max(top, float(f.max()))
        ax.plot(f, np.array([r["rate_measured"] for r in mine]) / unit, "o", color=f"C{i}",
                label=f"β = {beta:g}: κ_c {measured:.3f} measured, {kappa_c:.3f} predicted")  # fmt: skip
    f = np.linspace(0.55, top * 1.05, 200)
    ax.plot(f, 1.0 - 1.0 / f, "-", color="k", linewidth=1, label="prediction 1 − κ_c/κ")
    ax.axhline(0.0, color="0.5", linewidth=0.6)
    ax.axvline(1.0, color="0.5", linewidth=0.6, linestyle=":")
    ax.set_xlabel("κ / κ_c   (κ_c = β / I_1(β))")
    ax.set_ylabel("rate of the density mode k = 1 / (I_1(β)/β)")
    ax.set_title("noisy model on the circle: the uniform state's threshold", fontsize=9)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)
