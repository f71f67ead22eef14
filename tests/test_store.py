"""The trajectory store: round trip, xarray view, trimming, errors, and survival of SIGKILL."""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import xarray as xr
import zarr

from attnflow.io import store
from attnflow.io.store import (
    CorruptStoreError,
    StoredTrajectory,
    TrajectoryWriter,
    open_dataset,
    read_trajectory,
    snapshot_time,
)

N, D = 5, 3


def _x(k: int, n: int = N, d: int = D) -> np.ndarray:
    """Deterministic snapshot k: distinct, non-round values, so a mix-up of snapshots shows."""
    return np.sin(np.arange(n * d).reshape(n, d) + 0.37 * k)


def _rotations(n: int) -> np.ndarray:
    angles = 2 * np.pi * np.arange(n) / n
    q = np.zeros((n, 3, 3))
    q[:, 0, 0] = q[:, 1, 1] = np.cos(angles)
    q[:, 0, 1] = -np.sin(angles)
    q[:, 1, 0] = np.sin(angles)
    q[:, 2, 2] = 1.0
    return q


def _write(path, n_snapshots, *, n_snapshots_max=10, close=True, **kwargs):
    kwargs.setdefault("xi", np.arange(N))
    writer = TrajectoryWriter(path, n_snapshots_max=n_snapshots_max, n=N, d=D, **kwargs)
    for k in range(n_snapshots):
        writer.append(0.1 * k, _x(k))
    if close:
        writer.close("ok")
    return writer


# --- round trip -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trip_is_exact(tmp_path, dtype):
    path = tmp_path / "trajectory.zarr"
    gauge = _rotations(N)
    config = {"model": {"n": N, "d": D, "beta": 1.0}, "solver": {"dtype": dtype}, "version": "0.1.0"}
    with TrajectoryWriter(
        path, n_snapshots_max=8, n=N, d=D, xi=np.arange(N), gauge=gauge, attrs=config, dtype=dtype
    ) as writer:
        for k in range(6):
            writer.append(0.1 * k, _x(k))
    traj = read_trajectory(path)
    assert isinstance(traj, StoredTrajectory)
    assert traj.status == "ok"
    assert traj.attrs == config
    assert traj.ts.dtype == np.float64
    np.testing.assert_array_equal(traj.ts, 0.1 * np.arange(6))
    assert traj.xs.dtype == np.dtype(dtype)
    # Exact: the store keeps the bits of the snapshot cast to the store dtype.
    np.testing.assert_array_equal(traj.xs, np.stack([_x(k) for k in range(6)]).astype(dtype))
    assert traj.xi.dtype == np.int64
    np.testing.assert_array_equal(traj.xi, np.arange(N))
    assert traj.gauge.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(traj.gauge, gauge.astype(dtype))


def test_float_labels_2d_and_no_gauge(tmp_path):
    path = tmp_path / "trajectory.zarr"
    xi = np.linspace(0, 1, 2 * N).reshape(N, 2)
    _write(path, 3, xi=xi)
    traj = read_trajectory(path)
    assert traj.gauge is None
    assert traj.attrs == {}
    np.testing.assert_array_equal(traj.xi, xi)
    ds = open_dataset(path)
    assert ds.xi.dims == ("token", "label_dim")
    assert "gauge" not in ds


def test_close_records_status_and_count(tmp_path):
    path = tmp_path / "trajectory.zarr"
    writer = _write(path, 3, close=False)
    writer.close("non_finite")
    assert writer.closed
    traj = read_trajectory(path)
    assert traj.status == "non_finite"
    assert traj.xs.shape == (3, N, D)
    assert open_dataset(path).attrs["n_snapshots"] == 3


def test_context_manager_records_error_status(tmp_path):
    path = tmp_path / "trajectory.zarr"
    with pytest.raises(ZeroDivisionError):
        with TrajectoryWriter(path, n_snapshots_max=4, n=N, d=D, xi=np.arange(N)) as writer:
            writer.append(0.0, _x(0))
            1 / 0  # noqa: B018
    traj = read_trajectory(path)
    assert traj.status == "error"
    assert traj.xs.shape == (1, N, D)


