"""Tests of attnflow.analysis.metrics: closed forms on exact states, invariants, edges and errors."""

import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnflow.analysis import metrics

TWO_PI = 2.0 * np.pi


# --------------------------------------------------------------------------- exact states


def dirac(n=7, d=3, seed=0):
    v = np.random.default_rng(seed).normal(size=d)
    return np.tile(v / np.linalg.norm(v), (n, 1))


def latitude_circle(n, v3, phase=0.0):
    phi = phase + TWO_PI * np.arange(n) / n
    r = np.sqrt(1.0 - v3 * v3)
    return np.stack([r * np.cos(phi), r * np.sin(phi), np.full(n, v3)], axis=1)


def haar_orthogonal(rng, d):
    z = rng.normal(size=(d, d))
    q, r = np.linalg.qr(z)
    return q * np.sign(np.diag(r))


def unit_rows(rng, shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


CLUSTER_CENTRES = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [-0.6, 0.0, -0.8]])
CLUSTER_SIZES = np.array([1, 3, 5, 7])


def clusters():
    ids = np.repeat(np.arange(len(CLUSTER_SIZES)), CLUSTER_SIZES)
    perm = np.random.default_rng(3).permutation(ids.size)
    return CLUSTER_CENTRES[ids[perm]], ids[perm]


# --------------------------------------------------------------------------- Dirac


def test_dirac_values():
    x = dirac()
    # A Dirac: all pairwise cosines are 1 up to one rounding of the mean.
    assert float(metrics.mean_cosine(x)) == pytest.approx(1.0, abs=1e-14)
    assert float(metrics.resultant_deficit(x)) == pytest.approx(0.0, abs=1e-15)
    assert float(metrics.marginal_spread(x)) == pytest.approx(0.0, abs=1e-15)
    assert float(metrics.min_cosine(x)) == pytest.approx(1.0, abs=1e-15)
    assert metrics.n_clusters(x) == 1
    assert metrics.n_eff(x) == 1.0
    # The least singular direction is orthogonal to the single point: round-off only.
    assert float(metrics.planarity(x)) == pytest.approx(0.0, abs=1e-14)


def test_single_token_is_a_dirac():
    # n = 1 has no pairs; a one-point law is a Dirac, so the mean cosine is defined as 1.
    assert float(metrics.mean_cosine(np.array([[0.0, 1.0, 0.0]]))) == 1.0


# --------------------------------------------------------------------------- latitude circle


@pytest.mark.parametrize("n", [8, 64, 257])
def test_latitude_circle_closed_forms(n):
    v3 = 0.3
    x = latitude_circle(n, v3, phase=0.4)
    # a latitude circle: mean (0, 0, v3), mean pairwise cosine (n v3² − 1)/(n − 1); round-off in Σ cos.
    assert float(metrics.mean_cosine(x)) == pytest.approx((n * v3**2 - 1) / (n - 1), abs=1e-10)
    assert float(metrics.resultant_deficit(x)) == pytest.approx(1.0 - v3, abs=1e-12)
    # Equally spaced azimuths: Σ e^{iφ_k} = 0 up to round-off.
    assert float(metrics.azimuth_uniformity(x)) == pytest.approx(0.0, abs=1e-12)
    # XᵀX = diag(n r²/2, n r²/2, n v3²) with v3² < r²/2, so n̂ = e3 and planarity = |v3|.
    assert float(metrics.planarity(x)) == pytest.approx(v3, abs=1e-12)


def test_azimuth_uniformity_about_another_axis():
    rng = np.random.default_rng(5)
    rot = haar_orthogonal(rng, 3)
    x = latitude_circle(16, -0.5) @ rot.T
    # The circle rotated with its axis: still equally spaced about the rotated axis.
    assert float(metrics.azimuth_uniformity(x, axis=rot[:, 2])) == pytest.approx(0.0, abs=1e-12)
    # All azimuths equal (a Dirac off the axis) gives 1.
    assert float(metrics.azimuth_uniformity(dirac())) == pytest.approx(1.0, abs=1e-14)


def test_azimuth_point_on_axis_counts_as_zero_azimuth():
    x = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])
    # atan2(0, 0) convention: the pole has φ = 0, the other point φ = π: they cancel.
    assert float(metrics.azimuth_uniformity(x)) == pytest.approx(0.0, abs=1e-15)


