"""Pure helpers of the benchmark: the work one field evaluation does on each evaluation path, the
time limit of that work at measured rates, ratios, and the JSON writer (no JAX, no attnflow).

The evaluation paths of ``attnflow.numerics.summation.attention_sum`` (non-causal, "usa"), for
``n`` tokens in dimension ``d`` with the values zero-padded to ``dv`` columns:

- ``dense``: one ``n × n`` weight matrix: ``n²`` exponentials; the logits ``(n, d) × (d, n)`` and
  the sum ``(n, n) × (n, dv)``: ``2 n² (d + dv)`` flops.
- ``unrolled tiles`` (the dense evaluation of a few tiles, float64): ``m = ⌈n / b⌉`` tiles of ``b``
  slots (padding included); each of the ``m(m+1)/2`` pairs ``I ≤ J`` is evaluated once:
  ``b²`` exponentials, the logits product and ``C_IJ v_J``; the ``m(m−1)/2`` off-diagonal pairs
  also ``C_IJᵀ v_I``.
- ``tiles`` (the scanned symmetric tiles, float64): the same pairs, but every pair, diagonal ones
  included, also computes the transposed product (masked to zero on the diagonal).
- ``rows`` (float32 row blocks of ``b`` rows): ``⌈n / b⌉ · b`` rows (padding rows included), each
  against all ``n`` columns.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

PATHS = ("dense", "unrolled tiles", "tiles", "rows")


@dataclasses.dataclass(frozen=True)
class Work:
    """Exponentials and floating-point operations (matrix products: 2 per multiply-add)."""

    exps: int
    flops: int
    items: int  # tile pairs (tiles), rows (rows, dense): what the path iterates over


def padded_columns(d: int, multiple: int) -> int:
    """``d`` rounded up to a multiple of ``multiple`` (the engine pads the value matrix)."""
    return -(-d // multiple) * multiple


def evaluation_work(n: int, d: int, *, path: str, block: int | None, dv: int) -> Work:
    """The work of one field evaluation on ``path`` (see the module docstring)."""
    if path not in PATHS:
        raise ValueError(f"evaluation_work: `path` must be one of {PATHS}; got {path!r}.")
    if path == "dense":
        return Work(exps=n * n, flops=2 * n * n * (d + dv), items=n)
    if block is None or block < 1:
        raise ValueError(
            f"evaluation_work: `block` must be a positive integer on path {path!r}; got {block!r}."
        )
    m = -(-n // block)
    if path == "rows":
        rows = m * block
        return Work(exps=rows * n, flops=2 * rows * n * (d + dv), items=rows)
    pairs = m * (m + 1) // 2
    entries = block * block
    transposed = pairs if path == "tiles" else pairs - m  # the unrolled diagonal skips Cᵀ v
    flops = pairs * 2 * entries * (d + dv) + transposed * 2 * entries * dv
    return Work(exps=pairs * entries, flops=flops, items=pairs)


def limit_s(work: Work, *, exp_rate: float, matmul_rate: float) -> float:
    """Seconds for ``work`` at ``exp_rate`` exponentials/s plus ``matmul_rate`` flop/s (the two do
    not overlap in this bound: the elementwise pass and the products are separate passes)."""
    return work.exps / exp_rate + work.flops / matmul_rate


def ratio(a, b):
    """``a / b``, or None where either is missing or not finite, or ``b`` is 0."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return None
    return a / b


def finite_or_null(obj):
    """``obj`` with every non-finite float replaced by None (JSON has no NaN or Infinity), tuples as
    lists, dict keys as strings and NumPy scalars as Python numbers."""
    if type(obj).__module__ == "numpy" and hasattr(obj, "item"):
        obj = obj.item()  # a NumPy scalar (an array of more than one element raises here)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj) -> str:
    """Valid JSON (``allow_nan=False``) of ``obj`` after ``finite_or_null``; anything else that JSON
    cannot hold is an error."""
    return json.dumps(finite_or_null(obj), indent=1, allow_nan=False)


def write_json(path: Path, obj) -> None:
    path.write_text(dumps(obj) + "\n")


OTHER_SCRIPTS = "<!-- results of the other benchmark scripts: kept when run.py rewrites the report -->"


def write_report(path: Path, text: str) -> None:
    """Write the report ``text`` at ``path``, keeping the part of the old file from ``OTHER_SCRIPTS``
    on (the sections that ``expansion.py``, ``throughput.py``, ``memory.py``... fill by hand)."""
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(OTHER_SCRIPTS) :] if OTHER_SCRIPTS in old else OTHER_SCRIPTS + "\n"
    path.write_text(text.rstrip("\n") + "\n\n" + kept)
