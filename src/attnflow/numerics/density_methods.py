"""Explicit Runge–Kutta steps on a density state (any pytree), with the identity retraction.

The particles' methods (``attnflow.numerics.integrators``) renormalise onto the sphere after each
step; a density is a vector space element and is not retracted. The tableaus are the particles'
own (validated there); one stage routine serves them all (scipy's ``rk.py``):

- ``DensityRK4``: classical RK4, ``step(field, state, dt) -> (state, 0.0)``. Order 4.
- ``DensityDopri5``: Dormand–Prince 5(4), ``step(field, state, dt) -> (state, error_norm)`` with
  the RMS of the embedded error scaled by ``atol + rtol·|state|`` (a controller accepts a step
  when ``error_norm <= 1``). Order 5.

Each step returns ``(new_state, error_norm)``, the same type for every method; a fixed-step method's
error is 0. ``integrate`` is the ``lax.scan`` over fixed steps that the tests and the benchmark use
(snapshots, the resolution status, a run frozen at its first non-ok snapshot); the generic loop of
the package drives ``step`` the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp

from attnflow.numerics.integrators import DOPRI5_TABLEAU, RK4_TABLEAU, Tableau

__all__ = ["DensityDopri5", "DensityRK4", "integrate"]


def _axpy(state, dt, weights, slopes):
    """``state + dt Σ_i weights_i slopes_i`` leaf by leaf (zero weights skipped)."""

    def combine(x, *ks):
        terms = [w * k for w, k in zip(weights, ks, strict=False) if w != 0.0]
        return x + dt * sum(terms[1:], terms[0]) if terms else x

    return jax.tree.map(combine, state, *slopes)


def _slopes(field, state, dt, tableau: Tableau) -> list:
    slopes = []
    for row in tableau.a:
        slopes.append(field(_axpy(state, dt, row, slopes)))
    return slopes


@dataclasses.dataclass(frozen=True)
class _DensityMethod:
    tableau: ClassVar[Tableau]
    order: ClassVar[int]

    def step(self, field: Callable, state, dt):
        slopes = _slopes(field, state, dt, self.tableau)
        return _axpy(state, dt, self.tableau.b, slopes), jnp.zeros((), jnp.result_type(float))


@dataclasses.dataclass(frozen=True)
class DensityRK4(_DensityMethod):
    """Classical RK4 on a pytree state. Order 4."""

    tableau = RK4_TABLEAU
    order = 4


@dataclasses.dataclass(frozen=True)
class DensityDopri5(_DensityMethod):
    """Dormand–Prince 5(4) on a pytree state, with its embedded error norm. Order 5."""

    rtol: float = 1e-8
    atol: float = 1e-10
    tableau = DOPRI5_TABLEAU
    order = 5

    def step(self, field: Callable, state, dt):
        slopes = _slopes(field, state, dt, self.tableau)
        high = _axpy(state, dt, self.tableau.b, slopes)
        low = _axpy(state, dt, self.tableau.b_error, slopes)

        def scaled(x, h, lo):
            return ((h - lo) / (self.atol + self.rtol * jnp.maximum(jnp.abs(x), jnp.abs(h)))) ** 2

        squares = jax.tree.leaves(jax.tree.map(scaled, state, high, low))
        total = sum(jnp.sum(s) for s in squares)
        count = sum(s.size for s in squares)
        return high, jnp.sqrt(total / count)


def integrate(field, method, state, *, dt: float, steps_per_snapshot: int, snapshots: int, status=None):
    """Fixed steps of ``dt``: ``(ts (S+1,), states (S+1, ...) stacked leaves, codes (S+1,))``.

    ``status(state) -> int code`` (0 ok), checked at each snapshot; from the first non-ok snapshot
    on the state is frozen (the run's last resolved law is repeated) and the code kept."""
    status = (lambda s: jnp.zeros((), jnp.int32)) if status is None else status

    def advance(carry, _):
        current, code = carry

        def one(s, _):
            return method.step(field, s, dt)[0], None

        new, _ = jax.lax.scan(one, current, None, length=steps_per_snapshot)
        new_code = jnp.asarray(status(new), jnp.int32)
        keep = code != 0
        new = jax.tree.map(lambda a, b: jnp.where(keep | (new_code != 0), a, b), current, new)
        code = jnp.where(keep, code, new_code)
        return (new, code), (new, code)

    code0 = jnp.asarray(status(state), jnp.int32)
    _, (states, codes) = jax.lax.scan(advance, (state, code0), None, length=snapshots)
    states = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), state, states)
    codes = jnp.concatenate([code0[None], codes])
    ts = dt * steps_per_snapshot * jnp.arange(snapshots + 1)
    return ts, states, codes