# --------------------------------------------------------------------------- clusters


def test_exact_clusters_with_unequal_masses():
    x, ids = clusters()
    p = CLUSTER_SIZES / CLUSTER_SIZES.sum()
    assert metrics.n_clusters(x) == len(CLUSTER_SIZES)
    # Participation number 1/Σ p_k²: the same arithmetic on the same counts.
    assert metrics.n_eff(x) == pytest.approx(1.0 / np.sum(p**2), rel=1e-12)
    # Each group is an exact Dirac: conditional spread 0 to round-off, for any labelling.
    assert float(metrics.conditional_spread(x, ids)) == pytest.approx(0.0, abs=1e-15)
    assert float(metrics.conditional_spread(x, 10 * ids - 7)) == pytest.approx(0.0, abs=1e-15)
    assert float(metrics.conditional_spread(x, ids, num_groups=6)) == pytest.approx(0.0, abs=1e-15)
    # The marginal is spread: 1 − |m| well above 0.
    assert float(metrics.marginal_spread(x)) > 0.3


def test_cluster_labels_first_appearance_order_and_partition():
    x, ids = clusters()
    labels = metrics.cluster_labels(x)
    assert labels[0] == 0
    assert set(np.unique(labels)) == set(range(len(CLUSTER_SIZES)))
    # Same partition as the construction: labels are a bijective relabelling of ids.
    assert len(set(zip(labels.tolist(), ids.tolist(), strict=True))) == len(CLUSTER_SIZES)


def test_cluster_threshold_and_chaining():
    def arc(angles):
        return np.stack([np.cos(angles), np.sin(angles), np.zeros_like(angles)], axis=1)

    # Two points 0.05 rad apart merge at θ_c = 0.1; 0.15 rad apart do not.
    assert metrics.n_clusters(arc(np.array([0.0, 0.05]))) == 1
    assert metrics.n_clusters(arc(np.array([0.0, 0.15]))) == 2
    # Single linkage: a chain with 0.05 rad steps over 1 rad is one component.
    assert metrics.n_clusters(arc(np.arange(21) * 0.05)) == 1
    assert metrics.n_clusters(arc(np.array([0.0, 0.15])), theta_c=0.2) == 1


def test_cluster_labels_blocked_equals_dense():
    rng = np.random.default_rng(11)
    centres = unit_rows(rng, (6, 3))
    x = centres[rng.integers(0, 6, size=50)]
    x = x + 0.01 * rng.normal(size=x.shape)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    dense = metrics.cluster_labels(x, theta_c=0.2)
    for block_size in (1, 3, 7, 50):
        np.testing.assert_array_equal(metrics.cluster_labels(x, theta_c=0.2, block_size=block_size), dense)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.floats(0.0, 0.2), st.integers(0, 2**32 - 1))
def test_components_are_scipy_s_connected_components(size, density, seed):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(seed)
    a, b = np.nonzero(rng.random((size, size)) < density)
    labels = metrics._components(size, a, b)
    count, theirs = connected_components(
        coo_matrix((np.ones(a.size), (a, b)), shape=(size, size)), directed=False
    )
    # the same partition, each vertex labelled by the smallest vertex of its component
    assert np.unique(labels).size == count == np.unique(np.stack([labels, theirs]), axis=1).shape[1]
    np.testing.assert_array_equal(labels, [np.flatnonzero(theirs == c).min() for c in theirs])


def test_components_of_a_shuffled_path_are_one():
    order = np.random.default_rng(5).permutation(100_000)
    labels = metrics._components(order.size, order[:-1], order[1:])
    assert np.all(labels == 0)


