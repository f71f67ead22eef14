"""The time loop: compiled chunks of steps between stored snapshots (SPEC §5).

``solve(field, x0, ...)`` advances ``x0`` to ``t_end`` and returns a ``Trajectory`` of the snapshots
at multiples of ``save_every``. Each chunk between two snapshots is one jitted call (``lax.scan``
over fixed steps, or a ``lax.while_loop`` of accepted/rejected adaptive steps), so Python runs once
per snapshot, not once per step. ``on_snapshot(k, t, x)`` is called after each snapshot (storage,
progress bars). A batch of initial data ``x0 (B, n, d)`` (seeds) is advanced with ``vmap``.

Failures inside the compiled loop are a status, not an exception: ``"nonfinite"`` (the state left
the reals; the run stops at the last finite snapshot) or ``"max_steps"`` (the adaptive controller
ran out of steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.dynamics import VectorField, noise_increment
from attnflow.integrators import Integrator
from attnflow.sphere import normalize

SnapshotCallback = Callable[[int, float, np.ndarray], None]


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """Snapshots ``xs (T, n, d)`` (or ``(T, B, n, d)`` for a batch) at times ``ts (T,)``."""

    ts: np.ndarray
    xs: np.ndarray
    status: str
    steps: int


def snapshot_count(t_end: float, save_every: float) -> int:
    """Number of stored snapshots, the initial one included."""
    return int(round(t_end / save_every)) + 1


def _fixed_chunk(field, integrator, dt, steps, noise):
    def advance(x, key, t_target):  # t_target unused: the step count fixes the time
        def body(carry, _):
            x, key = carry
            x = integrator.step(field, x, dt)
            if noise > 0:
                key, sub = jax.random.split(key)
                x = normalize(x + noise_increment(sub, x, noise=noise, dt=dt))
            return (x, key), None

        (x, key), _ = jax.lax.scan(body, (x, key), None, length=steps)
        return x, key, jnp.asarray(steps), jnp.asarray(True)

    return advance


def _adaptive_chunk(field, integrator, max_steps):
    def advance(x, carry, t_target):
        def cond(state):
            _, _, t, steps = state
            return (t < t_target * (1 - 1e-14)) & (steps < max_steps)

        def body(state):
            x, h, t, steps = state
            h_try = jnp.minimum(h, t_target - t)
            x_new, err = integrator.step_with_error(field, x, h_try)
            accept = err <= 1.0
            # A step shortened to land on the snapshot time does not shrink the next one.
            h_next = jnp.where(accept & (h_try < h), h, integrator.next_dt(h_try, err))
            return jnp.where(accept, x_new, x), h_next, jnp.where(accept, t + h_try, t), steps + 1

        h, t = carry
        x, h, t, steps = jax.lax.while_loop(cond, body, (x, h, t, jnp.asarray(0)))
        return x, (h, t), steps, steps < max_steps

    return advance


def solve(
    field: VectorField,
    x0: jax.Array,
    *,
    integrator: Integrator,
    dt: float,
    t_end: float,
    save_every: float,
    noise: float = 0.0,
    key: jax.Array | None = None,
    on_snapshot: SnapshotCallback | None = None,
    max_steps_per_snapshot: int = 1_000_000,
) -> Trajectory:
    """Integrate ``dx/dt = field(x)`` from ``x0`` and store snapshots every ``save_every``."""
    if noise > 0 and integrator.adaptive:
        raise ValueError(
            "solve: `noise` > 0 needs a fixed-step method (euler, rk4, geodesic_rk4); got adaptive."
        )
    n_snapshots = snapshot_count(t_end, save_every)
    batched = x0.ndim == 3
    key = jax.random.key(0) if key is None else key
    if integrator.adaptive:
        chunk = _adaptive_chunk(field, integrator, max_steps_per_snapshot)
        shape = x0.shape[:1] if batched else ()
        carry = (jnp.full(shape, dt, x0.dtype), jnp.zeros(shape, x0.dtype))
    else:
        chunk = _fixed_chunk(field, integrator, dt, int(round(save_every / dt)), noise)
        carry = jax.random.split(key, x0.shape[0]) if batched else key
    advance = jax.jit(jax.vmap(chunk, in_axes=(0, 0, None)) if batched else chunk)

    x = x0
    xs, ts, steps, status = [np.asarray(x0)], [0.0], 0, "ok"
    if on_snapshot is not None:
        on_snapshot(0, 0.0, xs[0])
    for k in range(1, n_snapshots):
        t = k * save_every
        x_new, carry, chunk_steps, within = advance(x, carry, jnp.asarray(t, x0.dtype))
        steps += int(jnp.max(chunk_steps))
        if not bool(jnp.all(within)):
            status = "max_steps"
            break
        if not bool(jnp.all(jnp.isfinite(x_new))):
            status = "nonfinite"
            break
        x = x_new
        xs.append(np.asarray(x))
        ts.append(t)
        if on_snapshot is not None:
            on_snapshot(k, t, xs[-1])
    return Trajectory(ts=np.asarray(ts), xs=np.stack(xs), status=status, steps=steps)
