"""From a config to a density run (workflows.density_build): the labels, gauges, factors, profiles
and initial laws that pass through, each against the library built by hand, and the refusals that
need no run (memory, refused keys named for ``--set``)."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.core import gauges
from attnflow.core.kernel import make_profile
from attnflow.io.config import ConfigError, config_from_dict, load_config
from attnflow.numerics import density_circle as dc
from attnflow.workflows.density_build import build_density, check_memory, content_values
from configs import toml_text

BASE = {
    "model": {"d": 2, "beta": 1.0},
    "density": {"grid": 48},
    "solver": {"dt": 0.05, "t_end": 0.5, "save_every": 0.25},
}


def _config(changes: dict):
    merged = {section: dict(keys) for section, keys in BASE.items()}
    for section, keys in changes.items():
        merged.setdefault(section, {}).update(keys)
    return config_from_dict(merged)


POSITIONS = {"aux": {"kind": "positions"}, "density": {"grid": 48, "labels": 4}}


def _angles(run) -> np.ndarray:
    return np.asarray(run.field.gauge.angle), np.asarray(run.field.gauge.orientation)


def test_rope_turns_positions_on_the_unit_interval():
    run = build_density(_config({**POSITIONS, "gauge": {"kind": "rope"}}))
    nodes = np.asarray(run.labels.nodes)
    np.testing.assert_allclose(nodes, (np.arange(4) + 0.5) / 4, rtol=0, atol=0)
    angle, orientation = _angles(run)
    np.testing.assert_array_equal(angle, 2 * np.pi * nodes)  # "full_period": a full turn over [0, 1)
    assert np.all(orientation == 1)
    run = build_density(_config({**POSITIONS, "gauge": {"kind": "rope", "frequencies": [3.0]}}))
    np.testing.assert_array_equal(_angles(run)[0], 3.0 * nodes)


def test_generalized_rope_in_the_plane_is_rope():
    rotation = [[[0.0, -1.0], [1.0, 0.0]]]
    gauge = {"kind": "generalized_rope", "generators": rotation, "rates": [1.0]}
    run = build_density(_config({**POSITIONS, "gauge": gauge}))
    angle = _angles(run)[0]
    expected = 2 * np.pi * np.asarray(run.labels.nodes)
    # the same rotations (the matrices' angle is read back by atan2: to round-off, mod 2 pi)
    np.testing.assert_allclose(np.cos(angle), np.cos(expected), atol=1e-14)
    np.testing.assert_allclose(np.sin(angle), np.sin(expected), atol=1e-14)


def test_prompt_gauges_are_the_particles_haar_draws():
    config = _config({"aux": {"kind": "prompts", "n_prompts": 3}, "gauge": {"kind": "prompt", "seed": 7}})
    run = build_density(config)
    np.testing.assert_array_equal(np.asarray(run.labels.nodes), [0.0, 1.0, 2.0])
    np.testing.assert_allclose(np.asarray(run.labels.weights), 1 / 3, rtol=1e-15)
    expected = dc.circle_gauge_from_matrices(gauges.haar_orthogonal(7, 3, 2))
    np.testing.assert_array_equal(_angles(run)[0], np.asarray(expected.angle))
    np.testing.assert_array_equal(_angles(run)[1], np.asarray(expected.orientation))


def test_files_for_labels_gauges_and_factors(tmp_path):
    table = np.array([[0.1, 1.0], [0.4, 3.0], [0.9, 4.0]])  # nodes, weights (rescaled to sum 1)
    reflection = np.array([[0.0, 1.0], [1.0, 0.0]])
    q = np.stack([np.eye(2), reflection, np.eye(2)])
    w = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.5], [0.2, 0.5, 1.0]])
    for name, array in (("labels", table), ("q", q), ("w", w)):
        np.save(tmp_path / f"{name}.npy", array)
    run = build_density(
        _config({
            "aux": {"kind": "file", "path": str(tmp_path / "labels.npy")},
            "gauge": {"kind": "file", "path": str(tmp_path / "q.npy")},
            "factor": {"kind": "file", "path": str(tmp_path / "w.npy")},
        })
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(run.labels.nodes), [0.1, 0.4, 0.9])
    np.testing.assert_allclose(np.asarray(run.labels.weights), [0.125, 0.375, 0.5], rtol=1e-15)
    assert _angles(run)[1].tolist() == [1.0, -1.0, 1.0]  # the reflection kept as one
    np.testing.assert_array_equal(np.asarray(run.field.w), w)


@pytest.mark.parametrize("kind", ["distance_bias", "toeplitz_cos"])
def test_positional_factors_on_the_nodes(kind):
    run = build_density(
        _config(
            {
                **POSITIONS,
                "factor": {"kind": kind},
                "density": {"grid": 48, "labels": 4, "label_rule": "gauss"},
            }
        )
    )
    nodes = np.asarray(run.labels.nodes)
    x, _ = np.polynomial.legendre.leggauss(4)
    np.testing.assert_allclose(nodes, 0.5 * (x + 1), rtol=1e-15)
    gap = nodes[:, None] - nodes[None, :]
    expected = np.exp(-np.abs(gap)) if kind == "distance_bias" else np.cos(2 * np.pi * gap)
    np.testing.assert_allclose(np.asarray(run.field.w), expected, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize(
    "model",
    [{"profile": "linear"}, {"time_scale": "rescaled", "beta": 2.0}, {"normalization": "sa"}],
)
def test_profiles_normalisations_and_time_scales_pass_through(model):
    run = build_density(_config({"model": {"d": 2, **model}}))
    options = {key: model[key] for key in ("beta", "time_scale") if key in model}
    expected = make_profile(model.get("profile", "exp"), **options)
    assert float(run.field.scale) == float(expected.scale)
    assert run.field.normalization == model.get("normalization", "usa")
    assert run.dt == 0.05 and run.steps_per_snapshot == 5 and run.snapshots == 3


def test_a_von_mises_fisher_mixture_is_normalised_and_centred():
    density = {"centers": [[0.0, 1.0], [0.0, -1.0]], "weights": [3.0, 1.0], "kappa": 2.0}
    run = build_density(_config({"density": density}))
    f = np.asarray(run.state0.f)
    theta = dc.grid_angles(48)
    np.testing.assert_allclose(2 * np.pi * f.mean(axis=1), 1.0, rtol=1e-14)  # mass 1 per row
    assert np.all(f == f[0]) and theta[np.argmax(f[0])] == pytest.approx(np.pi / 2)
    mixture = 0.75 * np.exp(2 * (np.sin(theta) - 1)) + 0.25 * np.exp(2 * (-np.sin(theta) - 1))
    np.testing.assert_allclose(f[0], mixture / (2 * np.pi * mixture.mean()), rtol=1e-13)


def test_the_sphere_initial_wave_has_mass_one_and_turns_with_rope():
    config = _config({
        "model": {"d": 3},
        "aux": {"kind": "positions"},
        "gauge": {"kind": "rope"},
        "density": {"grid": None, "lmax": 18, "labels": 2, "amplitude": 0.5, "mode": 2},
    })  # fmt: skip
    run = build_density(config)
    a = np.asarray(run.state0.a)
    np.testing.assert_allclose(np.sqrt(4 * np.pi) * a[:, 0, 0].real, 1.0, rtol=1e-14)
    power = (np.abs(a) ** 2).sum(axis=-1)
    assert np.all(power[:, 3:] < 1e-28) and np.all(power[:, 2] > 1e-4)  # P_2 of a direction: degree 2 only
    alpha = 2 * np.pi * np.asarray(run.labels.nodes)  # RoPE in d = 3: a turn about the third axis
    c, s = np.cos(alpha), np.sin(alpha)
    turn = np.zeros((alpha.size, 3, 3))
    turn[:, 0, 0], turn[:, 0, 1], turn[:, 1, 0], turn[:, 1, 1], turn[:, 2, 2] = c, -s, s, c, 1.0
    np.testing.assert_allclose(run.frames, turn, atol=1e-15)


def test_sphere_gauges_are_the_particles_matrices(tmp_path):
    prompts = {"model": {"d": 3}, "aux": {"kind": "prompts", "n_prompts": 3}, "factor": {"kind": "none"}}
    sphere = {"grid": None, "lmax": 18, "centers": [[0.0, 0.0, 1.0]], "kappa": 1.0}
    run = build_density(_config({**prompts, "gauge": {"kind": "prompt", "seed": 7}, "density": sphere}))
    np.testing.assert_array_equal(run.frames, gauges.haar_orthogonal(7, 3, 3))
    np.save(tmp_path / "q.npy", gauges.haar_orthogonal(8, 3, 3))
    gauge = {"kind": "file", "path": str(tmp_path / "q.npy")}
    run = build_density(_config({**prompts, "gauge": gauge, "density": sphere}))
    np.testing.assert_array_equal(run.frames, gauges.haar_orthogonal(8, 3, 3))
    assert run.wigner.shape == (3, 19, 19, 37)


def test_a_sphere_law_from_a_file_is_read_in_the_content_frame(tmp_path):
    """The file holds content-frame values on the run's grid; with prompt gauges (a reflection among
    them) the solver's gauge-frame slices, turned back, are those values: the same state as the
    von Mises-Fisher law the config itself makes (band-limited to round-off at lmax = 18)."""
    prompts = {"model": {"d": 3}, "aux": {"kind": "prompts", "n_prompts": 3}, "factor": {"kind": "none"}}
    gauge = {"kind": "prompt", "seed": 0}
    vmf = {"grid": None, "lmax": 18, "centers": [[0.0, 0.6, 0.8]], "kappa": 1.0}
    made = build_density(_config({**prompts, "gauge": gauge, "density": vmf}))
    values = np.asarray(content_values(made.field, made.state0.a, made.wigner))
    assert values.shape == (3, 30, 57) and np.ptp(values) > 0.1  # the grid at lmax = 18, beta = 1
    np.save(tmp_path / "f0.npy", 2.0 * values[0])  # one row for every label, any mass
    read = build_density(
        _config(
            {
                **prompts,
                "gauge": gauge,
                "density": {"grid": None, "lmax": 18, "path": str(tmp_path / "f0.npy")},
            }
        )
    )
    np.testing.assert_allclose(np.asarray(read.state0.a), np.asarray(made.state0.a), atol=1e-14)


def test_memory_bound_names_the_grid():
    config = _config({})
    profile = make_profile("exp", beta=1.0)
    check_memory(config, profile, 4, limit=10**6)  # 40 copies of 4 x 48 floats and the factor fit
    with pytest.raises(ConfigError, match=r"`density\.grid` must be small enough for memory"):
        check_memory(config, profile, 4, limit=10**4)


def test_a_refused_key_given_by_set_is_named_for_set(tmp_path):
    path = tmp_path / "density.toml"
    path.write_text(toml_text(BASE))
    with pytest.raises(
        ConfigError, match=r"^--set: `model\.noise` must be left out with a \[density\] section"
    ):
        load_config(path, ["model.noise=0.5"])
    with pytest.raises(
        ConfigError, match=r"density\.toml: `density\.kappa` must be left out when `density\.init`"
    ):
        path.write_text(toml_text({**BASE, "density": {"grid": 48, "kappa": 3.0}}))
        load_config(path)
    # path and centers imply the initial law
    assert config_from_dict({**BASE, "density": {"grid": 48, "path": "/x.npy"}}).density.init == "file"
    assert config_from_dict({**BASE, "density": {"grid": 48, "centers": [[1.0, 0.0]]}}).density.init == "vmf"


@pytest.mark.parametrize(("grid", "d"), [({"grid": 48}, 2), ({"lmax": 18}, 3)])
def test_softmax_over_a_signed_factor_file_is_the_library_s_refusal_under_its_key(tmp_path, grid, d):
    """One check (core.factors.check_softmax_factor), on the circle and on the sphere; the config
    key named (the build had a copy of it naming factor.path)."""
    np.save(tmp_path / "w.npy", np.array([[1.0, -0.5], [-0.5, 1.0]]))
    factor = {"kind": "file", "path": str(tmp_path / "w.npy")}
    data = {**BASE, "aux": {"kind": "positions"}, "density": {**grid, "labels": 2}, "factor": factor}
    config = config_from_dict({**data, "model": {"d": d, "normalization": "sa"}})
    with pytest.raises(
        ConfigError, match=r"^config: `model\.normalization` 'sa' requires a non-negative .* MatrixFactor\.$"
    ):
        build_density(config)
