"""Realisations: angle laws, gauge constructions (analysis.realisation), and the runs of the paper's
experiments E7 (orbit universality) and E8 (points on the sphere) (workflows.realize)."""

import types

import jax
import numpy as np
import pytest
import scipy.stats
from scipy.integrate import quad

from attnflow.analysis import laws, metrics, realisation
from attnflow.viz import plotting
from attnflow.workflows import realize
from attnflow.workflows.reproduce import reproduce

TWO_PI = 2 * np.pi
E7_LAW = laws.VonMisesMixture(weights=(0.6, 0.4), kappas=(4.0, 10.0), mus=(1.0, 4.0))


# --------------------------------------------------------------------------- angle laws


def test_von_mises_mixture_cdf_against_quadrature():
    theta = np.linspace(0.0, TWO_PI, 17)
    reference = [quad(lambda t: float(E7_LAW.pdf(t)), 0.0, a, epsabs=1e-13, limit=200)[0] for a in theta]
    # The Fourier-series CDF is exact to round-off; quad's own error is ~1e-14 here.
    np.testing.assert_allclose(E7_LAW.cdf(theta), reference, atol=1e-10)
    assert E7_LAW.cdf(0.0) == 0.0 and E7_LAW.cdf(TWO_PI) == pytest.approx(1.0, abs=1e-15)


def test_von_mises_single_component_against_scipy():
    law = laws.VonMisesMixture(weights=(1.0,), kappas=(2.5,), mus=(5.0,))
    theta = np.linspace(0.0, TWO_PI, 9)
    # scipy's vonmises CDF G unwraps by whole turns, so ν([0, θ]) = G(θ − μ) − G(−μ).
    reference = scipy.stats.vonmises.cdf(theta - 5.0, 2.5) - scipy.stats.vonmises.cdf(-5.0, 2.5)
    np.testing.assert_allclose(law.cdf(theta), reference, atol=1e-10)
    np.testing.assert_allclose(law.pdf(theta), scipy.stats.vonmises.pdf(theta, 2.5, loc=5.0), rtol=1e-12)
    # κ = 0 is the uniform law.
    uniform = laws.VonMisesMixture(weights=(1.0,), kappas=(0.0,), mus=(0.0,))
    np.testing.assert_allclose(uniform.cdf(theta), theta / TWO_PI, atol=1e-15)


def test_von_mises_mixture_ppf_inverts_the_cdf():
    u = np.linspace(0.0, 1.0, 20001)
    alpha = E7_LAW.ppf(u)
    assert np.all(np.diff(alpha) >= 0)  # monotone
    assert alpha[0] == pytest.approx(0.0, abs=1e-12) and alpha[-1] == pytest.approx(TWO_PI, abs=1e-12)
    np.testing.assert_allclose(E7_LAW.cdf(alpha), u, atol=1e-10)


def test_von_mises_mixture_sampling():
    a = E7_LAW.sample(0, 20000)
    np.testing.assert_array_equal(a, E7_LAW.sample(0, 20000))  # seeded
    np.testing.assert_array_equal(a, E7_LAW.sample(np.random.default_rng(0), 20000))
    assert E7_LAW.sample(jax.random.key(3), 10).shape == (10,)
    assert np.all((a >= 0) & (a < TWO_PI))
    # KS of 20000 iid samples: ≈ 0.006 typically; 0.015 is far in the tail (p < 1e-3).
    assert metrics.circular_ks(a, E7_LAW.cdf) < 0.015


def test_von_mises_mixture_validation():
    with pytest.raises(ValueError, match="`weights` must be >= 0 and sum to 1"):
        laws.VonMisesMixture(weights=(0.5, 0.4), kappas=(1.0, 1.0), mus=(0.0, 1.0))
    with pytest.raises(ValueError, match="one length"):
        laws.VonMisesMixture(weights=(1.0,), kappas=(1.0, 2.0), mus=(0.0,))


