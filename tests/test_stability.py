"""Linear instability of the uniform state on the circle: closed form vs the simulated field.

The reference rates are written here from the formula ``c k² I_k(β)/β`` (scipy.special.iv), and
checked against dynamics.py twice: the exact Jacobian of the vector field (autodiff, any n) and a
particle simulation (n = 4000) with a fitted exponential growth.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import iv

from attnflow.analysis import stability
from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics.dynamics import make_vector_field
from attnflow.workflows import growth


def test_closed_form_rates_and_dominant_mode():
    ks = np.arange(1, 9)
    np.testing.assert_allclose(stability.circle_growth_rate(ks, 5.0), ks**2 * iv(ks, 5.0) / 5.0, rtol=1e-15)
    assert stability.dominant_mode(5.0) == 3  # the paper's dominant mode at β = 5
    assert stability.dominant_mode(1.0) == 1
    # The n-particle rate tends to the mean-field one: aliases I_{n−k}(β) are ~1e-3000 at n = 4000.
    np.testing.assert_allclose(
        stability.circle_growth_rate(ks, 5.0, n=4000), ks**2 * iv(ks, 5.0) / 5.0, rtol=1e-13
    )
    # c scales the time: rescaled profile (c = e^{−β}).
    assert stability.circle_growth_rate(3, 5.0, c=np.exp(-5.0)) == pytest.approx(
        np.exp(-5.0) * 9 * iv(3, 5.0) / 5.0
    )


@pytest.mark.parametrize("time_scale", ["plain", "rescaled"])
def test_jacobian_of_the_field_has_the_predicted_rates(time_scale):
    """The linearised USA field on S^1 at the uniform state, applied to the tangent mode
    ``δx_i = sin(kφ_i) x_i^⊥``, returns ``λ_k(n) δx`` (exact circulant eigenvalue, aliases included)."""
    n, beta = 16, 5.0  # small n: the aliases k + ln matter, so the discrete formula is really tested
    profile = make_profile("exp", beta=beta, time_scale=time_scale)
    kernel = Kernel(gauges.IdentityGauge(n=n, d=2), factors.NoFactor(n=n), profile)
    field = make_vector_field(kernel)
    x = jnp.asarray(stability.uniform_circle(n))
    perp = jnp.stack([-x[:, 1], x[:, 0]], axis=1)
    phi = 2 * np.pi * np.arange(n) / n
    c = float(profile.c)
    for k in range(1, n // 2):
        direction = jnp.asarray(np.sin(k * phi))[:, None] * perp
        _, tangent = jax.jvp(field, (x,), (direction,))
        rate = stability.circle_growth_rate(k, beta, c=c, n=n)
        # Round-off of 16-term sums of numbers up to c e^β.
        np.testing.assert_allclose(
            np.asarray(tangent), rate * np.asarray(direction), atol=1e-11 * c * np.exp(beta)
        )
    # With n = 16 the aliases are visible: k = 7 differs from the mean-field rate by > 1%.
    assert abs(stability.circle_growth_rate(7, beta, n=n) / stability.circle_growth_rate(7, beta) - 1) > 1e-2


@pytest.mark.slow
def test_particle_simulation_growth_rates():
    ks = np.arange(1, 7)
    expected = ks**2 * iv(ks, 5.0) / 5.0  # c = 1: 4.87, 14.0, 18.6, 16.3, 10.8, 5.70
    measured = growth.measure_growth_rates(ks, n=4000, beta=5.0, eps=1e-8, t_end=0.3, dt=0.02)
    # Fit of log-amplitudes over 15 RK4 steps in the linear regime (measured within 2e-4).
    np.testing.assert_allclose(measured, expected, rtol=0.02)
    assert ks[np.argmax(measured)] == 3


def test_mode_amplitudes_read_back_a_displacement():
    n = 64
    phi = 2 * np.pi * np.arange(n) / n
    x = stability.uniform_circle(n, displacement=1e-3 * np.sin(2 * phi) + 2e-3 * np.sin(5 * phi))
    np.testing.assert_allclose(stability.mode_amplitudes(x, [1, 2, 5]), [0.0, 1e-3, 2e-3], atol=1e-14)
    with pytest.raises(ValueError, match="`n` must be >= 2"):
        stability.circle_growth_rate(1, 5.0, n=1)


def test_fit_recovers_known_rates_from_synthetic_snapshots():
    """fit_growth_rates on states built with a_k(t) = a_k(0) e^{λ_k t} exactly (no simulation)."""
    n, ks, rates = 64, np.array([1, 2, 5]), np.array([0.7, -1.3, 2.9])
    phi = 2 * np.pi * np.arange(n) / n
    ts = np.linspace(0.0, 1.0, 11)
    modes = np.sin(np.outer(ks, phi))
    xs = np.stack([stability.uniform_circle(n, displacement=1e-6 * np.exp(rates * t) @ modes) for t in ts])
    # Amplitudes read back to ~1e-16/1e-6 relative: slopes exact to ~1e-9.
    np.testing.assert_allclose(stability.fit_growth_rates(ts, xs, ks), rates, atol=1e-8)
