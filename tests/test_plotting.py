"""Tests of attnflow.viz.plotting: the draw_* functions draw what they are given on the Axes they are
given, and the write_* functions write valid, non-empty PNG files for d = 3 (spheres) and d = 5
(principal-plane projections)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from attnflow.viz.plotting import (
    draw_projection,
    draw_series,
    draw_sphere,
    draw_state,
    write_comparison_figure,
    write_run_figures,
    write_series_figure,
    write_target_figure,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
N = 40
T = 6


def _unit(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    g = rng.standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    with path.open("rb") as fh:
        assert fh.read(8) == PNG_SIGNATURE, path
    # A blank canvas compresses to a few hundred bytes; a drawn figure is well above 1 kB.
    assert path.stat().st_size > 1024, (path, path.stat().st_size)


def _scatter(ax) -> PathCollection:
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(scatters) == 1
    return scatters[0]


def _series(ts: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "t": ts,
        "energy": 1.0 - np.exp(-ts),
        "mean_cosine": 1.0 - 0.9 * np.exp(-ts),
        "gauge_mean_cosine": 1.0 - 0.8 * np.exp(-ts),
        "n_eff": np.array([5, 4, 3, 2, 1, 1], dtype=float),
    }


# --------------------------------------------------------------------------- draw_*


def test_draw_sphere_returns_given_axes_with_n_points():
    x = _unit(np.random.default_rng(0), (N, 3))
    ax = Figure().add_subplot(1, 1, 1, projection="3d")
    out = draw_sphere(ax, x, color=np.arange(N), title="sphere")
    assert out is ax
    scatter = _scatter(ax)
    assert len(scatter.get_offsets()) == N
    assert np.asarray(scatter.get_array()).shape == (N,)  # coloured by `color`
    assert ax.get_title() == "sphere"
    assert tuple(ax.get_box_aspect() / ax.get_box_aspect()[0]) == (1.0, 1.0, 1.0)


def test_draw_sphere_rejects_2d_axes_and_wrong_d():
    x3 = _unit(np.random.default_rng(0), (N, 3))
    with pytest.raises(TypeError, match="3-D Axes"):
        draw_sphere(Figure().add_subplot(1, 1, 1), x3)
    ax = Figure().add_subplot(1, 1, 1, projection="3d")
    with pytest.raises(ValueError, match="draw_projection"):
        draw_sphere(ax, _unit(np.random.default_rng(0), (N, 5)))
    with pytest.raises(ValueError, match="`color`"):
        draw_sphere(ax, x3, color=np.arange(N + 1))


@pytest.mark.parametrize("d", [2, 5])
def test_draw_projection_returns_given_axes_with_n_points(d):
    x = _unit(np.random.default_rng(1), (N, d))
    ax = Figure().add_subplot(1, 1, 1)
    out = draw_projection(ax, x, color=np.arange(N) % 4)
    assert out is ax
    offsets = np.asarray(_scatter(ax).get_offsets())
    assert offsets.shape == (N, 2)
    # Projections onto orthonormal directions never lengthen a unit vector (1e-12: round-off).
    assert np.all(np.linalg.norm(offsets, axis=1) <= 1.0 + 1e-12)
    if d == 2:
        np.testing.assert_array_equal(offsets, x)


def test_draw_projection_spans_the_leading_plane():
    # Points on a great circle of S^4: the projection keeps their full length (1e-12: round-off).
    rng = np.random.default_rng(2)
    basis, _ = np.linalg.qr(rng.standard_normal((5, 2)))
    angles = np.linspace(0.0, 2.0 * np.pi, N, endpoint=False)
    x = np.cos(angles)[:, None] * basis[:, 0] + np.sin(angles)[:, None] * basis[:, 1]
    ax = draw_projection(Figure().add_subplot(1, 1, 1), x)
    offsets = np.asarray(_scatter(ax).get_offsets())
    np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), 1.0, atol=1e-12)


def test_draw_projection_of_a_collapsed_state_is_finite():
    x = np.tile(np.eye(5)[2], (N, 1))
    ax = draw_projection(Figure().add_subplot(1, 1, 1), x)
    offsets = np.asarray(_scatter(ax).get_offsets())
    assert np.all(np.isfinite(offsets))
    # The single point keeps its unit length (1e-12: round-off).
    np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize(("d", "position"), [(3, (1, 2, 1)), (5, 122)])
def test_draw_state_picks_sphere_or_projection(d, position):
    fig = Figure()
    x = _unit(np.random.default_rng(3), (N, d))
    ax = draw_state(fig, position, x, color=np.arange(N), title="state")
    assert ax in fig.axes
    assert (ax.name == "3d") == (d == 3)
    assert len(_scatter(ax).get_offsets()) == N
    assert ax.get_title() == "state"


def test_draw_series_returns_given_axes():
    ts = np.linspace(0.0, 1.0, T)
    ax = Figure().add_subplot(1, 1, 1)
    out = draw_series(ax, ts, np.exp(ts), label="e", ylabel="value", logy=True)
    assert out is ax
    assert len(ax.lines) == 1
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), ts)
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "value"
    with pytest.raises(ValueError, match="aligned with `ts`"):
        draw_series(ax, ts, np.ones(T + 1))


# --------------------------------------------------------------------------- write_*


@pytest.mark.parametrize("d", [3, 5])
def test_write_run_figures(tmp_path, d):
    rng = np.random.default_rng(4)
    ts = np.linspace(0.0, 5.0, T)
    xs = _unit(rng, (T, N, d))
    us = _unit(rng, (T, N, d))
    out_dir = tmp_path / "run" / "figures"
    paths = write_run_figures(out_dir, ts=ts, xs=xs, us=us, color=np.arange(N), series=_series(ts))
    assert [p.name for p in paths] == ["states.png", "energy.png", "collapse.png"]
    assert all(p.parent == out_dir for p in paths)
    for path in paths:
        _assert_png(path)


def test_write_run_figures_skips_missing_series(tmp_path):
    rng = np.random.default_rng(5)
    ts = np.linspace(0.0, 5.0, T)
    xs = _unit(rng, (T, N, 3))
    # No energy, no n_eff, an undefined (all-null) gauge series: only what is there is drawn.
    series = {"mean_cosine": 1.0 - np.exp(-ts), "gauge_mean_cosine": [None] * T}
    paths = write_run_figures(tmp_path, ts=ts, xs=xs, us=None, color=None, series=series)
    assert [p.name for p in paths] == ["states.png", "collapse.png"]
    for path in paths:
        _assert_png(path)
    assert not (tmp_path / "energy.png").exists()

    paths = write_run_figures(tmp_path / "empty", ts=ts, xs=xs, us=xs, color=None, series={})
    assert [p.name for p in paths] == ["states.png"]
    _assert_png(paths[0])

    only_n_eff = {"n_eff": np.arange(T, 0, -1)}
    paths = write_run_figures(tmp_path / "n_eff", ts=ts, xs=xs, us=xs, color=None, series=only_n_eff)
    assert [p.name for p in paths] == ["states.png", "collapse.png"]


def test_write_run_figures_leaves_the_states_out_on_request(tmp_path):
    rng = np.random.default_rng(8)
    ts = np.linspace(0.0, 5.0, T)
    xs = _unit(rng, (T, N, 3))
    paths = write_run_figures(tmp_path, ts=ts, xs=xs, us=xs, color=None, series=_series(ts), states=False)
    assert [p.name for p in paths] == ["energy.png", "collapse.png"]
    assert not (tmp_path / "states.png").exists()


def test_write_run_figures_validates_shapes(tmp_path):
    rng = np.random.default_rng(6)
    ts = np.linspace(0.0, 5.0, T)
    xs = _unit(rng, (T, N, 3))
    with pytest.raises(ValueError, match="`xs` must be a \\(T, n, d\\)"):
        write_run_figures(tmp_path, ts=ts[:-1], xs=xs, us=None, color=None, series={})
    with pytest.raises(ValueError, match="`us` must be None or have the shape"):
        write_run_figures(tmp_path, ts=ts, xs=xs, us=xs[:, :-1], color=None, series={})
    with pytest.raises(ValueError, match="series\\['energy'\\]"):
        write_run_figures(tmp_path, ts=ts, xs=xs, us=None, color=None, series={"energy": np.ones(T + 2)})


@pytest.mark.parametrize("d", [3, 5])
@pytest.mark.parametrize("ncols", [None, 2])
def test_write_comparison_figure(tmp_path, d, ncols):
    rng = np.random.default_rng(7)
    panels = [
        {"x": _unit(rng, (N, d)), "color": np.arange(N), "title": "a"},
        {"x": _unit(rng, (N, d)), "color": None, "title": "b"},
        {"x": _unit(rng, (N, d)), "title": "c"},
    ]
    path = write_comparison_figure(tmp_path / "sub" / "compare.png", panels, ncols=ncols)
    assert path == tmp_path / "sub" / "compare.png"
    _assert_png(path)


def test_write_comparison_figure_validates(tmp_path):
    with pytest.raises(ValueError, match="`panels`"):
        write_comparison_figure(tmp_path / "c.png", [])
    with pytest.raises(ValueError, match="`ncols`"):
        write_comparison_figure(tmp_path / "c.png", [{"x": np.eye(3)}], ncols=0)


@pytest.mark.parametrize("logy", [False, True])
def test_write_series_figure(tmp_path, logy):
    ts = np.linspace(0.0, 5.0, 50)
    curves = [("n=64", ts, np.exp(-ts)), ("n=128", ts[::2], np.exp(-2 * ts[::2]))]
    path = write_series_figure(tmp_path / "series.png", curves, ylabel="gap", logy=logy, title="gaps")
    _assert_png(path)
    with pytest.raises(ValueError, match="`curves`"):
        write_series_figure(tmp_path / "none.png", [], ylabel="gap")


@pytest.mark.parametrize("d", [3, 5])
def test_write_target_figure_sphere(tmp_path, d):
    rng = np.random.default_rng(8)
    target = _unit(rng, (N, d))
    noisy = target + 0.05 * rng.standard_normal((N, d))
    realised = noisy / np.linalg.norm(noisy, axis=1, keepdims=True)
    path = write_target_figure(tmp_path / "target.png", target, realised, kind="sphere")
    _assert_png(path)


def test_write_target_figure_orbit(tmp_path):
    rng = np.random.default_rng(9)
    target = rng.vonmises(1.0, 4.0, size=200)  # in [-π, π): reduced to [0, 2π) by the function
    realised = target + 0.01 * rng.standard_normal(200)
    path = write_target_figure(tmp_path / "orbit.png", target, realised, kind="orbit")
    _assert_png(path)


def test_write_target_figure_rejects_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="Did you mean 'orbit'"):
        write_target_figure(tmp_path / "t.png", np.zeros(3), np.zeros(3), kind="orbitt")
