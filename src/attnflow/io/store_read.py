"""Reading a trajectory store (``trajectory.zarr``, written by :class:`attnflow.io.store.TrajectoryWriter`;
the layout, its conventions and its crash-safety rules are described there): into NumPy
(:func:`read_trajectory`, :func:`read_gauge`, :func:`read_series`, :func:`token_count`), block by
block (:func:`iter_snapshots`, :func:`iter_radial_snapshots`) or as an xarray ``Dataset``
(:func:`open_dataset`). Every reader keeps the contiguous prefix of complete snapshots (a finite
``t[k]`` is the commit mark of snapshot ``k``) and raises :class:`CorruptStoreError` when a chunk
fails its checksum before the end of that prefix. The layout's names and attributes are here too
(:data:`_ARRAY_ATTRS`, ...), shared with the writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "CorruptStoreError",
    "NotAStoreError",
    "StoredGauge",
    "StoredTrajectory",
    "iter_radial_snapshots",
    "iter_snapshots",
    "open_dataset",
    "read_gauge",
    "read_series",
    "read_trajectory",
    "spread",
    "token_count",
]

_WHERE = "store"
_DATA_ARRAYS = ("t", "x", "xi", "gauge", "gauge_angles", "r")  # the names a metric series may not take
_RESERVED_ATTRS = ("status", "n_snapshots")
# Group attributes the store writes about itself (not part of the attrs given to the writer).
_STORE_ATTRS = ("Conventions", "title", "source", "history", "time_convention", "json_attrs")
# Snapshots per read in the readers: bounds the memory of a scan to _READ_BLOCK * n * d values.
_READ_BLOCK = 256


# CF-style attributes of the stored arrays (the model's time and positions are dimensionless).
_ARRAY_ATTRS = {
    "t": {"long_name": "time", "units": "1"},
    "x": {"long_name": "token positions on the unit sphere", "units": "1", "coordinates": "xi"},
    "r": {
        "long_name": "token radii r_i = |z_i| (pre- and peri-LN tokens z_i = r_i x_i)",
        "units": "1",
        "coordinates": "xi",
    },
    "xi": {"long_name": "frozen token labels", "units": "1"},
    "gauge": {"long_name": "gauge matrices Q(xi_i), u_i = Q(xi_i) x_i", "units": "1"},
    "gauge_angles": {
        "long_name": "RoPE angles: Q(xi_i) rotates coordinates (2k, 2k+1) by gauge_angles[i, k]",
        "units": "rad",
        "gauge_kind": "rope",
    },
}


@dataclass(frozen=True)
class StoredGauge:
    """The gauge of a store as it is stored: dense matrices ``(n, d, d)``, or RoPE's angles
    ``(n, m)`` (``Q(xi_i)`` rotates the coordinate pairs ``(2k, 2k+1)``, ``k < m``, by
    ``rope_angles[i, k]`` and leaves the others), which apply without any ``d x d`` matrix."""

    d: int
    matrices: np.ndarray | None = None
    rope_angles: np.ndarray | None = None
    dtype: str = "float64"  # of the stored positions, and of ``dense``

    def frame(self, xs: Any, tokens: Any = None) -> np.ndarray:
        """The gauge frame ``u_i = Q(xi_i) x_i`` of ``xs (..., k, d)``, the positions of the tokens
        ``tokens`` (indices; all tokens when None), as float64."""
        xs = np.asarray(xs, dtype=np.float64)
        rows = slice(None) if tokens is None else np.asarray(tokens)
        if self.matrices is not None:
            return np.einsum("nij,...nj->...ni", np.asarray(self.matrices, dtype=np.float64)[rows], xs)
        angles = np.asarray(self.rope_angles, dtype=np.float64)[rows]
        m = angles.shape[1]
        a, b = xs[..., 0 : 2 * m : 2], xs[..., 1 : 2 * m : 2]
        cos, sin = np.cos(angles), np.sin(angles)
        u = xs.copy()
        u[..., 0 : 2 * m : 2] = cos * a - sin * b
        u[..., 1 : 2 * m : 2] = sin * a + cos * b
        return u

    def dense(self) -> np.ndarray:
        """The matrices ``Q(xi_i)``, ``(n, d, d)`` (built from the angles for RoPE: ``n d²``
        numbers; :meth:`frame` needs none of them)."""
        if self.matrices is not None:
            return self.matrices
        n = self.rope_angles.shape[0]
        basis = np.broadcast_to(np.eye(self.d)[:, None, :], (self.d, n, self.d))  # e_j of every token
        return self.frame(basis).transpose(1, 2, 0).astype(self.dtype)  # Q_i e_j is column j of Q_i


@dataclass(frozen=True)
class StoredTrajectory:
    """A trajectory read back from a store, trimmed to its complete snapshots.

    Attributes:
        ts: ``(T,)`` float64 snapshot times, strictly increasing.
        xs: ``(T, n, d)`` positions in the stored dtype.
        xi: ``(n,)`` or ``(n, k)`` frozen labels.
        attrs: the config dict given to the writer (as JSON round-trips it).
        status: what ``close`` recorded, or ``"incomplete"`` when the writer never closed (or fewer
            snapshots are readable than it recorded).
        stored_gauge: the gauge as stored (:class:`StoredGauge`), or ``None`` when no gauge was set.
        rs: ``(T, n)`` radii of the tokens ``z = r x`` (pre- and peri-LN runs), or ``None``.

    ``gauge_frame(xs, tokens)`` is the gauge-frame view; ``gauge`` the dense matrices (for RoPE
    built on access: prefer ``gauge_frame`` at large d).
    """

    ts: np.ndarray
    xs: np.ndarray
    xi: np.ndarray
    attrs: dict[str, Any]
    status: str
    stored_gauge: StoredGauge | None = None
    rs: np.ndarray | None = None

    @property
    def gauge(self) -> np.ndarray | None:
        """``(n, d, d)`` gauge matrices ``Q(xi_i)``, or ``None`` when no gauge was set."""
        return None if self.stored_gauge is None else self.stored_gauge.dense()

    def gauge_frame(self, xs: Any, tokens: Any = None) -> np.ndarray:
        """``u_i = Q(xi_i) x_i`` of ``xs (..., k, d)`` of the tokens ``tokens`` (all when None);
        ``xs`` itself (as float64) when no gauge was set."""
        if self.stored_gauge is None:
            return np.array(xs, dtype=np.float64)
        return self.stored_gauge.frame(xs, tokens)


def read_trajectory(
    path: str | os.PathLike[str], *, max_tokens: int | None = None, snapshots: Any = None
) -> StoredTrajectory:
    """Read a store into memory, trimmed to its complete snapshots (a contiguous prefix).

    ``max_tokens``: keep at most that many tokens, :func:`spread` over the token order (their
    labels and gauge with them; all when None). The snapshots are read block by block, so memory
    follows the tokens kept, not the store's size. ``snapshots``: indices of complete snapshots
    (the caller knows how many there are) to read, one by one, instead of every complete one."""
    group = _open_store(path)
    n = int(group["x"].shape[1])
    rows = slice(None) if max_tokens is None or n <= max_tokens else spread(n, max_tokens)
    radii = _radii(group)
    if snapshots is None:
        recorded = group.attrs.get("n_snapshots")
        blocks = [
            (ts, xs[:, rows], None if rs is None else rs[:, rows])
            for ts, xs, rs in _complete_blocks(group["t"], group["x"], r=radii, recorded=recorded)
        ]
    else:
        blocks = [_complete_snapshot(group, int(k), rows) for k in snapshots]
    ts = np.concatenate([ts for ts, _, _ in blocks])
    xs = np.concatenate([xs for _, xs, _ in blocks])
    rs = None if radii is None else np.concatenate([rs for _, _, rs in blocks])
    xi = np.asarray(group["xi"][...])[rows]
    attrs = _decoded_attrs(group.attrs)
    status = _resolved_status(attrs, ts.shape[0])
    config = {key: value for key, value in attrs.items() if key not in (*_RESERVED_ATTRS, *_STORE_ATTRS)}
    gauge = _stored_gauge(group)
    if gauge is not None and not isinstance(rows, slice):
        gauge = replace(
            gauge,
            matrices=None if gauge.matrices is None else gauge.matrices[rows],
            rope_angles=None if gauge.rope_angles is None else gauge.rope_angles[rows],
        )
    return StoredTrajectory(ts=ts, xs=xs, xi=xi, attrs=config, status=status, stored_gauge=gauge, rs=rs)


def _radii(group: zarr.Group) -> zarr.Array | None:
    return group["r"] if "r" in group else None


def _complete_snapshot(group: zarr.Group, k: int, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Snapshot ``k`` as a block of one, ``(t (1,), x (1, kept, d), r (1, kept) or None)``; it must
    be complete."""
    ts, torn = _read_rows(group["t"], k, k + 1)
    xs, torn_x = _read_rows(group["x"], k, k + 1)
    radii = _radii(group)
    rs, torn_r = (None, set()) if radii is None else _read_rows(radii, k, k + 1)
    finite = np.isfinite(ts).all() and np.isfinite(xs).all() and (rs is None or np.isfinite(rs).all())
    if ts.shape[0] != 1 or torn or torn_x or torn_r or not finite:
        raise CorruptStoreError(
            f"store: snapshot {k} must be complete to be read; got a missing or torn one."
        )
    return ts, xs[:, rows], None if rs is None else rs[:, rows]


