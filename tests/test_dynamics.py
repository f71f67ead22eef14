"""The USA-AV vector field (attnflow.numerics.dynamics): tangency for every gauge × factor × option, the
gradient-flow identities v = n·P∇E and dE/dt = (1/n)Σ|v|², E non-decreasing in the settings of
experiments E0–E5, causal structure of the Jacobian, permutation equivariance and the option errors."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnflow.core import factors, gauges, sphere
from attnflow.numerics import dynamics, integrators, summation
from attnflow.numerics.solve import solve
from helpers_core import (
    FACTORS,
    GAUGES,
    N_SMALL,
    NONNEGATIVE_FACTORS,
    energy_series,
    factor_distance_bias,
    factor_none,
    factor_toeplitz_cos,
    gauge_generalized_zx,
    gauge_identity,
    gauge_prompt_haar,
    gauge_rope_full_period,
    make_kernel,
    uniform,
)

TANGENT_CASES = [
    (g, f, norm, causal)
    for g, f, norm, causal in itertools.product(sorted(GAUGES), sorted(FACTORS), ("usa", "sa"), (False, True))
    if norm == "usa" or f in NONNEGATIVE_FACTORS
]


@pytest.mark.parametrize("gauge_name, factor_name, normalization, causal", TANGENT_CASES)
def test_velocity_is_tangent(gauge_name, factor_name, normalization, causal):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=1)
    k = make_kernel(g, FACTORS[factor_name](N_SMALL), beta=1.5)
    for value in dynamics.VALUES:
        v = dynamics.make_vector_field(k, normalization=normalization, causal=causal, value=value)(x)
        assert v.shape == x.shape
        # |v| ≤ ~e^{1.5}·max|w| ≈ 10, so ⟨x_i, v_i⟩ after projection is round-off of size ~1e-15
        np.testing.assert_allclose(np.sum(np.asarray(x * v), axis=1), 0.0, rtol=0, atol=1e-13, err_msg=value)
        assert float(jnp.max(jnp.abs(v))) > 1e-3  # and the field is not trivially zero


def test_field_is_the_usa_model_for_identity_gauge():
    n, beta = N_SMALL, 2.0
    x = np.asarray(uniform(n, 3, seed=2))
    k = make_kernel(gauge_identity(n), factor_none(n), beta=beta)
    s = x @ x.T
    g = np.exp(beta * s) @ x / n
    want = g - np.sum(g * x, axis=1, keepdims=True) * x  # P_{x_i}((1/n) Σ_j e^{β⟨x_i,x_j⟩} x_j)
    # e^{β}·e^{β(s−1)} vs e^{βs}: relative ulps on O(e^β) sums, then a cancellation in P_x
    np.testing.assert_allclose(dynamics.make_vector_field(k)(jnp.asarray(x)), want, rtol=1e-13, atol=1e-14)


def test_logits_only_value_is_x():
    n, beta = N_SMALL, 1.0
    g = gauge_rope_full_period(n)
    x = uniform(n, 3, seed=3)
    u = np.asarray(g.apply(x))
    k = make_kernel(g, factor_none(n), beta=beta)
    g_sum = np.exp(beta * (u @ u.T)) @ np.asarray(x) / n  # rotation in the logits only, value x_j
    want = g_sum - np.sum(g_sum * np.asarray(x), axis=1, keepdims=True) * np.asarray(x)
    got = dynamics.make_vector_field(k, value="logits_only")(x)
    # same sums, different exp factorisation: a few ulps of O(e^β) terms
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("gauge_name, factor_name", list(itertools.product(sorted(GAUGES), sorted(FACTORS))))
def test_field_is_n_times_projected_energy_gradient(gauge_name, factor_name):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=4)
    factor = FACTORS[factor_name](N_SMALL)
    for kind, time_scale in itertools.product(("exp", "linear"), ("plain", "rescaled")):
        k = make_kernel(g, factor, kind=kind, beta=1.5, time_scale=time_scale)
        grad = jax.grad(lambda y, k=k: summation.energy(k, y))(x)
        want = N_SMALL * sphere.project(x, grad)
        v = dynamics.make_vector_field(k)(x)
        # autodiff and the closed form sum the same O(e^β) terms in different orders; ×n amplifies
        # ulps of the gradient to ~1e-14, and 1e-10 leaves room for the expm-built dense gauges
        np.testing.assert_allclose(v, want, rtol=0, atol=1e-10, err_msg=f"{kind} {time_scale}")


@pytest.mark.parametrize("gauge_name, factor_name", list(itertools.product(sorted(GAUGES), sorted(FACTORS))))
def test_energy_rate_is_mean_squared_speed(gauge_name, factor_name):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=5)
    factor = FACTORS[factor_name](N_SMALL)
    for kind in ("exp", "linear"):
        k = make_kernel(g, factor, kind=kind, beta=1.5)
        v = dynamics.make_vector_field(k)(x)
        _, rate = jax.jvp(lambda y, k=k: summation.energy(k, y), (x,), (v,))  # dE/dt = ⟨∇E, v⟩
        want = float(jnp.sum(v * v)) / N_SMALL
        # an exact identity evaluated in float64: 1e-6 relative is the acceptance bound of the issue,
        # far above the ~1e-14 round-off
        np.testing.assert_allclose(float(rate), want, rtol=1e-6, err_msg=kind)
        assert want > 0


@pytest.mark.parametrize(
    "gauge_fn, factor_fn",
    [(gauge_rope_full_period, factor_distance_bias), (gauge_prompt_haar, factor_toeplitz_cos)],
)
def test_energy_rate_finite_difference_along_rk4(gauge_fn, factor_fn):
    n, h = N_SMALL, 1e-3
    g = gauge_fn(n)
    k = make_kernel(g, factor_fn(n), beta=1.0)
    field = dynamics.make_vector_field(k)
    x0 = uniform(n, g.d, seed=6)
    traj = solve(field, x0, integrator=integrators.RK4(), dt=h, t_end=4 * h, save_every=h)
    e = energy_series(k, traj.xs)
    fd = (-e[4] + 8 * e[3] - 8 * e[1] + e[0]) / (12 * h)  # centred 5-point stencil at t = 2h
    v = field(jnp.asarray(traj.xs[2]))
    want = float(jnp.sum(v * v)) / n
    # stencil truncation O(h⁴) ~ 1e-12, round-off ~ 1e-16/h ~ 1e-13, RK4 error O(h⁵): all ≪ 1e-6 relative
    np.testing.assert_allclose(fd, want, rtol=1e-6)


def _rope(theta):
    return lambda n: gauges.make_rope(np.arange(n), 3, np.array([theta]))


E_SETTINGS = {
    "E0_usa": (gauge_identity, factor_none),
    "E1a_rope_full_period": (gauge_rope_full_period, factor_none),
    "E1b_rope_theta1": (_rope(1.0), factor_none),
    "E2_generalized_rope": (gauge_generalized_zx, factor_none),
    "E3_prompt_k4": (gauge_prompt_haar, factor_none),
    "E4_distance_bias_m1": (gauge_identity, lambda n: factor_distance_bias(n, slope=1.0)),
    "E4_distance_bias_m5": (gauge_identity, lambda n: factor_distance_bias(n, slope=5.0)),
    "E5_toeplitz_cos": (gauge_identity, factor_toeplitz_cos),
}


@pytest.mark.parametrize("name", sorted(E_SETTINGS))
def test_energy_non_decreasing_along_rk4(name):
    gauge_fn, factor_fn = E_SETTINGS[name]
    n = N_SMALL
    k = make_kernel(gauge_fn(n), factor_fn(n), beta=1.0)
    x0 = uniform(n, 3, seed=7)
    traj = solve(
        dynamics.make_vector_field(k), x0, integrator=integrators.RK4(), dt=0.01, t_end=4.0, save_every=0.1
    )
    assert traj.status == "ok" and traj.xs.shape == (41, n, 3)
    e = energy_series(k, traj.xs)
    # E = O(1): increments above −1e-12 are non-decreasing up to round-off of E (~1e-16) and the
    # RK4 defect at dt = 0.01 (the absolute tolerance per snapshot)
    assert np.diff(e).min() >= -1e-12, np.diff(e).min()
    assert e[-1] > e[0]  # and it does increase


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_causal_jacobian_is_lower_block_triangular(normalization):
    n = N_SMALL
    g = gauges.make_rope(np.arange(n), 3, np.array([1.0]))
    k = make_kernel(g, factor_distance_bias(n), beta=1.0)
    field = dynamics.make_vector_field(k, normalization=normalization, causal=True)
    jac = np.asarray(jax.jit(jax.jacfwd(field))(uniform(n, 3, seed=8)))  # (n, d, n, d): ∂v_i/∂x_j
    blocks = np.abs(jac).max(axis=(1, 3))  # (i, j)
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    # masked entries are replaced by exact zeros before any arithmetic: the derivative is exactly 0
    assert blocks[upper].max() <= 1e-15
    # token i does see every j < i: each strictly-lower block is far from round-off
    assert blocks[np.tril(np.ones((n, n), dtype=bool), k=-1)].min() > 1e-6
    # the non-causal field does depend on later tokens (so the check above is meaningful)
    full_field = dynamics.make_vector_field(k, normalization=normalization)
    full = np.asarray(jax.jit(jax.jacfwd(full_field))(uniform(n, 3, seed=8)))
    assert np.abs(full).max(axis=(1, 3))[upper].min() > 1e-6


N_PERM = 8
_XI = np.arange(N_PERM) / N_PERM
_W = np.asarray(FACTORS["matrix_signed"](N_PERM).matrix())
_Q = gauges.haar_orthogonal(jax.random.key(21), N_PERM, 3)
_X = uniform(N_PERM, 3, seed=9)


def _labelled_kernels(perm):
    """The same labelled tokens in the order ``perm``: gauges and factors built from permuted labels."""
    xi = _XI[perm]
    rope = gauges.make_rope(xi * N_PERM, 3, np.array([0.9]))
    dense = gauges.DenseGauge(q=jnp.asarray(_Q[perm]))
    db = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(2.0))
    tc = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(2 * np.pi))
    mf = factors.make_matrix_factor(_W[np.ix_(perm, perm)], n=N_PERM)
    return [
        (make_kernel(rope, db), "sa"),
        (make_kernel(rope, tc), "usa"),
        (make_kernel(dense, mf), "usa"),
        (make_kernel(dense, db), "usa"),
    ]


@settings(max_examples=10, deadline=None)
@given(perm=st.permutations(list(range(N_PERM))))
def test_permutation_equivariance(perm):
    perm = np.asarray(perm)
    identity = np.arange(N_PERM)
    for (k, norm), (k_perm, _) in zip(_labelled_kernels(identity), _labelled_kernels(perm), strict=True):
        v = dynamics.make_vector_field(k, normalization=norm)(_X)
        v_perm = dynamics.make_vector_field(k_perm, normalization=norm)(_X[perm])
        # the same terms summed in another order: a few ulps of O(e^β) sums
        np.testing.assert_allclose(v_perm, np.asarray(v)[perm], rtol=0, atol=1e-14)
        # energy is invariant (sum of 64 terms reordered)
        np.testing.assert_allclose(summation.energy(k_perm, _X[perm]), summation.energy(k, _X), rtol=1e-14)


def test_vector_field_option_errors():
    n = 8
    g = gauge_rope_full_period(n)
    with pytest.raises(
        ValueError, match=r"'sa' requires a non-negative factor.*got the sign-changing factor ToeplitzCos"
    ):
        dynamics.make_vector_field(make_kernel(g, factor_toeplitz_cos(n)), normalization="sa")
    with pytest.raises(ValueError, match=r"'sa' requires a non-negative factor.*MatrixFactor"):
        dynamics.make_vector_field(make_kernel(g, FACTORS["matrix_signed"](n)), normalization="sa")
    with pytest.raises(
        ValueError, match=r"`value` must be one of \('gradient', 'logits_only'\); got 'value'"
    ):
        dynamics.make_vector_field(make_kernel(g, factor_none(n)), value="value")
    # a non-negative matrix factor is accepted for sa
    dynamics.make_vector_field(make_kernel(g, FACTORS["matrix_nonneg"](n)), normalization="sa")


def test_noise_increment_is_tangent_and_scaled():
    x = uniform(4096, 3, seed=10)
    dx = dynamics.noise_increment(jax.random.key(1), x, noise=0.5, dt=0.01)
    # projection of a Gaussian: tangent up to round-off of entries ~0.1·4
    np.testing.assert_allclose(np.sum(np.asarray(x * dx), axis=1), 0.0, rtol=0, atol=1e-15)
    # E|P_x ζ|² = d − 1 = 2, so mean |dx|² = 2·noise·dt·2 = 0.02; 4096 samples: ~2% std error, 10% bound
    np.testing.assert_allclose(float(jnp.mean(jnp.sum(dx * dx, axis=1))), 0.02, rtol=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("d", [3, 5])
def test_noise_law_brownian_motion_on_the_sphere(d):
    """Zero field: ``dx = sqrt(2 noise) P_x ∘ dW`` is Brownian motion on the sphere with generator
    ``noise · Δ``; linear functions are eigenfunctions of eigenvalue ``−(d − 1)``, so
    ``E<x_t, x_0> = exp(−(d − 1) noise t)``."""
    n, noise, dt = 2**15, 0.5, 0.002
    x0 = uniform(n, d, seed=11)
    traj = solve(lambda x: jnp.zeros_like(x), x0, integrator=integrators.Euler(), dt=dt, t_end=1.0,
                 save_every=0.5, noise=noise, key=jax.random.key(3))  # fmt: skip
    for t, x in zip(traj.ts[1:], traj.xs[1:], strict=True):
        cosines = np.sum(x * np.asarray(x0), axis=1)
        exact = np.exp(-(d - 1) * noise * t)
        # Monte-Carlo: 4 standard errors of the mean over 2^15 independent particles (~1e-4 false alarms)
        standard_error = cosines.std() / np.sqrt(n)
        # the scheme's weak bias, O(dt): a step x -> normalize(x + sqrt(2 noise dt) P_x ζ) contracts
        # <x, x_k> by E[1 / sqrt(1 + 2 noise dt |P_x ζ|²)], which exceeds exp(−(d−1) noise dt) by
        # (d − 1)(d + 2) (noise dt)² + O(dt³): over t / dt steps, (d−1)(d+2) noise² dt t relative
        bias = (d - 1) * (d + 2) * noise**2 * dt * t * exact
        assert abs(cosines.mean() - exact) <= 4 * standard_error + bias, (t, cosines.mean(), exact, bias)
        # and the law is resolved: a factor 2 in the rate (e.g. sqrt(noise dt)) would be far outside
        assert abs(np.exp(-(d - 1) * noise * t / 2) - exact) > 10 * (4 * standard_error + bias)
