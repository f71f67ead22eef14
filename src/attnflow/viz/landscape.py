"""The branch diagram of a continuation: energy against the parameter, one line per branch.

Stable points (Morse index 0: strict local maxima modulo rotations) are drawn solid, unstable ones
dashed; the rows are those of ``branches.csv`` (``attnflow.workflows.landscape``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.plotting import DPI

__all__ = ["write_branch_figure"]


def _runs(stable: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b]`` of equal stability; consecutive runs share their end point."""
    runs, a = [], 0
    for i in range(1, stable.size + 1):
        if i == stable.size or stable[i] != stable[a]:
            runs.append((a, i - 1))
            a = i
    return runs


def write_branch_figure(rows: Sequence[Mapping], key: str, path: str | Path) -> Path:
    """Draw ``energy`` against ``key`` for every ``branch`` of ``rows``; write a PNG at ``path``."""
    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    branches = sorted({int(row["branch"]) for row in rows})
    colours = [f"C{i % 10}" for i in range(len(branches))]
    for colour, branch in zip(colours, branches, strict=True):
        mine = sorted((row for row in rows if int(row["branch"]) == branch), key=lambda row: row[key])
        p = np.array([row[key] for row in mine], dtype=float)
        e = np.array([row["energy"] for row in mine], dtype=float)
        stable = np.array([int(row["morse_index"]) == 0 for row in mine])
        for a, b in _runs(stable):
            b_draw = min(b + 1, p.size - 1)  # join to the next run's first point
            style = "-" if stable[a] else "--"
            ax.plot(p[a : b_draw + 1], e[a : b_draw + 1], style, color=colour, linewidth=1.4)
        shape = mine[0].get("shape", "") if mine else ""
        ax.plot([], [], "-", color=colour, label=f"branch {branch} ({shape})")
    ax.plot([], [], "-", color="0.3", label="stable (index 0)")
    ax.plot([], [], "--", color="0.3", label="unstable")
    ax.set_xlabel(key)
    ax.set_ylabel("energy")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="best")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    fig.clear()
    return path