def test_overwrite_replaces_a_store(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 5)
    _write(path, 2, overwrite=True)
    assert read_trajectory(path).xs.shape == (2, N, D)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trajectory.zarr"]  # no staging left


# --- xarray view ----------------------------------------------------------------------------------


def test_xarray_open_zarr_sees_dims_and_time_coordinate(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 4, gauge=_rotations(N), attrs={"model": {"n": N}})
    for consolidated in (None, True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # consolidated metadata: no fallback warning from xarray
            ds = xr.open_zarr(path, consolidated=consolidated)
        assert ds.x.dims == ("t", "token", "dim")
        assert ds.t.dims == ("t",)
        assert "t" in ds.indexes  # `t` is the coordinate of its own dimension
        assert ds.xi.dims == ("token",)
        assert ds.gauge.dims == ("token", "gauge_dim", "dim")
        assert ds.sizes["t"] == 10  # the raw view shows the preallocation, NaN past the end
        assert np.isnan(ds.t.values[4:]).all()
        assert json.loads(ds.attrs["model"]) == {"n": N}  # nested: a JSON string, named by json_attrs
        assert ds.attrs["json_attrs"] == "model"
        for name in ("t", "x", "xi", "gauge"):
            assert ds[name].attrs["long_name"] and ds[name].attrs["units"] == "1"


def test_the_raw_xarray_view_round_trips_through_netcdf(tmp_path):
    path = tmp_path / "trajectory.zarr"
    config = {"model": {"n": N, "d": D, "beta": 1.0, "time_scale": "rescaled"}, "aux": {"kind": "positions"}}
    _write(path, 4, gauge=_rotations(N), attrs={"config": config, "attnflow_version": "0.1.0"})
    ds = xr.open_zarr(path).isel(t=slice(0, 4))
    assert "xi" in ds.coords and ds.xi.dims == ("token",)  # the label is a coordinate of token
    assert ds.xi.attrs["long_name"] == "token positions i (frozen labels)"  # named by aux.kind
    assert ds.attrs["Conventions"].startswith("CF-") and ds.attrs["source"].startswith("attnflow ")
    assert "rescaled time" in ds.attrs["time_convention"] and ds.attrs["history"]
    netcdf = tmp_path / "x.nc"
    ds.to_netcdf(netcdf)  # failed on the nested config attribute before
    with xr.open_dataset(netcdf) as back:
        assert json.loads(back.attrs["config"]) == config
        assert "xi" in back.coords
        np.testing.assert_array_equal(back.x.values, ds.x.values)
        np.testing.assert_array_equal(back.xi.values, np.arange(N))
        np.testing.assert_array_equal(back.t.values, ds.t.values)
    # attnflow's own readers decode the JSON attribute: the config comes back as a dict
    assert read_trajectory(path).attrs == {"config": config, "attnflow_version": "0.1.0"}
    assert open_dataset(path).attrs["config"] == config


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"aux": {"kind": "prompts"}}, "prompt ids (frozen labels)"),
        ({"aux": {"kind": "none"}}, "frozen token labels"),
        (None, "frozen token labels"),
    ],
)
def test_the_labels_long_name_says_what_they_are(tmp_path, config, name):
    path = tmp_path / "trajectory.zarr"
    _write(path, 1, attrs={} if config is None else {"config": config})
    ds = xr.open_zarr(path)
    assert ds.xi.attrs["long_name"] == name and "xi" in ds.coords


def test_a_store_written_before_the_netcdf_conventions_reads_unchanged(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 3, attrs={"config": {"model": {"n": N}}})
    group = zarr.open_group(path, mode="r+", zarr_format=3)
    # as the old writer left it: the nested config itself, no store attributes, no coordinates
    group.attrs.put({"config": {"model": {"n": N}}, "status": "ok", "n_snapshots": 3})
    assert read_trajectory(path).attrs == {"config": {"model": {"n": N}}}
    assert open_dataset(path).attrs["config"] == {"model": {"n": N}}