def test_empirical_law_quantiles_are_the_samples():
    samples = E7_LAW.sample(5, 50)
    law = laws.EmpiricalAngleLaw(samples)
    mids = (np.arange(50) + 0.5) / 50
    np.testing.assert_allclose(law.ppf(mids), np.sort(samples), atol=0)
    np.testing.assert_allclose(law.cdf(np.sort(samples)), mids, atol=1e-15)
    assert law.cdf(0.0) == 0.0 and law.cdf(TWO_PI) == 1.0
    # Negative and > 2π samples are reduced mod 2π.
    np.testing.assert_allclose(laws.EmpiricalAngleLaw(samples - TWO_PI).samples, np.sort(samples), atol=1e-14)


def test_empirical_law_with_ties_has_atoms_read_at_a_tolerance():
    # Four values taken 4 times each: atoms of mass 3/16, the CDF jumping from (k−½)/16 to (k+2½)/16.
    law = laws.EmpiricalAngleLaw(np.repeat([0.5, 1.5, 2.5, 4.0], 4))
    assert law.cdf(np.nextafter(0.5, 0.0)) == pytest.approx(1 / 32) and law.cdf(0.5) == 7 / 32
    assert law.cdf(np.nextafter(4.0, 0.0)) == pytest.approx(25 / 32) and law.cdf(4.0) == 31 / 32
    assert law.ks_tolerance == laws.ATOM_TOLERANCE == 32 * np.spacing(TWO_PI)
    assert law.cdf.ks_tolerance == laws.ATOM_TOLERANCE
    # Ties to round-off (np.mod of a whole turn) and a sample at 0 (a jump of 1/(2m)) are atoms too.
    assert laws.EmpiricalAngleLaw(np.array([1.0, 1.0 + TWO_PI, 3.0])).ks_tolerance == laws.ATOM_TOLERANCE
    assert laws.EmpiricalAngleLaw(np.array([0.0, 3.0])).ks_tolerance == laws.ATOM_TOLERANCE
    # A sample within 2 ATOM_TOLERANCE below 2π is one at 0 (no target angle at the cut of the circle).
    assert laws.EmpiricalAngleLaw(np.array([3.0, -1e-14])).samples.tolist() == [0.0, 3.0]
    # Distinct samples: a continuous law, KS read exactly (tolerance 0).
    distinct = laws.EmpiricalAngleLaw(E7_LAW.sample(5, 50))
    assert distinct.ks_tolerance == 0.0 and distinct.cdf.ks_tolerance == 0.0


def test_quantile_law_cdf_by_bisection():
    law = laws.as_angle_law(lambda u: TWO_PI * u**2)
    theta = np.linspace(0, TWO_PI, 7)
    np.testing.assert_allclose(law.cdf(theta), np.sqrt(theta / TWO_PI), atol=1e-12)


@pytest.mark.parametrize("n", [16, 256])
def test_orbit_angles_are_within_half_a_cell_of_the_law(n):
    alpha = realisation.orbit_angles(E7_LAW, n)
    # The midpoint quantiles are at KS distance exactly 1/(2n) (half a cell of the CDF).
    assert metrics.circular_ks(alpha, E7_LAW.cdf) == pytest.approx(1 / (2 * n), abs=1e-12)


def test_orbit_gauge_puts_the_orbit_at_the_target_azimuths():
    alpha = np.array([0.1, 2.0, 4.5, 6.0])
    gauge = realisation.orbit_gauge(alpha)
    v = np.array([np.cos(0.7), np.sin(0.7), 0.0]) * 0.8 + np.array([0.0, 0.0, 0.6])
    x = np.asarray(gauge.apply_transpose(np.tile(v, (4, 1))))
    # Q_iᵀ v sits at azimuth az(v) + α_i, at the same height.
    np.testing.assert_allclose(np.mod(np.arctan2(x[:, 1], x[:, 0]) - 0.7, TWO_PI), alpha, atol=1e-14)
    np.testing.assert_allclose(x[:, 2], 0.6, atol=1e-15)


# --------------------------------------------------------------------------- gauges with Q g = v0


@pytest.mark.parametrize(
    "builder, det", [(realisation.householder_gauges, -1.0), (realisation.rotation_gauges, 1.0)]
)
@pytest.mark.parametrize("d", [2, 3, 5])
def test_gauges_map_targets_to_v0(builder, det, d):
    rng = np.random.default_rng(d)
    g = rng.normal(size=(40, d))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    v0 = np.eye(d)[-1]
    q = builder(g, v0)
    np.testing.assert_allclose(np.einsum("nij,nj->ni", q, g), np.tile(v0, (40, 1)), atol=1e-14)
    np.testing.assert_allclose(
        np.einsum("nki,nkj->nij", q, q), np.broadcast_to(np.eye(d), q.shape), atol=1e-14
    )
    np.testing.assert_allclose(np.linalg.det(q), det, atol=1e-12)


