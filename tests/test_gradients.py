"""Differentiable simulation: ``jax.grad`` through a fixed-step solve (``integrate``, a ``lax.scan``)
and an adaptive one (``integrate_adaptive``, a bounded loop of trial steps) with respect to beta
(the profile made the documented way, ``make_profile``), the initial state and the RoPE gauge's
angles, each checked against central finite differences of the same solve; the two gradients agree
with each other to the solves' accuracy (both approximate the ODE's sensitivity)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import gauges
from attnflow.core.factors import NoFactor
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics.differentiable import MAX_TRIALS, integrate_adaptive
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4, Adaptive
from attnflow.numerics.solve import integrate, solve
from attnflow.numerics.steps import AdaptiveSteps
from helpers_core import uniform

N, D, DT, STEPS, BETA = 10, 3, 0.05, 20, 1.5
T_END = DT * STEPS
XI = np.arange(N) / N
ADAPTIVE = AdaptiveSteps(rtol=1e-8, atol=1e-10, dt0=DT, max_steps=32)  # the run takes 13 trials


def _field(beta, angles):
    return make_vector_field(
        Kernel(gauges.RoPE(angles=angles, d=D), NoFactor(N), make_profile("exp", beta=beta))
    )


def _fixed(field, x0):
    return integrate(field, x0, integrator=RK4(), dt=DT, steps=STEPS)


def _adaptive(field, x0, integrator=None):
    return integrate_adaptive(field, x0, t_end=T_END, stepsize=ADAPTIVE, integrator=integrator)


SOLVES = {"fixed": _fixed, "adaptive": _adaptive}


def _final_energy(beta, x0, angles, *, solver):
    field = _field(beta, angles)
    return field.energy(SOLVES[solver](field, x0))


def _tangent(x, v):
    """``v`` projected onto the tangent spaces of the sphere at the rows of ``x``."""
    return v - jnp.sum(v * x, axis=-1, keepdims=True) * x


def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.fixture(scope="module")
def point():
    return BETA, uniform(N, D, seed=5), jnp.asarray(np.outer(XI, [2 * np.pi]))


@pytest.fixture(scope="module")
def gradients(point):
    """Per solve: the gradient with respect to (beta, x0, angles) at ``point`` and the final energy,
    both from one compiled ``value_and_grad`` (one compilation per solve)."""
    out = {}
    for solver in SOLVES:
        both = jax.jit(jax.value_and_grad(partial(_final_energy, solver=solver), argnums=(0, 1, 2)))
        out[solver] = (both(*point)[1], lambda *args, f=both: f(*args)[0])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("solver", list(SOLVES))
def test_grad_of_the_final_energy_matches_finite_differences(gradients, point, solver):
    beta, x0, angles = point
    (g_beta, g_x0, g_angles), energy = gradients[solver]
    # beta: central differences, step 1e-5 (error O(h^2) ~ 1e-10 against round-off ~ 1e-11 / h)
    fd_beta = _central(lambda b: energy(b, x0, angles), beta, 1e-5)
    np.testing.assert_allclose(float(g_beta), float(fd_beta), rtol=1e-6)
    # directional derivatives along fixed random directions, for x0 tangent to the sphere: a start
    # off the sphere is no state of the model, and the adaptive solve's first error estimate sees
    # its radial part (its finite differences then move by 2 % between steps 1e-5 and 1e-7)
    rng = np.random.default_rng(0)
    for grad, at, wrap in ((g_x0, x0, lambda p: energy(beta, p, angles)),
                           (g_angles, angles, lambda a: energy(beta, x0, a))):  # fmt: skip
        direction = jnp.asarray(rng.standard_normal(at.shape))
        if at is x0:
            direction = _tangent(x0, direction)
        fd = _central(lambda t, p=at, u=direction, f=wrap: f(p + t * u), 0.0, 1e-6)
        np.testing.assert_allclose(float(jnp.vdot(grad, direction)), float(fd), rtol=1e-5, atol=1e-12)
    assert abs(float(g_beta)) > 1e-4  # the check is not vacuous: beta moves the final energy


@pytest.mark.slow
def test_the_two_solves_give_the_same_sensitivity(gradients, point):
    x0 = point[1]
    (fixed, _), (adaptive, _) = gradients["fixed"], gradients["adaptive"]
    # both approximate d E(x(1)) / d(beta, x0, angles) of the ODE (x0 along the sphere: the radial
    # part is each solver's handling of a start off it): RK4 at dt = 0.05 to about 1e-7 (its energy
    # moves by 3e-8 at dt = 0.025), the adaptive solve to its tolerance 1e-8
    fixed, adaptive = [(g[0], _tangent(x0, g[1]), g[2]) for g in (fixed, adaptive)]
    for a, b in zip(fixed, adaptive, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-8)


@pytest.mark.slow
def test_the_adaptive_integrate_is_the_adaptive_solve(point):
    beta, x0, angles = point
    field = _field(beta, angles)
    steps = AdaptiveSteps(rtol=ADAPTIVE.rtol, atol=ADAPTIVE.atol, dt0=DT)
    traj = solve(field, x0, integrator=Adaptive(), t_end=T_END, save_every=T_END, stepsize=steps, workers=1)
    assert int(traj.accepted + traj.rejected) <= ADAPTIVE.max_steps
    # the same trial steps, controller and dense output: equal to round-off (a few ulps)
    np.testing.assert_allclose(np.asarray(_adaptive(field, x0)), traj.xs[-1], rtol=0, atol=1e-14)
    # too few trials to reach t_end: NaN, never a state short of t_end
    short = integrate_adaptive(field, x0, t_end=T_END, stepsize=AdaptiveSteps(dt0=DT, max_steps=3))
    assert np.isnan(np.asarray(short)).all()


class _FrozenSlope(Adaptive):
    """A wrong differentiable solve: the slope carried from the last step treated as a constant."""

    def fsal_step(self, field, x, k1, dt, **options):
        return super().fsal_step(field, x, jax.lax.stop_gradient(k1), dt, **options)


@pytest.mark.slow
def test_the_finite_difference_check_catches_a_gradient_that_drops_a_dependence(gradients, point):
    beta, x0, angles = point
    energy = gradients["adaptive"][1]
    fd_beta = float(_central(lambda b: energy(b, x0, angles), beta, 1e-5))

    def wrong(b):
        field = _field(b, angles)
        return field.energy(_adaptive(field, x0, integrator=_FrozenSlope()))

    value, slope = jax.jit(jax.value_and_grad(wrong))(beta)
    assert float(value) == pytest.approx(float(energy(beta, x0, angles)), abs=1e-15)  # same values
    assert abs(float(slope) - fd_beta) > 1e-3 * abs(fd_beta)  # a wrong derivative, which it sees


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stepsize": AdaptiveSteps()}, r"`stepsize.max_steps` must be at most 100000 .*; got 1000000\."),
        ({"stepsize": ADAPTIVE, "integrator": RK4()}, r"`integrator` must have an embedded error estimate"),
    ],
)
def test_integrate_adaptive_refuses_what_it_cannot_do(point, kwargs, match):
    beta, x0, angles = point
    assert MAX_TRIALS == 100_000
    with pytest.raises(ValueError, match=match):
        integrate_adaptive(_field(beta, angles), x0, t_end=T_END, **kwargs)


def test_integrate_adaptive_names_an_x0_of_another_shape(point):
    beta, _, angles = point
    match = r"integrate_adaptive: `x0` must have shape \(n, d\) with \(n, d\) = \(10, 3\), the kernel's; got"
    with pytest.raises(ValueError, match=match):
        integrate_adaptive(_field(beta, angles), jnp.ones((N, D + 1)), t_end=T_END, stepsize=ADAPTIVE)


def test_make_profile_keeps_a_traced_beta_traced():
    def c_of(beta):
        return make_profile("exp", beta=beta, time_scale="rescaled").c

    np.testing.assert_allclose(float(jax.grad(c_of)(2.0)), -np.exp(-2.0), rtol=1e-14)
    assert float(make_profile("exp", beta=2.0, time_scale="rescaled").c) == float(jnp.exp(-2.0))
