"""Large runs: the ``[storage]`` section (thinned stores), metrics that label their approximations,
the expansion's energy, and the empirical-law figure."""

import json

import numpy as np
import pytest

from attnflow.analysis import metrics, summary
from attnflow.analysis.summary import OnlineSummary, subsample, summarize
from attnflow.core import sphere
from attnflow.io.config import ConfigError, config_from_dict
from attnflow.io.store import iter_snapshots, read_trajectory
from attnflow.viz.law import law_histogram, write_law_figure
from attnflow.workflows import run as run_module
from attnflow.workflows.build import build

ROPE = {
    "model": {"n": 64, "d": 3},
    "aux": {"kind": "positions"},
    "gauge": {"kind": "rope"},
    "solver": {"dt": 0.05, "t_end": 1.0, "save_every": 0.1},
}
THIN = {"token_stride": 4, "dtype": "float32", "snapshots": "final"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run stored in full and thinned."""
    root = tmp_path_factory.mktemp("runs")
    full = run_module.run(config_from_dict(ROPE), root / "full")
    thin = run_module.run(config_from_dict({**ROPE, "storage": THIN}), root / "thin")
    return root, full, thin


def test_a_thinned_store_keeps_every_kth_token_in_float32_at_the_first_and_last_time(runs):
    root, _, _ = runs
    full, thin = (
        read_trajectory(root / "full" / "trajectory.zarr"),
        read_trajectory(root / "thin" / "trajectory.zarr"),
    )
    assert full.xs.shape == (11, 64, 3) and thin.xs.shape == (2, 16, 3)
    assert thin.xs.dtype == np.float32 and thin.status == "ok"
    np.testing.assert_array_equal(thin.ts, full.ts[[0, -1]])
    np.testing.assert_array_equal(thin.xs, full.xs[[0, -1]][:, ::4].astype(np.float32))
    np.testing.assert_array_equal(thin.xi, full.xi[::4])
    np.testing.assert_array_equal(thin.gauge, full.gauge[::4].astype(np.float32))


def test_metrics_use_every_token_and_time_whatever_is_stored(runs):
    _, full, thin = runs
    for key in ("energy", "mean_cosine", "n_clusters", "min_cosine", "orbit_residual"):
        assert thin.metrics[key] == full.metrics[key]
    assert thin.metrics["series"] == full.metrics["series"] and len(full.metrics["series"]["t"]) == 11
    assert thin.metrics["run"]["stored_tokens"] == 16 and thin.metrics["run"]["snapshots"] == 2


def test_replot_of_a_thinned_run_draws_its_series(runs):
    root, _, _ = runs
    written = run_module.replot(root / "thin")
    assert sorted(p.name for p in written) == ["collapse.png", "energy.png", "states.png", "viewer.html"]


def test_resume_of_a_thinned_store_is_refused(tmp_path):
    config = config_from_dict({**ROPE, "storage": {"token_stride": 2}})
    with pytest.raises(run_module.RunInterrupted):
        run_module.run(config, tmp_path / "run", progress=lambda done, total: done == 3 and _interrupt())
    with pytest.raises(ConfigError, match="whose store keeps its state"):
        run_module.run(config, tmp_path / "run", resume=True)


def _interrupt():
    raise KeyboardInterrupt


def test_the_default_storage_keeps_everything():
    storage = config_from_dict({}).storage
    assert (storage.token_stride, storage.dtype, storage.snapshots) == (1, None, "all")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("token_stride", 0, "storage.token_stride"),
        ("dtype", "float16", "storage.dtype"),
        ("snapshots", "some", "storage.snapshots"),
    ],
)
def test_bad_storage_values_are_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"storage": {key: value}})


def test_above_the_pairwise_limit_the_pairwise_keys_use_a_labelled_subsample(monkeypatch):
    monkeypatch.setattr(summary, "PAIRWISE_LIMIT", 16)
    sim = build(config_from_dict(ROPE))
    x = np.asarray(sim.x0)
    result = summarize(sim.kernel, [0.0], x[None])
    rows = subsample(64, 16)
    assert rows.tolist() == list(range(0, 64, 4))
    assert result["n_clusters"] == metrics.n_clusters(x[rows])
    assert result["min_cosine"] == pytest.approx(float(metrics.min_cosine(x[rows])), abs=0)
    assert "subsample of 16 of 64 tokens" in result["methods"]["n_clusters"]
    assert result["series"]["n_eff"] == [None]
    assert result["mean_cosine"] == pytest.approx(float(metrics.mean_cosine(x)), rel=1e-15)  # all tokens
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("tolerance", [1e-6, 1e-10])
def test_the_expansion_energy_is_within_its_bound(tolerance):
    sim = build(config_from_dict(ROPE))
    xs = np.stack([np.asarray(sim.x0), np.asarray(sphere.sample_uniform(5, 64, 3))])
    exact = OnlineSummary(sim.kernel)
    approx = OnlineSummary(sim.kernel, energy="expansion", tolerance=tolerance)
    exact.add([0.0, 1.0], xs)
    approx.add([0.0, 1.0], xs)
    scale = float(sim.kernel.profile.scale) / (2 * float(sim.kernel.profile.beta))  # the energy's scale
    error = np.abs(np.subtract(approx.series["energy"], exact.series["energy"]))
    assert error.max() <= tolerance * scale
    assert approx.result()["methods"]["energy"].startswith("expansion")
    assert exact.result()["methods"]["energy"] == "exact"


def test_a_large_run_draws_the_law(monkeypatch, tmp_path):
    monkeypatch.setattr(run_module, "LAW_LIMIT", 32)
    monkeypatch.setattr(run_module, "SCATTER_LIMIT", 32)
    result = run_module.run(config_from_dict(ROPE), tmp_path / "run")
    names = sorted(p.name for p in (tmp_path / "run" / "figures").iterdir())
    assert names == ["collapse.png", "energy.png", "law.png", "states.png"]
    assert (tmp_path / "run" / "figures" / "law.png").stat().st_size < 200_000
    assert result.metrics["run"]["status"] == "ok"


def test_the_law_of_the_uniform_law_is_flat_and_of_a_dirac_is_one_cell():
    x = np.asarray(sphere.sample_uniform(0, 200_000, 3))
    law = law_histogram(x, color=np.full(len(x), 2.5))
    cells = law["density"].size
    assert law["density"].mean() == pytest.approx(1.0, rel=1e-12)
    # 200000 / 2592 cells ≈ 77 points per cell: a relative Poisson deviation of 0.11; 6 sigma
    assert np.abs(law["density"] - 1.0).max() < 6 / np.sqrt(200_000 / cells)
    assert np.allclose(law["mean_color"], 2.5)
    dirac = np.tile([0.0, 0.6, 0.8], (50, 1))
    assert law_histogram(dirac)["density"].max() == pytest.approx(cells)


def test_the_law_in_other_dimensions():
    circle = np.asarray(sphere.sample_uniform(0, 1000, 2))
    assert law_histogram(circle)["density"].shape == (72, 1)
    high = np.asarray(sphere.sample_uniform(0, 1000, 5))
    assert law_histogram(high)["density"].sum() == pytest.approx(72 * 36)
    with pytest.raises(ValueError, match="law_histogram: `color` must have one value per point"):
        law_histogram(high, color=np.ones(3))


def test_write_law_figure(tmp_path):
    x = np.asarray(sphere.sample_uniform(0, 5000, 3))
    path = write_law_figure(tmp_path / "law.png", x=x, u=x[::-1], color=np.arange(5000), t=2.0, n_total=10**6)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_iter_snapshots_reads_a_store_in_order(runs):
    root, _, _ = runs
    blocks = list(iter_snapshots(root / "full" / "trajectory.zarr"))
    stored = read_trajectory(root / "full" / "trajectory.zarr")
    np.testing.assert_array_equal(np.concatenate([xs for _, xs in blocks]), stored.xs)
