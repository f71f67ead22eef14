"""Crash-safe, incremental store of a density run (``density.zarr``), its reader and xarray view.

A density run appends one snapshot of its law at a time to a Zarr v3 group::

    density.zarr/
      zarr.json   group attrs: the resolved config (a JSON string, named by ``json_attrs``),
                  ``status``, ``domain`` ("circle" or "sphere"), CF-style global attributes
      t           (time,)                         float64, NaN = "not written yet"
      f           (time, label, theta)            S^1: each label's density on theta_k = 2 pi k / M
                  (time, label, lat, lon)         S^2: each label's density (content frame) on the
                                                  Gauss-Legendre grid
      a           (time, label, degree, order, part)  S^2 only: the harmonic coefficients of the
                                                  gauge-frame slices (real, imaginary): the state
      label       (label,)   the label nodes xi_l;    weight (label,) their quadrature weights rho_l
      theta       (theta,)   S^1: the angles (rad);   lat, lon (lat,), (lon,) S^2 (degrees)

``xarray.open_zarr(path)`` reads it as a Dataset: ``f`` with the coordinates ``theta`` (or ``lat``,
``lon``) and ``label``, ``t`` and ``weight`` as variables beside it (``ds.set_coords("t")
.swap_dims(time="t")`` indexes the snapshots by time), every array with ``long_name`` and ``units``.
:func:`open_dataset` does the same trimmed to the complete snapshots (a killed run's store has NaN
past them).

Crash safety follows :mod:`attnflow.io.store`: the group and every array's metadata are built in a
hidden sibling folder and renamed into place; arrays are preallocated with NaN (appending never
rewrites metadata); snapshots are grouped in chunks of about 256 KiB, each chunk file written whole
(zarr-python >= 3.1.3 writes a temporary file and renames it); ``append`` writes the state arrays
(``f``, then ``a``) and only then ``t[k]``, whose finite value commits snapshot ``k``; readers keep
the prefix of snapshots whose ``t`` and arrays are finite. ``close`` records the status and, for a
run that ended (any status but ``interrupted``, ``error``), trims the arrays to the snapshots
written (a run stopped early by its resolution leaves no NaN rows for plain ``xarray`` readers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.errors import ZarrUserWarning

from attnflow.io.store import snapshots_per_chunk

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["DensityArray", "DensityWriter", "StoredDensity", "open_dataset", "read_density", "read_snapshots"]

_WHERE = "density store"
_RESUMABLE = ("interrupted", "error", "incomplete")  # statuses whose store keeps its preallocation


@dataclasses.dataclass(frozen=True)
class DensityArray:
    """One array of a snapshot: its dimensions after ``time``, its shape, and its attributes."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]
    attrs: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class StoredDensity:
    """What a store holds, trimmed to its complete snapshots: ``ts (T,)``, ``arrays`` (name →
    ``(T, ...)``), ``coords`` (name → values), the resolved ``config`` and the ``status``."""

    ts: np.ndarray
    arrays: dict[str, np.ndarray]
    coords: dict[str, np.ndarray]
    config: dict[str, Any]
    status: str


def _codecs() -> list[Crc32cCodec]:
    return [Crc32cCodec()]


