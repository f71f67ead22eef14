"""The kernel family (numerics.summation, core.factors): profiles, kernel symmetry, the attention sum
and energy against an independent NumPy evaluation, blocked = dense, the rescaled time scale, the
energy bound of the w = 1 kernel and the validation errors."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, summation
from helpers_core import FACTORS, GAUGES, N_SMALL, NONNEGATIVE_FACTORS, make_kernel, uniform


def _numpy_attention(kernel, x, *, normalization, causal, beta, c, values="gradient"):
    """The attention sum written out with NumPy: u = Qx, C = w ⊙ φ'(UUᵀ), g = C U / n (or row-normalised)."""
    q = np.asarray(kernel.gauge.matrices())
    x = np.asarray(x)
    n = x.shape[0]
    u = np.einsum("nij,nj->ni", q, x)
    w = np.broadcast_to(np.asarray(kernel.factor.dense()), (n, n))
    c_mat = w * c * np.exp(beta * (u @ u.T))
    if causal:
        c_mat = np.tril(c_mat)
    if normalization == "sa":
        c_mat = c_mat / c_mat.sum(axis=1, keepdims=True)
    else:
        c_mat = c_mat / n
    return c_mat @ u


@pytest.mark.parametrize("gauge_name", sorted(GAUGES))
def test_kernel_matrix_symmetric(gauge_name):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=1)
    for factor_name, kind in itertools.product(sorted(FACTORS), ("exp", "linear")):
        k = make_kernel(g, FACTORS[factor_name](N_SMALL), kind=kind, beta=1.5)
        h = np.asarray(k.factor.dense() * k.profile.phi(summation.logits(k, x)))
        # h(z_i, z_j) = h(z_j, z_i): S = UUᵀ is symmetric up to summation order, O(1) entries
        np.testing.assert_allclose(
            h, h.T, rtol=0, atol=1e-14, err_msg=f"{gauge_name} × {factor_name} × {kind}"
        )


def test_profiles():
    s = jnp.linspace(-1.0, 1.0, 9)
    exp_plain = make_profile("exp", beta=2.0)
    exp_resc = make_profile("exp", beta=2.0, time_scale="rescaled")
    lin = make_profile("linear", beta=2.0, time_scale="rescaled")
    # φ(t) = (c/β) e^{βt}: e^{β}·e^{β(t−1)} vs e^{βt}, a few ulps apart
    np.testing.assert_allclose(exp_plain.phi(s), np.exp(2.0 * s) / 2.0, rtol=1e-15)
    # rescaled: c = e^{−β} so φ(t) = e^{β(t−1)}/β
    np.testing.assert_allclose(exp_resc.phi(s), np.exp(2.0 * (s - 1)) / 2.0, rtol=1e-15)
    np.testing.assert_allclose(float(exp_resc.scale), 1.0, rtol=1e-15)  # φ'(1) = c e^β = 1, rounding only
    np.testing.assert_allclose(lin.phi(s), np.exp(-2.0) * s, rtol=1e-15)  # φ(t) = c t, one product
    np.testing.assert_array_equal(lin.dphi_unit(s), 1.0)  # φ' is constant
    # φ'(s)/φ'(1) = e^{β(s−1)} ≤ 1 on the sphere; one exp each, same formula
    np.testing.assert_allclose(exp_plain.dphi_unit(s), np.exp(2.0 * (s - 1)), rtol=1e-15)


def test_profile_errors():
    with pytest.raises(ValueError, match=r"`kind` must be one of \('exp', 'linear'\); got 'cubic'"):
        make_profile("cubic")
    with pytest.raises(ValueError, match=r"`time_scale` must be one of \('plain', 'rescaled'\); got 'slow'"):
        make_profile("exp", time_scale="slow")
    k = make_kernel(GAUGES["identity"](4), factors.NoFactor(4))
    with pytest.raises(ValueError, match=r"`normalization` must be one of \('usa', 'sa'\); got 'softmax'"):
        summation.attention_sum(k, uniform(4, 3), uniform(4, 3), normalization="softmax")


