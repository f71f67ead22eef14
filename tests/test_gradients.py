"""Differentiable simulation: ``jax.grad`` through ``integrate`` (fixed steps, the pure time loop)
with respect to beta (the profile made the documented way, ``make_profile``), the initial state
and the RoPE gauge's angles, each checked against central finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import gauges
from attnflow.core.factors import NoFactor
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4
from attnflow.numerics.solve import integrate
from helpers_core import uniform

N, D, DT, STEPS = 10, 3, 0.05, 20
XI = np.arange(N) / N


def _final_energy(beta, x0, angles):
    kernel = Kernel(gauges.RoPE(angles=angles, d=D), NoFactor(N), make_profile("exp", beta=beta))
    field = make_vector_field(kernel)
    return field.energy(integrate(field, x0, integrator=RK4(), dt=DT, steps=STEPS))


_energy_jit = jax.jit(_final_energy)


def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


def test_grad_of_the_final_energy_matches_finite_differences():
    x0 = uniform(N, D, seed=5)
    angles = jnp.asarray(np.outer(XI, [2 * np.pi]))
    beta = 1.5
    g_beta, g_x0, g_angles = jax.jit(jax.grad(_final_energy, argnums=(0, 1, 2)))(beta, x0, angles)
    # beta: central differences, step 1e-5 (error O(h^2) ~ 1e-10 against round-off ~ 1e-11 / h)
    fd_beta = _central(lambda b: _energy_jit(b, x0, angles), beta, 1e-5)
    np.testing.assert_allclose(float(g_beta), float(fd_beta), rtol=1e-6)
    # directional derivatives along fixed random directions (x0 moved in the ambient space: E is
    # evaluated after the first step's renormalisation, so every direction counts)
    rng = np.random.default_rng(0)
    for grad, point, wrap in ((g_x0, x0, lambda p: _energy_jit(beta, p, angles)),
                              (g_angles, angles, lambda a: _energy_jit(beta, x0, a))):  # fmt: skip
        direction = jnp.asarray(rng.standard_normal(point.shape))
        fd = _central(lambda t, p=point, u=direction, f=wrap: f(p + t * u), 0.0, 1e-6)
        np.testing.assert_allclose(float(jnp.vdot(grad, direction)), float(fd), rtol=1e-5, atol=1e-12)
    assert abs(float(g_beta)) > 1e-4  # the check is not vacuous: beta moves the final energy


def test_make_profile_keeps_a_traced_beta_traced():
    def c_of(beta):
        return make_profile("exp", beta=beta, time_scale="rescaled").c

    np.testing.assert_allclose(float(jax.grad(c_of)(2.0)), -np.exp(-2.0), rtol=1e-14)
    assert float(make_profile("exp", beta=2.0, time_scale="rescaled").c) == float(jnp.exp(-2.0))
