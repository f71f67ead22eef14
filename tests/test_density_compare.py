"""A particle run folder against a density run folder of the same model (workflows.density_compare):
the distance at the times both stored shrinks with the number of particles, and two runs of different
models are refused in one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.analysis.density_distance import nearest_nodes, sample_density
from attnflow.io.config import config_from_dict
from attnflow.numerics import density_circle as dc
from attnflow.workflows.density_compare import run_distance
from attnflow.workflows.density_run import run_density
from attnflow.workflows.run import run

GRID = 64  # resolves the sharpening bumps to t = 1 (40 angles: under_resolved at t = 1)
NODES = (np.arange(3) + 0.5) / 3
MODEL = {  # labels at the nodes in both runs, RoPE and the Toeplitz cosine at 2 pi on [0, 1)
    "model": {"d": 2, "beta": 1.0},
    "aux": {"kind": "file", "path": "labels.npy"},
    "gauge": {"kind": "rope", "frequencies": [2 * np.pi]},
    "factor": {"kind": "toeplitz_cos"},
    "solver": {"dt": 0.025, "t_end": 1.0, "save_every": 0.5},
}


def _config(tmp_path, changes: dict):
    merged = {section: dict(keys) for section, keys in MODEL.items()}
    for section, keys in changes.items():
        merged.setdefault(section, {}).update(keys)
    merged["aux"]["path"] = str(tmp_path / merged["aux"]["path"])
    return config_from_dict(merged)


def _bumps() -> np.ndarray:
    """A von Mises bump at pi xi per label (the flow moves and sharpens it)."""
    theta = dc.grid_angles(GRID)
    return np.exp(2.0 * np.cos(theta[None, :] - np.pi * NODES[:, None]))


def _particles(tmp_path, n: int, f0: np.ndarray) -> tuple:
    labels = np.repeat(NODES, n // 3)
    angles = sample_density(f0, n // 3, np.random.default_rng(n), stratified=False)
    theta = np.concatenate(angles)
    np.save(tmp_path / f"labels{n}.npy", labels)
    np.save(tmp_path / f"x{n}.npy", np.column_stack([np.cos(theta), np.sin(theta)]))
    return (
        {
            "model": {"n": n},
            "aux": {"path": f"labels{n}.npy"},
            "init": {"kind": "file", "path": str(tmp_path / f"x{n}.npy")},
        },
        labels,
    )


@pytest.mark.slow
def test_particles_against_the_density_run_shrink_with_n_and_other_models_are_refused(tmp_path):
    np.save(tmp_path / "labels.npy", NODES)
    f0 = _bumps()
    np.save(tmp_path / "f0.npy", f0)
    density = tmp_path / "density"
    run_density(_config(tmp_path, {"density": {"grid": GRID, "path": str(tmp_path / "f0.npy")}}), density)
    distances = {}
    for n in (48, 768):
        changes, labels = _particles(tmp_path, n, f0)
        assert np.array_equal(nearest_nodes(labels, NODES), np.repeat(np.arange(3), n // 3))
        run(_config(tmp_path, changes), tmp_path / f"particles{n}")
        result = run_distance(tmp_path / f"particles{n}", density)
        assert result.t.tolist() == [0.0, 0.5, 1.0] and (result.n, result.labels) == (n, 3)
        distances[n] = result.distance
    # 16 times the particles: W1 about 4 times smaller (n^-1/2); a factor 2 leaves room for one draw
    assert np.all(distances[768] < 0.5 * distances[48]), distances
    # another model (beta) is refused, naming the key and both values
    other = tmp_path / "other"
    run_density(
        _config(
            tmp_path, {"model": {"beta": 2.0}, "density": {"grid": GRID, "path": str(tmp_path / "f0.npy")}}
        ),
        other,
    )
    with pytest.raises(
        ValueError, match=r"`model.beta` must be the same in both runs.*1\.0 \(particles\) and 2\.0"
    ):
        run_distance(tmp_path / "particles48", other)