def test_gauges_at_v0_and_at_minus_v0():
    v0 = np.array([0.0, 0.0, 1.0])
    near = np.array([1e-9, 0.0, -1.0])
    targets = np.stack([v0, -v0, near / np.linalg.norm(near)])
    house = realisation.householder_gauges(targets, v0)
    rot = realisation.rotation_gauges(targets, v0)
    np.testing.assert_allclose(house[0], np.eye(3), atol=0)  # g = v0: w = 0, Q = I
    np.testing.assert_allclose(rot[0], np.eye(3), atol=0)
    for q in (house, rot):  # g = −v0 (half-turn for the rotation) and 1e-9 away from it
        np.testing.assert_allclose(np.einsum("nij,nj->ni", q, targets), np.tile(v0, (3, 1)), atol=1e-7)
        np.testing.assert_allclose(q[1] @ q[1].T, np.eye(3), atol=1e-15)
        np.testing.assert_allclose(q[2] @ q[2].T, np.eye(3), atol=1e-7)  # ~1e-16/|g + v0|
    assert np.linalg.det(rot[1]) == pytest.approx(1.0)


# --------------------------------------------------------------------------- realisations (E7, E8)


def _quantiles_by_quadrature(law, u: np.ndarray) -> np.ndarray:
    """Quantiles of ``law`` at ``u`` from its density alone (not its CDF series nor its ppf): the
    CDF on a fine grid by the cumulative trapezoid rule, inverted by interpolation."""
    theta = np.linspace(0.0, TWO_PI, 400_001)
    pdf = np.asarray(law.pdf(theta), dtype=float)
    cdf = np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(theta))])
    return np.interp(u, cdf / cdf[-1], theta)


@pytest.mark.slow
def test_e7_orbit_realisation_reaches_the_ks_bound():
    n = 256
    result = realize.realize_orbit(E7_LAW, n=n, beta=1.0, t_end=40.0, dt=0.01, seed=0)
    # E7: KS of the relative angles ≤ 1/(2n) + 1e-6 and orbit residual ≤ 1e-6 at τ = 40.
    assert metrics.circular_ks(result.relative_angles, E7_LAW.cdf) <= 1 / (2 * n) + 1e-6
    assert result.distance <= 1 / (2 * n) + 1e-6
    assert result.orbit_residual <= 1e-6
    assert result.relative_angles.shape == (n,) and result.wasserstein is None
    assert result.trajectory.status == "ok" and result.trajectory.ts[-1] == pytest.approx(40.0)
    # The realised relative angles are the law's midpoint quantiles, computed here independently
    # (trapezoid CDF on a 2π/4e5 grid: error ~1e-9, far below the 1e-6 residual allowed).
    independent = _quantiles_by_quadrature(E7_LAW, (np.arange(n) + 0.5) / n)
    assert np.max(np.abs(np.angle(np.exp(1j * (result.relative_angles - independent))))) < 1e-6


def test_measuring_an_exact_orbit_gives_its_angles():
    """measure_realisation on a state put exactly on the orbit (no simulation): residual 0 to
    round-off, relative angles = α_i whatever the base point."""
    n = 32
    construction = realisation.orbit_construction(E7_LAW, n=n)
    u_star = np.array([0.3, -0.5, 0.2]) / np.linalg.norm([0.3, -0.5, 0.2])
    x = np.asarray(construction.kernel.gauge.apply_transpose(np.tile(u_star, (n, 1))))
    result = realisation.measure_realisation(construction, types.SimpleNamespace(xs=x[None]))
    alpha = np.mod(realisation.orbit_angles(E7_LAW, n), TWO_PI)
    np.testing.assert_allclose(result.u_star, u_star, atol=1e-15)  # a unit vector: round-off
    assert result.orbit_residual < 1e-15
    np.testing.assert_allclose(np.sort(result.relative_angles), np.sort(alpha), atol=1e-13)


