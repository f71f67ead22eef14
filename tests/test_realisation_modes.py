"""Realisation modes (a-priori, exact) and seed batches (analysis.realisation, workflows.realize).

The exact mode simulates the gauge frame first and chooses the gauges from the consensus it reaches,
so the target is realised to the convergence of the gauge frame (round-off at τ = 40, β = 1); the
a-priori mode is off by ``|u* − v_0|``, which does not vanish. A batch of seeds is one call of one
compiled program and bitwise equal to the seeds run one at a time.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.analysis import realisation
from attnflow.analysis.laws import VonMisesMixture, spherical_mixture_samples
from attnflow.workflows import realize

LAW = VonMisesMixture([0.6, 0.4], [4.0, 10.0], [1.0, 4.0])


@pytest.mark.parametrize("n", [32, 64])
def test_exact_mode_realises_the_targets_to_the_tolerance_and_a_priori_does_not(n):
    targets = np.asarray(spherical_mixture_samples(0, n))
    construction = realisation.sphere_construction(targets, sigma=0.2, seed=[0, 1])
    exact = realize.realize_batch(construction, mode="exact", save_every=40.0)
    a_priori = realize.realize_batch(construction, mode="a-priori", save_every=40.0)
    for result in exact:
        # the gauge frame converges to round-off by τ = 40 (orbit residual ~3e-15): 1e-12 leaves 300x
        assert result.orbit_residual <= 1e-12
        assert result.wasserstein <= 1e-12 and result.distance <= 1e-12
        assert np.linalg.norm(result.u_star - construction.v0) <= 1e-12
    for result in a_priori:
        # the consensus of a cap of width 0.2 is off v_0 by about 1e-2 (measured 7e-3 .. 4e-2)
        assert result.wasserstein >= 1e-3 and result.distance >= 1e-3


def test_exact_mode_from_any_initial_data():
    # sigma = 1e3: the cap is the whole sphere; a-priori misses by O(1), exact does not
    targets = np.asarray(spherical_mixture_samples(1, 32))
    construction = realisation.sphere_construction(targets, sigma=1e3, seed=[3, 4], gauge="rotation")
    exact = realize.realize_batch(construction, mode="exact", save_every=40.0)
    a_priori = realize.realize_batch(construction, mode="a-priori", save_every=40.0)
    assert max(r.wasserstein for r in exact) <= 1e-12  # round-off, as above
    assert min(r.wasserstein for r in a_priori) >= 0.1  # measured 0.75 .. 1.0


def test_exact_orbit_sits_at_the_absolute_target_azimuths():
    n = 32
    result = realize.realize_orbit(LAW, n=n, seed=2, mode="exact", save_every=40.0)
    alpha = realisation.orbit_angles(LAW, n)
    expected = np.stack([np.cos(alpha), np.sin(alpha), np.zeros(n)], axis=1)
    assert np.max(np.linalg.norm(result.x - expected, axis=1)) <= 1e-12  # the orbit of e_1, to round-off
    # the circular KS of the exact quantiles is 1/(2n) itself (round-off on top: 1e-12)
    assert result.distance == pytest.approx(result.bound, abs=1e-12)


def test_exact_initial_rotates_the_gauge_frame_onto_the_reference():
    targets = np.asarray(spherical_mixture_samples(0, 8))
    construction = realisation.sphere_construction(targets, sigma=0.3, seed=5, gauge="rotation")
    gauge = construction.kernel.gauge
    u_star = np.array([0.6, 0.0, 0.8])
    x0 = realisation.exact_initial(construction, u_star)
    r = realisation.rotation_to(u_star, construction.v0)
    np.testing.assert_allclose(r @ u_star, construction.v0, atol=1e-15)  # R u* = v_0 (round-off)
    np.testing.assert_allclose(r.T @ r, np.eye(3), atol=1e-15)
    assert np.linalg.det(r) == pytest.approx(1.0, abs=1e-14)
    # the gauge frame of the new content is the old one rotated by R (round-off of two products)
    np.testing.assert_allclose(gauge.apply(x0), gauge.apply(construction.x0) @ r.T, atol=1e-14)
    frame = realisation.frame_kernel(construction.kernel)
    np.testing.assert_array_equal(frame.gauge.apply(x0), x0)  # the identity gauge
    orbit = realisation.orbit_construction(LAW, n=8, seed=0)
    np.testing.assert_array_equal(realisation.frame_kernel(orbit.kernel).gauge.apply(orbit.x0), orbit.x0)


@pytest.mark.parametrize("mode", realisation.MODES)
@pytest.mark.parametrize("kind", ["orbit", "sphere"])
def test_a_batch_of_seeds_is_bitwise_the_seeds_run_alone(kind, mode):
    n, seeds, options = 16, [0, 3, 7], {"t_end": 4.0, "dt": 0.01, "save_every": 1.0}
    if kind == "orbit":
        build = lambda seed: realisation.orbit_construction(LAW, n=n, seed=seed)  # noqa: E731
    else:
        targets = np.asarray(spherical_mixture_samples(0, n))
        build = lambda seed: realisation.sphere_construction(targets, seed=seed)  # noqa: E731
    batch = realize.realize_batch(build(seeds), mode=mode, **options)
    assert len(batch) == len(seeds)
    for seed, result in zip(seeds, batch, strict=True):
        alone = realize.realize(build(seed), mode=mode, **options)
        np.testing.assert_array_equal(result.trajectory.xs, alone.trajectory.xs)  # bitwise
        np.testing.assert_array_equal(result.trajectory.ts, alone.trajectory.ts)
        np.testing.assert_array_equal(result.u_star, alone.u_star)
        assert result.distance == alone.distance and result.orbit_residual == alone.orbit_residual
        assert result.trajectory.status == alone.trajectory.status
        assert result.trajectory.steps == alone.trajectory.steps
        assert result.trajectory.statistics() == alone.trajectory.statistics()


def test_mode_and_batch_errors():
    construction = realisation.orbit_construction(LAW, n=8, seed=[0, 1])
    with pytest.raises(ValueError, match=r"^realize: `mode` must be one of \('a-priori', 'exact'\); "
                       r"got 'exakt'\. Did you mean 'exact'\?$"):  # fmt: skip
        realize.realize_batch(construction, mode="exakt")
    with pytest.raises(ValueError, match=r"^realize: `construction.x0` must be one state \(n, d\)"):
        realize.realize(construction)
    single = realisation.orbit_construction(LAW, n=8, seed=0)
    with pytest.raises(ValueError, match=r"^realize_batch: `construction.x0` must be a batch \(B, n, d\)"):
        realize.realize_batch(single)
    for bad in ([], [0, 1.5], "0", True):
        with pytest.raises(ValueError, match=r"^realize_orbit: `seed` must be an integer or a non-empty"):
            realisation.orbit_construction(LAW, n=8, seed=bad)
    assert realisation.orbit_construction(LAW, n=8, seed=(2, 3)).x0.shape == (2, 8, 3)
    np.testing.assert_array_equal(  # a batch stacks the seeds' own initial data
        realisation.orbit_construction(LAW, n=8, seed=[4, 2]).x0[1],
        realisation.orbit_construction(LAW, n=8, seed=2).x0,
    )


def test_run_realisation_records_the_mode(tmp_path):
    target = tmp_path / "targets.npy"
    np.save(target, np.asarray(spherical_mixture_samples(0, 16)))
    metrics = realize.run_realisation(
        target, kind="sphere", out=tmp_path / "run", mode="exact", t_end=40.0, save_every=20.0
    )
    assert metrics["realisation_mode"] == "exact"
    assert metrics["realisation_wasserstein"] <= 1e-12  # round-off, as in the first test
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["realize"]["mode"] == "exact"
    with pytest.raises(ValueError, match=r"^realize --mode: `mode` must be one of"):
        realize.run_realisation(target, kind="sphere", out=tmp_path / "bad", mode="exactly")
    assert not (tmp_path / "bad").exists()


def test_mode_errors_rows():
    rows = realize.mode_errors(sizes=[16], sigmas=[0.2], seeds=[0], t_end=40.0)
    by_mode = {row["mode"]: row for row in rows}
    assert set(by_mode) == set(realisation.MODES) and len(rows) == 2
    assert by_mode["exact"]["wasserstein"] <= 1e-12 < by_mode["a-priori"]["wasserstein"]
    assert jnp.isfinite(by_mode["a-priori"]["base_point_distance"])