def test_cluster_counts_equal_the_count_of_each_state():
    rng = np.random.default_rng(12)
    states = []
    for k in range(1, 9):  # k clusters of noisy points, then a spread state and a chained arc
        centres = unit_rows(rng, (k, 3))
        x = centres[np.arange(40) % k] + 0.01 * rng.normal(size=(40, 3))
        states.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    states.append(unit_rows(rng, (40, 3)))
    angles = np.arange(40) * 0.05
    states.append(np.stack([np.cos(angles), np.sin(angles), np.zeros(40)], axis=1))
    xs = np.stack(states)
    expected = [metrics.n_clusters(x, theta_c=0.2) for x in xs]
    np.testing.assert_array_equal(metrics.cluster_counts(xs, theta_c=0.2), expected)
    assert expected[-1] == 1 and expected[-2] > 8  # chaining and a spread state are in the set
    with pytest.raises(ValueError, match=r"^cluster_counts: `xs` must be a \(T, n, d\) array of states"):
        metrics.cluster_counts(xs[0])


def test_conditional_spread_closed_form():
    # Group 0: an antipodal pair (|m_0| = 0); group 1: a Dirac of 2; group 2: a latitude circle.
    circle = latitude_circle(4, 0.6)
    x = np.concatenate([[[1.0, 0, 0], [-1.0, 0, 0]], dirac(2), circle])
    groups = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    expected = (2 / 8) * 1.0 + (2 / 8) * 0.0 + (4 / 8) * (1.0 - 0.6)
    # Σ_k (n_k/n)(1 − |m_k|), exact up to round-off.
    assert float(metrics.conditional_spread(x, groups)) == pytest.approx(expected, abs=1e-14)
    jitted = jax.jit(partial(metrics.conditional_spread, num_groups=3))
    assert float(jitted(x, groups)) == pytest.approx(expected, abs=1e-14)


# --------------------------------------------------------------------------- great circle


def test_uniform_great_circle():
    n = 40
    x = latitude_circle(n, 0.0, phase=0.1)
    # On a great circle: the least singular direction is the pole, ⟨x_i, e3⟩ = 0 exactly.
    assert float(metrics.planarity(x)) == pytest.approx(0.0, abs=1e-14)
    # Equally spaced azimuths and zero mean, up to round-off in Σ cos.
    assert float(metrics.azimuth_uniformity(x)) == pytest.approx(0.0, abs=1e-12)
    assert float(metrics.resultant_deficit(x)) == pytest.approx(1.0, abs=1e-12)
    assert float(metrics.min_cosine(x)) == pytest.approx(-1.0, abs=1e-14)  # n even: antipodes


def test_tilted_great_circle_in_higher_dimension():
    rng = np.random.default_rng(2)
    rot = haar_orthogonal(rng, 5)
    circle = np.zeros((12, 5))
    circle[:, :2] = latitude_circle(12, 0.0)[:, :2]
    # In d = 5 the circle spans a 2-plane, so it lies in a hyperplane: planarity 0 to round-off.
    assert float(metrics.planarity(circle @ rot.T)) == pytest.approx(0.0, abs=1e-13)
    # Three orthonormal points are as far from planar as possible: max |⟨e_k, n̂⟩| ≥ 1/√3.
    assert float(metrics.planarity(np.eye(3))) >= 1 / np.sqrt(3) - 1e-12


def test_min_cosine_blocked_equals_dense():
    x = unit_rows(np.random.default_rng(4), (37, 3))
    dense = float(metrics.min_cosine(x))
    # Blocked evaluation sees the same entries: identical minimum.
    for block_size in (1, 5, 36):
        assert float(metrics.min_cosine(x, block_size=block_size)) == dense


# --------------------------------------------------------------------------- orbits


def test_orbit_residual_zero_on_an_orbit():
    rng = np.random.default_rng(7)
    n, d = 20, 4
    q = np.stack([haar_orthogonal(rng, d) for _ in range(n)])
    v = unit_rows(rng, (d,))
    x = np.einsum("nji,j->ni", q, v)  # x_i = Q_iᵀ v
    # u_i = v for all i, so u* = v and every x_i is on the orbit: round-off only.
    np.testing.assert_allclose(metrics.orbit_base_point(x, q), v, atol=1e-14)
    assert float(metrics.orbit_residual(x, q)) == pytest.approx(0.0, abs=1e-14)
    # Gauge frame is a Dirac while the content is spread.
    summary = metrics.snapshot_summary(x, q=q)
    assert summary["gauge_mean_cosine"] == pytest.approx(1.0, abs=1e-14)
    assert summary["mean_cosine"] < 0.9

    x_bad = x.copy()
    x_bad[0] = -x_bad[0]  # one token sent to the antipode of its orbit point
    # |x_0 − Q_0ᵀ u*| is close to 2 (u* moves only O(1/n)).
    assert float(metrics.orbit_residual(x_bad, q)) > 0.1


