"""The store's radii (io.store, ``radii=True``): ``r (t, token)`` beside ``x`` for the tokens
``z = r x`` of pre- and peri-LN runs, committed with the snapshot, trimmed with it, read back by
every reader, and refused when given to a store without them (or missing from one with them)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from attnflow.io import store

N, D = 6, 3


def _snapshot(k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(k)
    x = rng.normal(size=(N, D))
    return x / np.linalg.norm(x, axis=1, keepdims=True), 1.0 + rng.random(N)


def _writer(path, *, radii=True, snapshots=5):
    return store.TrajectoryWriter(
        path, n_snapshots_max=snapshots, n=N, d=D, xi=np.arange(N), attrs={"config": {"a": 1}}, radii=radii
    )


def test_radii_are_stored_beside_x_and_read_by_every_reader(tmp_path):
    path = tmp_path / "trajectory.zarr"
    with _writer(path) as writer:
        for k in range(3):
            writer.append(0.5 * k, *_snapshot(k))
    stored = store.read_trajectory(path)
    assert stored.rs.shape == (3, N) and stored.status == "ok"
    for k in range(3):
        np.testing.assert_array_equal(stored.rs[k], _snapshot(k)[1])
        np.testing.assert_array_equal(stored.xs[k], _snapshot(k)[0])
    blocks = list(store.iter_radial_snapshots(path))
    np.testing.assert_array_equal(np.concatenate([rs for _, _, rs in blocks]), stored.rs)
    assert [len(ts) for ts, _ in store.iter_snapshots(path)] == [3]  # unchanged for x alone
    ds = store.open_dataset(path)
    assert ds["r"].dims == ("t", "token") and ds["r"].shape == (3, N)
    assert ds["r"].attrs["long_name"].startswith("token radii")
    np.testing.assert_array_equal(ds["r"].values, stored.rs)
    some = store.read_trajectory(path, max_tokens=3, snapshots=[1, 2])
    np.testing.assert_array_equal(some.rs, stored.rs[1:, store.spread(N, 3)])


def test_a_store_without_radii_reads_as_before(tmp_path):
    path = tmp_path / "trajectory.zarr"
    with _writer(path, radii=False) as writer:
        writer.append(0.0, _snapshot(0)[0])
    assert store.read_trajectory(path).rs is None
    assert "r" not in store.open_dataset(path)
    assert [rs for _, _, rs in store.iter_radial_snapshots(path)] == [None]


def test_radii_missing_or_unwanted_are_refused(tmp_path):
    x, r = _snapshot(0)
    with _writer(tmp_path / "with.zarr") as writer:
        with pytest.raises(
            ValueError, match=r"^store: `r` must be given: this store keeps the radii; got None\.$"
        ):
            writer.append(0.0, x)
        with pytest.raises(ValueError, match=r"^store: `r` must be finite and positive; got min 0\.0\.$"):
            writer.append(0.0, x, np.zeros(N))
        with pytest.raises(ValueError, match=r"^store: `r` must be a real array of shape \(n,\) = \(6,\)"):
            writer.append(0.0, x, r[:3])
        assert writer.n_snapshots == 0  # nothing committed
        writer.append(0.0, x, r)
    with _writer(tmp_path / "without.zarr", radii=False) as writer:
        with pytest.raises(ValueError, match=r"^store: `r` must be left out: this store keeps no radii"):
            writer.append(0.0, x, r)
    with _writer(tmp_path / "series.zarr") as writer:
        writer.append(0.0, x, r)
        with pytest.raises(
            ValueError, match=r"`series` keys must be identifiers other than the store's arrays"
        ):
            writer.close(series={"r": [1.0]})


def test_a_snapshot_whose_radii_were_not_written_is_not_complete(tmp_path):
    """x written and t committed but r lost (a damaged chunk rewritten as NaN): the readers keep the
    snapshots before it, as for a lost x."""
    path = tmp_path / "trajectory.zarr"
    writer = _writer(path)
    for k in range(3):
        writer.append(0.5 * k, *_snapshot(k))
    zarr.open_group(path, mode="r+")["r"][2] = np.full(N, np.nan)
    stored = store.read_trajectory(path)
    assert stored.ts.tolist() == [0.0, 0.5] and stored.rs.shape == (2, N) and stored.status == "incomplete"
    assert store.open_dataset(path).sizes["t"] == 2


def test_a_reopened_store_continues_its_radii(tmp_path):
    path = tmp_path / "trajectory.zarr"
    writer = _writer(path)
    writer.append(0.0, *_snapshot(0))
    writer.close("interrupted")
    again = store.TrajectoryWriter.reopen(path)
    with pytest.raises(ValueError, match=r"`r` must be given"):
        again.append(0.5, _snapshot(1)[0])
    again.append(0.5, *_snapshot(1))
    again.close("ok")
    np.testing.assert_array_equal(store.read_trajectory(path).rs[1], _snapshot(1)[1])
