"""What `attnflow run` puts in its store: exact snapshot times an xarray user can select."""

import warnings

import numpy as np
import pytest
import xarray as xr

from attnflow.io.config_load import config_from_dict
from attnflow.io.store import open_dataset, read_trajectory
from attnflow.workflows.run import replot, run
from attnflow.workflows.sweep_points import classify_run
from configs import small_config


def test_run_stores_exact_times_selectable_by_value(tmp_path):
    config = config_from_dict(small_config({"solver": {"dt": 0.05, "t_end": 0.5, "save_every": 0.1}}))
    run(config, tmp_path / "run")
    path = tmp_path / "run" / "trajectory.zarr"
    ts = read_trajectory(path).ts
    assert ts.tolist() == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]  # not 0.30000000000000004
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: xarray opens it without a warning
        ds = xr.open_zarr(path)
    assert ds.x.sel(t=0.3).shape == (16, 3)
    np.testing.assert_array_equal(open_dataset(path).x.sel(t=0.3).values, read_trajectory(path).xs[3])
    # The sweep's reader of the final state sees it (d = 3: a shape class, not the "unreadable" None).
    assert classify_run(tmp_path / "run")["shape"] is not None


@pytest.mark.slow
def test_rope_run_at_large_d_stores_angles_and_replots(tmp_path):
    """n = 8, d = 2000: the store holds 8 x 1 RoPE angles (not 8 x 2000 x 2000 matrices), and its
    gauge frame is the one the metrics describe."""
    config = config_from_dict(
        {
            "model": {"n": 8, "d": 2000},
            "aux": {"kind": "positions"},
            "gauge": {"kind": "rope"},
            "solver": {"dt": 0.05, "t_end": 0.2, "save_every": 0.1},
        }
    )
    result = run(config, tmp_path / "run").metrics
    assert result["run"]["status"] == "ok"
    path = tmp_path / "run" / "trajectory.zarr"
    assert not (path / "gauge").exists()
    stored = read_trajectory(path)
    assert stored.stored_gauge.rope_angles.shape == (8, 1) and stored.xs.shape == (3, 8, 2000)
    u = stored.gauge_frame(stored.xs[-1])
    m = u.mean(axis=0)
    assert abs((8 * m @ m - 1) / 7 - result["gauge_mean_cosine"]) < 1e-12  # same formula, round-off
    assert replot(tmp_path / "run")  # the figures redraw from the angles
