"""Checks of what :class:`attnflow.io.store.TrajectoryWriter` is given (sizes, dtypes, labels,
gauges, attributes, each snapshot's time, positions and radii): one line naming the argument, the
rule and the value, before anything is written."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attnflow.io.store_read import _RESERVED_ATTRS, _STORE_ATTRS, _WHERE

_DTYPES = ("float64", "float32")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{_WHERE}: `{name}` must be a positive integer; got {value!r}.")
    return int(value)


def _check_dtype(dtype: Any) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(f"{_WHERE}: `dtype` must be one of {_DTYPES}; got {dtype!r}.")
    return name


def _is_real(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)


def _check_xi(xi: Any, n: int) -> np.ndarray:
    xi = np.asarray(xi)
    if xi.ndim not in (1, 2) or xi.shape[0] != n:
        raise ValueError(f"{_WHERE}: `xi` must have shape (n,) or (n, k) with n = {n}; got {xi.shape}.")
    if not _is_real(xi):
        raise ValueError(f"{_WHERE}: `xi` must hold integers or floats; got dtype {xi.dtype}.")
    if np.issubdtype(xi.dtype, np.integer):
        return xi.astype(np.int64)
    xi = xi.astype(np.float64)
    if not np.isfinite(xi).all():
        raise ValueError(f"{_WHERE}: `xi` must be finite; got {_nonfinite_summary(xi)}.")
    return xi


def _check_gauge(gauge: Any, n: int, d: int) -> np.ndarray | None:
    if gauge is None:
        return None
    gauge = np.asarray(gauge)
    if gauge.shape != (n, d, d):
        raise ValueError(f"{_WHERE}: `gauge` must have shape (n, d, d) = {(n, d, d)}; got {gauge.shape}.")
    if not _is_real(gauge) or not np.isfinite(gauge).all():
        raise ValueError(
            f"{_WHERE}: `gauge` must hold finite real numbers; got dtype {gauge.dtype}"
            + (f", {_nonfinite_summary(gauge)}." if _is_real(gauge) else ".")
        )
    return gauge


def _check_rope_angles(angles: Any, n: int, d: int) -> np.ndarray | None:
    if angles is None:
        return None
    angles = np.asarray(angles)
    if angles.ndim != 2 or angles.shape[0] != n or not 1 <= angles.shape[1] <= d // 2:
        raise ValueError(
            f"{_WHERE}: `rope_angles` must have shape (n, m) with n = {n}, 1 <= m <= d // 2 = {d // 2}; "
            f"got {angles.shape}."
        )
    if not _is_real(angles) or not np.isfinite(angles).all():
        raise ValueError(f"{_WHERE}: `rope_angles` must hold finite real numbers; got dtype {angles.dtype}.")
    return angles.astype(np.float64)


def _check_attrs(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    if attrs is None:
        return {}
    if not isinstance(attrs, Mapping):
        raise ValueError(f"{_WHERE}: `attrs` must be a dict; got {type(attrs).__name__}.")
    reserved = [key for key in (*_RESERVED_ATTRS, *_STORE_ATTRS) if key in attrs]
    if reserved:
        raise ValueError(
            f"{_WHERE}: `attrs` must not use the store's own keys {(*_RESERVED_ATTRS, *_STORE_ATTRS)}; "
            f"got {reserved[0]!r}."
        )
    try:
        return json.loads(json.dumps(dict(attrs), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{_WHERE}: `attrs` must be JSON-serialisable (finite numbers, strings, lists, "
            f"dicts); got {error}."
        ) from None


def _check_time(t: Any, t_last: float) -> float:
    if np.ndim(t) != 0 or not _is_real(np.asarray(t)):
        raise ValueError(f"{_WHERE}: `t` must be a real scalar; got {t!r}.")
    t = float(t)
    if not math.isfinite(t):
        raise ValueError(f"{_WHERE}: `t` must be finite; got {t!r}.")
    if t <= t_last:
        raise ValueError(
            f"{_WHERE}: `t` must be greater than the previous snapshot's time {t_last!r}; got {t!r}."
        )
    return t


def _check_x(x: Any, shape: tuple[int, int]) -> np.ndarray:
    x = np.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{_WHERE}: `x` must have shape (n, d) = {shape}; got {x.shape}.")
    if not _is_real(x):
        raise ValueError(f"{_WHERE}: `x` must hold real numbers; got dtype {x.dtype}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{_WHERE}: `x` must be finite; got {_nonfinite_summary(x)}.")
    return x


def _check_r(r: Any, n: int, *, kept: bool) -> np.ndarray | None:
    if r is None:
        if kept:
            raise ValueError(f"{_WHERE}: `r` must be given: this store keeps the radii; got None.")
        return None
    if not kept:
        raise ValueError(
            f"{_WHERE}: `r` must be left out: this store keeps no radii (create it with radii=True); "
            "got an array."
        )
    r = np.asarray(r)
    if r.shape != (n,) or not _is_real(r):
        raise ValueError(
            f"{_WHERE}: `r` must be a real array of shape (n,) = ({n},); got {r.dtype} {r.shape}."
        )
    if not (np.isfinite(r).all() and (r > 0).all()):
        raise ValueError(f"{_WHERE}: `r` must be finite and positive; got min {float(np.min(r))!r}.")
    return r


def _nonfinite_summary(array: np.ndarray) -> str:
    bad = ~np.isfinite(array)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} non-finite entries, the first at index {first}"