def test_orbit_residual_is_jittable_and_vmappable():
    rng = np.random.default_rng(8)
    q = np.stack([haar_orthogonal(rng, 3) for _ in range(6)])
    xs = unit_rows(rng, (4, 6, 3))
    loop = [float(metrics.orbit_residual(xk, q)) for xk in xs]
    vmapped = jax.jit(jax.vmap(metrics.orbit_residual, in_axes=(0, None)))(xs, q)
    # Same arithmetic under vmap/jit: agreement to round-off.
    np.testing.assert_allclose(vmapped, loop, rtol=1e-13)


# --------------------------------------------------------------------------- time series


def test_collapse_time_synthetic():
    ts = np.linspace(0.0, 10.0, 101)
    values = 1.0 - np.exp(-ts)
    # 1 − e^{−t} ≥ 0.999 ⟺ t ≥ ln 1000 ≈ 6.908: first grid point is t = 7.0 (6.9 falls short).
    assert metrics.collapse_time(ts, values) == pytest.approx(7.0, abs=1e-12)
    assert metrics.collapse_time(ts, values, threshold=0.5) == pytest.approx(0.7, abs=1e-12)
    assert metrics.collapse_time(ts, values, threshold=1.5) is None
    assert metrics.collapse_time(ts, np.full(101, np.nan)) is None


def test_monotonicity():
    assert metrics.is_monotone([0.0, 1.0, 1.0, 2.0], tol=0.0)
    drop = [0.0, 1.0, 1.0 - 1e-12, 2.0]
    # The only decrease is the 1e-12 step (exact to a few ulps of 1.0).
    assert metrics.max_decrease(drop) == pytest.approx(1e-12, abs=1e-15)
    assert metrics.is_monotone(drop, tol=1e-10)
    assert not metrics.is_monotone(drop, tol=0.0)
    assert metrics.max_decrease([3.0]) == 0.0
    assert not metrics.is_monotone([0.0, np.nan, 1.0], tol=1.0)
    assert not metrics.is_monotone([np.nan], tol=1.0)  # a run stopped at a NaN first snapshot
    assert np.isnan(metrics.max_decrease([np.nan])) and metrics.max_decrease([2.0]) == 0.0