def test_orbit_realisation_from_samples():
    samples = E7_LAW.sample(11, 64)
    result = realize.realize_orbit(samples, n=64, t_end=30.0, seed=2)
    # n = number of samples: the realised relative angles are the samples themselves.
    np.testing.assert_allclose(np.sort(result.relative_angles), np.sort(samples), atol=1e-8)
    assert result.distance <= result.bound + 1e-6


ATOM_TARGETS = {"one_angle": np.full(16, 1.0), "four_angles": np.repeat([0.5, 1.5, 2.5, 4.0], 4)}


@pytest.mark.parametrize("mode", realisation.MODES)
@pytest.mark.parametrize("target", sorted(ATOM_TARGETS))
def test_orbit_realisation_of_a_law_with_atoms_meets_the_bound(target, mode):
    """Tied samples: the realised angles are the samples to round-off (a few ulps of 2π, either
    side of the atoms), and that measures within 1/(2n), while angles 0.1 off still fail."""
    samples = ATOM_TARGETS[target]
    n = samples.size
    result = realize.realize_orbit(samples, n=n, mode=mode, save_every=40.0)
    off = np.angle(np.exp(1j * (result.relative_angles - np.sort(samples))))
    assert np.max(np.abs(off)) <= 8 * np.spacing(TWO_PI) and result.orbit_residual < 1e-14
    assert result.bound == 1 / (2 * n)
    assert result.distance <= result.bound
    law = laws.as_angle_law(samples)
    # The quantiles themselves (the samples; at KS distance exactly 1/(2n)) measure 1/(2n) to round-off.
    assert metrics.circular_ks(np.sort(samples), law.cdf) == pytest.approx(result.bound, abs=1e-12)
    for shift in (0.1, -0.1):  # a wrong realisation fails the bound by far
        assert metrics.circular_ks(result.relative_angles + shift, law.cdf) > 5 * result.bound


def test_orbit_distance_of_a_continuous_law_is_the_exact_ks_distance():
    """Distinct samples (and the von Mises mixture) have no atoms: the distance is the exact KS
    formula max_k max(k/n − F(θ_(k)), F(θ_(k)) − (k−1)/n), bit for bit."""
    samples = E7_LAW.sample(11, 48)
    for law in (laws.EmpiricalAngleLaw(samples), E7_LAW):
        result = realize.realize_orbit(law, n=48, mode="exact", save_every=40.0)
        theta = np.sort(np.mod(result.relative_angles, TWO_PI))
        f, k = law.cdf(theta), np.arange(1, 49)
        assert result.distance == float(np.max(np.maximum(k / 48 - f, f - (k - 1) / 48)))
        assert result.distance <= result.bound + 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("gauge", ["householder", "rotation"])
def test_e8_gauge_realisation_bound(gauge):
    targets = laws.spherical_mixture_samples(0, 256)
    v0 = np.array([0.0, 0.0, 1.0])
    construction = realisation.sphere_construction(targets, v0=v0, gauge=gauge, sigma=0.2, seed=0)
    # The construction: Q_i y_i = v0 and Q_iᵀ Q_i = I to round-off (a few ulps of products of 3).
    q = np.asarray(construction.kernel.gauge.matrices())
    np.testing.assert_allclose(np.einsum("nij,nj->ni", q, targets), np.tile(v0, (256, 1)), atol=1e-14)
    eye = np.broadcast_to(np.eye(3), q.shape)
    np.testing.assert_allclose(np.einsum("nki,nkj->nij", q, q), eye, atol=1e-14)
    result = realize.realize(construction, t_end=40.0)
    x = result.x
    # E8: x_i − y_i = Q_iᵀ(u* − v0) + (residual): every token is at the same distance |u* − v0|
    # from its target (Q_i is an isometry), up to the orbit residual (≤ 1e-6).
    assert result.orbit_residual <= 1e-6
    gaps = np.linalg.norm(x - targets, axis=1)
    assert np.ptp(gaps) <= 2e-6
    assert np.max(gaps) <= 2 * np.linalg.norm(result.u_star - v0)  # the E8 bound
    # W1 (geodesic cost) ≤ the identity matching's mean angle ≤ the max angle 2 arcsin(chord/2).
    assert result.wasserstein <= 2 * np.arcsin(np.max(gaps) / 2) + 1e-12
    assert float(np.linalg.norm(result.u_star - v0)) < 0.05  # u* stays near v0 from the cap


