"""The branch diagram of a continuation: energy against the parameter, one line per branch.

Stable points (Morse index 0: strict local maxima modulo rotations) are drawn solid, unstable ones
dashed; the rows are those of ``branches.csv`` (``attnflow.workflows.landscape``).

:func:`write_d3_branches` draws several such folders (one panel each, e.g. one per n) reduced to the
three D3 branches (single arc, antipodal arcs, great circle; :func:`read_branch_folder`), and
:func:`branch_summary` tabulates them (beta_c, where the single arc begins, energies at one beta).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz.figure_files import save_figure

__all__ = ["branch_summary", "read_branch_folder", "write_branch_figure", "write_d3_branches"]


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
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------- D3: branches of several folders

D3_BRANCHES = {"arc": "single arc", "antipodal_arcs": "antipodal arcs", "great_circle": "great circle"}


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file() or path.stat().st_size == 0:
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _number(text: str) -> float:
    return float(text) if text not in ("", None) else float("nan")


def read_branch_folder(folder: str | Path) -> dict:
    """One ``attnflow landscape --continue`` folder, reduced to the D3 branches.

    For each shape of :data:`D3_BRANCHES`, the highest-energy state of that shape that is stable
    (index 0) at the folder's own parameter value, else the highest-energy one of that shape. Returns
    ``{"n", "key", "value" (the config's), "branches": {label: {"state", "p", "energy", "index"}},
    "beta_c"`` (where the great circle's index first leaves 0), ``"arc_from"`` (where the single arc's
    branch begins, ``nan`` if it reaches the grid's first value), ``"transitions"}``.
    """
    folder = Path(folder)
    summary = json.loads((folder / "landscape.json").read_text())
    key = summary["continuation"]["key"]
    section, name = key.split(".")
    states = _read_csv(folder / "states.csv")
    rows = _read_csv(folder / "branches.csv")
    transitions = _read_csv(folder / "transitions.csv")
    chosen: dict[str, int] = {}
    for shape, label in D3_BRANCHES.items():
        mine = [s for s in states if s["shape"] == shape]
        stable = [s for s in mine if int(s["morse_index"]) == 0]
        if mine:
            chosen[label] = int((stable or mine)[0]["state"])
    branches = {}
    for label, state in chosen.items():
        mine = sorted((r for r in rows if int(r["branch"]) == state), key=lambda r: float(r[key]))
        branches[label] = {
            "state": state,
            "p": np.array([float(r[key]) for r in mine]),
            "energy": np.array([float(r["energy"]) for r in mine]),
            "index": np.array([int(r["morse_index"]) for r in mine]),
        }

    def first(label: str, kind: str, test) -> float:
        if label not in chosen:
            return float("nan")
        hits = [
            float(t[key])
            for t in transitions
            if int(t["branch"]) == chosen[label] and t.get("kind", "index") == kind and test(t)
        ]
        return min(hits) if hits else float("nan")

    return {
        "n": int(summary["config"]["model"]["n"]),
        "key": key,
        "value": float(summary["config"][section][name]),
        "branches": branches,
        "beta_c": first("great circle", "index", lambda t: _number(t["index_below"]) == 0),
        "arc_from": first("single arc", "end", lambda t: np.isnan(_number(t["index_below"]))),
        "transitions": transitions,
    }


def _crossing(branch: dict | None, circle: dict | None) -> float:
    """The first parameter where ``branch``'s energy rises above the great circle's (linear
    interpolation between grid points; ``nan`` if it never does or a branch is missing)."""
    if branch is None or circle is None or not branch["p"].size:
        return float("nan")
    gap = branch["energy"] - np.interp(branch["p"], circle["p"], circle["energy"])
    above = np.flatnonzero(gap > 0)
    if not above.size:
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(branch["p"][0])
    p0, p1, g0, g1 = branch["p"][i - 1], branch["p"][i], gap[i - 1], gap[i]
    return float(p0 + (p1 - p0) * (-g0) / (g1 - g0))


def branch_summary(folders: Sequence[str | Path], *, at: float = 3.0) -> list[dict]:
    """One row per folder: ``n``, ``beta_c``, ``arc_from``, ``arc_over_circle`` (where the single
    arc's energy rises above the great circle's) and each branch's energy (and index) at the
    parameter value ``at`` (``nan`` where the branch does not reach it)."""
    table = []
    for folder in folders:
        data = read_branch_folder(folder)
        row = {
            "n": data["n"],
            "beta_c": data["beta_c"],
            "arc_from": data["arc_from"],
            "arc_over_circle": _crossing(
                data["branches"].get("single arc"), data["branches"].get("great circle")
            ),
        }
        for label, branch in data["branches"].items():
            hit = np.flatnonzero(np.isclose(branch["p"], at, atol=1e-9))
            row[f"energy {label}"] = float(branch["energy"][hit[0]]) if hit.size else float("nan")
            row[f"index {label}"] = int(branch["index"][hit[0]]) if hit.size else -1
        table.append(row)
    return table


def _relative(p: np.ndarray, energy: np.ndarray, circle: dict | None) -> np.ndarray:
    """``(E − E_gc)/|E_gc|`` at ``p`` (the great circle's energy interpolated); ``E`` without one."""
    if circle is None or not circle["p"].size:
        return energy
    reference = np.interp(p, circle["p"], circle["energy"])
    return (energy - reference) / np.abs(reference)


def write_d3_branches(folders: Sequence[str | Path], path: str | Path) -> Path:
    """The D3 branch diagram of several ``attnflow landscape --continue`` folders (one panel per
    folder, e.g. per n): each branch's energy relative to the great circle's, ``(E − E_gc)/|E_gc|``
    (the energies themselves grow like ``e^β``), against the parameter,
    stable (index 0) solid, unstable dashed; ``beta_c`` (the great circle loses stability) and the
    single arc's first point marked. Writes a PNG at ``path``."""
    data = sorted((read_branch_folder(f) for f in folders), key=lambda d: d["n"])
    fig = Figure(figsize=(3.3 * len(data) + 0.6, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(data), sharey=True, squeeze=False)[0]
    colours = {label: f"C{i}" for i, label in enumerate(D3_BRANCHES.values())}
    for ax, folder in zip(axes, data, strict=True):
        circle = folder["branches"].get("great circle")
        for label, branch in folder["branches"].items():
            p, e = branch["p"], _relative(branch["p"], branch["energy"], circle)
            stable = branch["index"] == 0
            for a, b in _runs(stable):
                b_draw = min(b + 1, p.size - 1)
                style = "-" if stable[a] else "--"
                ax.plot(p[a : b_draw + 1], e[a : b_draw + 1], style, color=colours[label], linewidth=1.4)
            ax.plot([], [], "-", color=colours[label], label=label)
        if np.isfinite(folder["beta_c"]):
            ax.axvline(folder["beta_c"], color="0.4", linestyle=":", linewidth=1)
            ax.annotate(f"β_c = {folder['beta_c']:.4f}", (folder["beta_c"], 0.97), xytext=(4, 0),
                        xycoords=("data", "axes fraction"), textcoords="offset points", fontsize=7,
                        va="top")  # fmt: skip
        arc = folder["branches"].get("single arc")
        if arc is not None and arc["p"].size and np.isfinite(folder["arc_from"]):
            first = float(_relative(arc["p"][:1], arc["energy"][:1], circle)[0])
            ax.plot([arc["p"][0]], [first], "o", color=colours["single arc"], ms=3)
            ax.annotate(f"single arc from {folder['arc_from']:.3f}", (arc["p"][0], first), xytext=(6, -10),
                        textcoords="offset points", fontsize=7)  # fmt: skip
        ax.set_title(f"n = {folder['n']}", fontsize=9)
        ax.set_xlabel(folder["key"].split(".")[-1])
        ax.grid(True, linewidth=0.3, alpha=0.5)
    axes[0].set_ylabel("(E − E_great circle) / E_great circle")
    axes[0].plot([], [], "-", color="0.3", label="stable (index 0)")
    axes[0].plot([], [], "--", color="0.3", label="unstable")
    axes[0].legend(fontsize=7, loc="center left")
    fig.tight_layout()
    return save_figure(fig, path)
