"""``density.zarr`` (io.density_store): the commit order (``t`` last), the trimmed readers, the
close that trims an ended run and keeps an interrupted one's room, the reopen of a resumed run."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from attnflow.io.density_store import DensityArray, DensityWriter, open_dataset, read_density, read_snapshots

LABELS, GRID = 2, 8


def _writer(path, count: int = 5) -> DensityWriter:
    return DensityWriter(
        path,
        n_snapshots_max=count,
        arrays={"f": DensityArray(("label", "theta"), (LABELS, GRID), {"long_name": "f", "units": "1"})},
        coords={
            "label": (("label",), np.array([0.25, 0.75]), {"units": "1"}),
            "theta": (("theta",), 2 * np.pi * np.arange(GRID) / GRID, {"units": "rad"}),
        },
        attrs={"config": {"density": {"grid": GRID}}, "domain": "circle"},
    )


def _f(k: int) -> np.ndarray:
    return np.full((LABELS, GRID), 0.1 * (k + 1))


def test_a_snapshot_counts_once_its_time_is_written(tmp_path):
    path = tmp_path / "density.zarr"
    writer = _writer(path)
    for k in range(2):
        writer.append(0.5 * k, {"f": _f(k)})
    writer._group["f"][2] = _f(2)  # a kill between the state and its time: not committed
    stored = read_density(path)
    assert stored.ts.tolist() == [0.0, 0.5] and stored.status == "incomplete"
    np.testing.assert_array_equal(stored.arrays["f"], [_f(0), _f(1)])
    assert open_dataset(path).sizes["time"] == 2
    assert stored.config == {"density": {"grid": GRID}}


def test_close_trims_an_ended_run_and_keeps_an_interrupted_ones_room(tmp_path):
    ended, stopped = tmp_path / "ended.zarr", tmp_path / "stopped.zarr"
    for path, status in ((ended, "under_resolved"), (stopped, "interrupted")):
        writer = _writer(path)
        for k in range(3):
            writer.append(0.5 * k, {"f": _f(k)})
        writer.close(status)
    ds = xr.open_zarr(ended)  # plain xarray: no NaN rows past the last snapshot
    assert ds.sizes["time"] == 3 and np.isfinite(ds["t"].values).all()
    assert read_density(ended).status == "under_resolved"
    assert xr.open_zarr(stopped).sizes["time"] == 5  # the room to resume into
    writer = DensityWriter.reopen(stopped)
    assert writer.n_snapshots == 3 and read_density(stopped).status == "incomplete"
    writer.append(1.5, {"f": _f(3)})
    writer.close("ok")
    ts, arrays = read_snapshots(stopped, [0, 3])
    assert ts.tolist() == [0.0, 1.5] and np.array_equal(arrays["f"], [_f(0), _f(3)])


def test_append_refuses_what_would_read_as_unwritten(tmp_path):
    writer = _writer(tmp_path / "density.zarr")
    bad = _f(0)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"`f` must be finite of shape \(2, 8\)"):
        writer.append(0.0, {"f": bad})
    with pytest.raises(ValueError, match="must not exist yet"):
        _writer(tmp_path / "density.zarr")
    with pytest.raises(ValueError, match="must be a density store"):
        read_density(tmp_path)


class _Logged:
    """A group (or array) whose item writes are logged by array name, in order."""

    def __init__(self, target, log: list, name: str = "") -> None:
        self._target, self._log, self._name = target, log, name

    def __getitem__(self, key):
        item = self._target[key]
        return _Logged(item, self._log, key) if isinstance(key, str) else item

    def __setitem__(self, key, value) -> None:
        self._log.append(self._name)
        self._target[key] = value

    def __getattr__(self, name):
        return getattr(self._target, name)


def test_append_writes_the_state_before_its_time(tmp_path):
    writer = _writer(tmp_path / "density.zarr")
    log: list[str] = []
    writer._group = _Logged(writer._group, log)
    writer.append(0.0, {"f": _f(0)})
    writer.append(0.5, {"f": _f(1)})
    assert log == ["f", "t", "f", "t"]  # t[k], the commit mark, after the state of snapshot k
