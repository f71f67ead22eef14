"""Phase diagrams of a sweep: the shape of a final state, and a metric over two grid keys.

**Shape of a final state** (d = 3, :func:`classify_shape`). The Toeplitz-cosine experiments (SPEC
§2.2 D2/D3) end on one great circle, on arcs of it, or in clusters; the final snapshot is put in one
class by these rules, tried in order (the thresholds are the module constants):

- ``"dirac"``: ``mean_cosine ≥ 0.999`` (the collapse threshold of SPEC §4).
- ``"great_circle"``: on one great circle (``planarity ≤ 0.05``), with no gap of the arc test
  below, and uniform (``|m| ≤ 0.05``; 0 for equally spaced points).
- ``"arc"``: on one great circle, and the points form exactly one arc (see below) wider than
  0.1 rad (the cluster angle θ_c of SPEC §4; a narrower one is a cluster).
- ``"antipodal_arcs"``: on one great circle, exactly two arcs (possibly narrow: two clusters)
  whose mean directions are roughly opposite (cosine ≤ −0.5).
- ``"small_circle"``: off every great circle but on one circle: the points lie within 0.05 of
  the best affine plane (fitted to the centred cloud) and leave no wide gap on it (like a
  latitude circle).
- ``"clusters"``: everything else (three or more arcs or clusters, or spread off a circle).

Arcs: the azimuths of the points in the best plane (the two leading right singular vectors of
``X``) are sorted; a gap wider than ``max(0.5 rad, 3·2π/n)`` (three times the uniform spacing)
separates arcs, and a run of points between two wide gaps is an arc when it holds at least 10% of
the tokens (smaller runs are stray points and are not counted). ``n_arcs`` is 0 for a closed ring.

These are tolerances for a state *at the end of a run*: a run too short to converge is classified
by where it is (the great circle of SPEC E5 needs τ = 100 at β = 1.5, n = 64: ``|m|`` is still 0.09
at τ = 20 on some seeds).

**Phase diagram** (:func:`phase_table`, :func:`draw_phase`, :func:`phase_figure`): the rows of a
sweep's results table are grouped by the values of two columns (``x``, ``y``); each cell shows
the metric aggregated over the rows of that cell (the other grid keys, e.g. seeds):

- a numeric column (``energy_gap``): its mean;
- a comparison ``NAME OP VALUE`` with ``OP`` one of ``>= <= == != > <`` (``n_clusters>=2``,
  ``shape==arc``): the fraction of rows where it holds (a probability, 0 to 1);
- a text column (``shape``, ``status``): its most frequent value (categorical colours), annotated
  with its share when the cell is mixed.

Rows without a value (failed points) are left out; a cell with no row is blank.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PhaseTable",
    "SHAPES",
    "classify_run",
    "classify_shape",
    "draw_phase",
    "parse_metric",
    "phase_figure",
    "phase_table",
    "shape_features",
    "write_phase_figure",
]

DIRAC_MEAN_COSINE = 0.999  # SPEC §4 collapse threshold
PLANAR_TOL = 0.05  # planarity (max distance to the best plane) of "on one great circle"
UNIFORM_TOL = 0.05  # |mean| of a uniform great circle (0 when equally spaced)
GAP_MIN = 0.5  # radians; wide gaps (arc separators) exceed max(GAP_MIN, GAP_SPACINGS * 2π/n)
GAP_SPACINGS = 3.0
ARC_MIN_MASS = 0.1  # fraction of tokens an arc must hold to count
ARC_MIN_WIDTH = 0.1  # radians; a narrower arc is a cluster (SPEC §4 theta_c)
ANTIPODAL_COS = -0.5  # two arcs are antipodal when their mean directions have cosine <= this

SHAPES = ("dirac", "great_circle", "arc", "antipodal_arcs", "small_circle", "clusters")
SHAPE_COLOURS = {
    "dirac": "#4d4d4d",
    "great_circle": "#1b9e77",
    "arc": "#7570b3",
    "antipodal_arcs": "#d95f02",
    "small_circle": "#e6ab02",
    "clusters": "#e7298a",
}


# --- the shape of a final state ---------------------------------------------------------------------


def _arcs(phi: np.ndarray) -> list[np.ndarray]:
    """Indices of the runs of sorted azimuths between wide gaps, each in increasing azimuth
    (empty list: a closed ring)."""
    n = phi.size
    order = np.argsort(phi)
    sorted_phi = phi[order]
    gaps = np.diff(np.concatenate([sorted_phi, sorted_phi[:1] + 2 * np.pi]))  # gap k follows point k
    wide = np.flatnonzero(gaps > max(GAP_MIN, GAP_SPACINGS * 2 * np.pi / n))
    if wide.size == 0:
        return []
    runs = []
    for a, b in zip(wide, np.roll(wide, -1), strict=True):
        idx = np.arange(a + 1, b + 1 if b > a else b + 1 + n) % n
        runs.append(order[idx])
    return runs


def shape_features(x: Any) -> dict[str, Any]:
    """The features behind :func:`classify_shape` for one snapshot ``x (n, 3)`` of unit rows.

    ``mean_cosine``, ``resultant`` (``|m|``), ``planarity``, ``n_arcs`` (arcs holding ≥ 10% of the
    tokens; 0 for a closed ring), ``closed_ring`` (no wide gap), ``widest_arc`` (the largest
    angular width of those arcs, radians; ``None`` with none), ``arc_cosine`` (cosine between the
    mean directions of the two heaviest arcs; ``None`` with fewer than two), ``circle_spread``
    (the largest distance to the best affine plane, fitted to ``x − m``) and ``circle_closed`` (no
    wide gap in the azimuths about the centre in that plane).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 3 or x.shape[0] < 2:
        raise ValueError(f"shape_features: `x` must be an (n, 3) array with n >= 2; got shape {x.shape!r}.")
    n = x.shape[0]
    m = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    phi = np.arctan2(x @ vt[1], x @ vt[0])
    arcs = sorted(_arcs(phi), key=len, reverse=True)
    major = [arc for arc in arcs if arc.size >= ARC_MIN_MASS * n]
    _, _, vt_c = np.linalg.svd(x - m, full_matrices=False)
    phi_c = np.arctan2((x - m) @ vt_c[1], (x - m) @ vt_c[0])
    widths = [float(np.mod(phi[arc[-1]] - phi[arc[0]], 2 * np.pi)) for arc in major]
    arc_cosine = None
    if len(major) >= 2:
        c0, c1 = (x[arc].mean(axis=0) for arc in major[:2])
        arc_cosine = float(c0 @ c1 / (np.linalg.norm(c0) * np.linalg.norm(c1)))
    return {
        "mean_cosine": float((n * m @ m - 1) / (n - 1)),
        "resultant": float(np.linalg.norm(m)),
        "planarity": float(np.max(np.abs(x @ vt[2]))),
        "circle_spread": float(np.max(np.abs((x - m) @ vt_c[2]))),
        "circle_closed": not _arcs(phi_c),
        "n_arcs": len(major),
        "closed_ring": not arcs,
        "widest_arc": max(widths) if widths else None,
        "arc_cosine": arc_cosine,
    }