def spread(count: int, limit: int) -> np.ndarray:
    """At most ``limit`` indices of ``range(count)``, evenly spread, first and last included."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.round(np.linspace(0, count - 1, limit)).astype(np.int64))


def token_count(path: str | os.PathLike[str]) -> int:
    """The number of tokens a store holds (its ``x`` is ``(T, n, d)``), read from its metadata."""
    return int(_open_store(path)["x"].shape[1])


def read_gauge(path: str | os.PathLike[str]) -> StoredGauge | None:
    """The gauge of a store (dense matrices or RoPE angles), without its snapshots."""
    return _stored_gauge(_open_store(path))


def _stored_gauge(group: zarr.Group) -> StoredGauge | None:
    d, dtype = int(group["x"].shape[2]), np.dtype(group["x"].dtype).name
    if "gauge" in group:
        return StoredGauge(d=d, matrices=np.asarray(group["gauge"][...]), dtype=dtype)
    if "gauge_angles" in group:
        return StoredGauge(d=d, rope_angles=np.asarray(group["gauge_angles"][...]), dtype=dtype)
    return None


def read_series(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The metric series a store holds (what ``close(series=...)`` wrote; ``{}`` for a store
    without them), each ``(K,)`` over the ``K`` snapshots the closed store recorded."""
    group = _open_store(path)
    recorded = group.attrs.get("n_snapshots")
    if not isinstance(recorded, int):
        return {}  # series are written at close, with the count
    return {
        name: np.asarray(array[:recorded])
        for name, array in group.arrays()
        if name not in _DATA_ARRAYS and array.ndim == 1 and array.shape[0] == group["t"].shape[0]
    }


