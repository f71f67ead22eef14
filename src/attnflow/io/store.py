"""Crash-safe, incremental trajectory store (`trajectory.zarr`), its reader and xarray view.

A run appends one snapshot ``(t, x)`` at a time to a Zarr v3 group::

    trajectory.zarr/
      zarr.json    group attrs: the resolved config, plus "status" (and "n_snapshots" after close);
                   the consolidated metadata of every array
      t            (t,)                    float64, NaN = "not written yet"
      x            (t, token, dim)         float64 or float32, NaN = "not written yet"
      r            (t, token)              the tokens' radii, only for a layer norm whose tokens are
                                           z = r x in R^d (pre-, peri-LN); the dtype of x
      energy, mean_cosine, ...  (t,)       the run's metric series, written at ``close`` (NaN past
                                           the last snapshot, or where a metric is undefined)
      xi           (token,) or (token, label_dim)
      gauge        (token, gauge_dim, dim) Q(xi_i) when a gauge is set: u_i = Q(xi_i) x_i
      gauge_angles (token, rope_pair)      instead of ``gauge`` for RoPE: the angles theta_k xi_i of
                                           the rotations of the coordinate pairs (2k, 2k+1)
                                           (attribute gauge_kind = "rope", and d); n*m numbers
                                           instead of n*d*d

``xarray.open_zarr(path)`` reads it (without a warning: the metadata are consolidated) as a Dataset
with those dimensions; ``t`` is the coordinate of its own dimension, so ``ds.sel(t=0.3)`` selects a
snapshot, since a run stores the times ``snapshot_time(k, save_every)``: the exact decimal
``k * save_every`` rounded once, not a sum of steps. Every array carries ``long_name`` and ``units``.
The gauge's two matrix axes are named ``gauge_dim`` (rows, the gauge frame) and ``dim``
(columns, contracted with ``x``), because xarray does not support a dimension repeated in one
variable; ``xarray.dot(ds.gauge, ds.x, dim="dim")`` is then the gauge-frame view ``u``.
Stores written before these conventions (dimension ``time``, no consolidated metadata) still read.

NetCDF conventions, so that ``xarray.open_zarr(path).to_netcdf("run.nc")`` works and round-trips:
group attributes are numbers and strings only: a nested value given to the writer (the resolved
``config``) is stored as a JSON string, and the attribute ``json_attrs`` names those keys
(:func:`read_trajectory` and :func:`open_dataset` decode them; ``json.loads(ds.attrs["config"])``
does it by hand on the raw xarray view). The labels ``xi`` (positions, prompt ids: its
``long_name`` says which, from the config's ``aux.kind``) are a coordinate of ``token`` (the
CF ``coordinates`` attribute of ``x``), and the group carries CF-style global attributes:
``Conventions``, ``title``, ``source`` (attnflow and its version), ``history`` (when it was
written) and, where the config gives it, ``time_convention`` (plain time, or the rescaled time
``t e^β`` of ``model.time_scale = "rescaled"``). Stores written before (nested attributes, ``xi`` a
data variable) read as before.

Crash safety: a process killed with SIGKILL at any moment leaves every completed snapshot readable.
The design, and why each piece is there:

1. **Metadata is written once, before any data, and atomically.** The group is built (metadata of
   every array, ``xi`` and ``gauge`` data, config attrs) in a hidden sibling folder and renamed into
   place, so ``path`` either does not exist or is a fully initialised store. ``x`` is preallocated
   with shape ``(n_snapshots_max, n, d)`` and ``t`` with ``(n_snapshots_max,)``, both filled with
   NaN, so appending never resizes an array and array metadata is never rewritten (a torn metadata
   write would make every snapshot unreadable). The only later metadata write is the group's
   attrs at ``close``; zarr-python >= 3.1.3 writes every file of a ``LocalStore`` to a temporary file
   and renames it into place (zarr-python PR #3412), so a kill during ``close`` leaves either the
   old attrs (status "incomplete") or the new ones.
2. **Snapshots grouped in chunks of about 256 KiB.** ``x`` is chunked ``(S, n, d)`` and ``t``
   ``(S,)`` (:func:`snapshots_per_chunk`; ``S = 1``, a snapshot per file, when one snapshot is that
   large), so a 64-token run of 201 snapshots is a handful of files, not two per snapshot.
   Appending snapshot ``k`` rewrites its chunk file whole: zarr-python >= 3.1.3 writes it to a
   temporary file and renames it into place, so a kill leaves the old chunk (the completed
   snapshots it held) or the new one, never a mix. Completed chunks are never written again.
   (Zarr v3 sharding, with a chunk per snapshot inside each shard, was measured first: its
   appends cost 2.4 times the CPU of a file per snapshot, plain chunks of several snapshots
   1.4 times, for 201 snapshots of 64 tokens; a shard buys cheaper reads of one snapshot, which
   chunks of at most 256 KiB do not need.)
3. **Commit order.** ``append`` writes ``x[k]`` (and ``r[k]``) and only after those writes have
   returned writes ``t[k]``. The finite ``t[k]`` is the commit mark of snapshot ``k``.
4. **Checksummed chunks.** Every chunk carries a CRC32C checksum (the Zarr v3 ``crc32c`` codec), so a
   torn or garbled chunk fails to decode instead of reading as plausible numbers. With zarr >= 3.1.3
   a chunk file is replaced atomically anyway; on storage that tears writes, the only chunk that
   can be torn is the one being written: the chunk of the snapshot in progress, which also holds
   up to ``S - 1`` completed snapshots before it (with ``S = 1``, only the snapshot in progress).
5. **Readers trim to a contiguous prefix.** Snapshot ``k`` counts as complete iff ``t[k]`` is
   readable and finite and ``x[k]`` (and ``r[k]``) is readable and finite (append rejects
   non-finite data, so NaN can only mean "not written"); ``read_trajectory`` and ``open_dataset``
   keep snapshots ``0..K-1`` where ``K`` is the first incomplete one. A killed writer's store reads
   with status "incomplete".

6. **Metric series last.** ``close(status, series=...)`` writes the run's metric series (one array
   per metric on the dimension ``t``), then the status, then the consolidated metadata that lists
   them: a kill on the way leaves the snapshots as they were, the status "incomplete" or the
   series unlisted in the consolidated metadata (each array still readable by name).

Stores written before (a chunk per snapshot, no metric series) read unchanged.

What is not covered: power loss or an OS crash (nothing is fsync'ed; the page cache survives a
killed process but not a dead machine), and concurrent writers to one path. A kill can leave a
stray ``*.partial`` temporary file (from zarr, or from step 1); readers ignore it.
"""

