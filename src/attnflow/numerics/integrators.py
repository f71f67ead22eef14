"""Explicit Runge–Kutta integrators on the sphere, written as tableaus plus one stage routine.

Two ways to stay on the sphere share the same stages (``_increment``):

- **step then renormalise** (``Euler``, ``RK4``, ``Adaptive``): stages at ``x + σ`` in R^d (the
  vector field extends smoothly off the sphere and leaves it invariant), then ``normalize``.
- **normal coordinates** (``GeodesicRK4``): stages at ``exp_x(σ)`` with slopes pulled back by
  ``dexp_inv``, so every stage point lies on the sphere; the step ends with ``exp_x(σ)``. This is the
  classical method applied to the ODE in the chart ``exp_x``, hence of the same order.

``Adaptive`` is the Dormand–Prince 5(4) pair with error control in the ambient norm (each accepted
step renormalised). Every integrator declares its ``order``; the tests measure it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attnflow.core.sphere import dexp_inv, exp_map, normalize, project

VectorField = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Tableau:
    """Butcher tableau of an explicit method; ``b_error`` = weights of the embedded lower order."""

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    b_error: tuple[float, ...] | None = None


EULER_TABLEAU = Tableau(a=((),), b=(1.0,))
RK4_TABLEAU = Tableau(a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6))
DOPRI5_TABLEAU = Tableau(
    a=(
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
        (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
    ),
    b=(35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0),
    b_error=(5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40),
)


def _combine(weights, slopes, dt):
    terms = [w * k for w, k in zip(weights, slopes, strict=False) if w != 0.0]
    return dt * sum(terms[1:], terms[0]) if terms else 0.0


def _increment(field, x, dt, tableau, *, geodesic: bool):
    """Stages of ``tableau``; returns the slopes ``k_i`` (in ``T_x`` for the geodesic chart)."""
    slopes = []
    for row in tableau.a:
        sigma = _combine(row, slopes, dt)
        if geodesic:
            point = exp_map(x, sigma) if slopes else x
            k = field(point)
            slopes.append(dexp_inv(x, sigma, k) if slopes else k)
        else:
            slopes.append(field(x + sigma))
    return slopes


class _FixedStep:
    """A fixed-step method: ``tableau`` stages, then renormalise or map back through ``exp_x``."""

    tableau: Tableau
    order: int
    geodesic: bool = False
    adaptive = False

    def step(self, field: VectorField, x: jax.Array, dt) -> jax.Array:
        slopes = _increment(field, x, dt, self.tableau, geodesic=self.geodesic)
        sigma = _combine(self.tableau.b, slopes, dt)
        if self.geodesic:
            return normalize(exp_map(x, project(x, sigma)))
        return normalize(x + sigma)


@dataclasses.dataclass(frozen=True)
class Euler(_FixedStep):
    """Explicit Euler then renormalise (the published codes' scheme). Order 1."""

    tableau = EULER_TABLEAU
    order = 1


@dataclasses.dataclass(frozen=True)
class RK4(_FixedStep):
    """Classical Runge–Kutta in R^d, then renormalise. Order 4."""

    tableau = RK4_TABLEAU
    order = 4


@dataclasses.dataclass(frozen=True)
class GeodesicRK4(_FixedStep):
    """Classical Runge–Kutta in the normal coordinates ``exp_x`` of each particle. Order 4."""

    tableau = RK4_TABLEAU
    order = 4
    geodesic = True


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """Dormand–Prince 5(4) with error control (``rtol``, ``atol``), renormalised. Order 5."""

    rtol: float = 1e-8
    atol: float = 1e-10
    order = 5
    adaptive = True

    def step_with_error(self, field: VectorField, x: jax.Array, dt):
        """One trial step: ``(x_new, error_norm)``; accept when ``error_norm <= 1``."""
        slopes = _increment(field, x, dt, DOPRI5_TABLEAU, geodesic=False)
        high = x + _combine(DOPRI5_TABLEAU.b, slopes, dt)
        low = x + _combine(DOPRI5_TABLEAU.b_error, slopes, dt)
        scale = self.atol + self.rtol * jnp.maximum(jnp.abs(x), jnp.abs(high))
        return normalize(high), jnp.sqrt(jnp.mean(((high - low) / scale) ** 2))

    def next_dt(self, dt, error_norm):
        """Standard controller: ``dt · clip(0.9 · err^{−1/5}, 0.2, 5)``."""
        factor = 0.9 * jnp.maximum(error_norm, 1e-10) ** (-1.0 / self.order)
        return dt * jnp.clip(factor, 0.2, 5.0)


Integrator = Euler | RK4 | GeodesicRK4 | Adaptive
METHODS = ("euler", "rk4", "geodesic_rk4", "adaptive")


def make_integrator(method: str, *, rtol: float = 1e-8, atol: float = 1e-10) -> Integrator:
    """Integrator by config name (``solver.method``)."""
    table = {"euler": Euler, "rk4": RK4, "geodesic_rk4": GeodesicRK4}
    if method in table:
        return table[method]()
    if method == "adaptive":
        return Adaptive(rtol=rtol, atol=atol)
    raise ValueError(f"solver: `method` must be one of {METHODS}; got {method!r}.")
