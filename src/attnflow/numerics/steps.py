"""Step-size policies: how long each step of a run is (diffrax's step-size controllers).

A policy advances one run from one snapshot time to the next (``advance``), carrying its own state
between snapshots (``init``):

- ``ConstantSteps(dt)``: ``save_every / dt`` steps of ``dt`` (a ``lax.scan``), with the noise and
  stochastic fields that need a fixed grid. The state carried is nothing.
- ``AdaptiveSteps(rtol, atol, ...)``: trial steps of a method with an embedded error estimate
  (``method.step_with_error``), accepted when the scaled error is at most 1; the next step is
  ``h · clip(safety · err^(−1/order), factor_min, factor_max)`` (``adapt``, the controller proper).
  A step is shortened to land on the snapshot time and does not shrink the next one. The state
  carried is ``(h, t)``; at most ``max_steps`` trial steps per snapshot.

``advance`` (given ``active``, False for a run that has stopped) returns
``(x, key, state, steps, within)``: ``within`` is False when the policy ran out of steps. A
non-finite error estimate stops the adaptive loop at once (the caller reads the state's finiteness
and reports ``Status.nonfinite``).

Designed for a PI controller and dense output (a later policy): ``adapt`` takes the error and
returns (accept, next step); a policy may carry more state (previous errors, the last slope).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attnflow.core.sphere import normalize
from attnflow.numerics.dynamics import noise_increment


def is_stochastic(field) -> bool:
    """A stochastic field is called ``field(x, key)`` (a fresh key each step: ``random_batch``)."""
    return bool(getattr(field, "stochastic", False))


def make_step(method, field, noise: float):
    """``step(x, key, h) -> (x, key)``: one step of ``method``, with the field's key (a stochastic
    field draws from a fresh key each step, shared by its stages) and the noise increment
    ``sqrt(2·noise·h) P_x dW`` followed by renormalisation."""
    stochastic = is_stochastic(field)

    def step(x, key, h):
        if stochastic:
            key, sub_field, sub_noise = jax.random.split(key, 3)
            x = method.step(lambda y: field(y, sub_field), x, h)
        else:
            if noise > 0:
                key, sub_noise = jax.random.split(key)
            x = method.step(field, x, h)
        if noise > 0:
            x = normalize(x + noise_increment(sub_noise, x, noise=noise, dt=h))
        return x, key

    return step


def _whole_multiple(name: str, total: float, step_name: str, step: float) -> int:
    ratio = total / step
    if round(ratio) < 1 or abs(ratio - round(ratio)) > 1e-9 * max(1.0, ratio):
        raise ValueError(
            f"solve: `{name}` must be a whole multiple of `{step_name}` = {step!r}; got {total!r} "
            f"(ratio {ratio:.6g})."
        )
    return int(round(ratio))


@dataclasses.dataclass(frozen=True)
class ConstantSteps:
    """Fixed steps of ``dt`` (``save_every`` must be a whole multiple of it)."""

    dt: float

    def __post_init__(self) -> None:
        if not self.dt > 0:
            raise ValueError(f"ConstantSteps: `dt` must be positive; got {self.dt!r}.")

    def steps_per_save(self, save_every: float) -> int:
        return _whole_multiple("save_every", save_every, "dt", self.dt)

    def check(self, method, field, *, noise: float, save_every: float) -> None:  # noqa: ARG002
        self.steps_per_save(save_every)

    def evaluations_per_save(self, method, save_every: float) -> int:
        """Field evaluations between two snapshots (to size the compiled calls)."""
        return self.steps_per_save(save_every) * len(method.tableau.b)

    def init(self, dtype):  # noqa: ARG002
        return ()

    def advance(self, method, field, x, key, state, t_target, *, active, noise: float, save_every: float):  # noqa: ARG002
        """``save_every / dt`` steps (``t_target`` is implied by the count; computed even when not
        ``active``: the caller discards them)."""
        step = make_step(method, field, noise)
        count = self.steps_per_save(save_every)

        def body(carry, _):
            return step(*carry, self.dt), None

        (x, key), _ = jax.lax.scan(body, (x, key), None, length=count)
        return x, key, state, jnp.asarray(count), jnp.asarray(True)


@dataclasses.dataclass(frozen=True)
class AdaptiveSteps:
    """Error-controlled steps of a method with an embedded pair, from a first trial step ``dt0``."""

    rtol: float = 1e-8
    atol: float = 1e-10
    dt0: float = 1e-2
    max_steps: int = 1_000_000  # trial steps per snapshot
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 5.0

    def __post_init__(self) -> None:
        for name in ("rtol", "atol", "dt0"):
            if not getattr(self, name) > 0:
                raise ValueError(f"AdaptiveSteps: `{name}` must be positive; got {getattr(self, name)!r}.")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(
                f"AdaptiveSteps: `max_steps` must be a positive integer; got {self.max_steps!r}."
            )

    def check(self, method, field, *, noise: float, save_every: float) -> None:  # noqa: ARG002
        if not hasattr(method, "step_with_error"):
            raise ValueError(
                f"solve: `integrator` must have an embedded error estimate (adaptive) for AdaptiveSteps; "
                f"got {type(method).__name__}."
            )
        if noise > 0:
            raise ValueError(
                "solve: `noise` > 0 needs a fixed-step method (euler, rk4, geodesic_rk4); got adaptive."
            )
        if is_stochastic(field):
            raise ValueError(
                "solve: a stochastic `field` (random batches) needs a fixed-step method (euler, rk4, "
                "geodesic_rk4); got adaptive."
            )

    def evaluations_per_save(self, method, save_every: float) -> None:  # noqa: ARG002
        """Unknown in advance."""
        return None

    def init(self, dtype):
        return jnp.asarray(self.dt0, dtype), jnp.asarray(0.0, dtype)

    def adapt(self, h, error_norm, order: int):
        """``(accept, next step)`` after a trial step ``h`` with scaled error ``error_norm``."""
        factor = self.safety * jnp.maximum(error_norm, 1e-10) ** (-1.0 / order)
        return error_norm <= 1.0, h * jnp.clip(factor, self.factor_min, self.factor_max)

    def advance(self, method, field, x, key, state, t_target, *, active, noise: float, save_every: float):  # noqa: ARG002
        """Trial steps until ``t_target`` (or ``max_steps`` of them); none unless ``active``."""

        def cond(loop):
            _, _, t, steps = loop
            return active & (t < t_target * (1 - 1e-14)) & (steps < self.max_steps)

        def body(loop):
            x, h, t, steps = loop
            h_try = jnp.minimum(h, t_target - t)
            x_new, err = method.step_with_error(field, x, h_try, rtol=self.rtol, atol=self.atol)
            broken = ~jnp.isfinite(err)  # the state left the reals: keep it and stop
            accept, h_next = self.adapt(h_try, err, method.order)
            accept = accept | broken
            h_next = jnp.where(accept & (h_try < h), h, h_next)  # landing on t_target: h is kept
            t_next = jnp.where(broken, t_target, jnp.where(accept, t + h_try, t))
            return jnp.where(accept, x_new, x), h_next, t_next, steps + 1

        h, t = state
        x, h, t, steps = jax.lax.while_loop(cond, body, (x, h, t, jnp.asarray(0)))
        return x, key, (h, t), steps, steps < self.max_steps


StepPolicy = ConstantSteps | AdaptiveSteps