def iter_snapshots(path: str | os.PathLike[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The complete snapshots of a store as blocks ``(ts (G,), xs (G, n, d))``, in order, trimmed
    like ``read_trajectory``: memory of one block (at most ``_READ_BLOCK`` snapshots), whatever the
    store's length (metrics and figures of long runs read it this way)."""
    for ts, xs, _ in iter_radial_snapshots(path):
        yield ts, xs


def iter_radial_snapshots(
    path: str | os.PathLike[str],
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """``iter_snapshots`` with the radii: blocks ``(ts (G,), xs (G, n, d), rs (G, n))``, ``rs``
    ``None`` for a store without radii (every layer norm but pre and peri)."""
    group = _open_store(path)
    recorded = group.attrs.get("n_snapshots")
    yield from _complete_blocks(group["t"], group["x"], r=_radii(group), recorded=recorded)


def open_dataset(path: str | os.PathLike[str]) -> xr.Dataset:
    """The store as a lazy xarray Dataset, trimmed like ``read_trajectory``.

    Dimensions ``t``, ``token``, ``dim`` (plus ``label_dim`` for 2-D labels and ``gauge_dim``
    with a gauge); ``t`` is the indexed coordinate of its own dimension. ``attrs["status"]`` is the status
    ``read_trajectory`` reports. Variables load on access (no dask; call ``.chunk()`` for dask).
    """
    import xarray as xr  # heavy (pandas): only where a Dataset is opened, not to write a run

    group = _open_store(path)
    recorded = group.attrs.get("n_snapshots")
    blocks = [ts for ts, _, _ in _complete_blocks(group["t"], group["x"], r=_radii(group), recorded=recorded)]
    ts = np.concatenate(blocks)
    status = _resolved_status(dict(group.attrs), ts.shape[0])
    consolidated = group.metadata.consolidated_metadata is not None
    # `t` is read above, trimmed: xarray would load its whole index at once, torn chunk included.
    ds = xr.open_zarr(Path(path), consolidated=consolidated, chunks=None, zarr_format=3, drop_variables="t")
    if "time" in ds.dims:  # a store written before the time dimension was named `t`
        ds = ds.rename_dims({"time": "t"})
    ds = ds.isel(t=slice(0, ts.shape[0])).assign_coords(t=("t", ts, _ARRAY_ATTRS["t"]))
    ds.attrs = _decoded_attrs(ds.attrs)
    ds.attrs["status"] = status
    return ds


def _decoded_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The group's attributes with the JSON strings named by ``json_attrs`` decoded (a store
    written before that convention has none, and its nested attributes are returned as they are)."""
    decoded = dict(attrs)
    encoded = decoded.get("json_attrs")
    for key in encoded.split(",") if isinstance(encoded, str) and encoded else []:
        if isinstance(decoded.get(key), str):
            decoded[key] = json.loads(decoded[key])
    return decoded


def _open_store(path: str | os.PathLike[str]) -> zarr.Group:
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise NotAStoreError(
            f"{_WHERE}: `path` must be a trajectory store (a Zarr v3 group); got {str(path)!r}, "
            "which has no zarr.json."
        )
    group = zarr.open_group(path, mode="r", zarr_format=3)
    missing = [name for name in ("t", "x", "xi") if name not in group]
    if missing:
        raise ValueError(
            f"{_WHERE}: `path` must be a trajectory store with arrays t, x, xi; got "
            f"{str(path)!r}, which lacks {', '.join(missing)}."
        )
    return group


class NotAStoreError(FileNotFoundError, ValueError):
    """The path given is not a trajectory store (bad input: a ``ValueError``, and a
    ``FileNotFoundError`` for callers that test for a missing file)."""


class CorruptStoreError(ValueError):
    """A chunk of a store fails its checksum where no interrupted write can explain it: the data
    were damaged after they were written (a killed run only ever loses its unwritten snapshots)."""


def _complete_blocks(
    t: zarr.Array, x: zarr.Array, *, r: zarr.Array | None = None, recorded: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Yield ``(ts, xs, rs)`` blocks of complete snapshots, in order, up to the first incomplete
    one (``rs`` None for a store without radii ``r``).

    A snapshot is complete iff its ``t`` and ``x`` (and ``r``) are readable and finite. Reading block by block
    bounds memory and makes the cost follow the snapshots written, not the preallocation.
    A chunk that fails its checksum ends the prefix only where an interrupted write explains it:
    it is the last snapshot written and the store was never closed (``recorded`` is None).
    Otherwise it raises ``CorruptStoreError`` naming the chunk.
    """
    size = t.shape[0]
    for start in range(0, size, _READ_BLOCK):
        stop = min(start + _READ_BLOCK, size)
        ts, torn = _read_rows(t, start, stop)
        k = _finite_prefix(ts)
        xs, torn_x = _read_rows(x, start, start + k)
        torn |= torn_x
        k = _finite_prefix(xs)
        rs = None
        if r is not None:
            rs, torn_r = _read_rows(r, start, start + k)
            torn |= torn_r
            k = _finite_prefix(rs)
        if start + k in torn:
            _check_torn_tail(t, start + k, recorded, per_chunk=max(int(t.chunks[0]), int(x.chunks[0])))
        yield ts[:k], xs[:k], None if rs is None else rs[:k]
        if k < stop - start:
            return


def _check_torn_tail(t: zarr.Array, row: int, recorded: int | None, *, per_chunk: int = 1) -> None:
    """A torn ``row`` is the record of an interrupted write when the store was never closed and
    no snapshot after its chunk (of ``per_chunk`` snapshots) was committed; else corruption."""
    after = (row // per_chunk + 1) * per_chunk  # the torn chunk's completed snapshots are lost with it
    later = _read_rows(t, after, min(after + _READ_BLOCK, t.shape[0]))[0]
    if recorded is None and not np.isfinite(later).any():
        return  # the last write of a run that never closed its store
    path = getattr(t.store, "root", "")
    raise CorruptStoreError(
        f"{_WHERE}: snapshot {row} of {str(path)!r} fails its checksum (the chunk of `t` or `x` holding "
        "it), although later snapshots or the closed store show it was written: the store is corrupt, "
        "not the record of an interrupted run."
    )


def _finite_prefix(rows: np.ndarray) -> int:
    """Number of leading rows (along axis 0) that are entirely finite."""
    ok = np.isfinite(rows).all(axis=tuple(range(1, rows.ndim)))
    return rows.shape[0] if ok.all() else int(np.argmin(ok))


def _is_checksum_error(error: ValueError) -> bool:
    return "checksum" in str(error)


def _read_rows(array: zarr.Array, start: int, stop: int) -> tuple[np.ndarray, set[int]]:
    """``array[start:stop]``, with NaN in place of any row whose chunk fails its checksum, and the
    set of those rows. Any other error propagates."""
    try:
        return np.asarray(array[start:stop]), set()
    except ValueError as error:
        if not _is_checksum_error(error):
            raise
    rows = np.full((stop - start, *array.shape[1:]), np.nan, dtype=array.dtype)
    torn = set()
    for i in range(start, stop):
        try:
            rows[i - start] = array[i]
        except ValueError as error:
            if not _is_checksum_error(error):
                raise
            torn.add(i)
    return rows, torn


def _resolved_status(attrs: Mapping[str, Any], k: int) -> str:
    status = attrs.get("status", "incomplete")
    recorded = attrs.get("n_snapshots")
    if not isinstance(status, str) or (recorded is not None and recorded != k):
        return "incomplete"
    return status
