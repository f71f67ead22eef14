"""Phase diagrams of a sweep: a metric over two grid keys (the shape classes are
:mod:`attnflow.analysis.shapes`).

**Phase diagram** (:func:`phase_table`, :func:`draw_phase`, :func:`phase_figure`): the rows of a
sweep's results table are grouped by the values of two columns (``x``, ``y``); each cell shows
the metric aggregated over the rows of that cell (the other grid keys, e.g. seeds):

- a numeric column (``energy_gap``): its mean;
- a comparison ``NAME OP VALUE`` with ``OP`` one of ``>= <= == != > <`` (``n_clusters>=2``,
  ``shape==arc``, ``gradient_flow==true``): the fraction of rows where it holds (a probability,
  0 to 1);
- a text column (``shape``, ``status``): its most frequent value (categorical colours), annotated
  with its share when the cell is mixed.

**The value of a comparison** is read as the type of the column (:func:`phase_table`): a number
for a numeric column; ``true`` or ``false`` for a boolean one (TOML's spelling; Python's ``True``
and ``False`` are accepted too); text for a text column (quotes optional: ``shape=='arc'``). A
boolean or text column is compared with ``==`` or ``!=`` only. A value that cannot be of the
column's type (``gradient_flow==1``, ``n_clusters==two``, ``shape>arc``) is refused
(``ValueError``, one line), never compared to a constant false.

**Missing values** (null in the table; NaN, which the table stores as null):

- the row of a point that did not finish (``status`` "failed" or "missing": it has no
  metrics.json, :mod:`attnflow.workflows.sweep_points`) has no measurement: it is left out;
- in the row of a finished point, null means that the event never happened or was not measured
  (``collapse_time`` of a run that never collapsed; ``shape`` when d != 3): it is left out of a
  mean and of a most frequent value, and it satisfies no comparison, not even ``!=``. So
  ``collapse_time<10`` counts a seed that never collapsed as false (a cell of such seeds reads 0,
  not "n/a"), and ``collapse_time>10`` reads "collapsed, after t = 10".

A cell with no row left is blank and reads "n/a".
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

from attnflow.analysis.shapes import SHAPES
from attnflow.io.results import read_results

__all__ = [
    "BOOLEANS",
    "SHAPE_COLOURS",
    "UNFINISHED",
    "PhaseTable",
    "draw_phase",
    "parse_metric",
    "phase_figure",
    "phase_table",
    "write_phase_figure",
]

SHAPE_COLOURS = {
    "dirac": "#4d4d4d",
    "great_circle": "#1b9e77",
    "arc": "#7570b3",
    "antipodal_arcs": "#d95f02",
    "small_circle": "#e6ab02",
    "clusters": "#e7298a",
}


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


UNFINISHED = ("failed", "missing")
"""The ``status`` of a point that has no metrics (:mod:`attnflow.workflows.sweep_points`): its
row is left out where the metric has no value."""
BOOLEANS = {"true": True, "false": False, "True": True, "False": False}
"""The spellings of a boolean comparison value: TOML's (``true``), and Python's (``True``)."""
_EQUALITY = ("==", "!=")


def _split(spec: str) -> tuple[str, str | None, str | None]:
    """``"NAME OP VALUE"`` → ``(NAME, OP, VALUE as written)``; ``"NAME"`` → ``(NAME, None, None)``."""
    match = _COMPARISON.match(spec)
    if match is None:
        if not spec.strip() or any(c in spec for c in "<>=!"):
            raise ValueError(
                f"phase: `--metric` must be a column name or NAME OP VALUE with OP one of "
                f">=, <=, ==, !=, >, <; got {spec!r}. For example: --metric 'n_clusters>=2'."
            )
        return spec.strip(), None, None
    name, op, text = match.groups()
    return name, op, text


def _unquoted(text: str) -> str:
    return text.strip("'\"")


def parse_metric(spec: str) -> tuple[str, str | None, Any]:
    """``"NAME"`` → ``(NAME, None, None)``; ``"NAME>=2"`` → ``(NAME, ">=", 2.0)``;
    ``"NAME==true"`` → ``(NAME, "==", True)``; other values stay text. Without the column's type:
    :func:`phase_table` reads the value as the type of its column."""
    name, op, text = _split(spec)
    if text is None:
        return name, None, None
    if text in BOOLEANS:
        return name, op, BOOLEANS[text]
    try:
        return name, op, float(text)
    except ValueError:
        return name, op, _unquoted(text)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "text" if isinstance(value, str) else "other"


_KINDS = {"number": "numbers", "boolean": "true/false", "text": "text", "other": "other values"}


def _reference(rows: Sequence[Mapping[str, Any]], name: str, op: str, text: str, metric: str) -> Any:
    """The value of the comparison ``metric`` read as the type of the column ``name``."""
    kinds = sorted({_kind(row.get(name)) for row in rows if not _missing(row.get(name))})
    if not kinds:  # no row has a value: none satisfies the comparison, whatever its value
        return parse_metric(metric)[2]
    if len(kinds) > 1 or kinds == ["other"]:
        held = " and ".join(_KINDS[k] for k in kinds)
        raise ValueError(
            f"phase: `--metric` must compare a column of numbers, true/false or text; got {metric!r} "
            f"({name!r} holds {held})."
        )
    kind = kinds[0]
    if kind == "number":
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ValueError(
                f"phase: `--metric` must compare the numeric column {name!r} with a number "
                f"(e.g. {name}{op}2); got {metric!r}."
            )
        return value
    if op not in _EQUALITY:
        raise ValueError(
            f"phase: `--metric` must compare the {_KINDS[kind]} column {name!r} with == or != "
            f"(>=, <=, >, < compare numbers); got {metric!r}."
        )
    if kind == "boolean":
        if text not in BOOLEANS:
            raise ValueError(
                f"phase: `--metric` must compare the true/false column {name!r} with true or false "
                f"(True and False accepted); got {metric!r}."
            )
        return BOOLEANS[text]
    return _unquoted(text)


def _unfinished(row: Mapping[str, Any]) -> bool:
    return row.get("status") in UNFINISHED


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
    """Aggregate ``metric`` over the cells of ``x`` by ``y``: a mean, a fraction of rows where a
    comparison holds, or a most frequent value; the value of a comparison is read as the type of
    its column, and a missing value counts as the module doc says."""
    if not rows:
        raise ValueError("phase: the results table must have at least one row; got an empty table.")
    name, op, text = _split(metric)
    for option, column in (("--x", x), ("--y", y), ("--metric", name)):
        _column_check(rows, column, option)
    ref = None if op is None or text is None else _reference(rows, name, op, text, metric)
    xs, ys = _sorted_unique([r.get(x) for r in rows]), _sorted_unique([r.get(y) for r in rows])
    cells: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        value = row.get(name)
        if row.get(x) is None or row.get(y) is None:
            continue
        if _missing(value):  # never happened or not measured (module doc)
            if op is None or _unfinished(row):
                continue
            value = 0.0  # satisfies no comparison
        elif op is not None:
            value = float(_OPS[op](value, ref))
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


NOT_AVAILABLE = "n/a"
"""The text of a cell no row of the table reached (nothing measured there)."""


def _cell_text(table: PhaseTable, i: int, j: int) -> str:
    if table.counts[i, j] == 0:
        return NOT_AVAILABLE
    if table.categorical:
        return "" if table.share[i, j] >= 1 else f"{table.share[i, j]:.0%}"
    return f"{table.values[i, j]:.2f}" if table.probability else f"{table.values[i, j]:.3g}"


def _ink(table: PhaseTable, i: int, j: int, mappable) -> str:
    if table.counts[i, j] == 0:
        return "0.45"  # a blank (white) cell: grey text
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
    if out is not None and Path(out).suffix.lower() != ".png":  # the figure is a PNG whatever the name
        raise ValueError(f"phase: `--out` must end in '.png'; got {str(out)!r}.")
    rows = read_results(sweep_dir)
    fig = phase_figure(rows, x, y, metric, title=title)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") or "metric"
    path = Path(out) if out is not None else Path(sweep_dir) / "figures" / f"phase_{slug}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path
