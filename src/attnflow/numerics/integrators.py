"""Explicit Runge–Kutta methods, written as tableaus plus one stage routine, on any state.

A state is an ``(n, d)`` array of points on the sphere (the particles), or any pytree of arrays (a
density: grid values or coefficients per label, ``attnflow.numerics.density_circle``); the stage
sums are taken leaf by leaf (``jax.tree.map``) and the error norm over every leaf at once. After a
step comes the **retraction**, injected as jax-md injects its shift function: ``"sphere"``
renormalises each row (the particles), ``"none"`` is the identity (a state in a vector space: the
unnormalised tokens of a pre-LN layer, a density). Two ways to stay on the sphere share the same
stages (``_slopes``):

- **step then retract** (``Euler``, ``RK4``, ``Adaptive``): stages at ``x + σ`` (for particles in
  R^d: the vector field extends smoothly off the sphere and leaves it invariant), then the
  retraction.
- **normal coordinates** (``GeodesicRK4``, particles only): stages at ``exp_x(σ)`` with slopes
  pulled back by ``dexp_inv``, so every stage point lies on the sphere; the step ends with
  ``exp_x(σ)``. This is the classical method applied to the ODE in the chart ``exp_x``, hence of
  the same order.

``Adaptive`` is the Dormand–Prince 5(4) pair with first-same-as-last stages: ``fsal_step`` takes
the slope at ``x`` from the previous step and evaluates the field 6 times (its last stage is the
slope at the retracted new point, the next step's first), returns the step, its 7 slopes and the
scaled norm of the embedded error estimate (ambient norm). ``interpolate`` is the pair's free
4th-order dense output (Shampine's continuous extension, retracted): snapshots are read off it,
never stepped to. How long a step is, is not the method's business: the step-size policy
(``attnflow.numerics.steps``: ``ConstantSteps``, ``AdaptiveSteps``) decides;
``method.default_steps(dt)`` is the policy a method runs with when none is given. Every method
declares its ``order``; the tests measure it.

For a single array the tree maps are the plain array expressions, term for term: the particles'
results do not depend on the state being allowed to be a pytree (bitwise).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attnflow.core.sphere import dexp_inv, exp_map, normalize, project
from attnflow.numerics.steps import AdaptiveSteps, ConstantSteps

VectorField = Callable  # state -> its time derivative, a pytree of the state's structure
_ROUND_OFF = 1e-12  # tableau coefficients are decimal fractions of small integers: sums exact to ~1e-15


@dataclasses.dataclass(frozen=True)
class Tableau:
    """Butcher tableau of an explicit method: stage ``i`` is evaluated at ``t + c_i h`` from the
    slopes ``Σ_j a_ij k_j``; ``b`` are the weights of the step, ``b_error`` those of the embedded
    lower-order step (None: no error estimate).

    Validated at construction: ``a`` is strictly lower triangular (row ``i`` has ``i`` entries),
    every row sums to its node (``Σ_j a_ij = c_i``, the condition that each stage is consistent),
    and ``b`` (and ``b_error``) sum to 1 (consistency of the step)."""

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    b_error: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        stages = len(self.a)
        if len(self.b) != stages or len(self.c) != stages:
            raise ValueError(
                f"Tableau: `b` and `c` must have one entry per stage ({stages}); got {len(self.b)} and "
                f"{len(self.c)}."
            )
        for i, (row, node) in enumerate(zip(self.a, self.c, strict=True)):
            if len(row) != i:
                raise ValueError(
                    f"Tableau: `a` must be strictly lower triangular (row {i} with {i} entries); got {row!r}."
                )
            if abs(sum(row) - node) > _ROUND_OFF:
                raise ValueError(
                    f"Tableau: row {i} of `a` must sum to its node c[{i}] = {node!r}; got {sum(row)!r}."
                )
        for name, weights in (("b", self.b), ("b_error", self.b_error)):
            if weights is not None and (len(weights) != stages or abs(sum(weights) - 1.0) > _ROUND_OFF):
                raise ValueError(
                    f"Tableau: `{name}` must be {stages} weights summing to 1; got {weights!r} "
                    f"(sum {sum(weights)!r})."
                )


EULER_TABLEAU = Tableau(a=((),), b=(1.0,), c=(0.0,))
RK4_TABLEAU = Tableau(
    a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), c=(0.0, 0.5, 0.5, 1.0)
)
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
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0),
    b_error=(5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40),
)
# Dense output of DOPRI5 (Shampine 1986, as in Hairer–Nørsett–Wanner and scipy's RK45): the weight of
# slope i at theta in [0, 1] is sum_j DOPRI5_DENSE[i][j] theta^(j+1); at theta = 1 it is b_i.
DOPRI5_DENSE = (
    (1.0, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432),
    (0.0, 0.0, 0.0, 0.0),
    (0.0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799),
    (0.0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072),
    (0.0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632),
    (0.0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844),
    (0.0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423),
)


def _combine(weights, slopes, dt, like):
    """``dt Σ_i weights_i k_i`` leaf by leaf, zero weights skipped; ``0.0`` leaves (the structure of
    ``like``) when no weight is left. Per leaf the expression is the array one: ``dt · (w_1 k_1 +
    w_2 k_2 + ...)``, summed left to right."""
    pairs = [(w, k) for w, k in zip(weights, slopes, strict=False) if w != 0.0]
    if not pairs:
        return jax.tree.map(lambda _: 0.0, like)

    def leaf(*ks):
        terms = [w * k for (w, _), k in zip(pairs, ks, strict=True)]
        return dt * sum(terms[1:], terms[0])

    return jax.tree.map(leaf, *(k for _, k in pairs))


def _add(x, sigma):
    """``x + σ`` leaf by leaf."""
    return jax.tree.map(operator.add, x, sigma)


def _slopes(field, x, dt, tableau, *, geodesic: bool):
    """Stages of ``tableau``; returns the slopes ``k_i`` (in ``T_x`` for the geodesic chart)."""
    slopes = []
    for row in tableau.a:
        sigma = _combine(row, slopes, dt, x)
        if geodesic:
            point = exp_map(x, sigma) if slopes else x
            k = field(point)
            slopes.append(dexp_inv(x, sigma, k) if slopes else k)
        else:
            slopes.append(field(_add(x, sigma)))
    return slopes


def _real_dtype(leaf):
    """The real dtype of a leaf (float64 for complex128): the dtype of the coefficients it meets."""
    return jnp.finfo(leaf.dtype).dtype


def _coefficients(values, x):
    """``values`` as an array in the real dtype of each leaf of ``x`` (the state's structure)."""
    return jax.tree.map(lambda leaf: jnp.asarray(values, _real_dtype(leaf)), x)


def _ahead(x, dt, weights, slopes):
    """``x + dt Σ_j weights_j slopes_j`` leaf by leaf, the slopes stacked along a first axis and the
    weights one array per leaf (``_coefficients``)."""
    return jax.tree.map(lambda y, w, s: y + dt * jnp.tensordot(w, s, axes=1), x, weights, slopes)


def _mean_square(tree) -> jax.Array:
    """The mean of ``|z|²`` over every entry of every leaf (the leaves as one vector). One leaf takes
    ``jnp.mean`` itself: called outside ``jit``, a sum and a division are two programs, and XLA
    divides by the count differently inside ``jnp.mean``'s one."""
    squares = [jnp.abs(z) ** 2 if jnp.iscomplexobj(z) else z**2 for z in jax.tree.leaves(tree)]
    if len(squares) == 1:
        return jnp.mean(squares[0])
    total = functools.reduce(operator.add, [jnp.sum(z) for z in squares])
    return total / sum(z.size for z in squares)


def _unchanged(x: jax.Array) -> jax.Array:
    return x


RETRACTIONS = {"sphere": normalize, "none": _unchanged}


@dataclasses.dataclass(frozen=True)
class _Method:
    """A Runge–Kutta method: ``tableau`` stages, then the retraction (module docstring) or the map
    back through ``exp_x``; the stages and the step-size policies do not know which it is."""

    tableau = None
    order = 0
    geodesic = False
    retraction: str = dataclasses.field(default="sphere", kw_only=True)

    def __post_init__(self) -> None:
        if self.retraction not in RETRACTIONS:
            raise ValueError(
                f"integrator: `retraction` must be one of {tuple(RETRACTIONS)}; got {self.retraction!r}."
            )
        if self.geodesic and self.retraction != "sphere":
            raise ValueError(
                f"integrator: `retraction` must be 'sphere' for geodesic_rk4 (it steps on the sphere); "
                f"got {self.retraction!r}."
            )

    def retract(self, x):
        return RETRACTIONS[self.retraction](x)

    def step(self, field: VectorField, x, dt):
        """One step of ``dt`` from the state ``x`` (an array or a pytree): the new state."""
        slopes = _slopes(field, x, dt, self.tableau, geodesic=self.geodesic)
        sigma = _combine(self.tableau.b, slopes, dt, x)
        if self.geodesic:
            return normalize(exp_map(x, project(x, sigma)))
        return self.retract(_add(x, sigma))

    def default_steps(self, dt: float, *, max_steps: int, max_steps_total: int | None = None):  # noqa: ARG002
        """The step-size policy of this method when ``solve`` is given none: fixed steps of ``dt``
        (their number is known: ``solve`` checks it against ``max_steps_total`` before it starts)."""
        return ConstantSteps(dt)


@dataclasses.dataclass(frozen=True)
class Euler(_Method):
    """Explicit Euler then the retraction (for particles, the published codes' scheme). Order 1."""

    tableau = EULER_TABLEAU
    order = 1


@dataclasses.dataclass(frozen=True)
class RK4(_Method):
    """Classical Runge–Kutta (for particles in R^d), then the retraction. Order 4."""

    tableau = RK4_TABLEAU
    order = 4


@dataclasses.dataclass(frozen=True)
class GeodesicRK4(_Method):
    """Classical Runge–Kutta in the normal coordinates ``exp_x`` of each particle. Order 4."""

    tableau = RK4_TABLEAU
    order = 4
    geodesic = True


@dataclasses.dataclass(frozen=True)
class Adaptive(_Method):
    """Dormand–Prince 5(4), then the retraction; by default with error control at (``rtol``,
    ``atol``) (``AdaptiveSteps``). Order 5."""

    # they only make the default policy (``default_steps``); the policy's own are the program's
    # arguments, so they take no part in equality (runs at other tolerances share a program)
    rtol: float = dataclasses.field(default=1e-8, compare=False)
    atol: float = dataclasses.field(default=1e-10, compare=False)
    tableau = DOPRI5_TABLEAU
    order = 5

    def fsal_step(self, field: VectorField, x, k1, dt, *, rtol, atol, first_stage=1):
        """One trial step from ``x`` with its slope ``k1 = field(x)``: ``(x_new, slopes, error_norm)``,
        ``slopes`` the state's structure with every leaf stacked over the 7 stages (``(7, n, d)`` for
        particles). Six field evaluations: the last stage is taken at the retracted ``x_new`` (its
        row of ``a`` is ``b``), so ``slopes[-1]`` (of every leaf) is exactly the next step's ``k1``.
        ``first_stage = 0`` (a run's first step) evaluates ``k1`` too (``k1`` is then ignored).
        The stages are a loop (``lax.fori_loop``) over the rows of ``a``, so the field appears once
        in the compiled program. ``error_norm`` is the RMS, over every entry of every leaf, of the
        embedded error scaled by ``atol + rtol·|x|``; a controller accepts the step when
        ``error_norm <= 1``."""
        tableau, stages = self.tableau, len(self.tableau.b)
        a = _coefficients([row + (0.0,) * (stages - len(row)) for row in tableau.a], x)

        def stage(i, slopes):
            point = _ahead(x, dt, jax.tree.map(lambda rows: rows[i], a), slopes)
            retracted = self.retract(point)
            point = jax.tree.map(lambda r, p: jnp.where(i == stages - 1, r, p), retracted, point)
            return jax.tree.map(lambda s, k: s.at[i].set(k), slopes, field(point))

        slopes = jax.tree.map(lambda y, k: jnp.zeros((stages, *y.shape), y.dtype).at[0].set(k), x, k1)
        slopes = jax.lax.fori_loop(first_stage, stages, stage, slopes)
        high = _ahead(x, dt, jax.tree.map(lambda rows: rows[-1], a), slopes)
        low = _ahead(x, dt, _coefficients(tableau.b_error, x), slopes)

        def scaled(y, h, lo):
            return (h - lo) / (atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(h)))

        error = jax.tree.map(scaled, x, high, low)
        return self.retract(high), slopes, jnp.sqrt(_mean_square(error))

    def step_with_error(self, field: VectorField, x, dt, *, rtol, atol):
        """One trial step without a carried slope: ``(x_new, error_norm)`` (7 evaluations)."""
        k1 = jax.tree.map(jnp.zeros_like, x)
        x_new, _, err = self.fsal_step(field, x, k1, dt, rtol=rtol, atol=atol, first_stage=0)
        return x_new, err

    def interpolate(self, x, slopes, dt, theta):
        """The dense output at ``t + theta·dt`` (``theta`` in [0, 1]) of the step of length ``dt``
        from ``x`` with ``slopes``, retracted: error O(dt^5) per step (4th order)."""

        def leaf(y, s):
            powers = theta ** jnp.arange(1, 5, dtype=_real_dtype(s))
            weights = jnp.asarray(DOPRI5_DENSE, _real_dtype(s)) @ powers
            return y + dt * jnp.tensordot(weights, s, axes=1)

        return self.retract(jax.tree.map(leaf, x, slopes))

    def default_steps(self, dt: float, *, max_steps: int, max_steps_total: int | None = None):
        """Error control at this method's tolerances, from a first trial step ``dt``."""
        return AdaptiveSteps(
            rtol=self.rtol, atol=self.atol, dt0=dt, max_steps=max_steps, max_steps_total=max_steps_total
        )


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
