"""Crash-safe, incremental trajectory store (`trajectory.zarr`): its writer here, its readers and
xarray view in :mod:`attnflow.io.store_read` (importable from here too, as ``store.read_trajectory``
and so on), the checks of the writer's inputs in :mod:`attnflow.io.store_checks`.

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
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.errors import ZarrUserWarning

from attnflow.io.store_checks import (
    _check_attrs,
    _check_dtype,
    _check_gauge,
    _check_r,
    _check_rope_angles,
    _check_time,
    _check_x,
    _check_xi,
    _positive_int,
)
from attnflow.io.store_read import (
    _ARRAY_ATTRS,
    _DATA_ARRAYS,
    _WHERE,
    CorruptStoreError,
    NotAStoreError,
    StoredGauge,
    StoredTrajectory,
    iter_radial_snapshots,
    iter_snapshots,
    open_dataset,
    read_gauge,
    read_series,
    read_trajectory,
    spread,
    token_count,
)

__all__ = [
    "CorruptStoreError",
    "NotAStoreError",
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
    "spread",
    "token_count",
]

_CHUNK_BYTES = 1 << 18  # snapshots per chunk file: about this many bytes of positions
_SERIES_NAMES = {
    "energy": "interaction energy E",
    "mean_cosine": "mean pairwise cosine of the content",
    "gauge_mean_cosine": "mean pairwise cosine of the gauge frame",
    "n_eff": "effective number of clusters",
}
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