@pytest.mark.parametrize("gauge_name", ["identity", "rope_explicit_d5", "prompt_haar"])
@pytest.mark.parametrize(
    "normalization, causal", [("usa", False), ("usa", True), ("sa", False), ("sa", True)]
)
def test_attention_sum_matches_numpy(gauge_name, normalization, causal):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=2)
    for factor_name in NONNEGATIVE_FACTORS if normalization == "sa" else sorted(FACTORS):
        k = make_kernel(g, FACTORS[factor_name](N_SMALL), beta=1.5)
        got = summation.attention_sum(k, g.apply(x), g.apply(x), normalization=normalization, causal=causal)
        want = _numpy_attention(k, x, normalization=normalization, causal=causal, beta=1.5, c=1.0)
        # e^{β(s−1)}·e^{β} vs e^{βs} and a different summation order: relative round-off ~1e-15
        # on sums of up to 16 terms of size ≤ e^{1.5}
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14, err_msg=factor_name)


@pytest.mark.parametrize(
    "gauge_name", ["identity", "rope_full_period", "generalized_commuting_d4", "dense_haar"]
)
def test_energy_matches_numpy_and_bound(gauge_name):
    g = GAUGES[gauge_name](N_SMALL)
    x = uniform(N_SMALL, g.d, seed=3)
    q = np.asarray(g.matrices())
    u = np.einsum("nij,nj->ni", q, np.asarray(x))
    for factor_name, kind, time_scale in itertools.product(
        sorted(FACTORS), ("exp", "linear"), ("plain", "rescaled")
    ):
        k = make_kernel(g, FACTORS[factor_name](N_SMALL), kind=kind, beta=1.5, time_scale=time_scale)
        c = 1.0 if time_scale == "plain" else np.exp(-1.5)
        phi = c / 1.5 * np.exp(1.5 * (u @ u.T)) if kind == "exp" else c * (u @ u.T)
        want = np.sum(np.asarray(k.factor.dense()) * phi) / (2 * N_SMALL**2)
        # a sum of 256 terms of size ≤ e^{1.5}/1.5: relative round-off well below 1e-13 (absolute
        # term for the linear profile, whose energy can be near 0 by cancellation)
        np.testing.assert_allclose(float(summation.energy(k, x)), want, rtol=1e-13, atol=1e-15)
    # The energy bound: with w = 1 the energy is at most c e^β/(2β), attained on x_i = Q(ξ_i)ᵀ v
    k = make_kernel(g, factors.NoFactor(N_SMALL), beta=1.5)
    bound = np.exp(1.5) / 3.0
    assert float(summation.energy(k, x)) < bound
    v = np.zeros(g.d)
    v[0] = 1.0
    x_star = g.apply_transpose(jnp.broadcast_to(jnp.asarray(v), (N_SMALL, g.d)))
    # on the maximiser every logit is 1 up to the gauge's orthogonality defect (≤ 6e-14 for the expm-built
    # generalized RoPE, see test_gauges), times β: relative 1e-12
    np.testing.assert_allclose(float(summation.energy(k, x_star)), bound, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [7, 32])