def test_series_equals_python_loop():
    xs = unit_rows(np.random.default_rng(9), (5, 10, 3))
    for fn in (metrics.mean_cosine, metrics.min_cosine, metrics.planarity):
        loop = np.array([float(fn(xk)) for xk in xs])
        # vmap and lax.map evaluate the same per-snapshot arithmetic: round-off only.
        np.testing.assert_allclose(metrics.series(xs, fn), loop, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(metrics.series(xs, fn, batch_size=2), loop, rtol=1e-13, atol=1e-15)
    counts = metrics.series(xs, metrics.n_clusters, traceable=False)
    assert counts.shape == (5,)
    assert np.array_equal(np.asarray(counts), [metrics.n_clusters(xk) for xk in xs])


# --------------------------------------------------------------------------- distances


@pytest.mark.parametrize("n", [1, 10, 256])
def test_circular_ks_midpoints_against_uniform(n):
    angles = TWO_PI * (np.arange(n) + 0.5) / n
    uniform = lambda t: t / TWO_PI  # noqa: E731
    # midpoints are within KS distance exactly 1/(2n) of the uniform law.
    assert metrics.circular_ks(angles, uniform) == pytest.approx(1 / (2 * n), abs=1e-14)
    # Angles are reduced mod 2π, so whole turns do not matter.
    shifted = angles + TWO_PI * np.random.default_rng(n).integers(-3, 4, size=n)
    assert metrics.circular_ks(shifted, uniform) == pytest.approx(1 / (2 * n), abs=1e-13)


def test_circular_ks_atom():
    # All mass at 0: F_n jumps to 1 at θ = 0 where F(0) = 0.
    assert metrics.circular_ks(np.zeros(5), lambda t: t / TWO_PI) == 1.0


class StepCDF:
    """The uniform law on [0, 2π) with an atom of mass ``mass`` at ``atom``, as a CDF with a
    ``ks_tolerance`` (the protocol of attnflow.analysis.laws.AngleCDF)."""

    def __init__(self, atom, mass, ks_tolerance):
        self.atom, self.mass, self.ks_tolerance = atom, mass, ks_tolerance

    def __call__(self, t):
        t = np.asarray(t, dtype=float)
        return (1.0 - self.mass) * t / TWO_PI + self.mass * (t >= self.atom)


@pytest.mark.parametrize("atom", [0.0, 2.0])
def test_circular_ks_reads_atoms_to_the_tolerance(atom):
    n, delta = 64, 32 * np.spacing(TWO_PI)
    law = StepCDF(atom, 0.5, delta)
    # The law's midpoint quantiles: 32 angles on the atom, the others below and above it.
    u, start = (np.arange(n) + 0.5) / n, 0.5 * atom / TWO_PI  # F(atom−)
    quantiles = np.where(u < start, u * 2 * TWO_PI, np.where(u <= start + 0.5, atom, (u - 0.5) * 2 * TWO_PI))
    assert np.sum(quantiles == atom) == 32
    # 1/(2n) exactly, less the rise of F over δ.
    assert metrics.circular_ks(quantiles, law) == pytest.approx(1 / (2 * n), abs=1e-13)
    assert metrics.circular_ks(quantiles, law) <= 1 / (2 * n)
    # Round-off of a few ulps either side of the atom (below 0: just under 2π): still 1/(2n) at most,
    noisy = quantiles + np.random.default_rng(0).integers(-5, 6, size=n) * np.spacing(TWO_PI)
    assert metrics.circular_ks(noisy, law) <= 1 / (2 * n)
    # while the exact formula (tolerance 0) counts the whole jump against the angles below it,
    assert metrics.circular_ks(noisy, law, tolerance=0.0) > 0.2
    # and angles 0.1 off fail, with or without the tolerance.
    for shift in (0.1, -0.1):
        assert metrics.circular_ks(quantiles + shift, law) > 0.2


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.integers(min_value=0, max_value=2**32 - 1))
def test_circular_ks_tolerance_is_at_most_the_distance_of_nearby_angles(m, seed):
    """Angles within δ' < δ of the midpoint quantiles of a law with ties measure at most 1/(2n),
    and D_δ <= D (tolerance 0) for any angles."""
    from attnflow.analysis import laws

    rng = np.random.default_rng(seed)
    values = rng.choice(np.round(rng.uniform(0.0, TWO_PI, size=4), 1), size=m)
    law = laws.EmpiricalAngleLaw(values)
    n = int(rng.integers(1, 3 * m + 1))
    quantiles = law.ppf((np.arange(n) + 0.5) / n)
    delta = law.cdf.ks_tolerance
    noisy = quantiles + rng.uniform(-0.9, 0.9, size=n) * delta
    assert metrics.circular_ks(noisy, law.cdf) <= 1 / (2 * n) + 1e-14
    angles = rng.uniform(0.0, TWO_PI, size=n)
    assert metrics.circular_ks(angles, law.cdf) <= metrics.circular_ks(angles, law.cdf, tolerance=0.0)


def test_circular_ks_tolerance_zero_is_the_exact_formula():
    angles = np.random.default_rng(3).uniform(-7.0, 7.0, size=101)
    cdf = lambda t: (t / TWO_PI) ** 2  # noqa: E731
    theta, k = np.sort(np.mod(angles, TWO_PI)), np.arange(1, 102)
    exact = float(np.max(np.maximum(k / 101 - cdf(theta), cdf(theta) - (k - 1) / 101)))
    # No ks_tolerance on the callable: tolerance 0, the formula bit for bit.
    assert metrics.circular_ks(angles, cdf) == metrics.circular_ks(angles, cdf, tolerance=0.0) == exact
    with pytest.raises(ValueError, match="`tolerance` must be in"):
        metrics.circular_ks(angles, cdf, tolerance=-1e-14)