class DensityWriter:
    """Appends snapshots of a density to a new store (see the module docstring).

    ``arrays``: the state arrays of a snapshot (name → :class:`DensityArray`), written in this order
    before ``t``; ``coords``: name → ``(dims, values, attrs)``; ``attrs``: the group's attributes
    (nested values stored as JSON strings)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_snapshots_max: int,
        arrays: Mapping[str, DensityArray],
        coords: Mapping[str, tuple[tuple[str, ...], np.ndarray, Mapping[str, Any]]],
        attrs: Mapping[str, Any],
    ) -> None:
        self._path = Path(path)
        if self._path.exists():
            raise ValueError(f"{_WHERE}: `path` must not exist yet; got {str(self._path)!r}.")
        staging = self._path.with_name(f".{self._path.name}.{uuid.uuid4().hex}.partial")
        try:
            _create(staging, n_snapshots_max=int(n_snapshots_max), arrays=arrays, coords=coords, attrs=attrs)
            os.rename(staging, self._path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._attach(count=0)

    def _attach(self, *, count: int) -> None:
        self._group = zarr.open_group(self._path, mode="r+", zarr_format=3)
        self._names = json.loads(self._group.attrs["state_arrays"])
        self._count = count
        self._status: str | None = None

    @classmethod
    def reopen(cls, path: str | os.PathLike[str]) -> DensityWriter:
        """A writer continuing an existing store after its last complete snapshot (a resumed run);
        the store reads as ``incomplete`` again until ``close``."""
        stored = read_density(path, arrays=())
        if stored.ts.shape[0] == 0:
            raise ValueError(f"{_WHERE}: `path` must hold a complete snapshot to resume; got {str(path)!r}.")
        writer = cls.__new__(cls)
        writer._path = Path(path)
        writer._attach(count=int(stored.ts.shape[0]))
        writer._group.attrs.update({"status": "incomplete", "n_snapshots": None})
        return writer

    @property
    def path(self) -> Path:
        return self._path

    @property
    def n_snapshots(self) -> int:
        return self._count

    @property
    def n_snapshots_max(self) -> int:
        return int(self._group["t"].shape[0])

    @property
    def closed(self) -> bool:
        return self._status is not None

    def append(self, t: float, values: Mapping[str, np.ndarray]) -> None:
        """Snapshot ``k`` at time ``t``: every state array first (finite, of its shape), ``t`` last."""
        if self._status is not None:
            raise ValueError(f"{_WHERE}: `append` must come before `close`; got a closed writer.")
        k = self._count
        if k >= self.n_snapshots_max:
            raise ValueError(f"{_WHERE}: at most {self.n_snapshots_max} snapshots fit; got one more.")
        if not isinstance(values, Mapping) or set(values) != set(self._names):
            shown = sorted(values) if isinstance(values, Mapping) else type(values).__name__
            raise ValueError(f"{_WHERE}: `values` must be a dict of the arrays {self._names}; got {shown}.")
        for name in self._names:
            array = self._group[name]
            value = np.asarray(values[name], dtype=np.float64)
            if value.shape != tuple(array.shape[1:]) or not np.all(np.isfinite(value)):
                raise ValueError(
                    f"{_WHERE}: `{name}` must be finite of shape {tuple(array.shape[1:])}; got {value.shape}."
                )
            array[k] = value
        self._group["t"][k] = float(t)  # the commit mark, written last
        self._count = k + 1

    def close(self, status: str) -> None:
        """Record ``status``; a run that ended (not interrupted, not failed) is trimmed to its
        snapshots (the state arrays first, then ``t``, then the consolidated metadata)."""
        if self._status is not None:
            raise ValueError(f"{_WHERE}: `close` must be called once; got a second call.")
        trim = status not in _RESUMABLE and self._count < self.n_snapshots_max
        if trim:
            for name in [*self._names, "t"]:
                array = self._group[name]
                array.resize((self._count, *array.shape[1:]))
            self._group = zarr.open_group(self._path, mode="r+", zarr_format=3)  # the new shapes
        self._group.attrs.update({"status": status, "n_snapshots": self._count})
        if trim:  # the consolidated metadata list the new shapes (a kill before: readers trim by t)
            _consolidate(self._path)
        self._status = status


def _create(path: Path, *, n_snapshots_max: int, arrays, coords, attrs) -> None:
    nested = [key for key, value in attrs.items() if isinstance(value, dict | list)]
    stored = {key: json.dumps(value) if key in nested else value for key, value in attrs.items()}
    from datetime import UTC, datetime

    from attnflow.io.version import __version__

    stored.update(
        status="incomplete",
        n_snapshots=None,
        json_attrs=",".join(nested),
        state_arrays=json.dumps(list(arrays)),
        Conventions="CF-1.10",
        title="attnflow density: the law of the tokens per label at times t",
        source=f"attnflow {__version__}",
        history=f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} written by attnflow {__version__}",
    )
    group = zarr.open_group(path, mode="w-", zarr_format=3, attributes=stored)
    snapshot_bytes = sum(8 * int(np.prod(spec.shape)) for spec in arrays.values())
    per_chunk = snapshots_per_chunk(n_snapshots_max, snapshot_bytes)
    group.create_array(
        "t",
        shape=(n_snapshots_max,),
        chunks=(per_chunk,),
        dtype="float64",
        fill_value=np.nan,
        dimension_names=("time",),
        compressors=_codecs(),
        attributes={"long_name": "time", "units": "1"},
    )
    for name, spec in arrays.items():
        group.create_array(
            name,
            shape=(n_snapshots_max, *spec.shape),
            chunks=(per_chunk, *spec.shape),
            dtype="float64",
            fill_value=np.nan,
            dimension_names=("time", *spec.dims),
            compressors=_codecs(),
            attributes=dict(spec.attrs),
        )
    for name, (dims, values, coord_attrs) in coords.items():
        values = np.asarray(values)
        array = group.create_array(
            name,
            shape=values.shape,
            chunks=values.shape,
            dtype=values.dtype,
            dimension_names=dims,
            compressors=_codecs(),
            attributes=dict(coord_attrs),
        )
        array[...] = values
    _consolidate(path)


def _consolidate(path: Path) -> None:
    with warnings.catch_warnings():  # consolidated metadata are not (yet) in the Zarr v3 specification
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(path, zarr_format=3)


def _open(path: str | os.PathLike[str]) -> zarr.Group:
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise ValueError(f"{_WHERE}: `path` must be a density store (a Zarr v3 group); got {str(path)!r}.")
    group = zarr.open_group(path, mode="r", zarr_format=3)
    if "t" not in group or "state_arrays" not in group.attrs:
        raise ValueError(
            f"{_WHERE}: `path` must be a density store with `t` and its state; got {str(path)!r}."
        )
    return group


def _complete(group: zarr.Group) -> int:
    """The number of complete snapshots: the prefix whose ``t`` and state arrays are all finite."""
    ts = np.asarray(group["t"][...])
    count = int(np.argmin(np.isfinite(ts))) if not np.all(np.isfinite(ts)) else ts.shape[0]
    for name in json.loads(group.attrs["state_arrays"]):
        array = group[name]
        size = min(count, array.shape[0])
        finite = np.all(np.isfinite(np.asarray(array[:size])).reshape(size, -1), axis=1)
        count = size if finite.all() else int(np.argmin(finite))
    return count


def _status(group: zarr.Group, count: int) -> str:
    status, recorded = group.attrs.get("status", "incomplete"), group.attrs.get("n_snapshots")
    return status if recorded is None or recorded == count else "incomplete"


def _config(group: zarr.Group) -> dict[str, Any]:
    config = group.attrs.get("config", "{}")
    return json.loads(config) if isinstance(config, str) else dict(config)


def read_density(path: str | os.PathLike[str], *, arrays=None) -> StoredDensity:
    """The store's complete snapshots in memory (``arrays``: the state arrays to read; all when
    None, none with ``()``)."""
    group = _open(path)
    count = _complete(group)
    names = json.loads(group.attrs["state_arrays"]) if arrays is None else list(arrays)
    coords = {
        name: np.asarray(array[...]) for name, array in group.arrays() if name not in ("t", *_state(group))
    }
    return StoredDensity(
        ts=np.asarray(group["t"][:count]),
        arrays={name: np.asarray(group[name][:count]) for name in names},
        coords=coords,
        config=_config(group),
        status=_status(group, count),
    )


def _state(group: zarr.Group) -> list[str]:
    return json.loads(group.attrs["state_arrays"])


def read_snapshots(path: str | os.PathLike[str], indices) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(ts (K,), arrays)`` of the complete snapshots ``indices`` only (figures of a long run)."""
    group = _open(path)
    count = _complete(group)
    indices = [int(k) for k in indices]
    if any(not 0 <= k < count for k in indices):
        raise ValueError(f"{_WHERE}: snapshots {indices} must be below the {count} complete ones.")
    ts = np.asarray([group["t"][k] for k in indices])
    return ts, {name: np.stack([np.asarray(group[name][k]) for k in indices]) for name in _state(group)}


def open_dataset(path: str | os.PathLike[str]) -> xr.Dataset:
    """The store as a lazy xarray Dataset trimmed to its complete snapshots; ``attrs["config"]``
    decoded and ``attrs["status"]`` the status :func:`read_density` reports."""
    import xarray as xr  # heavy (pandas): only where a Dataset is opened

    group = _open(path)
    count = _complete(group)
    ds = xr.open_zarr(Path(path), consolidated=True, chunks=None, zarr_format=3)
    ds = ds.isel(time=slice(0, count))
    ds.attrs["config"] = _config(group)
    ds.attrs["status"] = _status(group, count)
    return ds