def test_blocked_equals_dense(block_size):
    n = 32
    g = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    x = uniform(n, 3, seed=4)
    u = g.apply(x)
    # every (normalization, causal) pair, each factor kind (broadcast ones, analytic rows, gathered rows)
    cases = [
        ("none", "usa", False),
        ("distance_bias", "sa", False),
        ("matrix_nonneg", "usa", True),
        ("distance_bias", "sa", True),
    ]
    for factor_name, normalization, causal in cases:
        k = make_kernel(g, FACTORS[factor_name](n), beta=2.0)
        opts = dict(normalization=normalization, causal=causal)
        dense = summation.attention_sum(k, u, u, **opts)
        blocked = summation.attention_sum(k, u, u, block_size=block_size, **opts)
        # same per-row arithmetic in a different matmul tiling: differences are a few ulps
        np.testing.assert_allclose(blocked, dense, rtol=0, atol=1e-13, err_msg=f"{factor_name} {opts}")
    k = make_kernel(g, FACTORS["none"](n), beta=2.0)  # the broadcast (1, 1) factor block in the energy
    # energy: a sum of 1024 O(e^β/β) terms regrouped by blocks, relative ~1e-15
    np.testing.assert_allclose(
        float(summation.energy(k, x, block_size=block_size)), float(summation.energy(k, x)), rtol=1e-13
    )
    # the blocked field (what make_vector_field passes down) equals the dense one
    k = make_kernel(g, FACTORS["distance_bias"](n), beta=2.0)
    dense = dynamics.make_vector_field(k, normalization="sa", causal=True)(x)
    blocked = dynamics.make_vector_field(k, normalization="sa", causal=True, block_size=block_size)(x)
    np.testing.assert_allclose(blocked, dense, rtol=0, atol=1e-13)  # as above: tiling round-off only


@pytest.mark.parametrize("kind", ["exp", "linear"])
def test_rescaled_time_scale_is_a_constant_factor(kind):
    beta = 2.0
    g = GAUGES["rope_full_period"](N_SMALL)
    x = uniform(N_SMALL, 3, seed=5)
    factor = FACTORS["distance_bias"](N_SMALL)
    plain = make_kernel(g, factor, kind=kind, beta=beta)
    resc = make_kernel(g, factor, kind=kind, beta=beta, time_scale="rescaled")
    v_plain = dynamics.make_vector_field(plain)(x)
    v_resc = dynamics.make_vector_field(resc)(x)
    # usa: the field is linear in c, so rescaled = e^{−β} × plain (one extra rounding of c)
    np.testing.assert_allclose(v_resc, np.exp(-beta) * np.asarray(v_plain), rtol=1e-14, atol=1e-16)
    # energy is linear in c too
    np.testing.assert_allclose(
        summation.energy(resc, x), np.exp(-beta) * summation.energy(plain, x), rtol=1e-14
    )
    # sa: c cancels in the softmax, so both time scales give the same field (ratio of equal roundings)
    np.testing.assert_allclose(
        dynamics.make_vector_field(resc, normalization="sa")(x),
        dynamics.make_vector_field(plain, normalization="sa")(x),
        rtol=0,
        atol=1e-15,
    )


def test_factor_rows_and_values():
    n = 8
    xi = np.arange(n) / n
    db = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(5.0))
    tc = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(2 * np.pi))
    # one exp / cos per entry, the same formula: a couple of ulps
    np.testing.assert_allclose(db.dense(), np.exp(-5.0 * np.abs(xi[:, None] - xi[None, :])), rtol=1e-15)
    np.testing.assert_allclose(
        tc.dense(), np.cos(2 * np.pi * (xi[:, None] - xi[None, :])), rtol=0, atol=1e-15
    )
    idx = jnp.array([5, 1])
    for f in (db, tc, FACTORS["matrix_signed"](n)):
        np.testing.assert_array_equal(f.rows(idx), np.asarray(f.dense())[np.asarray(idx)])  # same arithmetic
    np.testing.assert_array_equal(factors.NoFactor(n).dense(), np.ones((n, n)))
    assert db.nonnegative and factors.NoFactor(n).nonnegative and not tc.nonnegative
    assert FACTORS["matrix_nonneg"](n).nonnegative and not FACTORS["matrix_signed"](n).nonnegative


def test_check_symmetric_errors():
    w = np.eye(3)
    np.testing.assert_array_equal(factors.check_symmetric(w, n=3), w)
    with pytest.raises(ValueError, match=r"must have shape \(n, n\) = \(4, 4\); got \(3, 3\)"):
        factors.check_symmetric(w, n=4)
    bad = w.copy()
    bad[0, 1] = np.inf
    with pytest.raises(ValueError, match=r"must be finite"):
        factors.check_symmetric(bad, n=3)
    bad = w.copy()
    bad[0, 1] = 0.5
    with pytest.raises(ValueError, match=r"^W\.npy: factor matrix must be symmetric .* got 0\.5"):
        factors.check_symmetric(bad, n=3, name="W.npy")
    with pytest.raises(ValueError, match=r"must be symmetric"):
        factors.make_matrix_factor(bad, n=3)