def test_wasserstein_permutation_and_rotation():
    n, a = 12, 0.1
    x = latitude_circle(n, 0.0, phase=0.3)
    perm = np.random.default_rng(1).permutation(n)
    # Same cloud, reordered: the assignment finds the identity matching, cost exactly 0.
    assert metrics.wasserstein_sphere(x, x[perm]) == 0.0
    rotated = latitude_circle(n, 0.0, phase=0.3 + a)
    # a < π/n: the optimal matching moves every point by a along the equator.
    assert metrics.wasserstein_sphere(x, rotated[perm]) == pytest.approx(a, abs=1e-14)
    # Index-matched chord length 2 sin(a/2).
    assert float(metrics.max_pointwise_distance(x, rotated)) == pytest.approx(2 * np.sin(a / 2), abs=1e-14)


def test_wasserstein_antipodes():
    x = np.array([[0.0, 0.0, 1.0]])
    # The atan2 form stays exact at π, where arccos would be ill-conditioned.
    assert metrics.wasserstein_sphere(x, -x) == pytest.approx(np.pi, abs=1e-15)


# --------------------------------------------------------------------------- summary


def test_snapshot_summary_without_gauge():
    x, ids = clusters()
    summary = metrics.snapshot_summary(x)
    assert set(summary) == {
        "mean_cosine",
        "resultant_deficit",
        "min_cosine",
        "n_clusters",
        "n_eff",
        "gauge_mean_cosine",
        "gauge_resultant_deficit",
        "orbit_residual",
        "conditional_spread",
        "marginal_spread",
        "azimuth_uniformity",
        "planarity",
    }
    json.dumps(summary, allow_nan=False)  # JSON-ready: plain values, no NaN
    assert all(v is None or type(v) in (int, float) for v in summary.values())
    # With no gauge, Q = I: the gauge frame is the content frame.
    assert summary["gauge_mean_cosine"] == summary["mean_cosine"]
    assert summary["gauge_resultant_deficit"] == summary["resultant_deficit"]
    assert summary["conditional_spread"] is None
    assert summary["n_clusters"] == 4
    assert type(summary["n_clusters"]) is int
    with_groups = metrics.snapshot_summary(x, groups=ids)
    assert with_groups["conditional_spread"] == pytest.approx(0.0, abs=1e-15)


def test_snapshot_summary_undefined_values_are_none():
    # d = 4: no azimuth; an antipodal pair: the mean vanishes, so u* (and orbit_residual) is NaN.
    x = np.array([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]])
    summary = metrics.snapshot_summary(x)
    assert summary["azimuth_uniformity"] is None
    assert summary["orbit_residual"] is None
    assert summary["mean_cosine"] == pytest.approx(-1.0, abs=1e-15)


# --------------------------------------------------------------------------- properties


SHAPES = [(5, 3), (8, 3), (6, 4)]


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**32 - 1), clustered=st.booleans())
def test_permutation_invariance(shape, seed, clustered):
    rng = np.random.default_rng(seed)
    x = unit_rows(rng, shape)
    if clustered:  # exercise n_eff on a non-trivial partition
        x = x[rng.integers(0, 3, size=shape[0])]
    perm = rng.permutation(shape[0])
    # Symmetric functions of the empirical law: equal up to summation-order round-off.
    assert float(metrics.mean_cosine(x[perm])) == pytest.approx(float(metrics.mean_cosine(x)), abs=1e-13)
    assert float(metrics.min_cosine(x[perm])) == float(metrics.min_cosine(x))
    assert metrics.n_eff(x[perm]) == pytest.approx(metrics.n_eff(x), rel=1e-14)


