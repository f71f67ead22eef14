"""The expansion path (attnflow.numerics.expansion, polynomial_features): the closed-form tail bound
against the tail and the measured polynomial error, the monomial features against ⟨u,v⟩^k, the
field and the energy against the exact path within the requested tolerance for every gauge ×
factor × normalization × causal × value × profile (hypothesis, on and slightly off the sphere),
the cost model and the validation errors; the split (wide) products against the per-monomial ones
to 1e-13, and the lanes of a global sum covering every token once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, expansion, summation
from attnflow.numerics import polynomial_features as pf

BETAS = (0.5, 1.0, 4.0, 9.0)
TOLERANCES = (1e-6, 1e-10, 1e-13)
SHAPES = ((300, 2), (300, 3), (300, 4), (2048, 3))  # a few fixed shapes bound the recompilation
GAUGE_KINDS = ("identity", "rope", "dense")
FACTOR_KINDS = ("none", "distance_sorted", "distance_unsorted", "toeplitz")
# round-off of the exact and the expanded sums, in units of the field's scale: a few hundred ulps
ROUND_OFF = 1e-14


def _gauge(kind: str, n: int, d: int):
    if kind == "identity":
        return gauges.IdentityGauge(n=n, d=d)
    if kind == "rope":
        return gauges.make_rope(np.arange(n), d, gauges.rope_frequencies(d, kind=[0.3]))
    return gauges.DenseGauge(q=jnp.asarray(gauges.haar_orthogonal(jax.random.key(5), n, d)))


def _factor(kind: str, n: int):
    positions = np.arange(n) / n * 4.0
    if kind == "none":
        return factors.NoFactor(n=n)
    if kind == "toeplitz":
        return factors.ToeplitzCos(xi=jnp.asarray(positions), omega=jnp.asarray(2.5))
    if kind == "distance_unsorted":
        positions = np.random.default_rng(9).permutation(positions)
    return factors.DistanceBias(xi=jnp.asarray(positions), slope=jnp.asarray(1.3))


def _expansion_field(kernel, *, normalization, causal, value, tolerance):
    """``make_vector_field`` with ``expansion_sum`` in place of ``attention_sum``."""
    options = dict(normalization=normalization, causal=causal, tolerance=tolerance)

    def field(x):
        u = kernel.gauge.apply(x)
        if value == "gradient":
            g = kernel.gauge.apply_transpose(expansion.expansion_sum(kernel, u, u, **options))
        else:
            g = expansion.expansion_sum(kernel, u, x, **options)
        return sphere.project(x, g)

    return field


def _points(n: int, d: int, *, seed: int, off_sphere: bool):
    """Uniform points, or points at radii in [0.99, STAGE_RADIUS - 1e-3] (Runge–Kutta stage points;
    all pairs within |⟨u_i, u_j⟩| <= SHELL, where the bound holds)."""
    x = sphere.sample_uniform(seed, n, d)  # drawn on the host: a JAX key compiles a sampler per shape
    if off_sphere:
        radii = np.random.default_rng(seed + 1).uniform(0.99, pf.SHELL**0.5 - 1e-3, (n, 1))
        x = x * radii
    return x


@pytest.mark.parametrize("beta", BETAS)
def test_tail_bound_dominates_the_tail_and_the_measured_error(beta):
    s = np.linspace(-pf.SHELL, pf.SHELL, 4001)
    for degree in range(0, 40, 3):
        bound, tail = pf.tail_bound(beta, degree), pf.exact_tail(beta, degree)
        assert tail <= bound
        if bound < 1e-13:
            continue  # below the round-off of evaluating p_L in float64
        p = np.polynomial.polynomial.polyval(s, pf.monomial_coefficients(beta, degree))
        measured = np.abs(p - np.exp(beta * (s - 1.0))).max()
        # the truncation error is the tail (attained at s = ±SHELL), up to round-off: 1e-15 of the
        # values of p, which reach e^{β(SHELL−1)} (6.6 at beta = 9)
        assert measured <= tail * (1 + 1e-9) + 1e-15 * np.exp(beta * (pf.SHELL - 1.0))
        assert measured >= 0.5 * tail
    # the closed form overestimates the tail by at most a factor 2.8 (worst: beta = 9, degree 6, where
    # z = beta SHELL = 10.9 makes the geometric ratio z / (2(L + 2)) = 0.68 a loose majorant)
    assert max(pf.tail_bound(beta, k) / pf.exact_tail(beta, k) for k in range(6, 40)) <= 2.8


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_degree_is_the_smallest_that_meets_the_tolerance(beta, tolerance):
    degree = expansion.expansion_degree(beta, tolerance)
    assert pf.tail_bound(beta, degree) <= tolerance
    assert degree == 0 or pf.tail_bound(beta, degree - 1) > tolerance
    sa = expansion.expansion_degree(beta, tolerance, normalization="sa")
    assert sa >= degree
    # the coefficients do not amplify round-off: Σ|c_k| SHELL^k is within 5 of max p ~ e^{β(SHELL−1)}
    c = pf.monomial_coefficients(beta, sa)
    assert np.sum(np.abs(c) * pf.SHELL ** np.arange(sa + 1)) <= 5.0 * np.exp(beta * (pf.SHELL - 1.0))


@pytest.mark.parametrize("d", (2, 3, 4))
def test_features_reproduce_the_polynomial_of_the_logit(d):
    degree = 7
    exponents = pf.monomial_exponents(d, degree)
    assert exponents.shape == (pf.rank(d, degree), d)
    assert len({tuple(row) for row in exponents}) == exponents.shape[0]
    rng = np.random.default_rng(d)
    u, v = rng.normal(size=(5, d)), rng.normal(size=(7, d))
    fu, fv = (
        np.asarray(pf.monomial_features(jnp.asarray(u), degree)),
        pf.monomial_features(jnp.asarray(v), degree),
    )
    np.testing.assert_allclose(fu, np.prod(u[:, None, :] ** exponents[None], axis=2), rtol=1e-13)
    c = pf.monomial_coefficients(2.0, degree)
    direct = np.polynomial.polynomial.polyval(u @ v.T, c)
    # Σ_α weight_α u^α v^α = p(⟨u,v⟩): the multinomial theorem; O(1) entries, a few ulps each
    np.testing.assert_allclose((fu * pf.feature_weights(exponents, c)) @ np.asarray(fv).T, direct, atol=1e-12)


def _supported(factor_kind, normalization, causal):
    if normalization == "sa" and factor_kind == "toeplitz":
        return False  # the softmax needs w >= 0
    return not (causal and factor_kind == "distance_unsorted")  # checked in test_errors


def _check_case(
    shape, gauge_kind, factor_kind, normalization, causal, value, kind, tolerance, beta, off_sphere
):
    n, d = shape
    kernel = Kernel(_gauge(gauge_kind, n, d), _factor(factor_kind, n), make_profile(kind, beta=beta))
    rank = expansion.expansion_rank(d, beta, tolerance, kind=kind, normalization=normalization)
    if rank > expansion.MAX_RANK:
        with pytest.raises(ValueError, match="`d` must be small enough for the tolerance"):
            expansion.expansion_sum(
                kernel, jnp.ones((n, d)), jnp.ones((n, d)), tolerance=tolerance, normalization=normalization
            )
        return
    x = _points(n, d, seed=n + d, off_sphere=off_sphere)
    options = dict(normalization=normalization, causal=causal, value=value)
    with_energy = not causal and normalization == "usa" and value == "gradient"

    def evaluate(x):  # both paths (and both energies) in one compiled program, not op by op
        exact = dynamics.make_vector_field(kernel, **options)(x)
        approx = _expansion_field(kernel, tolerance=tolerance, **options)(x)
        if not with_energy:
            return exact, approx, None, None
        return (
            exact,
            approx,
            summation.energy(kernel, x),
            expansion.expansion_energy(kernel, x, tolerance=tolerance),
        )

    exact, approx, e_exact, e_approx = jax.jit(evaluate)(x)
    # the field's scale: φ'(1)·max|values| (usa) or max|values| (sa), values x or u (|u_i| = |x_i|);
    # Q(ξ)ᵀ is orthogonal and P_x = I − x xᵀ has norm 1 for |x|² <= 2, so the bound carries over
    radius = float(jnp.max(jnp.linalg.norm(x, axis=1)))
    scale = (float(kernel.profile.scale) if normalization == "usa" else 1.0) * radius
    error = float(jnp.max(jnp.abs(approx - exact))) / scale
    assert error <= tolerance + ROUND_OFF, (error, tolerance)
    if with_energy:
        # |ΔE| <= ε φ'(1)/(2β) (exp; the linear profile is exact)
        e_scale = float(kernel.profile.scale) / (2.0 * beta if kind == "exp" else 2.0)
        assert abs(float(e_approx - e_exact)) / e_scale <= tolerance + ROUND_OFF


def _cases(shapes, tolerances, betas):
    return st.tuples(
        st.sampled_from(shapes),
        st.sampled_from(GAUGE_KINDS),
        st.sampled_from(FACTOR_KINDS),
        st.sampled_from(("usa", "sa")),
        st.booleans(),
        st.sampled_from(dynamics.VALUES),
        st.sampled_from(("exp", "exp", "linear")),
        st.sampled_from(tolerances),
        st.sampled_from(betas),
        st.booleans(),
    ).filter(lambda c: _supported(c[2], c[3], c[4]))


# the default run: small shapes and ranks (compilation dominates: each case compiles both paths, ~10 s
# on a loaded 2-core machine); the slow one: every tolerance and beta
@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True)
@given(_cases(SHAPES[:3], TOLERANCES[:2], BETAS[:3]))
def test_field_and_energy_match_the_exact_path(case):
    _check_case(*case)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(_cases(SHAPES, TOLERANCES, BETAS))
def test_field_and_energy_match_the_exact_path_many(case):
    _check_case(*case)


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize(("beta", "tolerance"), [(1.0, 1e-10), (4.0, 1e-6), (9.0, 1e-10)])
def test_the_bound_holds_at_stages_of_radius_1_1(beta, tolerance, normalization):
    """Every token at |x| = STAGE_RADIUS = 1.1 (pairs up to |<u_i, u_j>| = 1.21: the edge of the
    shell): the field is still within the tolerance of its scale there, and the degree chosen for
    the former shell 1.05 (|x| <= 1.0247) is not enough at that radius (the test can fail)."""
    n, d = 300, 3
    assert pf.STAGE_RADIUS == 1.1 and pf.SHELL == pytest.approx(1.21, abs=1e-15)
    kernel = Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=beta))
    x = pf.STAGE_RADIUS * sphere.sample_uniform(3, n, d)
    x = x.at[1].set(-x[0]).at[2].set(x[0])  # an antipodal and an equal pair: s = -1.21 and 1.21
    options = dict(normalization=normalization, causal=False, value="gradient")
    exact, approx, beyond = jax.jit(
        lambda x: (
            dynamics.make_vector_field(kernel, **options)(x),
            _expansion_field(kernel, tolerance=tolerance, **options)(x),
            _expansion_field(kernel, tolerance=tolerance, **options)(x.at[5].multiply(1.001)),
        )  # fmt: skip
    )(x)
    scale = (float(kernel.profile.scale) if normalization == "usa" else 1.0) * pf.STAGE_RADIUS
    assert float(jnp.max(jnp.abs(approx - exact))) / scale <= tolerance + ROUND_OFF
    # one token beyond the radius (1.1011): the bound does not hold there, so no field is returned
    assert np.isnan(np.asarray(beyond)).all()
    # the former shell: its degree's polynomial misses e^{β(s−1)} at s = 1.21 by more than tolerance
    old = next(k for k in range(pf.MAX_DEGREE) if pf.tail_bound(beta, k, shell=1.05) <= tolerance)
    c = pf.monomial_coefficients(beta, old, shell=1.05)
    miss = abs(np.polynomial.polynomial.polyval(1.21, c) - np.exp(beta * 0.21))
    assert miss > tolerance  # why a radius-aware shell is needed


@pytest.mark.slow
def test_linear_profile_is_exact():
    n, d = 300, 3
    kernel = Kernel(_gauge("dense", n, d), _factor("distance_unsorted", n), make_profile("linear", beta=2.0))
    x = _points(n, d, seed=3, off_sphere=True)
    u = kernel.gauge.apply(x)
    assert expansion.expansion_degree(2.0, 1e-13, kind="linear") == 0
    # degree 0 is the kernel itself: the sums agree to round-off (O(1) entries)
    np.testing.assert_allclose(
        expansion.expansion_sum(kernel, u, u), summation.attention_sum(kernel, u, u), atol=1e-14
    )


def test_cost_model():
    kernel = Kernel(
        gauges.IdentityGauge(n=16384, d=3), factors.NoFactor(n=16384), make_profile("exp", beta=1.0)
    )
    assert expansion.prefer_expansion(kernel, 3, normalization="usa", causal=False, tolerance=1e-8)
    small = Kernel(gauges.IdentityGauge(n=32, d=3), factors.NoFactor(n=32), make_profile("exp", beta=1.0))
    assert not expansion.prefer_expansion(small, 3, normalization="usa", causal=False, tolerance=1e-8)
    # a matrix factor at the n where the expansion wins otherwise; the matrix of ones is a
    # broadcast view (no 2 GiB array: the choice depends on the factor's type, never on its entries)
    ones = factors.MatrixFactor(w=np.broadcast_to(np.float64(1.0), (16384, 16384)), nonnegative=True)
    assert ones.n == 16384
    matrix = Kernel(kernel.gauge, ones, kernel.profile)
    assert not expansion.prefer_expansion(matrix, 3, normalization="usa", causal=False, tolerance=1e-8)
    assert expansion.expansion_rank(3, 1.0, 1e-8) == pf.rank(3, expansion.expansion_degree(1.0, 1e-8))


def test_errors():
    n, d = 300, 3
    u = _points(n, d, seed=1, off_sphere=False)

    def kernel(factor, beta=1.0, d=d):
        return Kernel(gauges.IdentityGauge(n=n, d=d), factor, make_profile("exp", beta=beta))

    matrix = factors.make_matrix_factor(np.ones((n, n)), n=n)
    with pytest.raises(
        ValueError, match=r"`factor` must be none, distance_bias or toeplitz_cos .*got MatrixFactor"
    ):
        expansion.expansion_sum(kernel(matrix), u, u)
    with pytest.raises(ValueError, match=r"`causal` with the distance bias must have labels monotone"):
        expansion.expansion_sum(kernel(_factor("distance_unsorted", n)), u, u, causal=True)
    with pytest.raises(ValueError, match=r"`normalization` 'sa' requires a non-negative factor"):
        expansion.expansion_sum(kernel(_factor("toeplitz", n)), u, u, normalization="sa")
    with pytest.raises(ValueError, match=r"`normalization` must be one of \('usa', 'sa'\); got 'softmax'"):
        expansion.expansion_sum(kernel(factors.NoFactor(n=n)), u, u, normalization="softmax")
    with pytest.raises(ValueError, match=r"`tolerance` must be in \(0, 1\); got 0.0"):
        expansion.expansion_sum(kernel(factors.NoFactor(n=n)), u, u, tolerance=0.0)
    x8 = jnp.ones((n, 8)) / np.sqrt(8)
    with pytest.raises(ValueError, match=r"`d` must be small enough for the tolerance .* got d = 8"):
        expansion.expansion_sum(kernel(factors.NoFactor(n=n), beta=9.0, d=8), x8, x8, tolerance=1e-13)
    traced = jax.jit(lambda k, u: expansion.expansion_sum(k, u, u))
    with pytest.raises(ValueError, match=r"`beta` must be a concrete number"):
        traced(kernel(factors.NoFactor(n=n)), u)
    with pytest.raises(ValueError, match=r"`causal` with the distance bias must have labels monotone"):
        expansion.check(
            kernel(_factor("distance_unsorted", n)), d, normalization="usa", causal=True, tolerance=1e-8
        )
    assert expansion.check(
        kernel(factors.NoFactor(n=n)), d, normalization="usa", causal=True, tolerance=1e-8
    ) == (expansion.expansion_rank(d, 1.0, 1e-8))
    # labels non-increasing in token order are monotone too: the causal sum runs
    falling = factors.DistanceBias(xi=jnp.arange(n)[::-1] / n, slope=jnp.asarray(2.0))
    k = kernel(falling)
    np.testing.assert_allclose(
        expansion.expansion_sum(k, u, u, causal=True, tolerance=1e-12),
        summation.attention_sum(k, u, u, causal=True),
        atol=1e-12 * float(k.profile.scale),  # the requested tolerance, in units of the field's scale
    )


def _per_monomial(beta, degree, q, k, y):
    """The products before the split features: ``F(q) · (weights ⊙ F(k)ᵀ y)`` with the ``R``
    monomial features, one ``(R, n) @ (n, w)`` product (the formula the split must reproduce)."""
    exponents = pf.monomial_exponents(k.shape[1], degree)
    weights = pf.feature_weights(exponents, pf.monomial_coefficients(beta, degree))
    moments = pf.monomial_features(k, degree).T @ y
    return pf.monomial_features(q, degree) @ (moments * jnp.asarray(weights)[:, None])


@pytest.mark.slow
@pytest.mark.parametrize(("d", "beta", "tolerance", "width"), [(2, 1.0, 1e-10, 3), (3, 1.0, 1e-10, 3),
                         (3, 4.0, 1e-10, 4), (3, 9.0, 1e-10, 6), (5, 1.0, 1e-6, 5)])  # fmt: skip
def test_split_products_equal_the_per_monomial_products(d, beta, tolerance, width):
    """The wide products (``_Plan.moments``, ``weighted``, ``evaluate``) give the sums of the
    ``R`` monomial features to 1e-13 of their size; the grid weighted also above the degree (a
    wrong mask) is off by far more, so the comparison can fail."""
    n = 700
    degree = expansion.expansion_degree(beta, tolerance)
    plan = expansion._Plan(beta, degree, d, jnp.float64)
    k = _points(n, d, seed=d, off_sphere=True)
    q = _points(n, d, seed=d + 50, off_sphere=True)
    y = jax.random.normal(jax.random.key(d), (n, width))
    unmasked = expansion._Plan(beta, degree, d, jnp.float64)
    above = pf.split_exponents(d, degree).sum(axis=2) > degree
    unmasked.weights = jnp.where(jnp.asarray(above), 1.0, plan.weights)

    def products(q, k, y):  # the three in one compiled program, not op by op
        return (
            _per_monomial(beta, degree, q, k, y),
            plan.evaluate(q, plan.weighted(plan.moments(k, y))),
            unmasked.evaluate(q, unmasked.weighted(unmasked.moments(k, y))),
        )

    reference, split, wrong = jax.jit(products)(q, k, y)
    scale = float(jnp.max(jnp.abs(reference)))
    # sums of n = 700 terms of size <= 5 e^{β(SHELL−1)} max|y| (the coefficients are tame):
    # round-off of a few hundred ulps of the result's size, in either order of summation
    assert float(jnp.max(jnp.abs(split - reference))) <= 1e-13 * scale
    assert float(jnp.max(jnp.abs(wrong - reference))) > 1e-6 * scale


@pytest.mark.parametrize(("d", "n", "chunks"), [(4, 500, 3), (3, 1025, 8), (3, 9000, 16)])
def test_the_lanes_of_a_global_sum_cover_every_token_once(d, n, chunks):
    """Fewer chunks than lanes (the idle lanes skip their padding), and whole chunks per lane with
    the last chunk partly padding: the global sum over lanes equals the plan applied to all tokens
    at once (one chunk, no lanes) to round-off."""
    beta = 4.0
    plan = expansion._Plan(beta, expansion.expansion_degree(beta, 1e-10), d, jnp.float64)
    u = _points(n, d, seed=n, off_sphere=False)
    y = jax.random.normal(jax.random.key(n), (n, 2))
    a = jnp.ones((n, 1))
    assert -(-n // expansion._lane_chunk(plan, n, 2)) == chunks  # the case the parameters name
    lanes_sum, whole = jax.jit(  # both in one compiled program, not the whole op by op
        lambda u, y: (
            expansion._global_sum(plan, u, u, y, a),
            plan.evaluate(u, plan.weighted(plan.moments(u, y))),
        )
    )(u, y)
    # sums of n terms of size <= 5 e^{β(SHELL−1)} |y| ~ 15: round-off of the order of 1e-13
    np.testing.assert_allclose(lanes_sum, whole, rtol=0, atol=1e-12)


def test_a_step_whose_stages_leave_the_radius_ends_the_run_as_nonfinite():
    """RK4 at dt = 2 (beta = 1, spread data): the second step's last stage x + dt k3 reaches
    |x| = 1.7 (k3 is tangent at another point), where the expansion's bound no longer holds; the
    run stops with ``nonfinite`` at its last snapshot inside, while the exact path, whose sums hold
    at any radius, goes on."""
    from attnflow.numerics import integrators
    from attnflow.numerics.solve import solve
    from attnflow.numerics.status import Status

    n, d, dt = 64, 3, 2.0
    kernel = Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=1.0))
    x0 = sphere.sample_uniform(5, n, d)
    opts = dict(integrator=integrators.RK4(), dt=dt, t_end=2 * dt, save_every=dt)
    field = dynamics.make_vector_field(kernel)
    exact = solve(field, x0, **opts)
    assert exact.status == Status.ok and np.isfinite(exact.xs).all()
    x = jnp.asarray(exact.xs[1])  # the second step's stages, with the exact field

    @jax.jit  # one compiled program, not op by op
    def stage_from(x):
        k2 = field(x + dt / 2 * field(x))
        return x + dt * field(x + dt / 2 * k2)

    last_stage = stage_from(x)
    assert float(jnp.max(jnp.linalg.norm(last_stage, axis=1))) > 1.5  # 1.7: far beyond STAGE_RADIUS = 1.1
    approx = solve(dynamics.make_vector_field(kernel, interaction="expansion"), x0, **opts)
    assert approx.status == Status.nonfinite
    np.testing.assert_array_equal(approx.ts, exact.ts[:2])  # the last snapshot inside the radius
    np.testing.assert_allclose(approx.xs, exact.xs[:2], rtol=0, atol=1e-9)