@pytest.mark.parametrize("factor_name", ["none", "distance_bias"])
def test_float32_run_dtype_is_preserved(factor_name):
    """A float32 kernel gives a float32 field and energy (NoFactor's float64 ones must not promote)."""
    n = N_SMALL
    g = gauges.make_rope(np.arange(n), 3, np.array([0.3]), dtype=jnp.float32)
    if factor_name == "none":
        factor = factors.NoFactor(n)
    else:
        factor = factors.DistanceBias(
            xi=jnp.arange(n, dtype=jnp.float32) / n, slope=jnp.asarray(1.0, jnp.float32)
        )
    k = Kernel(g, factor, make_profile("exp", beta=1.0, dtype=jnp.float32))
    x32 = uniform(n, 3, seed=6).astype(jnp.float32)
    v = dynamics.make_vector_field(k)(x32)
    assert v.dtype == jnp.float32 and summation.energy(k, x32).dtype == jnp.float32
    k64 = make_kernel(gauges.make_rope(np.arange(n), 3, np.array([0.3])), FACTORS[factor_name](n), beta=1.0)
    # float32 round-off (1.2e-7) on sums of 16 terms of size ≤ e: 1e-5 absolute is ample
    np.testing.assert_allclose(v, dynamics.make_vector_field(k64)(x32.astype(jnp.float64)), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_each_factor_carries_its_tile_dense_mean_and_spectrum():
    """The operations a factor carries agree with its dense matrix: tile = W[I][:, J] (bitwise for a
    table, the same formula otherwise), mean = mean(W), eigenpairs = eigh(W), tabulated = W."""
    n = 12
    idx_i, idx_j = jnp.array([3, 0, 7]), jnp.array([11, 3, 5, 2])
    for name in ("none", "distance_bias", "toeplitz_cos", "matrix_signed", "matrix_nonneg"):
        f = FACTORS[name](n)
        w = np.asarray(f.dense())
        tile = np.broadcast_to(np.asarray(f.tile(idx_i, idx_j, jnp.float64)), (3, 4))
        # An analytic tile evaluates the same formula on the same labels: equal to an ulp.
        np.testing.assert_allclose(tile, w[np.asarray(idx_i)][:, np.asarray(idx_j)], rtol=0, atol=4e-16)
        assert f.tile(idx_i, idx_j, jnp.float32).dtype == jnp.float32
        assert f.mean() == pytest.approx(float(w.mean()), abs=1e-14)  # closed forms vs the sum
        values, vectors = f.eigenpairs()
        np.testing.assert_allclose(values, np.linalg.eigvalsh(w)[::-1], atol=1e-12)  # eigh round-off
        k = vectors.shape[1]
        np.testing.assert_allclose(w @ vectors, vectors * values[:k], atol=1e-12)
        np.testing.assert_array_equal(np.asarray(f.tabulated().dense()), w)
        assert f.tabulated().nonnegative == f.nonnegative
    assert isinstance(FACTORS["none"](n).tabulated(), factors.NoFactor)  # ones: no table


def test_a_kernel_s_gauge_and_factor_are_over_the_same_tokens():
    # the sum would otherwise fail deep inside JAX with a broadcasting error, or not at all
    toeplitz = factors.ToeplitzCos(xi=jnp.arange(20) / 20.0, omega=jnp.asarray(1.0))
    with pytest.raises(
        ValueError, match=r"^kernel: `factor` must be over the gauge's n = 16 tokens; got one over 20\.$"
    ):
        Kernel(gauges.IdentityGauge(16, 3), toeplitz, make_profile("exp", beta=1.0))
    assert Kernel(gauges.IdentityGauge(20, 3), toeplitz, make_profile("exp", beta=1.0)).n == 20
