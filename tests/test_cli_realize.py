"""`attnflow realize` in-process: run folders of both kinds; bad targets exit 2, one line, nothing written."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.analysis import laws
from attnflow.cli import app
from attnflow.io.store import read_trajectory


def invoke(*args: str):
    return CliRunner().invoke(app, ["realize", *args])


@pytest.fixture
def targets(tmp_path: Path) -> dict[str, Path]:
    files = {
        "sphere": laws.spherical_mixture_samples(0, 32),
        "orbit": laws.VonMisesMixture((0.6, 0.4), (4.0, 10.0), (1.0, 4.0)).sample(1, 40),
        "not_unit": 1.01 * laws.spherical_mixture_samples(0, 8),
        "nan_sphere": np.where(
            np.arange(24).reshape(8, 3) == 5, np.nan, laws.spherical_mixture_samples(0, 8)
        ),
        "nan_angles": np.array([0.1, np.inf, 2.0]),
        "matrix_3d": np.zeros((2, 3, 3)),
        "one_angle": np.array([1.0]),
        "strings": np.array(["a", "b"]),
    }
    paths = {}
    for name, array in files.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], array)
    paths["garbage"] = tmp_path / "garbage.npy"
    paths["garbage"].write_text("not an array")
    paths["archive"] = tmp_path / "archive.npz"
    np.savez(paths["archive"], a=np.zeros(3))
    paths["missing"] = tmp_path / "missing.npy"
    return paths


def test_orbit_run_folder(targets, tmp_path):
    out = tmp_path / "orbit"
    result = invoke(
        "--target", str(targets["orbit"]), "--kind", "orbit", "--n", "48", "--out", str(out), "--t-end", "20"
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".attnflow-run",  # the run folder's marker (attnflow.io.run_folder)
        "config.json",
        "figures",
        "metrics.json",
        "trajectory.zarr",
    ]
    m = json.loads((out / "metrics.json").read_text())
    assert m["realisation_kind"] == "orbit"
    assert m["realisation_bound"] == pytest.approx(1 / 96)
    # KS bound 1/(2n) of the orbit construction, empirical (interpolated) law of 40 samples, 48 tokens.
    assert m["realisation_distance"] <= m["realisation_bound"] + 1e-6
    assert m["orbit_residual"] <= 1e-6 and m["run"]["status"] == "ok"
    assert abs(m["energy_gap"]) < 1e-9
    config = json.loads((out / "config.json").read_text())
    assert config["realize"]["kind"] == "orbit" and config["model"]["n"] == 48
    stored = read_trajectory(out / "trajectory.zarr")
    assert stored.status == "ok" and stored.ts[-1] == pytest.approx(20.0) and stored.gauge.shape == (48, 3, 3)
    assert (out / "figures" / "target.png").stat().st_size > 0


def test_orbit_run_folder_for_tied_angles_meets_the_bound(tmp_path):
    # 16 copies of one angle, exact mode: the realised angles are 1.0 to round-off either side of
    # the law's atom, and the distance is read to the atom's tolerance: within 1/(2n), not 0.53.
    target = tmp_path / "tied.npy"
    np.save(target, np.full(16, 1.0))
    out = tmp_path / "tied"
    result = invoke("--target", str(target), "--kind", "orbit", "--mode", "exact", "--out", str(out))
    assert result.exit_code == 0, result.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["realisation_bound"] == 1 / 32 and m["orbit_residual"] < 1e-14
    assert m["realisation_distance"] <= m["realisation_bound"]


def test_sphere_run_folder(targets, tmp_path):
    out = tmp_path / "sphere"
    result = invoke(
        "--target", str(targets["sphere"]), "--kind", "sphere", "--out", str(out), "--t-end", "20"
    )
    assert result.exit_code == 0, result.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["realisation_kind"] == "sphere"
    assert m["realisation_distance"] <= m["realisation_bound"]  # E8's bound 2|u* − v0|
    assert m["realisation_wasserstein"] is not None and len(m["u_star"]) == 3
    assert (out / "figures" / "target.png").exists()
    # The folder's final state is the realisation: x_N matches the targets to the bound.
    x = read_trajectory(out / "trajectory.zarr").xs[-1]
    y = np.load(targets["sphere"])
    assert np.max(np.linalg.norm(x - y, axis=1)) == pytest.approx(m["realisation_distance"], abs=1e-12)


@pytest.mark.parametrize(
    "name, kind, extra, expected",
    [
        (
            "not_unit",
            "sphere",
            (),
            r"`--target` must hold unit vectors \(\| \|y_i\| - 1 \| <= 1e-06\); got \|y_0\| = 1.01",
        ),
        ("nan_sphere", "sphere", (), "`--target` must be finite everywhere; got 1 rows with NaN or inf"),
        (
            "orbit",
            "sphere",
            (),
            r"--kind sphere: `--target` must be an \(n, d\) array of unit vectors .* got shape \(40,\)",
        ),
        (
            "sphere",
            "orbit",
            (),
            r"--kind orbit: `--target` must be an \(n,\) array of angles .* got shape \(32, 3\)",
        ),
        ("matrix_3d", "orbit", (), r"got shape \(2, 3, 3\)"),
        ("one_angle", "orbit", (), r"n >= 2; got shape \(1,\)"),
        ("strings", "orbit", (), "dtype <U1"),
        ("nan_angles", "orbit", (), "`--target` must be finite everywhere; got 1 NaN/inf"),
        ("garbage", "orbit", (), "`--target` must be a readable .npy file; got '.*garbage.npy'"),
        (
            "missing",
            "sphere",
            (),
            "`--target` must be a readable .npy file; got '.*missing.npy' \\(FileNotFoundError\\)",
        ),
        ("archive", "orbit", (), "`--target` must be a .npy file holding one array"),
        (
            "sphere",
            "spere",
            (),
            "`--kind` must be one of \\('sphere', 'orbit'\\); got 'spere'. Did you mean 'sphere'\\?",
        ),
        (
            "sphere",
            "sphere",
            ("--n", "10"),
            r"`--n` must be the number of targets \(32\) for --kind sphere, or omitted; got 10",
        ),
        ("orbit", "orbit", ("--n", "1"), "`--n` must be an integer >= 2; got 1"),
    ],
)
def test_bad_targets_exit_2_and_write_nothing(targets, tmp_path, name, kind, extra, expected):
    out = tmp_path / "never"
    result = invoke("--target", str(targets[name]), "--kind", kind, "--out", str(out), *extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert not out.exists()


def test_non_empty_out_is_refused(targets, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = invoke("--target", str(targets["orbit"]), "--kind", "orbit", "--out", str(out))
    assert result.exit_code == 2
    assert "must be a new or empty folder or a realize folder" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
