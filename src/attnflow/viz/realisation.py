"""The two realisation modes compared: W1 to the targets against n, and the same numbers as a table.

The rows are those of :func:`attnflow.workflows.realize.mode_errors` (one per mode, n, sigma, seed:
``base_point_distance``, ``wasserstein``, ...). Medians over the seeds are drawn (lines) with every
seed's value (dots); a mode realised to round-off sits at ~1e-15, a mode off by ``|u* − v_0|`` well
above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.figure_files import save_figure

__all__ = ["mode_table", "write_mode_figure"]

MODE_STYLE = {"a-priori": ("--", "o"), "exact": ("-", "s")}


def _groups(rows: Sequence[Mapping]) -> dict[tuple[str, float], dict[int, list[Mapping]]]:
    """``(mode, sigma) -> {n: rows}``."""
    groups: dict[tuple[str, float], dict[int, list[Mapping]]] = {}
    for row in rows:
        by_n = groups.setdefault((str(row["mode"]), float(row["sigma"])), {})
        by_n.setdefault(int(row["n"]), []).append(row)
    return groups


def write_mode_figure(rows: Sequence[Mapping], path: str | Path) -> Path:
    """W1 (realised, targets) against ``n``, log-log, one line per (mode, sigma): the seeds' median
    (line) and each seed (dots). Writes a PNG at ``path``."""
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    groups = _groups(rows)
    sigmas = sorted({sigma for _, sigma in groups})
    colour = {sigma: f"C{i % 10}" for i, sigma in enumerate(sigmas)}
    for (mode, sigma), by_n in sorted(groups.items()):
        ns = np.array(sorted(by_n))
        w1 = [np.array([float(r["wasserstein"]) for r in by_n[n]]) for n in ns]
        line, marker = MODE_STYLE.get(mode, ("-", "o"))
        label = f"{mode}, sigma = {sigma:g}"
        ax.plot(ns, [np.median(w) for w in w1], line, marker=marker, color=colour[sigma], label=label, ms=4)
        for n, w in zip(ns, w1, strict=True):
            ax.plot(np.full(w.size, n), w, marker, color=colour[sigma], ms=2, alpha=0.4, linestyle="none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (tokens)")
    ax.set_ylabel("W1(realised, targets)")
    ax.set_title("Realisation: a-priori gauges (dashed) vs exact mode (solid)", fontsize=9)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=6, ncol=2, loc="center right")
    fig.tight_layout()
    return save_figure(fig, path)


def mode_table(rows: Sequence[Mapping]) -> str:
    """A Markdown table: per (mode, sigma), the seeds' median ``‖u* − v_0‖`` and W1 at each ``n``."""
    groups = _groups(rows)
    ns = sorted({int(r["n"]) for r in rows})
    header = "| mode | sigma | " + " | ".join(f"n = {n}: ‖u* − v0‖ / W1" for n in ns) + " |"
    lines = [header, "|" + "---|" * (2 + len(ns))]
    for (mode, sigma), by_n in sorted(groups.items()):
        cells = []
        for n in ns:
            sel = by_n.get(n, [])
            if not sel:
                cells.append("")
                continue
            gap = np.median([float(r["base_point_distance"]) for r in sel])
            w1 = np.median([float(r["wasserstein"]) for r in sel])
            cells.append(f"{gap:.1e} / {w1:.1e}")
        lines.append(f"| {mode} | {sigma:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