# --------------------------------------------------------------------------- errors


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match=r"mean_cosine: `x` must be an \(n, d\) array"):
        metrics.mean_cosine(np.ones(3))
    with pytest.raises(ValueError, match="`theta_c` must be an angle in"):
        metrics.n_clusters(dirac(), theta_c=-0.1)
    with pytest.raises(ValueError, match=r"`x` must be points of S\^2"):
        metrics.azimuth_uniformity(np.eye(4))
    with pytest.raises(ValueError, match="`axis` must be a non-zero finite 3-vector"):
        metrics.azimuth_uniformity(dirac(), axis=(0, 0, 0))
    with pytest.raises(ValueError, match="`q` must have shape"):
        metrics.orbit_residual(dirac(4), np.eye(3))
    with pytest.raises(ValueError, match="`groups` must be a 1-d array of n = 7"):
        metrics.conditional_spread(dirac(), np.zeros(6, dtype=int))
    with pytest.raises(ValueError, match="`groups` must hold integer labels"):
        metrics.conditional_spread(dirac(), np.zeros(7))
    with pytest.raises(ValueError, match="`b` must have the shape of `a`"):
        metrics.wasserstein_sphere(dirac(3), dirac(4))
    with pytest.raises(ValueError, match="`values` must have the length of `ts`"):
        metrics.collapse_time(np.arange(3.0), np.arange(4.0))
    with pytest.raises(ValueError, match="`tol` must be a non-negative float"):
        metrics.is_monotone([1.0, 2.0], tol=-1.0)
    with pytest.raises(ValueError, match=r"`xs` must be a \(T, n, d\) stack"):
        metrics.series(dirac(), metrics.mean_cosine)
    with pytest.raises(ValueError, match="`target_cdf` must map"):
        metrics.circular_ks(np.zeros(3), lambda t: 0.5)


def test_jit_of_jax_maps():
    x = jnp.asarray(latitude_circle(16, 0.2))
    for fn in (
        metrics.mean_cosine,
        metrics.resultant_deficit,
        metrics.min_cosine,
        metrics.azimuth_uniformity,
        metrics.planarity,
    ):
        # jit compiles the same arithmetic: round-off agreement.
        assert float(jax.jit(fn)(x)) == pytest.approx(float(fn(x)), abs=1e-14)


def test_snapshot_summary_can_skip_the_pairwise_keys():
    x = np.tile(np.array([[0.0, 0.0, 1.0]]), (5, 1))
    full = metrics.snapshot_summary(x)
    cheap = metrics.snapshot_summary(x, pairwise=False)
    assert (full["n_clusters"], full["n_eff"], full["min_cosine"]) == (1, 1.0, 1.0)  # a Dirac
    assert (cheap["n_clusters"], cheap["n_eff"], cheap["min_cosine"]) == (None, None, None)
    others = {k: v for k, v in full.items() if k not in ("n_clusters", "n_eff", "min_cosine")}
    assert {k: cheap[k] for k in others} == others  # the O(n) keys are unchanged


def test_numpy_input_is_computed_in_numpy_with_the_jax_formulas():
    rng = np.random.default_rng(21)
    x = rng.normal(size=(40, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = np.stack([haar_orthogonal(rng, 3) for _ in range(40)])
    groups = np.arange(40) % 3
    for name, call in {
        "mean_cosine": lambda y: metrics.mean_cosine(y),
        "resultant_deficit": lambda y: metrics.resultant_deficit(y),
        "marginal_spread": lambda y: metrics.marginal_spread(y),
        "orbit_base_point": lambda y: metrics.orbit_base_point(y, q),
        "orbit_residual": lambda y: metrics.orbit_residual(y, q),
        "azimuth_uniformity": lambda y: metrics.azimuth_uniformity(y, axis=(1.0, 2.0, 0.5)),
        "planarity": lambda y: metrics.planarity(y),
    }.items():
        in_numpy, in_jax = call(x), call(jnp.asarray(x))
        assert not isinstance(in_numpy, jax.Array), name  # nothing compiled for a NumPy snapshot
        assert isinstance(in_jax, jax.Array), name
        # the same formula in two libraries: round-off only
        np.testing.assert_allclose(in_numpy, in_jax, rtol=1e-12, atol=1e-14, err_msg=name)
    summary = metrics.snapshot_summary(x, q=q, groups=groups)
    jax_values = {
        "min_cosine": metrics.min_cosine(jnp.asarray(x)),
        "gauge_mean_cosine": metrics.mean_cosine(jnp.einsum("nij,nj->ni", q, x)),
        "orbit_residual": metrics.orbit_residual(jnp.asarray(x), q),
        "conditional_spread": metrics.conditional_spread(jnp.asarray(x), groups),
        "azimuth_uniformity": metrics.azimuth_uniformity(jnp.asarray(x)),
        "planarity": metrics.planarity(jnp.asarray(x)),
    }
    for key, value in jax_values.items():
        assert summary[key] == pytest.approx(float(value), rel=1e-12, abs=1e-14), key