@pytest.mark.parametrize("key", ["json_attrs", "Conventions", "history"])
def test_the_store_s_own_attributes_are_refused_as_writer_attrs(tmp_path, key):
    with pytest.raises(ValueError, match=rf"store: `attrs` must not use the store's own keys .*got '{key}'"):
        _write(tmp_path / "s.zarr", 1, attrs={key: "x"})


def test_snapshot_time_is_the_decimal_product():
    assert 3 * 0.1 != 0.3  # the product of floats misses the decimal...
    assert snapshot_time(3, 0.1) == 0.3  # ...which the store's times hit
    assert [snapshot_time(k, 0.25) for k in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert all(snapshot_time(k, 0.1) == float(f"{k / 10}") for k in range(1000))


def test_sel_by_typed_time(tmp_path):
    path = tmp_path / "trajectory.zarr"
    writer = TrajectoryWriter(path, n_snapshots_max=8, n=N, d=D, xi=np.arange(N))
    for k in range(8):
        writer.append(snapshot_time(k, 0.1), _x(k))
    writer.close()
    np.testing.assert_array_equal(open_dataset(path).x.sel(t=0.3).values, _x(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(xr.open_zarr(path).x.sel(t=0.7).values, _x(7))


def test_store_of_the_earlier_layout_still_reads(tmp_path):
    """A store written before the conventions (dimension `time`, `t` a CF coordinate of `x`, no
    consolidated metadata) reads with `t` as its own dimension."""
    path = tmp_path / "old.zarr"
    group = zarr.open_group(path, mode="w-", zarr_format=3, attributes={"status": "ok", "n_snapshots": 2})
    t = group.create_array(
        "t", shape=(3,), chunks=(1,), dtype="float64", fill_value=np.nan, dimension_names=("time",)
    )
    x = group.create_array(
        "x",
        shape=(3, N, D),
        chunks=(1, N, D),
        dtype="float64",
        fill_value=np.nan,
        dimension_names=("time", "token", "dim"),
        attributes={"coordinates": "t"},
    )
    xi = group.create_array("xi", shape=(N,), chunks=(N,), dtype="int64", dimension_names=("token",))
    xi[...] = np.arange(N)
    for k in range(2):
        x[k] = _x(k)
        t[k] = 0.5 * k
    ds = open_dataset(path)
    assert ds.x.dims == ("t", "token", "dim") and ds.sizes["t"] == 2
    np.testing.assert_array_equal(ds.x.sel(t=0.5).values, _x(1))
    assert read_trajectory(path).status == "ok"


def test_open_dataset_is_trimmed_and_indexed_by_t(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 4, gauge=_rotations(N), close=False)
    ds = open_dataset(path)
    assert ds.sizes == {"t": 4, "token": N, "dim": D, "gauge_dim": D}
    assert ds.attrs["status"] == "incomplete"
    np.testing.assert_array_equal(ds.t.values, 0.1 * np.arange(4))
    np.testing.assert_array_equal(ds.x.sel(t=0.2).values, _x(2))
    # The gauge-frame view u_i = Q(xi_i) x_i is one xarray.dot.
    u = xr.dot(ds.gauge, ds.x, dim="dim").transpose("t", "token", "gauge_dim")
    expected = np.einsum("iab,tib->tia", _rotations(N), np.stack([_x(k) for k in range(4)]))
    np.testing.assert_allclose(u.values, expected, rtol=0, atol=1e-15)  # one matmul of round-off


# --- trimming -------------------------------------------------------------------------------------


def test_unclosed_store_reads_as_incomplete_prefix(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 4, n_snapshots_max=10, close=False)  # as if killed between snapshots
    traj = read_trajectory(path)
    assert traj.status == "incomplete"
    assert traj.ts.shape == (4,)
    assert traj.xs.shape == (4, N, D)
    np.testing.assert_array_equal(traj.xs[-1], _x(3))


def test_empty_store_reads(tmp_path):
    path = tmp_path / "trajectory.zarr"
    _write(path, 0, close=False)
    traj = read_trajectory(path)
    assert traj.xs.shape == (0, N, D)
    assert open_dataset(path).sizes["t"] == 0


def test_x_written_but_t_not_is_not_a_snapshot(tmp_path):
    # A kill between the two writes of append: x[4] is on disk, t[4] is not.
    path = tmp_path / "trajectory.zarr"
    writer = _write(path, 4, close=False)
    writer._x[4] = _x(4)
    assert read_trajectory(path).xs.shape == (4, N, D)
    assert open_dataset(path).sizes["t"] == 4


@pytest.fixture(params=[1, 4], ids=["a snapshot per chunk", "4 snapshots per chunk"])
def per_chunk(request, monkeypatch):
    """Snapshots per chunk file: 1 (as stores were before, and as large snapshots are) or 4."""
    monkeypatch.setattr(store, "snapshots_per_chunk", lambda *_: request.param)
    return request.param


def _chunk(path, array, k, per_chunk):
    """The file of the chunk of ``array`` (t or x) holding snapshot ``k``."""
    c = k // per_chunk
    return path / array / "c" / (f"{c}" if array == "t" else f"{c}/0/0")


@pytest.mark.parametrize("array", ["t", "x"])
def test_torn_last_chunk_ends_the_prefix(tmp_path, array, per_chunk):
    # Storage that tears the last chunk write of a killed run (a filesystem without atomic
    # renames): the checksum makes the torn chunk unreadable, and the reader stops just before it,
    # losing the completed snapshots that shared the chunk with the one in progress.
    path = tmp_path / "trajectory.zarr"
    _write(path, 6, close=False)
    chunk = _chunk(path, array, 5, per_chunk)
    chunk.write_bytes(chunk.read_bytes()[:-3])
    kept = 5 // per_chunk * per_chunk  # 5 with a snapshot per chunk, 4 with four
    traj = read_trajectory(path)
    assert traj.xs.shape == (kept, N, D)
    np.testing.assert_array_equal(traj.xs, np.stack([_x(k) for k in range(kept)]))
    assert open_dataset(path).sizes["t"] == kept


def _garble(chunk):
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF  # a plausible-looking float, caught only by the CRC
    chunk.write_bytes(bytes(data))


def test_garbled_chunk_of_a_closed_store_is_corruption_not_truncation(tmp_path, per_chunk):
    path = tmp_path / "trajectory.zarr"
    _write(path, 3)
    _garble(_chunk(path, "x", 2, per_chunk))
    first = 2 // per_chunk * per_chunk  # the first snapshot of the garbled chunk
    message = rf"store: snapshot {first} of '.*trajectory\.zarr' fails its checksum \(the chunk of `t` or `x`"
    with pytest.raises(CorruptStoreError, match=message):
        read_trajectory(path)
    with pytest.raises(CorruptStoreError, match=message):
        open_dataset(path)


def test_garbled_chunk_before_written_snapshots_is_corruption(tmp_path, per_chunk):
    # Never closed (as if killed), but snapshots in later chunks were written after the damaged one.
    path = tmp_path / "trajectory.zarr"
    _write(path, 6, close=False)
    _garble(_chunk(path, "t", 2, per_chunk))
    with pytest.raises(CorruptStoreError, match=f"snapshot {2 // per_chunk * per_chunk} of"):
        read_trajectory(path)


def test_an_error_that_is_not_a_checksum_propagates(tmp_path, monkeypatch):
    # A library bug must not read as a truncated run.
    path = tmp_path / "trajectory.zarr"
    _write(path, 3)

    def broken(self, selection):
        raise ValueError("shape mismatch in some codec")

    monkeypatch.setattr(zarr.Array, "__getitem__", broken)
    with pytest.raises(ValueError, match="shape mismatch in some codec"):
        read_trajectory(path)


# --- errors ---------------------------------------------------------------------------------------


def test_append_rejects_wrong_shape(tmp_path):
    writer = TrajectoryWriter(tmp_path / "s.zarr", n_snapshots_max=3, n=64, d=3, xi=np.arange(64))
    with pytest.raises(ValueError, match=r"store: `x` must have shape \(n, d\) = \(64, 3\); got \(64, 4\)\."):
        writer.append(0.0, np.zeros((64, 4)))


def test_append_rejects_non_finite_x(tmp_path):
    writer = _write(tmp_path / "s.zarr", 0, close=False)
    x = _x(0)
    x[1, 2] = np.nan
    with pytest.raises(
        ValueError,
        match=r"store: `x` must be finite; got 1 non-finite entries, the first at index \(1, 2\)\.",
    ):
        writer.append(0.0, x)
    assert writer.n_snapshots == 0


def test_append_rejects_too_many_snapshots(tmp_path):
    writer = _write(tmp_path / "s.zarr", 2, n_snapshots_max=2, close=False)
    with pytest.raises(
        ValueError, match=r"store: at most `n_snapshots_max` = 2 snapshots fit; got snapshot number 3\."
    ):
        writer.append(1.0, _x(2))


@pytest.mark.parametrize(
    ("t", "match"),
    [
        (np.nan, r"store: `t` must be finite; got nan\."),
        (0.1, r"store: `t` must be greater than the previous snapshot's time 0\.1; got 0\.1\."),
        (np.array([1.0]), r"store: `t` must be a real scalar"),
    ],
)
def test_append_rejects_bad_time(tmp_path, t, match):
    writer = _write(tmp_path / "s.zarr", 2, close=False)
    with pytest.raises(ValueError, match=match):
        writer.append(t, _x(2))


def test_closed_writer_rejects_append_and_second_close(tmp_path):
    writer = _write(tmp_path / "s.zarr", 1)
    with pytest.raises(ValueError, match=r"store: `append` must come before `close`; .* status 'ok'\."):
        writer.append(1.0, _x(1))
    with pytest.raises(ValueError, match=r"store: `close` must be called once"):
        writer.close("ok")


def test_close_rejects_empty_status(tmp_path):
    writer = _write(tmp_path / "s.zarr", 1, close=False)
    with pytest.raises(ValueError, match=r"store: `status` must be a non-empty string; got ''\."):
        writer.close("")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, r"store: `n` must be a positive integer; got 0\."),
        ({"n_snapshots_max": 2.5}, r"store: `n_snapshots_max` must be a positive integer; got 2\.5\."),
        ({"dtype": "float16"}, r"store: `dtype` must be one of \('float64', 'float32'\); got 'float16'\."),
        (
            {"xi": np.arange(N + 1)},
            r"store: `xi` must have shape \(n,\) or \(n, k\) with n = 5; got \(6,\)\.",
        ),
        ({"xi": np.full(N, np.inf)}, r"store: `xi` must be finite"),
        (
            {"gauge": np.zeros((N, 2, 2))},
            r"store: `gauge` must have shape \(n, d, d\) = \(5, 3, 3\); got \(5, 2, 2\)\.",
        ),
        ({"attrs": {"status": "x"}}, r"store: `attrs` must not use the store's own keys"),
        ({"attrs": {"seed": object()}}, r"store: `attrs` must be JSON-serialisable"),
        ({"attrs": {"noise": float("nan")}}, r"store: `attrs` must be JSON-serialisable"),
    ],
)
def test_bad_construction_is_rejected_and_writes_nothing(tmp_path, kwargs, match):
    args = {"n_snapshots_max": 4, "n": N, "d": D, "xi": np.arange(N)} | kwargs
    with pytest.raises(ValueError, match=match):
        TrajectoryWriter(tmp_path / "s.zarr", **args)
    assert list(tmp_path.iterdir()) == []