from __future__ import annotations

import contextlib
import decimal
import errno
import json
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.errors import ZarrUserWarning

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "StoredGauge",
    "StoredTrajectory",
    "TrajectoryWriter",
    "iter_radial_snapshots",
    "iter_snapshots",
    "open_dataset",
    "read_gauge",
    "read_series",
    "read_trajectory",
    "snapshot_time",
    "snapshots_per_chunk",
]

_WHERE = "store"
_CHUNK_BYTES = 1 << 18  # snapshots per chunk file: about this many bytes of positions
_DATA_ARRAYS = ("t", "x", "xi", "gauge", "gauge_angles", "r")  # the names a metric series may not take
_SERIES_NAMES = {
    "energy": "interaction energy E",
    "mean_cosine": "mean pairwise cosine of the content",
    "gauge_mean_cosine": "mean pairwise cosine of the gauge frame",
    "n_eff": "effective number of clusters",
}
_DTYPES = ("float64", "float32")
_RESERVED_ATTRS = ("status", "n_snapshots")
# Group attributes the store writes about itself (not part of the attrs given to the writer).
_STORE_ATTRS = ("Conventions", "title", "source", "history", "time_convention", "json_attrs")
# ``xi``'s long_name by the config's ``aux.kind`` (the default: "frozen token labels")
_LABEL_NAMES = {
    "positions": "token positions i (frozen labels)",
    "prompts": "prompt ids (frozen labels)",
    "file": "frozen token labels (read from a file)",
}
_TIME_CONVENTIONS = {
    "plain": "plain time t (time scale c = 1)",
    "rescaled": "rescaled time (time scale c = exp(-beta)): a time t here is t exp(beta) in plain time",
}
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


