"""The split features of ``attnflow.numerics.polynomial_features`` (powers of the first coordinate
times the monomials of the others, the pairs of degree above L weighted 0): the same polynomial of
the logit as the monomial features, the same weights on the same exponents, the monomials in rows
(any number of variables, none included)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.numerics import polynomial_features as pf


@pytest.mark.parametrize("d", (1, 2, 3, 5))
@pytest.mark.parametrize("degree", (0, 1, 4, 9))
def test_split_features_reproduce_the_polynomial_of_the_logit(d, degree):
    rng = np.random.default_rng(10 * d + degree)
    u, v = rng.normal(size=(d, 6)), rng.normal(size=(d, 8))
    u, v = 1.1 * u / np.linalg.norm(u, axis=0), 1.1 * v / np.linalg.norm(v, axis=0)  # stage radius
    c = pf.monomial_coefficients(4.0, degree)
    weights = pf.split_weights(d, degree, c)
    tu, pu = (np.asarray(f) for f in pf.split_features(jnp.asarray(u), degree))
    tv, pv = (np.asarray(f) for f in pf.split_features(jnp.asarray(v), degree))
    assert tu.shape == (pf.rank(d - 1, degree) if d > 1 else 1, 6) and pu.shape == (degree + 1, 6)
    split = np.einsum("ga,gi,ai,gj,aj->ij", weights, tu, pu, tv, pv)
    direct = np.polynomial.polynomial.polyval(u.T @ v, c)
    # Σ_{g,a} W_ga T_g P_a T_g P_a = p(⟨u,v⟩); p is within 5 e^{β(SHELL−1)} = 12 on the shell, so
    # a few hundred ulps of it
    np.testing.assert_allclose(split, direct, rtol=0, atol=1e-13)


@pytest.mark.parametrize("d", (2, 3, 4))
def test_split_weights_are_the_monomial_weights_and_zero_above_the_degree(d):
    degree = 6
    c = pf.monomial_coefficients(2.0, degree)
    grid, weights = pf.split_exponents(d, degree), pf.split_weights(d, degree, c)
    total = grid.sum(axis=2)
    assert np.all(weights[total > degree] == 0.0)
    inside = total <= degree
    assert inside.sum() == pf.rank(d, degree)  # every exponent of degree <= L once
    as_rows = {tuple(a): w for a, w in zip(grid[inside], weights[inside], strict=True)}
    exponents = pf.monomial_exponents(d, degree)
    expected = pf.feature_weights(exponents, c)
    assert all(as_rows[tuple(a)] == w for a, w in zip(exponents, expected, strict=True))


@pytest.mark.parametrize("m", (0, 1, 2, 3, 6))
def test_graded_monomials_are_the_products_of_powers_in_the_order_of_the_exponents(m):
    degree = 5
    rows = np.random.default_rng(m).normal(size=(m, 7))
    exponents = pf.monomial_exponents(m, degree) if m else np.zeros((1, 0), dtype=int)
    got = np.asarray(pf.graded_monomials(jnp.asarray(rows), degree))
    expected = np.prod(rows[None, :, :] ** exponents[:, :, None], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-14)  # products of at most 5 factors
