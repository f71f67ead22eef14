"""Tests of analysis.theory: maximiser sets, energy bounds (D1, D2, D3), spectral criterion, certificates.

Reference values are closed forms of the theory written here (not taken from the module under test):
``c e^β/(2β)`` for gauge kernels, ``c λ_max(W)/(2n)`` for the linear cosine factor, the Hessian
spectrum ``{−c e^β/n, 0}`` at an orbit maximiser, ``β* ≈ 2.7455``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.analysis import metrics, theory
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import summation
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4
from attnflow.numerics.solve import solve

N = 24  # tokens of the certificate tests: the dense Hessian has (n d)² entries


def gauge_rope(n):
    return gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))


def gauge_rope_roformer_d4(n):
    return gauges.make_rope(np.arange(n), 4, gauges.rope_frequencies(4, kind="roformer"))


def gauge_generalized(n):
    generators = [gauges.axis_generator("z"), gauges.axis_generator("x")]
    return gauges.make_generalized_rope(np.arange(n), generators, [1.0, 3.0], omega=2 * np.pi / n)


def gauge_prompt(n):
    q_prompts = gauges.haar_orthogonal(jax.random.key(100), 4, 3)
    return gauges.make_prompt_gauge(np.arange(n) % 4, q_prompts)


def gauge_dense_d5(n):
    return gauges.DenseGauge(q=jnp.asarray(gauges.haar_orthogonal(jax.random.key(7), n, 5)))


GAUGES = {
    "rope": gauge_rope,
    "rope_roformer_d4": gauge_rope_roformer_d4,
    "generalized_rope": gauge_generalized,
    "prompt": gauge_prompt,
    "random_dense_d5": gauge_dense_d5,
}


def exp_kernel(gauge, factor=None, *, beta=1.0, time_scale="plain"):
    factor = factors.NoFactor(n=gauge.n) if factor is None else factor
    return Kernel(gauge, factor, make_profile("exp", beta=beta, time_scale=time_scale))


# --------------------------------------------------------------------------- predicted maximiser sets


@pytest.mark.parametrize("n", [8, 64])
def test_latitude_circle_prediction_matches_the_orbit(n):
    v = np.array([0.3, -0.5, 0.6])
    x = np.asarray(theory.orbit_configuration(gauge_rope(n), v))
    pred = theory.latitude_circle(v, n)
    h = v[2] / np.linalg.norm(v)
    assert pred.height == pytest.approx(h, abs=1e-15)
    # Every point at height v_3 and radius sqrt(1 − v_3²): exact rotations about e_3.
    np.testing.assert_allclose(x[:, 2], h, atol=1e-14)
    np.testing.assert_allclose(np.hypot(x[:, 0], x[:, 1]), pred.radius, atol=1e-14)
    # The maximiser's closed forms, to 1e-10 (round-off of sums over n points).
    assert float(metrics.mean_cosine(x)) == pytest.approx((n * h * h - 1) / (n - 1), abs=1e-10)
    assert float(metrics.mean_cosine(x)) == pytest.approx(pred.mean_cosine, abs=1e-10)
    assert float(metrics.resultant_deficit(x)) == pytest.approx(pred.resultant_deficit, abs=1e-10)
    np.testing.assert_allclose(x.mean(axis=0), pred.mean, atol=1e-10)
    assert float(metrics.azimuth_uniformity(x)) == pytest.approx(0.0, abs=1e-10)


def test_dirac_is_the_orbit_of_the_identity_gauge():
    x = theory.orbit_configuration(gauges.IdentityGauge(n=10, d=3), [1.0, 2.0, 2.0])
    np.testing.assert_allclose(x, np.tile([1 / 3, 2 / 3, 2 / 3], (10, 1)), atol=1e-15)
    assert float(metrics.mean_cosine(x)) == pytest.approx(1.0, abs=1e-10)
    assert metrics.n_eff(x) == 1.0
    assert float(metrics.resultant_deficit(x)) == pytest.approx(0.0, abs=1e-10)


def test_prompt_clusters_prediction():
    n, k = 30, 4  # cyclic ids i mod 4: masses 8, 8, 7, 7 (unequal)
    q_prompts = gauges.haar_orthogonal(jax.random.key(3), k, 3)
    gauge = gauges.make_prompt_gauge(np.arange(n) % k, q_prompts)
    v = np.array([0.2, 0.9, -0.4])
    x = np.asarray(theory.orbit_configuration(gauge, v))
    masses = np.bincount(np.arange(n) % k) / n
    pred = theory.prompt_clusters(q_prompts, v, masses)
    # K exact clusters: n_eff = 1/Σ p_k² (the definition of n_eff), conditional spread 0.
    assert metrics.n_clusters(x) == k
    assert metrics.n_eff(x) == pytest.approx(1.0 / np.sum(masses**2), abs=1e-10)
    assert pred.n_eff == pytest.approx(1.0 / np.sum(masses**2), abs=1e-12)
    assert float(metrics.conditional_spread(x, np.arange(n) % k)) == pytest.approx(0.0, abs=1e-12)
    assert float(metrics.marginal_spread(x)) == pytest.approx(pred.marginal_spread, abs=1e-12)
    np.testing.assert_allclose(x[:k], pred.centres, atol=1e-14)


def test_uniform_great_circle_diagnostics():
    x = theory.great_circle(np.arange(40) / 40, 2 * np.pi)
    assert float(metrics.planarity(x)) == pytest.approx(0.0, abs=1e-10)
    assert float(metrics.azimuth_uniformity(x)) == pytest.approx(0.0, abs=1e-10)
    assert float(metrics.resultant_deficit(x)) == pytest.approx(1.0, abs=1e-10)


# --------------------------------------------------------------------------- orbit maximisers (§2.1)


@pytest.mark.parametrize("name", sorted(GAUGES))
def test_orbit_configuration_is_a_certified_maximiser(name):
    gauge = GAUGES[name](N)
    beta = 1.0
    kernel = exp_kernel(gauge, beta=beta)
    v = np.random.default_rng(1).normal(size=gauge.d)
    x = theory.orbit_configuration(gauge, v)
    e_max = np.exp(beta) / (2 * beta)  # c e^β/(2β), c = 1
    assert theory.energy_max(kernel) == pytest.approx(e_max, abs=1e-14)
    cert = theory.certify(kernel, x)
    # 1e-12: the energy sum rounds at 1e-16; expm-built gauges are orthogonal to ~1e-14.
    assert cert.energy == pytest.approx(e_max, abs=1e-12)
    assert abs(cert.energy_gap) <= 1e-12
    assert cert.gradient_norm < 1e-10
    assert cert.hessian_top <= 1e-8
    assert cert.is_local_maximiser() and cert.is_global_maximiser()
    # The Hessian in the gauge frame at a Dirac is −(c e^β/n)(I − 11ᵀ/n) ⊗ I_{d−1}: eigenvalue
    # −c e^β/n, and d − 1 zero modes (moving v: the global rotation symmetry). Gauges are isometries.
    d = gauge.d
    eig = cert.hessian_eigenvalues
    assert eig.shape == (N * (d - 1),)
    assert int(np.sum(np.abs(eig) <= 1e-10)) == d - 1
    np.testing.assert_allclose(eig[: (N - 1) * (d - 1)], -np.exp(beta) / N, atol=1e-12)


@pytest.mark.parametrize("name", ["rope", "random_dense_d5"])
def test_random_configurations_stay_below_the_orbit_energy(name):
    gauge = GAUGES[name](N)
    kernel = exp_kernel(gauge)
    e_max = theory.energy_max(kernel)
    keys = jax.random.split(jax.random.key(0), 100)
    xs = jax.jit(jax.vmap(lambda k: sphere.sample_uniform(k, N, gauge.d)))(keys)
    energies = np.asarray(jax.jit(jax.vmap(lambda x: summation.energy(kernel, x)))(xs))
    assert np.all(energies < e_max)
    assert np.max(energies) < 0.9 * e_max  # random states are far from the maximum
    cert = theory.certify(kernel, xs[0])
    assert cert.gradient_norm > 1e-3 and not cert.is_local_maximiser()


def test_rescaled_time_scale_bound():
    gauge = gauge_rope(N)
    beta = 2.0
    kernel = exp_kernel(gauge, beta=beta, time_scale="rescaled")
    x = theory.orbit_configuration(gauge, [0.0, 0.6, 0.8])
    # c = e^{−β}: c e^β/(2β) = 1/(2β).
    assert theory.energy_max(kernel) == pytest.approx(1 / (2 * beta), abs=1e-15)
    assert float(summation.energy(kernel, x)) == pytest.approx(1 / (2 * beta), abs=1e-12)


def test_gauged_nonnegative_factor_bound_attained_on_the_orbit():
    gauge = gauge_rope(N)
    xi = np.arange(N) / N
    factor = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(3.0))
    kernel = exp_kernel(gauge, factor)
    w = np.exp(-3.0 * np.abs(xi[:, None] - xi[None, :]))
    expected = np.e / 2 * w.mean()  # φ(1)·mean(W)/2
    assert theory.energy_max(kernel) == pytest.approx(expected, rel=1e-13)
    x = theory.orbit_configuration(gauge, [1.0, 0.0, 1.0])
    assert float(summation.energy(kernel, x)) == pytest.approx(expected, rel=1e-12)


def test_factor_mean_closed_forms_match_the_dense_mean():
    xi = jnp.asarray(np.random.default_rng(2).uniform(0, 5, size=50))
    for factor in (
        factors.DistanceBias(xi=xi, slope=jnp.asarray(1.3)),
        factors.DistanceBias(xi=xi, slope=jnp.asarray(0.0)),
        factors.ToeplitzCos(xi=xi, omega=jnp.asarray(0.7)),
        factors.NoFactor(n=50),
    ):
        assert factor.mean() == pytest.approx(float(jnp.mean(factor.dense())), abs=1e-13)


# --------------------------------------------------------------------------- D1, D2, D3 (§2.2)


def linear_cosine_kernel(n, *, gauge=None, omega=2 * np.pi, time_scale="plain"):
    factor = factors.ToeplitzCos(xi=jnp.asarray(np.arange(n) / n), omega=jnp.asarray(omega))
    gauge = gauges.IdentityGauge(n=n, d=3) if gauge is None else gauge
    profile = make_profile("linear", beta=1.0, time_scale=time_scale)
    return Kernel(gauge, factor, profile)


@pytest.mark.parametrize("time_scale", ["plain", "rescaled"])
def test_d2_great_circle_attains_the_spectral_bound(time_scale):
    n = 64
    kernel = linear_cosine_kernel(n, time_scale=time_scale)
    c = float(kernel.profile.c)
    w = np.cos(2 * np.pi * (np.arange(n)[:, None] - np.arange(n)[None, :]) / n)
    bound = c * np.linalg.eigvalsh(w)[-1] / (2 * n)  # c λ_max(W)/(2n), λ_max = n/2
    assert bound == pytest.approx(c / 4, rel=1e-13)
    x = theory.great_circle(np.arange(n) / n, 2 * np.pi)
    assert float(summation.energy(kernel, jnp.asarray(x))) == pytest.approx(bound, abs=1e-12)
    assert theory.energy_max(kernel) == pytest.approx(bound, abs=1e-13)
    assert theory.spectral_bound(w, c=c) == pytest.approx(bound, abs=1e-13)
    cert = theory.certify(
        linear_cosine_kernel(16, time_scale=time_scale), theory.great_circle(np.arange(16) / 16, 2 * np.pi)
    )
    assert cert.gradient_norm < 1e-12 and cert.hessian_top <= 1e-8


def test_d2_with_a_gauge_is_attained_on_the_gauged_circle():
    n = 32
    gauge = gauge_rope(n)
    kernel = linear_cosine_kernel(n, gauge=gauge)
    u = theory.great_circle(np.arange(n) / n, 2 * np.pi)
    x = gauge.apply_transpose(jnp.asarray(u))  # the gauge frame holds the great circle
    assert float(summation.energy(kernel, x)) == pytest.approx(theory.energy_max(kernel), abs=1e-12)
    keys = jax.random.split(jax.random.key(1), 100)
    energies = jax.jit(jax.vmap(lambda k: summation.energy(kernel, sphere.sample_uniform(k, n, 3))))(keys)
    assert float(jnp.max(energies)) < theory.energy_max(kernel)


def test_d2_bound_is_not_claimed_when_it_is_not_attained():
    # ω = 1 with ξ_i = i/n: a simple top eigenvalue whose eigenvector has unequal entries.
    assert theory.energy_max(linear_cosine_kernel(32, omega=1.0)) is None
    # The exponential profile with a sign-changing factor (D3) has no closed form.
    kernel = Kernel(
        gauges.IdentityGauge(n=32, d=3),
        factors.ToeplitzCos(xi=jnp.asarray(np.arange(32) / 32), omega=jnp.asarray(2 * np.pi)),
        make_profile("exp"),
    )
    assert theory.energy_max(kernel) is None


@pytest.mark.parametrize(
    "factor",
    [
        factors.DistanceBias(xi=jnp.asarray(np.arange(24) / 24), slope=jnp.asarray(1.0)),
        factors.DistanceBias(xi=jnp.asarray(np.arange(24) / 24), slope=jnp.asarray(5.0)),
        factors.make_matrix_factor(
            (lambda a: (a + a.T) / 2)(np.random.default_rng(4).uniform(0, 1, (24, 24))), n=24
        ),
    ],
    ids=["distance_bias_m1", "distance_bias_m5", "random_nonnegative"],
)
def test_d1_gradient_ascent_never_beats_the_dirac(factor):
    n = 24
    kernel = exp_kernel(gauges.IdentityGauge(n=n, d=3), factor)
    e_dirac = theory.dirac_energy(kernel)
    assert theory.energy_max(kernel) == pytest.approx(e_dirac, rel=1e-15)
    field = make_vector_field(kernel)
    x0 = jax.vmap(lambda k: sphere.sample_uniform(k, n, 3))(jax.random.split(jax.random.key(5), 4))
    # in this process (bitwise the same as worker processes, without their start-up)
    traj = solve(field, x0, integrator=RK4(), dt=0.05, t_end=20.0, save_every=1.0, workers=1)
    energies = np.asarray(jax.jit(jax.vmap(jax.vmap(lambda x: summation.energy(kernel, x))))(traj.xs))
    # The gradient flow (E non-decreasing) from 4 random starts stays below E(Dirac), up to round-off.
    assert np.all(energies <= e_dirac * (1 + 1e-12))
    assert np.min(np.diff(energies, axis=0)) >= -1e-12
    # It climbs towards it (slowly for m = 5, the paper's E4: 2.4% below at τ = 20 on these seeds).
    assert np.all(energies[-1] > energies[0]) and np.all(energies[-1] >= 0.95 * e_dirac)


def test_d3_crossing_and_curves():
    beta_star = theory.d3_crossing()
    assert beta_star == pytest.approx(2.7455, abs=1e-4)
    assert theory.circle_energy(beta_star) == pytest.approx(theory.antipodal_energy(beta_star), rel=1e-12)
    assert theory.circle_energy(1.0) > theory.antipodal_energy(1.0)
    assert theory.circle_energy(5.0) < theory.antipodal_energy(5.0)
    assert theory.circle_energy(2.0, c=np.exp(-2.0)) == pytest.approx(
        np.exp(-2.0) * theory.circle_energy(2.0)
    )


@pytest.mark.parametrize("beta", [1.0, 5.0])
def test_d3_curves_match_finite_n_energies(beta):
    n = 64
    xi = np.arange(n) / n
    kernel = exp_kernel(
        gauges.IdentityGauge(n=n, d=3),
        factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(2 * np.pi)),
        beta=beta,
    )
    circle = theory.great_circle(xi, 2 * np.pi)
    # Equally spaced nodes integrate the trigonometric series exactly up to aliases I_{≥63}(β).
    assert float(summation.energy(kernel, jnp.asarray(circle))) == pytest.approx(
        theory.circle_energy(beta), rel=1e-12
    )
    antipodal = np.zeros((n, 3))
    antipodal[:, 0] = np.where(np.mod(xi + 0.25, 1.0) < 0.5, 1.0, -1.0)  # +e on (−1/4, 1/4)
    # A Riemann sum of a discontinuous integrand: O(1/n²) relative error, 8e-4 at n = 64.
    assert float(summation.energy(kernel, jnp.asarray(antipodal))) == pytest.approx(
        theory.antipodal_energy(beta), rel=2e-3
    )


def test_great_circle_is_a_local_max_for_small_beta_only():
    n = 32
    xi = np.arange(n) / n
    circle = theory.great_circle(xi, 2 * np.pi)
    factor = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(2 * np.pi))
    low = theory.certify(exp_kernel(gauges.IdentityGauge(n=n, d=3), factor, beta=1.0), circle)
    high = theory.certify(exp_kernel(gauges.IdentityGauge(n=n, d=3), factor, beta=2.0), circle)
    # A critical point by symmetry for every β; regime D3 (exp profile, w ≷ 0): optimal only for β ≲ 1.5.
    assert low.gradient_norm < 1e-12 and high.gradient_norm < 1e-12
    assert low.hessian_top <= 1e-8
    assert high.hessian_top > 1e-3


# --------------------------------------------------------------------------- spectral criterion


def test_spectral_criterion_predictions():
    n = 32
    xi = jnp.asarray(np.arange(n) / n)
    cosine = theory.spectral_criterion(factors.ToeplitzCos(xi=xi, omega=jnp.asarray(2 * np.pi)))
    assert cosine.prediction == "spread" and cosine.multiplicity == 2 and not cosine.positive
    np.testing.assert_allclose(cosine.eigenvalues[:2], n / 2, rtol=1e-12)
    # The same factor given as a dense matrix: the same answer.
    dense = theory.spectral_criterion(
        np.asarray(factors.ToeplitzCos(xi=xi, omega=jnp.asarray(2 * np.pi)).dense())
    )
    assert dense.prediction == "spread" and dense.multiplicity == 2
    alibi = theory.spectral_criterion(factors.DistanceBias(xi=xi, slope=jnp.asarray(1.0)))
    assert alibi.prediction == "dirac" and alibi.multiplicity == 1
    assert np.all(alibi.leading_vectors * np.sign(alibi.leading_vectors[0]) > 0)  # Perron vector
    # Non-full-period cosine: a simple leading eigenvalue, still sign-changing.
    assert (
        theory.spectral_criterion(factors.ToeplitzCos(xi=xi, omega=jnp.asarray(4.0))).prediction == "spread"
    )
    # Reducible W ≥ 0 with two equal blocks: a 2-dim leading eigenspace that holds a positive vector.
    block = np.kron(np.eye(2), np.ones((4, 4)))
    reducible = theory.spectral_criterion(block)
    assert reducible.multiplicity == 2 and reducible.prediction == "dirac"


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="`v` must be a non-zero vector of length d = 3"):
        theory.orbit_configuration(gauge_rope(4), [1.0, 0.0])
    with pytest.raises(ValueError, match="`w` must be symmetric"):
        theory.spectral_criterion(np.array([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="`x` must have shape"):
        theory.certify(exp_kernel(gauge_rope(4)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="`masses` must be 2 non-negative numbers"):
        theory.prompt_clusters(np.stack([np.eye(3)] * 2), [0, 0, 1.0], [0.7, 0.7])


# --------------------------------------------------------------------------- rates of the flow


def _usa_run(kernel, x0, *, t_end, dt, normalization="usa"):
    field = make_vector_field(kernel, normalization=normalization)
    options = dict(integrator=RK4(), dt=dt, t_end=t_end, save_every=dt, key=jax.random.key(0))
    return solve(field, jnp.asarray(x0), **options)


def test_collapse_rates_are_the_decay_of_a_near_dirac():
    """Tokens near a Dirac (w = 1 and a distance bias): 1 - mean cosine decays at 2 lambda_2 of the
    weights' Laplacian, 2 c e^beta for w = 1 (both rates equal), by a run of the real field."""
    n, beta = 8, 1.5
    rng = np.random.default_rng(0)
    x0 = np.array([0.0, 0.0, 1.0]) + 1e-4 * rng.normal(size=(n, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    xi = np.arange(n) / n
    for factor in (factors.NoFactor(n=n), factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(3.0))):
        kernel = Kernel(gauges.IdentityGauge(n=n, d=3), factor, make_profile("exp", beta=beta))
        t_end = 1.0 if isinstance(factor, factors.NoFactor) else 6.0  # the deficit stays above 1e-13
        run = _usa_run(kernel, x0, t_end=t_end, dt=0.01)
        deficit = 1.0 - np.asarray([metrics.mean_cosine(x) for x in run.xs])
        late = run.ts >= t_end / 2  # past the faster modes' fade (the distance bias has several rates)
        fitted = -np.polyfit(run.ts[late], np.log(deficit[late]), 1)[0]
        w = np.asarray(factor.dense())
        slowest, fastest = theory.collapse_rates(np.asarray(run.xs[-1]), w, beta=beta)
        if isinstance(factor, factors.NoFactor):
            assert slowest == pytest.approx(2 * np.exp(beta), rel=1e-6)  # |eps|^2 corrections of 1e-8
            assert fastest == pytest.approx(slowest, rel=1e-6)
        # RK4 at dt = 0.01 and a rate 9: 1e-7 relative; the quadratic terms 1e-8; faster modes faded
        assert slowest * 0.999 <= fitted <= fastest * 1.001, (fitted, slowest, fastest)
        if isinstance(factor, factors.NoFactor):  # one rate: the fit is it (RK4 and |eps|^2 terms: 1e-6)
            assert fitted == pytest.approx(slowest, rel=1e-4)


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_equiangular_rho_is_followed_by_equiangular_particles(normalization):
    n, beta, rho0 = 5, 2.0, 0.2
    kernel = Kernel(gauges.IdentityGauge(n=n, d=n), factors.NoFactor(n=n), make_profile("exp", beta=beta))
    run = _usa_run(kernel, sphere.equiangular(n, n, rho0), t_end=2.0, dt=0.005, normalization=normalization)
    rho = theory.equiangular_rho(run.ts, rho0=rho0, n=n, beta=beta, normalization=normalization)
    measured = np.asarray([metrics.mean_cosine(x) for x in run.xs])
    assert np.max(np.abs(measured - rho)) <= 1e-8  # RK4 + renormalisation at dt = 0.005: 1.4e-9 measured
    assert rho[-1] > 0.9  # it moved
    # linearised at rho = 1: rates 2 c e^beta (usa), 2 (sa)
    h = 1e-7
    near = theory.equiangular_rho([0.0, 1e-4], rho0=1 - h, n=n, beta=beta, normalization=normalization)
    rate = -np.log((1 - near[1]) / h) / 1e-4
    assert rate == pytest.approx(2 * np.exp(beta) if normalization == "usa" else 2.0, rel=1e-3)


def test_equiangular_rho_rejects_an_unknown_normalization():
    with pytest.raises(ValueError, match="`normalization` must be 'usa' or 'sa'"):
        theory.equiangular_rho([0.0, 1.0], rho0=0.1, n=4, beta=1.0, normalization="softmax")


def test_circle_normal_rate_is_the_bessel_formula_and_changes_sign_near_beta_c():
    import scipy.special

    xi = np.arange(256) / 256
    for beta in (0.5, 1.0, 2.0):
        continuum = (scipy.special.iv(0, beta) + scipy.special.iv(2, beta)) / 2 - scipy.special.iv(1, beta)
        # n = 256 equally spaced labels: the discrete sums equal the integrals to 1e-12
        assert theory.circle_normal_rate(xi, 2 * np.pi, beta=beta) == pytest.approx(continuum, abs=1e-12)
    rates = [theory.circle_normal_rate(xi, 2 * np.pi, beta=beta) for beta in (1.5, 1.6)]
    assert rates[0] > 0 > rates[1]  # the circle loses its stability near beta_c = 1.55


def test_circle_normal_rate_is_the_decay_of_a_lifted_circle():
    """The great circle lifted out of its plane by 1e-5 (mode k = 0) sinks back at the rate."""
    n, beta = 32, 1.0
    xi = np.arange(n) / n
    x0 = theory.great_circle(xi, 2 * np.pi)
    x0[:, 2] = 1e-5
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    factor = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(2 * np.pi))
    kernel = Kernel(gauges.IdentityGauge(n=n, d=3), factor, make_profile("exp", beta=beta))
    run = _usa_run(kernel, x0, t_end=4.0, dt=0.02)
    height = np.abs(np.asarray(run.xs)[:, :, 2]).max(axis=1)
    fitted = -np.polyfit(run.ts, np.log(height), 1)[0]
    # one pure mode (k = 0) in the linear regime: RK4 error 1e-9, quadratic terms 1e-5 relative
    assert fitted == pytest.approx(theory.circle_normal_rate(xi, 2 * np.pi, beta=beta), rel=1e-4)


def test_first_token_rate():
    assert theory.first_token_rate(32) == 0.5 and theory.first_token_rate(32, strict=True) == 1.0
    with pytest.raises(ValueError, match="`n` must be >= 2"):
        theory.first_token_rate(1)