def test_realize_sphere_is_construction_then_realize():
    targets = laws.spherical_mixture_samples(1, 16)
    one = realize.realize_sphere(targets, gauge="rotation", t_end=2.0, seed=3)
    two = realize.realize(realisation.sphere_construction(targets, gauge="rotation", seed=3), t_end=2.0)
    np.testing.assert_array_equal(one.x, two.x)


def test_spherical_mixture_samples():
    y = laws.spherical_mixture_samples(0, 3000)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-15)
    np.testing.assert_array_equal(y, laws.spherical_mixture_samples(0, 3000))
    # Three blobs: clusters at θ_c = 0.5 rad give three big components with masses ≈ 0.5, 0.3, 0.2.
    means = np.array([[0.6, 0.0, 0.8], [-0.5, 0.7, -0.1], [-0.3, -0.8, -0.5]])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    nearest = np.argmax(y @ means.T, axis=1)
    np.testing.assert_allclose(np.bincount(nearest) / 3000, [0.5, 0.3, 0.2], atol=0.03)


def test_realize_errors_name_the_parameter():
    with pytest.raises(ValueError, match="`targets` must hold unit vectors"):
        realize.realize_sphere(2 * laws.spherical_mixture_samples(0, 8))
    with pytest.raises(ValueError, match="`gauge` must be one of .* Did you mean 'rotation'"):
        realize.realize_sphere(laws.spherical_mixture_samples(0, 8), gauge="rotaton")
    with pytest.raises(ValueError, match="`n` must be an integer >= 2"):
        realize.realize_orbit(E7_LAW, n=1)
    with pytest.raises(ValueError, match="1-d angle samples"):
        realize.realize_orbit(np.zeros((4, 2)))


def test_the_quadrature_cdf_agrees_with_the_series_cdf_and_is_independent_of_it():
    # Two independent computations of the E7 law's CDF (Fourier series vs quadrature of the
    # density) agree to 1e-8 (linear interpolation between nodes: h²/8 max|f'| ~ 1e-9), far below
    # the KS bound 1/(2n) + 1e-6 that E7 checks.
    theta = np.linspace(0.0, 2.0 * np.pi, 4001)
    cdf = laws.quadrature_cdf(E7_LAW.pdf)
    assert np.max(np.abs(cdf(theta) - E7_LAW.cdf(theta))) < 1e-8
    assert cdf(0.0) == 0.0 and cdf(2.0 * np.pi) == 1.0
    # a wrong density is seen: the KS distance to a shifted law is large
    shifted = laws.VonMisesMixture(weights=(0.6, 0.4), kappas=(4.0, 10.0), mus=(1.3, 4.0))
    assert np.max(np.abs(laws.quadrature_cdf(shifted.pdf)(theta) - E7_LAW.cdf(theta))) > 0.05
    with pytest.raises(ValueError, match="`points` must be an even integer >= 2; got 3"):
        laws.quadrature_cdf(E7_LAW.pdf, points=3)


def test_e7_report_draws_the_target_law_density_over_the_histograms(tmp_path, monkeypatch):
    """The report's orbit figure compares both histograms with the law itself: its density on a grid
    of [0, 2π] (integrating to 1), passed down to the drawing."""
    drawn, draw = {}, plotting.write_target_figure

    def capture(path, target, realised, **options):
        drawn["density"] = options.get("density")
        return draw(path, target, realised, **options)

    monkeypatch.setattr(plotting, "write_target_figure", capture)
    outcome = reproduce(tmp_path / "rep", quick=True, only=["E7"], sizes=[8], n_seeds=1, workers=1)
    grid, pdf = outcome.jobs[0].figure.density
    assert grid[0] == 0.0 and grid[-1] == pytest.approx(TWO_PI)
    np.testing.assert_array_equal(pdf, E7_LAW.pdf(grid))  # the experiment's law (the one of this file)
    assert np.sum((pdf[1:] + pdf[:-1]) / 2 * np.diff(grid)) == pytest.approx(1.0, abs=1e-6)
    assert drawn["density"] is outcome.jobs[0].figure.density