def classify_shape(x: Any) -> str:
    """The class of the state ``x (n, 3)``: one of :data:`SHAPES` (rules in the module doc)."""
    f = shape_features(x)
    if f["mean_cosine"] >= DIRAC_MEAN_COSINE:
        return "dirac"
    if f["planarity"] > PLANAR_TOL:
        on_one_circle = f["circle_closed"] and f["circle_spread"] <= PLANAR_TOL
        return "small_circle" if on_one_circle else "clusters"
    if f["closed_ring"]:
        return "great_circle" if f["resultant"] <= UNIFORM_TOL else "clusters"
    if f["n_arcs"] == 1 and f["widest_arc"] > ARC_MIN_WIDTH:
        return "arc"
    if f["n_arcs"] == 2 and f["arc_cosine"] <= ANTIPODAL_COS:
        return "antipodal_arcs"
    return "clusters"


def classify_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``{"shape", "n_arcs"}`` of a run folder's final snapshot (``None`` unless d = 3 and the
    trajectory is readable)."""
    from attnflow.io.store import open_dataset

    empty = {"shape": None, "n_arcs": None}
    try:
        with open_dataset(Path(run_dir) / "trajectory.zarr") as ds:
            if ds.sizes.get("dim") != 3 or ds.sizes.get("time", 0) == 0:
                return empty
            x = np.asarray(ds["x"].isel(time=-1).values, dtype=np.float64)
    except (OSError, ValueError, KeyError):
        return empty
    features = shape_features(x)
    return {"shape": classify_shape(x), "n_arcs": features["n_arcs"]}


# --- phase diagrams ---------------------------------------------------------------------------------

_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}
_COMPARISON = re.compile(r"^\s*([^<>=!\s]+)\s*(>=|<=|==|!=|>|<)\s*([^<>=!\s].*?)\s*$")


def parse_metric(spec: str) -> tuple[str, str | None, Any]:
    """``"NAME"`` → ``(NAME, None, None)``; ``"NAME>=2"`` → ``(NAME, ">=", 2.0)``; text values stay text."""
    match = _COMPARISON.match(spec)
    if match is None:
        if not spec.strip() or any(c in spec for c in "<>=!"):
            raise ValueError(
                f"phase: `--metric` must be a column name or NAME OP VALUE with OP one of "
                f">=, <=, ==, !=, >, <; got {spec!r}. For example: --metric 'n_clusters>=2'."
            )
        return spec.strip(), None, None
    name, op, text = match.groups()
    try:
        value: Any = float(text)
    except ValueError:
        value = text.strip("'\"")
    return name, op, value


@dataclasses.dataclass(frozen=True)
class PhaseTable:
    """A metric over a grid of ``x`` by ``y`` values.

    ``values (ny, nx)``: floats (NaN for an empty cell) or, when ``categorical``, the most
    frequent category (``None`` for an empty cell); ``share (ny, nx)``: the share of that category
    (1 for numeric cells); ``counts (ny, nx)``: rows per cell.
    """

    x: str
    y: str
    metric: str
    xs: tuple[Any, ...]
    ys: tuple[Any, ...]
    values: np.ndarray
    share: np.ndarray
    counts: np.ndarray
    categorical: bool
    probability: bool


def _column_check(rows: Sequence[Mapping[str, Any]], name: str, option: str) -> None:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    if name not in columns:
        grid = [c for c in columns if "." in c]
        close = difflib.get_close_matches(name, columns, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"phase: `{option}` must be a column of the results table (grid keys: {', '.join(grid)}; "
            f"or a metric such as energy, n_clusters, shape); got {name!r}.{hint}"
        )


def _sorted_unique(values: Sequence[Any]) -> tuple[Any, ...]:
    unique = list(dict.fromkeys(v for v in values if v is not None))
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in unique):
        return tuple(sorted(unique))
    return tuple(sorted(unique, key=str))


def phase_table(rows: Sequence[Mapping[str, Any]], x: str, y: str, metric: str) -> PhaseTable:
    """Aggregate ``metric`` (see :func:`parse_metric`) over the cells of ``x`` by ``y``."""
    if not rows:
        raise ValueError("phase: the results table must have at least one row; got an empty table.")
    name, op, ref = parse_metric(metric)
    for option, column in (("--x", x), ("--y", y), ("--metric", name)):
        _column_check(rows, column, option)
    xs, ys = _sorted_unique([r.get(x) for r in rows]), _sorted_unique([r.get(y) for r in rows])
    cells: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        value = row.get(name)
        if value is None or row.get(x) is None or row.get(y) is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        if op is not None:
            try:
                value = float(_OPS[op](value, ref))
            except TypeError:
                raise ValueError(
                    f"phase: `--metric` must compare {name!r} with a value of its type; got {metric!r}."
                ) from None
        cells.setdefault((ys.index(row[y]), xs.index(row[x])), []).append(value)
    sample = [v for values in cells.values() for v in values]
    categorical = op is None and any(isinstance(v, str) for v in sample)
    shape = (len(ys), len(xs))
    values = np.full(shape, None, dtype=object) if categorical else np.full(shape, np.nan)
    share, counts = np.ones(shape), np.zeros(shape, dtype=int)
    for (i, j), cell in cells.items():
        counts[i, j] = len(cell)
        if categorical:
            (top, k), *_ = Counter(map(str, cell)).most_common(1)
            values[i, j], share[i, j] = top, k / len(cell)
        else:
            values[i, j] = float(np.mean(np.asarray(cell, dtype=float)))
    return PhaseTable(
        x=x, y=y, metric=metric, xs=xs, ys=ys, values=values, share=share, counts=counts,
        categorical=categorical, probability=op is not None,
    )  # fmt: skip


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _categories(table: PhaseTable) -> list[str]:
    present = {v for v in table.values.flat if v is not None}
    return [s for s in SHAPES if s in present] + sorted(present - set(SHAPES))


def draw_phase(ax, table: PhaseTable, *, annotate: bool = True):
    """Draw ``table`` on ``ax`` as a grid of cells (pcolormesh on cell indices; ticks are the
    values). Returns the mappable for a colour bar, or ``None`` for a categorical table."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ny, nx = table.values.shape
    edges_x, edges_y = np.arange(nx + 1) - 0.5, np.arange(ny + 1) - 0.5
    mappable = None
    if table.categorical:
        cats = _categories(table)
        palette = [SHAPE_COLOURS.get(c, f"C{k % 10}") for k, c in enumerate(cats)]
        codes = np.array([[np.nan if v is None else cats.index(v) for v in row] for row in table.values])
        ax.pcolormesh(
            edges_x, edges_y, np.ma.masked_invalid(codes), cmap=ListedColormap(palette),
            vmin=-0.5, vmax=len(cats) - 0.5, edgecolors="white", linewidth=0.5,
        )  # fmt: skip
        ax.legend(
            handles=[Patch(color=p, label=c) for p, c in zip(palette, cats, strict=True)],
            loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small",
        )  # fmt: skip
    else:
        limits = {"vmin": 0.0, "vmax": 1.0} if table.probability else {}
        mappable = ax.pcolormesh(
            edges_x, edges_y, np.ma.masked_invalid(table.values.astype(float)), cmap="viridis",
            edgecolors="white", linewidth=0.5, **limits,
        )  # fmt: skip
    if annotate and nx * ny <= 400:
        for i in range(ny):
            for j in range(nx):
                text = _cell_text(table, i, j)
                if text:
                    ax.text(
                        j, i, text, ha="center", va="center", fontsize=7, color=_ink(table, i, j, mappable)
                    )
    ax.set_xticks(range(nx), [_label(v) for v in table.xs], rotation=90 if nx > 8 else 0)
    ax.set_yticks(range(ny), [_label(v) for v in table.ys])
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim(-0.5, ny - 0.5)
    ax.set_xlabel(table.x)
    ax.set_ylabel(table.y)
    return mappable