def test_existing_path_needs_overwrite(tmp_path):
    path = tmp_path / "s.zarr"
    _write(path, 1)
    with pytest.raises(ValueError, match=r"store: `path` must not exist yet; .* Pass overwrite=True"):
        _write(path, 1)
    other = tmp_path / "notes"
    other.mkdir()
    with pytest.raises(ValueError, match=r"store: `path` exists and is not a Zarr store"):
        _write(other, 1, overwrite=True)
    assert other.is_dir()


def test_reading_a_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"store: `path` must be a trajectory store"):
        read_trajectory(tmp_path / "nope.zarr")


# --- SIGKILL --------------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from attnflow.io.store import TrajectoryWriter

    n, d = 16, 3
    writer = TrajectoryWriter(sys.argv[1], n_snapshots_max=1000, n=n, d=d, xi=np.arange(n))
    for k in range(1000):
        writer.append(0.5 * k, np.full((n, d), k + 1.0))
        print(k + 1, flush=True)
        time.sleep(0.002)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_leaves_every_completed_snapshot_readable(tmp_path):
    path = tmp_path / "trajectory.zarr"
    env = os.environ | {"JAX_PLATFORMS": "cpu"}  # `import attnflow` imports jax; skip device probing
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    reported = 0
    deadline = time.monotonic() + 30.0  # a hung child fails the test instead of hanging it
    try:
        while reported < 3:
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = child.stdout.readline() if ready else ""
            if not line:
                child.kill()
                pytest.fail(f"child stopped before 3 snapshots: {child.communicate()[1][-2000:]}")
            reported = int(line)
        time.sleep(0.02)  # let it get into the next few appends, so the kill lands mid-run
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    traj = read_trajectory(path)
    count = traj.xs.shape[0]
    assert count >= reported
    assert traj.status == "incomplete"
    assert np.isfinite(traj.xs).all()
    np.testing.assert_array_equal(traj.ts, 0.5 * np.arange(count))
    expected = np.broadcast_to((np.arange(count) + 1.0)[:, None, None], (count, 16, 3))
    np.testing.assert_array_equal(traj.xs, expected)
    ds = open_dataset(path)
    assert ds.sizes["t"] == count
    np.testing.assert_array_equal(ds.x.values, expected)