def _codecs() -> list[Crc32cCodec]:
    return [Crc32cCodec()]


def snapshots_per_chunk(n_snapshots_max: int, snapshot_bytes: int) -> int:
    """How many consecutive snapshots share one chunk (one file): about ``_CHUNK_BYTES`` of
    positions (at least 1, at most the preallocation). Each append rewrites its chunk, so the
    bound keeps that rewrite small; 1 is a snapshot per file, as stores were before."""
    return max(1, min(int(n_snapshots_max), _CHUNK_BYTES // max(1, int(snapshot_bytes))))


def snapshot_time(k: int, save_every: float) -> float:
    """The time of snapshot ``k``: the decimal product ``k * save_every`` rounded once to a float
    (``snapshot_time(3, 0.1) == 0.3``, where ``3 * 0.1`` is 0.30000000000000004), so a stored time
    equals the number a user types, and ``ds.sel(t=0.3)`` finds it."""
    return float(decimal.Decimal(repr(float(save_every))) * int(k))


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


class TrajectoryWriter:
    """Appends snapshots to a new crash-safe Zarr v3 trajectory store (see the module docstring).

    Args:
        path: folder of the store to create (conventionally ``RUN_DIR/trajectory.zarr``).
        n_snapshots_max: number of snapshots preallocated; ``append`` accepts at most this many.
        n: number of tokens.
        d: content dimension.
        xi: ``(n,)`` or ``(n, k)`` labels, integer or float.
        gauge: ``(n, d, d)`` matrices ``Q(xi_i)``, or ``None`` when no gauge is set.
        rope_angles: ``(n, m)`` angles of a RoPE gauge (``m <= d // 2``), stored instead of its
            matrices (give ``gauge`` or ``rope_angles``, not both).
        attrs: the resolved config (JSON-serialisable), stored as the group's attributes.
        dtype: ``"float64"`` or ``"float32"``, the dtype of ``x`` and ``gauge`` (``t`` is float64).
        overwrite: replace an existing trajectory store at ``path``.
        radii: also keep a radius per token and snapshot, ``r (t, token)`` (tokens ``z = r x`` of a
            pre- or peri-LN layer); ``append`` then takes ``r``.

    Use as a context manager: leaving the block closes the store with status ``"ok"``, or
    ``"interrupted"`` / ``"error"`` when the block is left by KeyboardInterrupt / another exception.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_snapshots_max: int,
        n: int,
        d: int,
        xi: Any,
        gauge: Any = None,
        rope_angles: Any = None,
        attrs: Mapping[str, Any] | None = None,
        dtype: str = "float64",
        overwrite: bool = False,
        radii: bool = False,
    ) -> None:
        self._path = Path(path)
        n_snapshots_max = _positive_int("n_snapshots_max", n_snapshots_max)
        n = _positive_int("n", n)
        d = _positive_int("d", d)
        dtype = _check_dtype(dtype)
        xi = _check_xi(xi, n)
        gauge = _check_gauge(gauge, n, d)
        rope_angles = _check_rope_angles(rope_angles, n, d)
        if gauge is not None and rope_angles is not None:
            raise ValueError(f"{_WHERE}: `gauge` and `rope_angles` must not be given together; got both.")
        attrs = _check_attrs(attrs)
        if self._path.exists() and not overwrite:
            raise ValueError(
                f"{_WHERE}: `path` must not exist yet; got {str(self._path)!r}. "
                "Pass overwrite=True to replace it."
            )
        if self._path.exists() and not (self._path / "zarr.json").is_file():
            raise ValueError(
                f"{_WHERE}: `path` exists and is not a Zarr store, so overwrite=True will not "
                f"delete it; got {str(self._path)!r}."
            )

        self._path.parent.mkdir(parents=True, exist_ok=True)
        staging = self._path.with_name(f".{self._path.name}.{uuid.uuid4().hex}.partial")
        try:
            _create_store(
                staging,
                n_snapshots_max=n_snapshots_max,
                n=n,
                d=d,
                xi=xi,
                gauge=gauge,
                rope_angles=rope_angles,
                attrs=attrs,
                dtype=dtype,
                radii=bool(radii),
            )
            _move_into_place(staging, self._path, overwrite=overwrite)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

        self._attach(count=0, t_last=-math.inf)

    def _attach(self, *, count: int, t_last: float) -> None:
        group = zarr.open_group(self._path, mode="r+", zarr_format=3)
        self._group = group
        self._t = group["t"]
        self._x = group["x"]
        self._r = group["r"] if "r" in group else None
        self._n_snapshots_max = int(group["t"].shape[0])
        self._shape = tuple(int(s) for s in group["x"].shape[1:])
        self._dtype = np.dtype(group["x"].dtype)
        self._count = count
        self._t_last = t_last
        self._status: str | None = None

    @classmethod
    def reopen(cls, path: str | os.PathLike[str]) -> TrajectoryWriter:
        """A writer that continues an existing store after its last complete snapshot (a resumed
        run): the store is marked ``"incomplete"`` again until ``close``; a torn snapshot after
        the complete prefix is simply written over."""
        stored = read_trajectory(path)
        if stored.ts.shape[0] == 0:
            raise ValueError(
                f"{_WHERE}: `path` must hold at least one complete snapshot to resume; got {str(path)!r}."
            )
        writer = cls.__new__(cls)
        writer._path = Path(path)
        writer._attach(count=int(stored.ts.shape[0]), t_last=float(stored.ts[-1]))
        writer._group.attrs.update({"status": "incomplete", "n_snapshots": None})
        return writer

    @property
    def path(self) -> Path:
        """Folder of the store."""
        return self._path

    @property
    def n_snapshots(self) -> int:
        """Number of snapshots appended so far."""
        return self._count

    @property
    def n_snapshots_max(self) -> int:
        """Number of preallocated snapshots."""
        return self._n_snapshots_max

    @property
    def closed(self) -> bool:
        """Whether ``close`` has been called."""
        return self._status is not None

    def append(self, t: Any, x: Any, r: Any = None) -> None:
        """Write one snapshot: positions ``x`` of shape ``(n, d)`` at time ``t`` (and the radii
        ``r (n,)``, given exactly when the store keeps radii).

        ``x`` and ``r`` are written first and ``t`` last, so the snapshot is committed exactly when
        the finite ``t`` lands (module docstring, point 3).
        """
        if self._status is not None:
            raise ValueError(
                f"{_WHERE}: `append` must come before `close`; the writer was closed with "
                f"status {self._status!r}."
            )
        if self._count >= self._n_snapshots_max:
            raise ValueError(
                f"{_WHERE}: at most `n_snapshots_max` = {self._n_snapshots_max} snapshots fit; "
                f"got snapshot number {self._count + 1}. Create the writer with a larger "
                "`n_snapshots_max`."
            )
        t = _check_time(t, self._t_last)
        x = _check_x(x, self._shape)
        r = _check_r(r, self._shape[0], kept=self._r is not None)
        k = self._count
        self._x[k] = x.astype(self._dtype, copy=False)
        if r is not None:
            self._r[k] = r.astype(self._dtype, copy=False)
        self._t[k] = t
        self._count = k + 1
        self._t_last = t

    def close(self, status: str = "ok", *, series: Mapping[str, Any] | None = None) -> None:
        """Record the final ``status`` and the number of snapshots in the group's attributes.

        ``series``: the run's metric series (``metrics.json``'s ``"series"``), each ``(K,)`` over
        the ``K`` snapshots written (``None`` entries: undefined, stored as NaN), stored as arrays
        on the dimension ``t`` (module docstring, point 6); a ``"t"`` entry must be the stored
        times and is not stored again."""
        if self._status is not None:
            raise ValueError(
                f"{_WHERE}: `close` must be called once; the writer was already closed with "
                f"status {self._status!r}."
            )
        if not isinstance(status, str) or not status:
            raise ValueError(f"{_WHERE}: `status` must be a non-empty string; got {status!r}.")
        arrays = self._checked_series(series) if series else {}
        for name, values in arrays.items():
            padded = np.full(self._n_snapshots_max, np.nan)
            padded[: values.shape[0]] = values
            stored = self._group.create_array(
                name,
                shape=padded.shape,
                chunks=padded.shape,
                dtype="float64",
                fill_value=np.nan,
                dimension_names=("t",),
                compressors=_codecs(),
                attributes={"long_name": _SERIES_NAMES.get(name, name), "units": "1"},
                overwrite=True,  # a resumed run records its series again
            )
            stored[...] = padded
        self._group.attrs.update({"status": status, "n_snapshots": self._count})
        if arrays:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ZarrUserWarning)  # as at creation
                zarr.consolidate_metadata(self._path, zarr_format=3)
        self._status = status

    def _checked_series(self, series: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The metric series to store, as float arrays over the snapshots written."""
        if not isinstance(series, Mapping):
            raise ValueError(
                f"{_WHERE}: `series` must be a dict of (K,) series; got {type(series).__name__}."
            )
        arrays = {}
        for name, values in series.items():
            if not isinstance(name, str) or not name.isidentifier() or name in _DATA_ARRAYS[1:]:
                raise ValueError(
                    f"{_WHERE}: `series` keys must be identifiers other than the store's arrays "
                    f"{_DATA_ARRAYS[1:]}; got {name!r}."
                )
            array = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
            if array.shape != (self._count,):
                raise ValueError(
                    f"{_WHERE}: `series[{name!r}]` must hold one value per snapshot written "
                    f"({self._count}); got shape {array.shape}."
                )
            arrays[name] = array
        times = arrays.pop("t", None)
        if times is not None:
            stored = np.asarray(self._t[: self._count])
            if not np.array_equal(times, stored):
                raise ValueError(
                    f"{_WHERE}: `series['t']` must be the stored snapshot times; got values that differ "
                    f"(first {times[:3].tolist()!r}, stored {stored[:3].tolist()!r})."
                )
        return arrays

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            return
        if exc_type is None:
            self.close("ok")
            return
        status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "error"
        with contextlib.suppress(Exception):  # the original exception matters more
            self.close(status)

    def __repr__(self) -> str:
        state = "open" if self._status is None else f"closed, status {self._status!r}"
        return (
            f"TrajectoryWriter({str(self._path)!r}, {self._count}/{self._n_snapshots_max} snapshots, {state})"
        )


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


def _group_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the group stores: ``attrs`` with nested values as JSON strings (named by
    ``json_attrs``), ``status``, and the CF-style global attributes (module docstring)."""
    from datetime import UTC, datetime

    from attnflow.io.version import __version__

    nested = [key for key, value in attrs.items() if isinstance(value, dict | list)]
    stored = {key: json.dumps(value) if key in nested else value for key, value in attrs.items()}
    stored.update(
        status="incomplete",
        json_attrs=",".join(nested),
        Conventions="CF-1.10",
        title="attnflow trajectory: tokens x on the unit sphere at times t, with frozen labels xi",
        source=f"attnflow {__version__}",
        history=f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} written by attnflow {__version__}",
    )
    config = attrs.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    scale = model.get("time_scale") if isinstance(model, dict) else None
    if scale in _TIME_CONVENTIONS:
        stored["time_convention"] = _TIME_CONVENTIONS[scale]
    return stored


# --- creation ------------------------------------------------------------------------------------


def _label_attributes(config) -> dict[str, str]:
    """``xi``'s attributes, its long_name naming the config's kind of label (positions, prompt
    ids) when the config gives one."""
    aux = config.get("aux") if isinstance(config, dict) else None
    kind = aux.get("kind") if isinstance(aux, dict) else None
    return {**_ARRAY_ATTRS["xi"], **({"long_name": _LABEL_NAMES[kind]} if kind in _LABEL_NAMES else {})}


def _create_store(
    path: Path,
    *,
    n_snapshots_max: int,
    n: int,
    d: int,
    xi: np.ndarray,
    gauge: np.ndarray | None,
    rope_angles: np.ndarray | None,
    attrs: dict[str, Any],
    dtype: str,
    radii: bool = False,
) -> None:
    group = zarr.open_group(path, mode="w-", zarr_format=3, attributes=_group_attributes(attrs))
    per_chunk = snapshots_per_chunk(n_snapshots_max, n * d * np.dtype(dtype).itemsize)
    group.create_array(
        "t",
        shape=(n_snapshots_max,),
        chunks=(per_chunk,),
        dtype="float64",
        fill_value=np.nan,
        dimension_names=("t",),
        compressors=_codecs(),
        attributes=_ARRAY_ATTRS["t"],
    )
    group.create_array(
        "x",
        shape=(n_snapshots_max, n, d),
        chunks=(per_chunk, n, d),
        dtype=dtype,
        fill_value=np.nan,
        dimension_names=("t", "token", "dim"),
        compressors=_codecs(),
        attributes=_ARRAY_ATTRS["x"],
    )
    if radii:
        group.create_array(
            "r",
            shape=(n_snapshots_max, n),
            chunks=(per_chunk, n),
            dtype=dtype,
            fill_value=np.nan,
            dimension_names=("t", "token"),
            compressors=_codecs(),
            attributes=_ARRAY_ATTRS["r"],
        )
    xi_dims = ("token",) if xi.ndim == 1 else ("token", "label_dim")
    xi_array = group.create_array(
        "xi",
        shape=xi.shape,
        chunks=xi.shape,
        dtype=xi.dtype,
        dimension_names=xi_dims,
        compressors=_codecs(),
        attributes=_label_attributes(attrs.get("config")),
    )
    xi_array[...] = xi
    if gauge is not None:
        gauge_array = group.create_array(
            "gauge",
            shape=gauge.shape,
            chunks=gauge.shape,
            dtype=dtype,
            dimension_names=("token", "gauge_dim", "dim"),
            compressors=_codecs(),
            attributes=_ARRAY_ATTRS["gauge"],
        )
        gauge_array[...] = gauge.astype(dtype)
    if rope_angles is not None:
        angles_array = group.create_array(
            "gauge_angles",
            shape=rope_angles.shape,
            chunks=rope_angles.shape,
            dtype="float64",
            dimension_names=("token", "rope_pair"),
            compressors=_codecs(),
            attributes={**_ARRAY_ATTRS["gauge_angles"], "d": d},
        )
        angles_array[...] = rope_angles
    with warnings.catch_warnings():
        # zarr notes that consolidated metadata are not (yet) in the Zarr v3 specification; xarray
        # reads them, and readers without them fall back to the arrays' own metadata.
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(path, zarr_format=3)


def _move_into_place(staging: Path, path: Path, *, overwrite: bool) -> None:
    """Rename the fully built store to ``path``, replacing an old store there only with ``overwrite``
    (a store that appeared meanwhile is never replaced without it: the rename fails)."""
    if not overwrite or not path.exists():
        try:
            os.rename(staging, path)  # fails rather than merging if `path` appeared meanwhile
        except OSError as error:
            if overwrite or error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise ValueError(
                f"{_WHERE}: `path` must not exist yet; got {str(path)!r}, "
                "created meanwhile by another writer."
            ) from None
        return
    trash = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
    os.rename(path, trash)
    os.rename(staging, path)
    shutil.rmtree(trash)


# --- reading -------------------------------------------------------------------------------------


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


# --- validation ----------------------------------------------------------------------------------


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