def _cell_text(table: PhaseTable, i: int, j: int) -> str:
    if table.counts[i, j] == 0:
        return ""
    if table.categorical:
        return "" if table.share[i, j] >= 1 else f"{table.share[i, j]:.0%}"
    return f"{table.values[i, j]:.2f}" if table.probability else f"{table.values[i, j]:.3g}"


def _ink(table: PhaseTable, i: int, j: int, mappable) -> str:
    if table.categorical or mappable is None:
        return "white"
    rgba = mappable.cmap(mappable.norm(table.values[i, j]))
    return "black" if 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5 else "white"


def phase_figure(rows: Sequence[Mapping[str, Any]], x: str, y: str, metric: str, *, title: str | None = None):
    """A matplotlib ``Figure`` (no pyplot) of the phase diagram of ``rows``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = phase_table(rows, x, y, metric)
    nx, ny = len(table.xs), len(table.ys)
    fig = Figure(figsize=(min(14.0, 3.0 + 0.5 * nx), min(10.0, 2.0 + 0.4 * ny)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    mappable = draw_phase(ax, table)
    if mappable is not None:
        label = f"P({metric})" if table.probability else f"mean {metric}"
        fig.colorbar(mappable, ax=ax, label=label)
    others = [k for k in dict.fromkeys(k for r in rows for k in r) if "." in k and k not in (x, y)]
    per_cell = int(table.counts.max()) if table.counts.size else 0
    default = f"{metric}" + (f" over {', '.join(others)} ({per_cell} per cell)" if others else "")
    ax.set_title(title or default, fontsize="medium")
    fig.tight_layout()
    return fig


def write_phase_figure(
    sweep_dir: str | os.PathLike,
    x: str,
    y: str,
    metric: str,
    out: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Draw the phase diagram of a sweep folder's results table into ``out`` (PNG; default
    ``DIR/figures/phase_<metric>.png``)."""
    from attnflow.workflows.sweep import read_results

    rows = read_results(sweep_dir)
    fig = phase_figure(rows, x, y, metric, title=title)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") or "metric"
    path = Path(out) if out is not None else Path(sweep_dir) / "figures" / f"phase_{slug}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path
