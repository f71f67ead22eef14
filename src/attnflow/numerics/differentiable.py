"""Adaptive solves that ``jax.grad`` can differentiate.

``solve`` and ``AdaptiveSteps`` advance an adaptive run with a ``lax.while_loop``, which JAX
differentiates forwards (``jax.jvp``) but not backwards: ``jax.grad`` through it fails. Fixed steps
have no such loop (``attnflow.numerics.solve.integrate`` is a ``lax.scan``, differentiable as it
is). :func:`integrate_adaptive` is the adaptive counterpart of ``integrate``: the same method
(``Adaptive``: first-same-as-last stages, embedded error, dense output), the same controller
(``PIController.adapt``) and the same acceptance rule as ``AdaptiveSteps``, run as a ``lax.scan``
of exactly ``max_steps`` trial steps (diffrax's bounded loop). Trials after the run has passed
``t_end`` are computed and discarded, so ``max_steps`` is the cost: choose it near what the run
needs (``solve``'s ``Trajectory.accepted + rejected`` counts it). Each trial is rematerialised in
the backward pass (``jax.checkpoint``): memory is ``max_steps`` carried states, not every stage.

What the gradient is: the derivative of the computed map, step sizes included (each step size
depends on the parameters through the error estimate that chose it), so it equals central finite
differences of the same solve to their own accuracy; it approximates the ODE's sensitivity to the
solve's tolerance (tested against a fixed-step gradient). The acceptance decisions are piecewise
constant: a parameter change that flips one moves the result by about the tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics.dynamics import VectorField
from attnflow.numerics.integrators import Adaptive
from attnflow.numerics.steps import AdaptiveSteps, check_particles, time_dtype

__all__ = ["MAX_TRIALS", "integrate_adaptive"]

MAX_TRIALS = 100_000  # every trial step is computed: a bound meant for a solve, not a safety net


def integrate_adaptive(
    field: VectorField,
    x0: jax.Array,
    *,
    t_end: float,
    stepsize: AdaptiveSteps,
    integrator: Adaptive | None = None,
) -> jax.Array:
    """The state at ``t_end`` of the adaptive solve from ``x0`` (its dense output at ``t_end``), a
    pure JAX function that ``jax.grad``, ``jit`` and ``vmap`` go through; ``stepsize`` gives the
    tolerances, the first trial step ``dt0``, the controller and ``max_steps``, the number of trial
    steps computed (at most ``MAX_TRIALS``). A solve that has not reached ``t_end`` after
    ``max_steps`` trials returns NaN (and NaN gradients), never a state short of ``t_end``::

        def final_energy(beta):
            field = make_vector_field(Kernel(gauge, factor, make_profile("exp", beta=beta)))
            steps = AdaptiveSteps(rtol=1e-8, atol=1e-10, max_steps=200)
            return field.energy(integrate_adaptive(field, x0, t_end=2.0, stepsize=steps))

        jax.grad(final_energy)(1.0)
    """
    method = Adaptive() if integrator is None else integrator
    stepsize.check(method, field, noise=0.0, save_every=t_end)
    check_particles(field, x0, False, where="integrate_adaptive")
    if stepsize.max_steps > MAX_TRIALS:
        raise ValueError(
            f"integrate_adaptive: `stepsize.max_steps` must be at most {MAX_TRIALS} (every trial step "
            f"is computed); got {stepsize.max_steps!r}. Set it near the run's trial count."
        )
    real = time_dtype(x0)
    t_end = jnp.asarray(t_end, real)
    stages = len(method.tableau.b)
    zero, dt0 = jnp.zeros((), real), jnp.asarray(stepsize.dt0, real)
    start = dict(
        t=zero, x=x0, k=field(x0), h=dt0, error_prev=jnp.ones((), real), t_last=zero, x_last=x0,
        h_last=dt0, slopes=jax.tree.map(lambda leaf: jnp.zeros((stages, *leaf.shape), leaf.dtype), x0),
    )  # fmt: skip

    @jax.checkpoint
    def trial(s, _):
        # first_stage = 1 as a Python int: the stages are then a scan, which reverses; a trial after
        # t_end (finite: the last step size) is discarded
        s, _, _ = stepsize.trial(method, field, s, first_stage=1, running=s["t"] < t_end)
        return s, None

    s, _ = jax.lax.scan(trial, start, None, length=stepsize.max_steps)
    theta = (t_end - s["t_last"]) / s["h_last"]
    x = method.interpolate(s["x_last"], s["slopes"], s["h_last"], theta)
    return jax.tree.map(lambda leaf: jnp.where(s["t"] >= t_end, leaf, np.nan), x)
