"""A sweep's results table: ``results.parquet`` and ``results.csv``, one row per point.

Columns in first-seen order, missing entries null; each column has one type (bool, int64,
float64, or strings, with JSON for lists). Both files are written atomically
(:func:`attnflow.io.atomic.replacing`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnflow.io.atomic import replacing

__all__ = ["RESULTS_CSV", "RESULTS_PARQUET", "read_results", "write_results"]

RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _column(values: list[Any]):
    """A pyarrow array of one type: bool, int64, float64, or strings (JSON for lists)."""
    import pyarrow as pa

    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.bool_() if present else pa.null())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.int64())
    if all(_is_number(v) for v in present):
        floats = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]
        return pa.array(floats, type=pa.float64())
    return pa.array(
        [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], type=pa.string()
    )


def write_results(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.parquet`` and ``results.csv`` (atomically) in ``out_dir``; columns in
    first-seen order, missing entries null."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    table = pa.table({name: _column([row.get(name) for row in rows]) for name in names})
    paths = out_dir / RESULTS_PARQUET, out_dir / RESULTS_CSV
    for path, write in zip(paths, (pq.write_table, pa_csv.write_csv), strict=True):
        with replacing(path) as tmp:
            write(table, tmp)
    return paths


class NotASweepError(FileNotFoundError, ValueError):
    """The folder given is not a sweep folder (bad input: a ``ValueError``)."""


def read_results(sweep_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of ``sweep_dir/results.parquet`` as dicts."""
    import pyarrow.parquet as pq

    path = Path(sweep_dir) / RESULTS_PARQUET
    if not path.is_file():
        raise NotASweepError(
            f"phase: `DIR` must be a sweep folder with {RESULTS_PARQUET}; got {str(sweep_dir)!r}."
        )
    return pq.read_table(path).to_pylist()
