"""Sphere geometry (attnflow.core.sphere): projections, exponential map and its inverse differential,
geodesic distance, and the initial laws (uniform, cap, equiangular)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import sphere


def _tangent(x, seed):
    return sphere.project(x, jax.random.normal(jax.random.key(seed), x.shape, dtype=x.dtype))


def test_normalize_gives_unit_rows():
    y = jax.random.normal(jax.random.key(0), (16, 5)) * 3.0
    # one rounding per coordinate and one in the norm: a few ulps
    np.testing.assert_allclose(np.linalg.norm(sphere.normalize(y), axis=1), 1.0, rtol=0, atol=1e-15)


def test_project_is_tangent_and_idempotent():
    x = sphere.sample_uniform(jax.random.key(1), 16, 4)
    y = jax.random.normal(jax.random.key(2), (16, 4))
    p = sphere.project(x, y)
    # Gaussian y has entries up to ~4, so ⟨x, y⟩ and its cancellation carry ~10 ulps of |y|
    np.testing.assert_allclose(np.sum(np.asarray(x * p), axis=1), 0.0, rtol=0, atol=1e-14)
    # projecting twice changes only round-off of the same size
    np.testing.assert_allclose(sphere.project(x, p), p, rtol=0, atol=1e-14)


def test_exp_map_is_the_geodesic():
    x = sphere.sample_uniform(jax.random.key(3), 16, 3)
    v = 0.9 * _tangent(x, 4)
    y = sphere.exp_map(x, v)
    # exp_x(v) stays on the sphere up to round-off
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, rtol=0, atol=1e-15)
    # |v| < π on every row, so the geodesic distance to exp_x(v) is |v| (arctan2 form: ~1e-15 accurate)
    np.testing.assert_allclose(sphere.geodesic_distance(x, y), np.linalg.norm(v, axis=1), rtol=0, atol=1e-14)
    # exp_x(0) = x exactly (series-safe sinc at 0)
    np.testing.assert_allclose(sphere.exp_map(x, jnp.zeros_like(x)), x, rtol=0, atol=0)


def test_dexp_inv_inverts_the_differential_of_exp():
    x = sphere.sample_uniform(jax.random.key(5), 16, 4)
    sigma = 1.3 * _tangent(x, 6)
    eta = _tangent(x, 7)
    # w = d(exp_x)_sigma [eta] by forward-mode autodiff of the closed form
    _, w = jax.jvp(lambda s: sphere.exp_map(x, s), (sigma,), (eta,))
    # pulling back recovers eta: O(1) arithmetic with r/sin r ≤ 1.4, round-off ~1e-15
    np.testing.assert_allclose(sphere.dexp_inv(x, sigma, w), eta, rtol=0, atol=1e-13)
    # at sigma = 0 it is the identity (the r > 0 guard and sinc(0) = 1)
    np.testing.assert_allclose(sphere.dexp_inv(x, jnp.zeros_like(x), eta), eta, rtol=0, atol=1e-15)


def test_geodesic_distance_accurate_for_close_and_far_points():
    x = sphere.sample_uniform(jax.random.key(8), 16, 3)
    e = sphere.normalize(_tangent(x, 9))
    close = sphere.exp_map(x, 1e-9 * e)
    # the arctan2 form keeps relative accuracy where arccos would lose ~half the digits
    np.testing.assert_allclose(sphere.geodesic_distance(x, close), 1e-9, rtol=1e-6)
    # antipodal points are at distance π; itself at 0 (clip keeps arccos-free form finite)
    np.testing.assert_allclose(sphere.geodesic_distance(x, -x), np.pi, rtol=0, atol=1e-15)
    np.testing.assert_allclose(sphere.geodesic_distance(x, x), 0.0, rtol=0, atol=1e-15)


def test_samplers_are_on_the_sphere_and_seeded():
    a = sphere.sample_uniform(jax.random.key(10), 64, 3)
    b = sphere.sample_uniform(jax.random.key(10), 64, 3)
    # unit rows to a few ulps
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=0, atol=1e-15)
    # same key, same points: bitwise
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    center = jnp.array([0.0, 0.0, 2.0])  # not unit: the sampler normalises it
    cap = sphere.sample_cap(jax.random.key(11), 64, center, sigma=0.2)
    np.testing.assert_allclose(np.linalg.norm(cap, axis=1), 1.0, rtol=0, atol=1e-15)
    # sigma = 0.2: a point leaves the upper hemisphere only for a 5-sigma Gaussian draw
    assert float(jnp.min(cap[:, 2])) > 0.0


@pytest.mark.parametrize("n, d, rho0", [(8, 8, 0.1), (5, 7, -0.2), (4, 4, 0.9)])
def test_equiangular_gram_matrix(n, d, rho0):
    x = np.asarray(sphere.equiangular(n, d, rho0))
    assert x.shape == (n, d)
    gram = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    # Cholesky of a well-conditioned n ≤ 8 matrix reproduces it to round-off
    np.testing.assert_allclose(x @ x.T, gram, rtol=0, atol=1e-14)
    # embedding: coordinates past n are exactly zero
    np.testing.assert_array_equal(x[:, n:], 0.0)


def test_equiangular_errors():
    with pytest.raises(ValueError, match=r"`d` must be >= n = 8; got 3"):
        sphere.equiangular(8, 3, 0.1)
    with pytest.raises(ValueError, match=r"`rho0` must lie in \(-1/\(n-1\), 1\).*got 1\.0"):
        sphere.equiangular(8, 8, 1.0)
    with pytest.raises(ValueError, match=r"`rho0` must lie in.*got -0\.5"):
        sphere.equiangular(4, 4, -0.5)


def test_equiangular_single_point():
    try:
        x = sphere.equiangular(1, 3, 0.1)
    except ValueError:
        return  # a clear ValueError is an acceptable answer for n = 1
    # one point: the Cholesky factor of [1] is e_1, exactly
    np.testing.assert_array_equal(np.asarray(x), [[1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("center", "direction", "dtype"),
    [
        ([1e-200, 0.0, 0.0], [1.0, 0.0, 0.0], np.float64),  # |c|^2 underflows to 0
        ([1e308, 1e308, 0.0], [1.0, 1.0, 0.0], np.float64),  # |c|^2 overflows to inf
        ([0.0, 0.0, 1e-30], [0.0, 0.0, 1.0], np.float32),
    ],
)
def test_a_cap_about_a_tiny_or_huge_center_is_the_cap_about_its_direction(center, direction, dtype):
    cap = sphere.sample_cap(5, 16, center, sigma=0.2, dtype=dtype)
    np.testing.assert_array_equal(
        np.asarray(cap), np.asarray(sphere.sample_cap(5, 16, direction, sigma=0.2, dtype=dtype))
    )


def test_a_cap_about_no_direction_is_refused():
    with pytest.raises(ValueError, match=r"`center` must be a finite nonzero vector; got \[0.0, 0.0, 0.0\]"):
        sphere.sample_cap(5, 16, [0.0, 0.0, 0.0], sigma=0.2)