# --- compact RoPE gauge ---------------------------------------------------------------------------


def test_rope_gauge_is_stored_as_angles_and_applies_without_matrices(tmp_path):
    n, d = 4, 6
    angles = np.outer(np.arange(n), [0.3, 1.1])  # two rotated pairs, the last pair fixed
    path = tmp_path / "trajectory.zarr"
    xs = np.sin(np.arange(2 * n * d).reshape(2, n, d))
    with TrajectoryWriter(path, n_snapshots_max=2, n=n, d=d, xi=np.arange(n), rope_angles=angles) as writer:
        for k in range(2):
            writer.append(k, xs[k])
    assert not (path / "gauge").exists()  # n*m angles, no n*d*d matrices
    traj = read_trajectory(path)
    q = np.zeros((n, d, d))
    for i in range(n):
        q[i] = np.eye(d)
        for k, a in enumerate(angles[i]):
            q[i, 2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]
    np.testing.assert_allclose(traj.gauge, q, rtol=0, atol=1e-15)  # cos/sin round-off
    expected = np.einsum("nij,tnj->tni", q, xs)
    np.testing.assert_allclose(traj.gauge_frame(traj.xs), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(traj.gauge_frame(traj.xs[:, [1, 3]], [1, 3]), expected[:, [1, 3]], atol=1e-15)
    ds = open_dataset(path)
    assert ds.gauge_angles.dims == ("token", "rope_pair") and ds.gauge_angles.attrs["gauge_kind"] == "rope"
    with pytest.raises(ValueError, match=r"store: `rope_angles` must have shape \(n, m\) with n = 4, 1 <= m"):
        TrajectoryWriter(
            tmp_path / "b.zarr", n_snapshots_max=1, n=n, d=d, xi=np.arange(n), rope_angles=np.ones((n, 4))
        )
    with pytest.raises(ValueError, match=r"store: `gauge` and `rope_angles` must not be given together"):
        TrajectoryWriter(
            tmp_path / "c.zarr", n_snapshots_max=1, n=n, d=d, xi=np.arange(n), gauge=q, rope_angles=angles
        )


# --- layout: chunks of several snapshots, the metric series ---------------------------------------


def _small_run(path, *, series=True):
    """A store as `attnflow run examples/rope.toml` writes one: 64 tokens, d = 3, 201 snapshots,
    RoPE angles, and (``series``) its metric series given to ``close``."""
    n, times = 64, [snapshot_time(k, 0.1) for k in range(201)]
    writer = TrajectoryWriter(
        path, n_snapshots_max=201, n=n, d=3, xi=np.arange(n), rope_angles=np.outer(np.arange(n), [0.1])
    )
    for k, t in enumerate(times):
        writer.append(t, _x(k, n=n))
    metrics = {"t": times, "energy": np.linspace(0.0, 1.0, 201), "mean_cosine": [None, *np.ones(200)]}
    writer.close("ok", series=metrics if series else None)
    return metrics


def _files(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_a_small_run_is_a_handful_of_files(tmp_path, monkeypatch):
    _small_run(tmp_path / "new.zarr")
    files = _files(tmp_path / "new.zarr")
    # seven zarr.json (group; t, x, xi, gauge_angles, two series), t and x two chunks each (170 +
    # 31 snapshots), one chunk each for the others: 15 files (409 before: two per snapshot)
    assert len(files) == 15, files
    assert [f for f in files if f.startswith("x/c/")] == ["x/c/0/0/0", "x/c/1/0/0"]
    monkeypatch.setattr(store, "snapshots_per_chunk", lambda *_: 1)  # the layout of stores before
    _small_run(tmp_path / "old.zarr", series=False)
    assert len(_files(tmp_path / "old.zarr")) == 409


def test_chunks_stay_near_their_byte_budget():
    assert store.snapshots_per_chunk(201, 64 * 3 * 8) == 170  # 1.5 kB a snapshot: 170 in 256 KiB
    assert store.snapshots_per_chunk(100, 64 * 3 * 8) == 100  # never past the preallocation
    assert store.snapshots_per_chunk(10_000, 10_000 * 3 * 8) == 1  # 240 kB a snapshot: one each
    assert store.snapshots_per_chunk(10_000, 1000 * 3 * 8) == 10  # 10 x 24 kB in a 256 KiB chunk
    assert store.snapshots_per_chunk(5, 10**9) == 1


def test_stores_of_a_snapshot_per_chunk_read_as_the_new_ones(tmp_path, monkeypatch):
    _small_run(tmp_path / "new.zarr", series=False)
    monkeypatch.setattr(store, "snapshots_per_chunk", lambda *_: 1)
    _small_run(tmp_path / "old.zarr", series=False)
    new, old = read_trajectory(tmp_path / "new.zarr"), read_trajectory(tmp_path / "old.zarr")
    np.testing.assert_array_equal(new.xs, old.xs)
    np.testing.assert_array_equal(new.ts, old.ts)
    assert new.status == old.status == "ok"
    xr.testing.assert_identical(
        open_dataset(tmp_path / "new.zarr").drop_attrs(), open_dataset(tmp_path / "old.zarr").drop_attrs()
    )


def test_metric_series_are_variables_of_t_and_round_trip_through_netcdf(tmp_path):
    path = tmp_path / "trajectory.zarr"
    metrics = _small_run(path)
    ds = open_dataset(path)
    assert ds.energy.dims == ("t",) and ds.energy.attrs["long_name"] == "interaction energy E"
    np.testing.assert_array_equal(ds.energy.values, metrics["energy"])
    assert np.isnan(ds.mean_cosine.values[0]) and (ds.mean_cosine.values[1:] == 1.0).all()  # None: NaN
    raw = xr.open_zarr(path)  # the consolidated metadata list them
    assert {"energy", "mean_cosine"} <= set(raw.data_vars) and "xi" in raw.coords
    raw.to_netcdf(tmp_path / "run.nc")
    with xr.open_dataset(tmp_path / "run.nc") as back:
        np.testing.assert_array_equal(back.energy.values, metrics["energy"])
        assert back.attrs["Conventions"].startswith("CF-") and "xi" in back.coords


@pytest.mark.parametrize(
    ("series", "match"),
    [
        ({"energy": [1.0, 2.0]}, r"`series\['energy'\]` must hold one value per snapshot written \(3\)"),
        ({"t": [0.0, 0.1, 0.3]}, r"`series\['t'\]` must be the stored snapshot times"),
        ({"x": [1.0, 2.0, 3.0]}, r"`series` keys must be identifiers other than the store's arrays"),
    ],
)
def test_close_rejects_series_that_do_not_fit(tmp_path, series, match):
    writer = _write(tmp_path / "s.zarr", 3, close=False)
    with pytest.raises(ValueError, match=match):
        writer.close("ok", series=series)
    assert not writer.closed and read_trajectory(tmp_path / "s.zarr").status == "incomplete"
