"""The time loop of a density (``attnflow.numerics.density_circle``, ``density_sphere``): the particles'.

A density state is a pytree (grid values or harmonic coefficients per label) and its field a pure
map ``state → d state / dt`` of the same structure. Nothing of the loop is the density's own: the
methods are the particles' (``attnflow.numerics.integrators``) with the identity retraction
(``retraction="none"``: a density is not renormalised), the steps are their step policy
(``ConstantSteps``) and the loop is their compiled core (``attnflow.numerics.solve.advance``: a run
whose state leaves the reals stops with status ``nonfinite``). What a density adds is its
resolution status (``Status.under_resolved``), checked at each snapshot: from the first snapshot that is not
``ok`` on, the run is frozen at its last resolved law.

``integrate`` is a pure function (``jit``, ``vmap``; a run folder's one-snapshot program). The
particles' orchestration takes a density as it is: ``solve(field, state, integrator=RK4(retraction=
"none"), dt=..., t_end=..., save_every=..., check=run_status)`` (``attnflow.numerics.solve``: fixed
or adaptive steps, a batch of states with ``batch=True``, snapshots streamed), :func:`run_status`
being the resolution status in the particles' codes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics import density_circle, density_sphere
from attnflow.numerics.integrators import Integrator
from attnflow.numerics.saving import SaveAt
from attnflow.numerics.solve import Problem, advance
from attnflow.numerics.status import Status
from attnflow.numerics.steps import ConstantSteps, time_dtype

__all__ = ["integrate", "run_status"]

_OK, _NONFINITE = Status.ok.code, Status.nonfinite.code


def integrate(
    field,
    state,
    *,
    integrator: Integrator,
    dt: float,
    steps_per_snapshot: int,
    snapshots: int,
    status=None,
):
    """Fixed steps of ``dt`` from ``state``: ``(ts (S+1,), states, codes (S+1,))``, ``states`` the
    state's structure with every leaf stacked over the ``S + 1`` snapshots (the initial one first),
    one snapshot every ``steps_per_snapshot`` steps.

    ``integrator``: a method of ``attnflow.numerics.integrators`` with ``retraction="none"`` (e.g.
    ``RK4(retraction="none")``). ``status(state) -> int code`` (a ``Status`` code, e.g.
    ``lambda s: density_circle.status_code(field, s)``; None: ``ok`` while the state is finite),
    checked at each snapshot; from the first one that is not ``ok`` on, the state is frozen (the
    run's last resolved law is repeated) and the code kept. A pure JAX function (``jit``, ``vmap``).
    """
    if integrator.retraction != "none":
        raise ValueError(
            f"density: `integrator` must have retraction='none' (a density is not renormalised); got "
            f"{integrator.retraction!r}: use e.g. RK4(retraction='none')."
        )
    dt = float(dt)
    save_every = dt * steps_per_snapshot
    problem = Problem(field, integrator, ConstantSteps(dt), SaveAt(save_every * snapshots, save_every))
    check = (lambda s: _OK) if status is None else status  # noqa: E731

    def snapshot(carry, t_target):
        moved, _ = advance(problem, carry, t_target[None])  # a frozen run keeps its carry
        stepped = jnp.where(moved[3] == _OK, check(moved[0]), _NONFINITE)
        code = jnp.where(carry[3] == _OK, stepped, carry[3]).astype(jnp.int32)
        kept = jax.tree.map(lambda new, old: jnp.where(code == _OK, new, old), moved[:3], carry[:3])
        return (*kept, code), (kept[0], code)

    code0 = jnp.asarray(check(state), jnp.int32)
    carry = (state, jax.random.key(0), problem.stepsize.init(integrator, state), code0)
    t_targets = np.asarray([save_every * (k + 1) for k in range(snapshots)], time_dtype(state))
    _, (states, codes) = jax.lax.scan(snapshot, carry, t_targets)
    states = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), state, states)
    codes = jnp.concatenate([code0[None], codes])
    ts = save_every * jnp.arange(snapshots + 1)
    return ts, states, codes


def run_status(field, state) -> jax.Array:
    """The resolution status of a density ``state`` (:func:`density_circle.status_code` or
    :func:`density_sphere.status_code`) as a :class:`attnflow.numerics.status.Status` code: the
    ``check`` that ``solve`` takes for a density."""
    module = density_circle if isinstance(field, density_circle.CircleDensityField) else density_sphere
    return module.status_code(field, state)
