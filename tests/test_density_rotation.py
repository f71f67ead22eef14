"""Rotations of a law on S^2 in harmonics (numerics.density_rotation): the coefficients of ``g ∘ Q``
against ``g`` evaluated at ``Q x`` directly (scipy's harmonics), for rotations and reflections, and
RoPE's turn about the third axis as phases."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

from attnflow.core import gauges
from attnflow.numerics.density_rotation import rotate_coefficients, wigner_blocks

LMAX = 7


def _evaluate(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Σ_l a_l0 Y_l0 + 2 Re Σ_{m>0} a_lm Y_lm`` at points ``x (k, 3)`` (one label's real function)."""
    theta, phi = np.arccos(np.clip(x[:, 2], -1.0, 1.0)), np.arctan2(x[:, 1], x[:, 0])
    total = np.zeros(x.shape[0])
    for degree in range(a.shape[0]):
        for m in range(degree + 1):
            y = scipy.special.sph_harm_y(degree, m, theta, phi)
            total += (1.0 if m == 0 else 2.0) * (a[degree, m] * y).real
    return total


def _random_coefficients(rng, count: int) -> np.ndarray:
    shape = (count, LMAX + 1, LMAX + 1)
    a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    a[:, :, 0] = a[:, :, 0].real  # a real function: a_l0 real
    return np.tril(a)  # zero for m > l


def test_the_coefficients_of_g_after_q_are_g_at_q_x():
    rng = np.random.default_rng(3)
    q = gauges.haar_orthogonal(5, 4, 3)  # Haar draws on O(3): rotations and reflections
    assert {int(round(d)) for d in np.linalg.det(q)} == {-1, 1}
    a = _random_coefficients(rng, q.shape[0])
    rotated = np.asarray(rotate_coefficients(a, wigner_blocks(q, LMAX)))
    x = rng.standard_normal((40, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for label in range(q.shape[0]):
        direct = _evaluate(a[label], x @ q[label].T)  # g(Q x)
        # expm of the generators and the products: round-off on coefficients of size ~1
        np.testing.assert_allclose(_evaluate(rotated[label], x), direct, atol=1e-12)
    # the transpose (a wrong frame) is another function
    wrong = np.asarray(rotate_coefficients(a, wigner_blocks(np.transpose(q, (0, 2, 1)), LMAX)))
    assert np.max(np.abs(_evaluate(wrong[0], x) - _evaluate(a[0], x @ q[0].T))) > 1e-2


def test_a_turn_about_the_third_axis_is_a_phase_per_order():
    alpha = np.array([0.3, -2.0])
    q = gauges.make_rope(alpha, 3, [1.0]).matrices()  # RoPE's pair (x, y) turned by alpha
    a = _random_coefficients(np.random.default_rng(0), 2)
    rotated = np.asarray(rotate_coefficients(a, wigner_blocks(np.asarray(q), LMAX)))
    phase = np.exp(1j * np.arange(LMAX + 1)[None, None, :] * alpha[:, None, None])
    np.testing.assert_allclose(rotated, phase * a, atol=1e-13)


def test_matrices_that_are_not_orthogonal_or_not_3_by_3_are_refused():
    with pytest.raises(ValueError, match="orthogonal"):
        wigner_blocks(np.ones((1, 3, 3)), 2)
    with pytest.raises(ValueError, match="3 × 3"):
        wigner_blocks(np.eye(2)[None], 2)
