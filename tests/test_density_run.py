"""``attnflow run`` with a ``[density]`` section (workflows.density_run): the run folder and
``density.zarr`` as xarray reads it, mass in the metrics, the under-resolved exit, a bitwise resume,
the sphere, the example, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.config import config_from_dict, resolved_dict
from attnflow.io.density_store import read_density
from attnflow.numerics import density_circle as dc
from attnflow.numerics.status import Status
from attnflow.workflows.density_run import run_density
from attnflow.workflows.run import RunInterrupted
from configs import toml_text

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GRID = 40  # above kernel_grid(1.0) = 36

CIRCLE = {  # RoPE and the Toeplitz cosine on 3 position nodes, the initial law from a file
    "model": {"d": 2, "beta": 1.0},
    "aux": {"kind": "positions"},
    "gauge": {"kind": "rope"},
    "factor": {"kind": "toeplitz_cos"},
    "density": {"grid": GRID, "labels": 3, "path": "f0.npy"},
    "solver": {"dt": 0.05, "t_end": 1.0, "save_every": 0.25},
}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _f0(count: int, grid: int = GRID) -> np.ndarray:
    """Positive grid values, not normalised (the run rescales each row to mass 1)."""
    theta = dc.grid_angles(grid)
    return np.stack([2.0 + np.cos(theta + k) + 0.3 * np.sin(2 * theta) for k in range(count)])


def _write(folder: Path, config: dict, *, f0: np.ndarray | None = None, name: str = "density.toml") -> Path:
    if f0 is not None:
        np.save(folder / "f0.npy", f0)
    path = folder / name
    path.write_text(toml_text(config))
    return path


def _changed(config: dict, changes: dict) -> dict:
    merged = {section: dict(keys) for section, keys in config.items()}
    for section, keys in changes.items():
        merged.setdefault(section, {}).update(keys)
    return merged


def test_the_contract_f0_file_to_density_zarr_read_by_xarray(tmp_path):
    f0 = _f0(3)
    config = _write(tmp_path, CIRCLE, f0=f0)
    out = tmp_path / "run"
    result = invoke("run", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".attnflow-run",
        "config.json",
        "density.zarr",
        "figures",
        "metrics.json",
    ]
    ds = xr.open_zarr(out / "density.zarr")  # plain xarray, no attnflow reader
    assert ds["t"].dims == ("time",) and ds["f"].dims == ("time", "label", "theta")
    assert {"theta", "label"} <= set(ds.coords)
    assert ds.sizes == {"time": 5, "label": 3, "theta": GRID}
    np.testing.assert_array_equal(ds["t"].values, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(ds["theta"].values, 2 * np.pi * np.arange(GRID) / GRID, rtol=0, atol=1e-15)
    np.testing.assert_allclose(ds["label"].values, [1 / 6, 1 / 2, 5 / 6], rtol=1e-15)
    # the first snapshot is the file's rows, each rescaled to mass 1 (trapezoid rule: exact)
    expected = f0 / (2 * np.pi * f0.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(ds["f"].values[0], expected, rtol=1e-15, atol=0)
    assert not np.array_equal(ds["f"].values[-1], ds["f"].values[0])  # the law moved
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["status"] == "ok" and metrics["run"]["domain"] == "circle"
    assert metrics["series"]["t"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # mass per label: conserved to round-off (the divergence has no mean); 1e-12 is the bound
    assert max(metrics["series"]["mass_error"]) <= 1e-12 and metrics["mass_error"] <= 1e-12
    assert metrics["energy_monotone"] is True and metrics["energy"] > metrics["energy_initial"]
    for name in ("density.png", "series.png"):
        assert (out / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "status" in result.output and "ok" in result.output


def test_one_row_without_labels(tmp_path):
    config = {
        "model": {"d": 2},
        "density": {"grid": GRID, "path": "f0.npy"},
        "solver": {"dt": 0.05, "t_end": 0.5, "save_every": 0.25},
    }
    path = _write(tmp_path, config, f0=_f0(1)[0])  # shape (M,)
    out = tmp_path / "run"
    assert invoke("run", str(path), "--out", str(out)).exit_code == 0
    ds = xr.open_zarr(out / "density.zarr")
    assert ds["f"].shape == (3, 1, GRID) and ds["weight"].values.tolist() == [1.0]


def test_an_under_resolved_run_exits_3_and_keeps_its_resolved_snapshots(tmp_path):
    # beta = 5 on 64 angles (kernel_grid: 63): the mode-3 instability cascades into the top third of
    # the modes by t = 20, where the resolution status stops the run
    config = {
        "model": {"d": 2, "beta": 5.0, "time_scale": "rescaled"},
        "density": {"grid": 64, "amplitude": 0.05, "mode": 3},
        "solver": {"dt": 0.1, "t_end": 40.0, "save_every": 5.0},
    }
    out = tmp_path / "run"
    result = invoke("run", str(_write(tmp_path, config)), "--out", str(out))
    assert result.exit_code == 3, result.output
    assert "under_resolved" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "raise density.grid" in result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["status"] == "under_resolved"
    stored = read_density(out / "density.zarr")
    assert stored.status == "under_resolved"
    count = stored.ts.shape[0]
    assert 2 <= count < 9 and metrics["series"]["t"] == stored.ts.tolist()
    assert max(metrics["series"]["resolution_tail"]) <= dc.TAIL_TOL  # only resolved laws are kept
    assert xr.open_zarr(out / "density.zarr").sizes["time"] == count  # trimmed: no NaN rows


def test_resume_is_bitwise_the_uninterrupted_run(tmp_path):
    config = _write(tmp_path, CIRCLE, f0=_f0(3))
    whole = tmp_path / "whole"
    assert invoke("run", str(config), "--out", str(whole)).exit_code == 0

    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    from attnflow.io.config import load_config

    part = tmp_path / "part"
    with pytest.raises(RunInterrupted):
        run_density(load_config(config), part, progress=stop_after_three)
    stopped = read_density(part / "density.zarr")
    assert stopped.ts.shape[0] == 3 and stopped.status == "interrupted"
    assert json.loads((part / "metrics.json").read_text())["run"]["status"] == "interrupted"
    result = invoke("run", str(config), "--out", str(part), "--resume")
    assert result.exit_code == 0, result.output
    a, b = read_density(whole / "density.zarr"), read_density(part / "density.zarr")
    np.testing.assert_array_equal(a.ts, b.ts)
    assert np.array_equal(a.arrays["f"], b.arrays["f"])  # bitwise
    series = [json.loads((f / "metrics.json").read_text())["series"] for f in (whole, part)]
    assert series[0] == series[1]


@pytest.mark.slow
def test_an_adaptive_run_meets_the_fixed_step_run_and_is_not_resumed(tmp_path):
    np.save(tmp_path / "f0.npy", _f0(3))
    for name, method in (("fixed", "rk4"), ("adaptive", "adaptive")):
        path = _write(tmp_path, _changed(CIRCLE, {"solver": {"method": method}}), name=f"{name}.toml")
        result = invoke("run", str(path), "--out", str(tmp_path / name))
        assert result.exit_code == 0, result.output
    fixed, adaptive = (read_density(tmp_path / name / "density.zarr") for name in ("fixed", "adaptive"))
    assert np.array_equal(fixed.ts, adaptive.ts) and adaptive.status == "ok"
    f, g = fixed.arrays["f"], adaptive.arrays["f"]
    # Dormand-Prince at rtol 1e-8 (6 steps) against RK4 at dt = 0.05 (20 steps): measured 2.4e-8 of
    # the law's motion (RK4's own error); a wrong field or a skipped stage is far outside
    assert np.max(np.abs(g - f)) <= 1e-6 * np.max(np.abs(f[-1] - f[0]))
    metrics = json.loads((tmp_path / "adaptive" / "metrics.json").read_text())
    assert (
        metrics["mass_error"] <= 1e-12 and metrics["energy_monotone"] is True and metrics["run"]["steps"] > 0
    )
    # its step-size state is not stored: no resume (one line, exit 2)
    result = invoke("run", str(tmp_path / "adaptive.toml"), "--out", str(tmp_path / "adaptive"), "--resume")
    assert (
        result.exit_code == 2 and "adaptive" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    )
    # solver.max_steps is read: a bound below the 6 trial steps the run needs ends it as max_steps
    bounded = _changed(CIRCLE, {"solver": {"method": "adaptive", "max_steps": 3}})
    result = invoke(
        "run", str(_write(tmp_path, bounded, name="bounded.toml")), "--out", str(tmp_path / "bounded")
    )
    assert result.exit_code == 3, result.output
    assert json.loads((tmp_path / "bounded" / "metrics.json").read_text())["run"]["status"] == "max_steps"


def test_resume_refuses_another_config(tmp_path):
    config = _write(tmp_path, CIRCLE, f0=_f0(3))
    out = tmp_path / "run"
    assert invoke("run", str(config), "--out", str(out)).exit_code == 0
    result = invoke("run", str(config), "--out", str(out), "--resume", "--set", "model.beta=2.0")
    assert result.exit_code == 2 and "model" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_sphere_run_folder_and_its_resume(tmp_path):
    """Prompt gauges (seed 0: a reflection and a rotation): the solver's slices are in the gauge
    frame, the stored ``f`` in the content frame (turned back by Wigner matrices)."""
    config = {
        "model": {"d": 3, "beta": 1.0},
        "aux": {"kind": "prompts", "n_prompts": 2},
        "gauge": {"kind": "prompt", "seed": 0},
        "density": {"lmax": 18, "centers": [[1.0, 0.0, 0.0]], "kappa": 1.0},
        "solver": {"dt": 0.025, "t_end": 0.2, "save_every": 0.05},
    }
    path = _write(tmp_path, config)
    whole = tmp_path / "whole"
    result = invoke("run", str(path), "--out", str(whole))
    assert result.exit_code == 0, result.output
    ds = xr.open_zarr(whole / "density.zarr")
    assert ds["f"].dims == ("time", "label", "lat", "lon")
    assert ds["a"].dims == ("time", "label", "degree", "order", "part") and ds.sizes["degree"] == 19
    # the content-frame law at t = 0 is the von Mises-Fisher law about (1, 0, 0) for every label
    lat, lon = np.radians(ds["lat"].values)[:, None], np.radians(ds["lon"].values)[None, :]
    x = np.cos(lat) * np.cos(lon)
    vmf = np.exp(x - 1.0) / (2 * np.pi * (1 - np.exp(-2.0)))
    # the harmonics of the law to degree 18 (its next coefficient is below 1e-18)
    np.testing.assert_allclose(ds["f"].values[0], np.broadcast_to(vmf, ds["f"].shape[1:]), atol=1e-14)
    metrics = json.loads((whole / "metrics.json").read_text())
    assert metrics["run"]["domain"] == "sphere" and metrics["mass_error"] <= 1e-12
    assert metrics["energy_monotone"] is True
    # the marginal law's spread two ways: from the stored content-frame f (Wigner matrices) and, in
    # the metrics, from the gauge-frame slices' resultants turned by Q^T (a transposed frame or a
    # dropped reflection moves the stored laws' resultants by O(1))
    points = np.stack(np.broadcast_arrays(x, np.cos(lat) * np.sin(lon), np.sin(lat)))
    area = np.polynomial.legendre.leggauss(ds.sizes["lat"])[1][:, None] * (2 * np.pi / ds.sizes["lon"])
    resultant = np.einsum("tlab,cab,a,l->tc", ds["f"].values, points, area[:, 0], ds["weight"].values)
    spread = 1.0 - np.linalg.norm(resultant, axis=-1)
    np.testing.assert_allclose(metrics["series"]["spread"], spread, atol=1e-12)
    assert np.ptp(spread) > 1e-3  # the law moves

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    from attnflow.io.config import load_config

    part = tmp_path / "part"
    with pytest.raises(RunInterrupted):
        run_density(load_config(path), part, progress=stop_after_two)
    assert invoke("run", str(path), "--out", str(part), "--resume").exit_code == 0
    a, b = read_density(whole / "density.zarr"), read_density(part / "density.zarr")
    assert np.array_equal(a.arrays["a"], b.arrays["a"]) and np.array_equal(a.arrays["f"], b.arrays["f"])


@pytest.mark.slow
def test_the_example_runs(tmp_path):
    out = tmp_path / "run"
    result = invoke("run", str(EXAMPLES / "density_circle.toml"), "--out", str(out))
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["status"] == "ok" and metrics["mass_error"] <= 1e-12
    # `attnflow plot` redraws the same figures from the folder alone
    drawn = {path.name: path.read_bytes() for path in (out / "figures").iterdir()}
    assert set(drawn) == {"density.png", "series.png"}
    for path in (out / "figures").iterdir():
        path.unlink()
    result = invoke("plot", str(out))
    assert result.exit_code == 0, result.output
    assert {path.name: path.read_bytes() for path in (out / "figures").iterdir()} == drawn
    (out / "metrics.json").unlink()  # a killed run's folder: the law only, from the store's times
    (out / "figures" / "density.png").unlink()
    result = invoke("plot", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "figures" / "density.png").read_bytes() == drawn["density.png"]


def test_a_particle_config_has_no_density_key():
    # the particles' resolved config (and hash, the run folder's name) are what they were
    assert "density" not in resolved_dict(config_from_dict({}))
    # the particles' status codes are what they were; a density's under_resolved comes after them
    assert (Status.ok.code, Status.nonfinite.code, Status.max_steps.code) == (0, 1, 2)
    assert Status.under_resolved.code == 3


def _bad_label_file(folder: Path) -> dict:
    np.save(folder / "labels.npy", np.ones((4, 3)))
    return {"aux": {"kind": "file", "path": "labels.npy"}, "density": {"labels": None}}


def _signed_factor(folder: Path) -> dict:
    np.save(folder / "w.npy", 2 * np.eye(3) - 1)  # symmetric, negative off the diagonal
    return {"model": {"normalization": "sa"}, "factor": {"kind": "file", "path": "w.npy"}}


def _bad_f0(folder: Path, kind: str) -> dict:
    f0 = _f0(3)
    if kind == "shape":
        f0 = _f0(3, GRID + 1)
    elif kind == "negative":
        f0[1, 5] = -0.1
    elif kind == "nonfinite":
        f0[0, 2] = np.nan
    else:
        f0[2] = 0.0
    np.save(folder / "f0.npy", f0)
    return {}


def _planar_gauge_file_on_the_sphere(folder: Path) -> dict:
    np.save(folder / "q.npy", np.broadcast_to(np.eye(2), (3, 2, 2)))
    return {
        "model": {"d": 3},
        "gauge": {"kind": "file", "path": "q.npy"},
        "density": {"grid": None, "lmax": 24, "path": None, "centers": [[1.0, 0.0, 0.0]], "kappa": 1.0},
    }


BAD = [  # (changes or a maker of changes, words the one line must hold)
    ({"model": {"beta": 5.0}, "density": {"grid": 32}}, ["density.grid", "63", "32"]),
    (
        {"model": {"d": 3}, "density": {"grid": None, "lmax": 3000, "path": None}},
        ["density.lmax", "memory", "3000"],
    ),
    (_bad_label_file, ["aux.path", "(L,)", "(4, 3)"]),
    (_signed_factor, ["model.normalization", "non-negative", "'sa'", "MatrixFactor"]),  # the library's check
    (lambda folder: _bad_f0(folder, "shape"), ["density.path", f"(3, {GRID})", f"(3, {GRID + 1})"]),
    (lambda folder: _bad_f0(folder, "negative"), ["density.path", "non-negative", "-0.1"]),
    (lambda folder: _bad_f0(folder, "nonfinite"), ["density.path", "finite"]),
    (lambda folder: _bad_f0(folder, "zero"), ["density.path", "positive mass", "row 2"]),
    ({"model": {"n": 128}}, ["model.n", "[density]", "128"]),
    ({"init": {"kind": "cap"}}, ["init.kind", "[density]"]),
    ({"model": {"layer_norm": "pre"}}, ["model.layer_norm", "[density]"]),
    ({"model": {"noise": 0.1}}, ["model.noise", "[density]"]),
    ({"solver": {"method": "geodesic_rk4"}}, ["solver.method", "geodesic_rk4"]),
    ({"solver": {"dt": 0.25}}, ["solver.dt", "at most", "0.25"]),
    ({"model": {"d": 3}}, ["model.d", "density.grid"]),
    ({"attention": {"heads": 2}}, ["attention", "[density]"]),
    (_planar_gauge_file_on_the_sphere, ["gauge.path", "(3, 3, 3)", "(3, 2, 2)"]),
    ({"density": {"path": None, "init": "vmf", "centers": [[1.0, 0.0]], "kappa": 400.0}}, ["density.kappa"]),
    ({"density": {"path": None, "amplitude": 1.5}}, ["density.amplitude", "1.5"]),
    (  # the circle's (3, 40) file given to a sphere run: its grid is latitudes x longitudes
        {"model": {"d": 3}, "gauge": {"kind": "none"}, "density": {"grid": None, "lmax": 24}},
        ["density.path", "(3, 40)", "(3, 38, 74)"],
    ),
]


@pytest.mark.parametrize(("changes", "words"), BAD, ids=[f"{w[0]}-{i}" for i, (_, w) in enumerate(BAD)])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, changes, words):
    np.save(tmp_path / "f0.npy", _f0(3))
    changes = changes(tmp_path) if callable(changes) else changes
    config = _changed(CIRCLE, changes)
    config = {s: {k: v for k, v in keys.items() if v is not None} for s, keys in config.items()}
    out = tmp_path / "run"
    result = invoke("run", str(_write(tmp_path, config)), "--out", str(out))
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for word in words:
        assert word in message, (word, message)
    assert not out.exists()


@pytest.mark.slow
def test_a_sigkilled_run_keeps_every_completed_snapshot(tmp_path):
    config = _write(tmp_path, _changed(CIRCLE, {"solver": {"t_end": 5000.0, "save_every": 0.05}}), f0=_f0(3))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (out / "density.zarr").exists() and read_density(out / "density.zarr", arrays=()).ts.size >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never stored 3 snapshots")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    stored = read_density(out / "density.zarr")
    assert stored.status == "incomplete" and stored.ts.size >= 3
    assert np.all(np.isfinite(stored.arrays["f"]))
    np.testing.assert_allclose(2 * np.pi * stored.arrays["f"].mean(axis=-1), 1.0, rtol=1e-13)  # whole laws
    np.testing.assert_allclose(np.diff(stored.ts), 0.05, rtol=1e-12)  # a contiguous prefix of the times
