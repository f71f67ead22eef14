"""The time loop: compiled chunks of steps between stored snapshots (SPEC §5).

``solve(field, x0, ...)`` advances ``x0`` to ``t_end`` and returns a ``Trajectory`` of the snapshots
at multiples of ``save_every``. The steps between two snapshots form a chunk (``lax.scan`` over fixed
steps, or a ``lax.while_loop`` of accepted/rejected adaptive steps), and one compiled call advances
one chunk, or several for small problems (``snapshots_per_call``, chosen by ``snapshot_group`` so
that a call does ~``SNAPSHOT_GROUP_WORK`` pair interactions): Python runs once per call, never once
per step. The call is compiled once per ``solve``, ahead of time (the snapshot times are a traced
argument, so every call reuses the same executable); the compilation time is reported separately as
``Trajectory.compile_time_s``.
``on_snapshot(k, t, x)`` is called after each snapshot (storage, progress bars). A batch of initial
data ``x0 (B, n, d)`` (seeds) runs, on a CPU, in worker processes, one single-threaded process per
core (``attnflow.numerics.workers``; ``workers=1``: in this process, the runs dealt to the CPU devices,
``attnflow.numerics.lanes.batch_on_devices``), every run bitwise equal to a single run; on an accelerator
with ``vmap``.

Performance notes:

- Fixed-step calls are dispatched one ahead: call ``c + 1`` is queued before the snapshots of call
  ``c`` are copied to the host and handed to ``on_snapshot``, so storage overlaps the computation
  (worker processes keep the state between calls, so they never wait for this process).
  The status flags (finiteness, step limit) are computed inside the compiled call and fetched with
  its snapshots: one host synchronisation per call. Grouping snapshots matters for small ``n``
  (n = 256, RK4: 10 steps take ~3 ms, comparable to the cost of a call and a synchronisation on a
  busy machine); from n ≈ 1300 on (RK4, 10 steps per snapshot) a call holds a single snapshot.
- Buffers are not donated: the carried state is ``O(n d)`` (2.4 MB at ``n = 10^5, d = 3``) and the
  ``n × n`` (or ``n × block``) intermediates live inside the compiled loop, where XLA allocates them
  once per call and reuses them at every step; donating the state would forbid the one-ahead
  dispatch above (the state of snapshot ``k`` is still being copied out).
- ``integrate`` is the same fixed-step loop as a pure function of ``x0`` (no snapshots, no Python
  loop): it can be ``jit``-ed and ``vmap``-ed over anything the field closes over, e.g. a batch of
  inverse temperatures (see its docstring).

Precision: ``x0`` in float32 with a float32 kernel (``solver.dtype = "float32"``) runs the whole
loop in single precision, about 3× faster per interaction on a CPU. Measured against float64 on the
E0/E1 settings (SPEC §6: n = 64, 128, 256, seeds 0–9, RK4, dt = 0.01; ``benchmarks/RESULTS.md``):
states within 6.6e-6 at t = 5 and 2.9e-6 at t = 20, mean cosines within 2e-6, energies within 3e-7
relative. **Documented bound** (tested in ``tests/test_performance.py``): ``max |x32 − x64| ≤ 2e-5``
up to t = 20 and those metrics within ``1e-5``. Expectations that need a resolution below ~1e-6
(``energy_gap < 1e-6`` is met at ~1e-7; RoPE orbit residuals "typically ≤ 1e-12") are float64 ones.

Failures inside the compiled loop are a status, not an exception: ``"nonfinite"`` (the state left
the reals; the run stops at the last finite snapshot) or ``"max_steps"`` (the adaptive controller
ran out of steps).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.sphere import normalize
from attnflow.numerics import lanes
from attnflow.numerics import workers as workers_module
from attnflow.numerics.dynamics import VectorField, noise_increment
from attnflow.numerics.integrators import Integrator

SnapshotCallback = Callable[[int, float, np.ndarray], None]


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """Snapshots ``xs (T, n, d)`` (or ``(T, B, n, d)`` for a batch) at times ``ts (T,)``."""

    ts: np.ndarray
    xs: np.ndarray
    status: str
    steps: int
    # the one-time start-up, excluded from run times: the ahead-of-time compilation of the chunk
    # (a batch in worker processes: the export, their compilation and, the first time, their start)
    compile_time_s: float = 0.0


def snapshot_count(t_end: float, save_every: float) -> int:
    """Number of stored snapshots, the initial one included."""
    return int(round(t_end / save_every)) + 1


def _check_whole_multiple(name: str, total: float, step_name: str, step: float) -> None:
    ratio = total / step
    if round(ratio) < 1 or abs(ratio - round(ratio)) > 1e-9 * max(1.0, ratio):
        raise ValueError(
            f"solve: `{name}` must be a whole multiple of `{step_name}` = {step!r}; got {total!r} "
            f"(ratio {ratio:.6g})."
        )


def _finite(x):
    return jnp.all(jnp.isfinite(x))


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
        return x, key, jnp.asarray(steps), jnp.asarray(True), _finite(x)

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
            # A non-finite error means the state left the reals: keep it (status "nonfinite") and stop.
            broken = ~jnp.isfinite(err)
            accept = (err <= 1.0) | broken
            # A step shortened to land on the snapshot time does not shrink the next one.
            h_next = jnp.where(accept & (h_try < h), h, integrator.next_dt(h_try, err))
            t_next = jnp.where(broken, t_target, jnp.where(accept, t + h_try, t))
            return jnp.where(accept, x_new, x), h_next, t_next, steps + 1

        h, t = carry
        x, h, t, steps = jax.lax.while_loop(cond, body, (x, h, t, jnp.asarray(0)))
        return x, (h, t), steps, steps < max_steps, _finite(x)

    return advance


SNAPSHOT_GROUP_WORK = 2**26  # pair interactions per compiled call before snapshots are grouped
SNAPSHOT_GROUP_MAX = 64


def _grouped(advance):
    """Advance through a whole group of snapshot times ``t_targets (G,)`` in one compiled call."""

    def chunk(x, carry, t_targets):
        def body(state, t_target):
            x, carry = state
            x, carry, steps, within, finite = advance(x, carry, t_target)
            return (x, carry), (x, steps, within, finite)

        (x, carry), (xs, steps, within, finite) = jax.lax.scan(body, (x, carry), t_targets)
        return x, carry, xs, steps, within, finite

    return chunk


class _Calls:
    """A compiled chunk program called in this process, with the interface of
    ``workers.BatchProgram``: ``start(*args)``, ``advance(*rest)`` (the first ``feedback``
    arguments are the previous call's first outputs), ``collect()`` (oldest call first),
    ``release()``. JAX dispatches asynchronously, so ``advance`` does not wait for the previous call."""

    def __init__(self, compiled, feedback: int):
        self.compiled, self.feedback = compiled, feedback
        self.queue: collections.deque = collections.deque()
        self.last = None

    def start(self, *args) -> None:
        self.last = self.compiled(*args)
        self.queue.append(self.last)

    def advance(self, *rest) -> None:
        self.start(*self.last[: self.feedback], *rest)

    def collect(self):
        return self.queue.popleft()

    def release(self) -> None:
        self.queue.clear()


def snapshot_group(n_chunks: int, *, pairs_per_chunk: float, limit: int = SNAPSHOT_GROUP_MAX) -> int:
    """How many snapshots one compiled call advances: enough that a call does about
    ``SNAPSHOT_GROUP_WORK`` pair interactions (so that per-call overhead and host synchronisation
    stay negligible for small ``n``), at most ``limit``, and a divisor of ``n_chunks`` (one
    executable serves the whole run)."""
    want = max(1, min(limit, -(-SNAPSHOT_GROUP_WORK // max(1, int(pairs_per_chunk)))))
    return max(g for g in range(1, want + 1) if n_chunks % g == 0) if n_chunks > 0 else 1


def integrate(
    field: VectorField,
    x0: jax.Array,
    *,
    integrator: Integrator,
    dt: float,
    steps: int,
    noise: float = 0.0,
    key: jax.Array | None = None,
) -> jax.Array:
    """The state after ``steps`` fixed steps of ``dt`` from ``x0``: a pure JAX function, no snapshots.

    The same compiled loop as ``solve``'s chunks, for use inside ``jit``/``vmap``: batches of
    parameters that the field closes over are one ``vmap`` away, e.g.::

        def final(beta):
            kernel = Kernel(gauge, factor, Profile("exp", beta, c))
            return integrate(make_vector_field(kernel), x0, integrator=RK4(), dt=0.01, steps=2000)

        xs = jax.jit(jax.vmap(final))(jnp.array([1.0, 2.0, 4.0]))  # (3, n, d)

    (``Profile`` fields are traced arrays, so one compilation serves every ``beta``.)
    """
    if integrator.adaptive:
        raise ValueError("integrate: `integrator` must be a fixed-step method (euler, rk4, geodesic_rk4).")
    key = jax.random.key(0) if key is None else key
    x, *_ = _fixed_chunk(field, integrator, dt, int(steps), noise)(x0, key, None)
    return x


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
    snapshots_per_call: int | None = None,
    workers: int | None = None,
) -> Trajectory:
    """Integrate ``dx/dt = field(x)`` from ``x0`` and store snapshots every ``save_every``.

    ``snapshots_per_call``: snapshots advanced per compiled call (fixed-step methods; the adaptive
    method always uses 1). ``None`` chooses it with ``snapshot_group``; it must divide the number of
    chunks. Results do not depend on it.

    ``workers``: worker processes for a batch ``x0 (B, n, d)`` on a CPU (``attnflow.numerics.workers``):
    ``None`` starts one per available core (at most ``B``), 1 runs the batch in this process
    (``attnflow.numerics.lanes.batch_on_devices``). Results do not depend on it (bitwise).
    """
    if noise > 0 and integrator.adaptive:
        raise ValueError(
            "solve: `noise` > 0 needs a fixed-step method (euler, rk4, geodesic_rk4); got adaptive."
        )
    _check_whole_multiple("t_end", t_end, "save_every", save_every)
    if not integrator.adaptive:
        _check_whole_multiple("save_every", save_every, "dt", dt)
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

    n_chunks = n_snapshots - 1
    if integrator.adaptive:
        group = 1
    elif snapshots_per_call is None:
        n, batch = x0.shape[-2], (x0.shape[0] if batched else 1)
        work = int(round(save_every / dt)) * len(integrator.tableau.b) * batch * n * n
        group = snapshot_group(n_chunks, pairs_per_chunk=work)
    else:
        group = int(snapshots_per_call)
        if group < 1 or n_chunks % group:
            raise ValueError(
                f"solve: `snapshots_per_call` must be a positive divisor of the number of chunks "
                f"({n_chunks}); got {snapshots_per_call!r}."
            )

    def snapshot_times(first: int) -> jax.Array:
        return jnp.asarray([(first + j) * save_every for j in range(group)], x0.dtype)

    xs, ts, steps, status = [np.asarray(x0)], [0.0], 0, "ok"
    if on_snapshot is not None:
        on_snapshot(0, 0.0, xs[0])
    if n_chunks == 0:
        return Trajectory(ts=np.asarray(ts), xs=np.stack(xs), status=status, steps=steps)
    start = time.perf_counter()
    grouped = _grouped(chunk)
    first_args = (x0, carry, snapshot_times(1))
    count = workers_module.batch_workers(x0.shape[0], workers) if batched else 1
    if count > 1:  # a CPU batch: one single-threaded worker process per core (attnflow.numerics.workers)
        calls = workers_module.BatchProgram(grouped, first_args, (0, 0, None), count, feedback=2)
    else:
        program = lanes.batch_on_devices(grouped, in_axes=(0, 0, None)) if batched else grouped
        calls = _Calls(jax.jit(program).lower(*first_args).compile(), feedback=2)
    compile_time = time.perf_counter() - start

    # One call ahead for fixed steps (bounded work if it turns out to be wasted); an adaptive chunk
    # from a bad state could spin to max_steps, so it is only dispatched once the state is known good.
    ahead = not integrator.adaptive
    n_calls = n_chunks // group
    try:
        calls.start(*first_args)
        for call in range(n_calls):
            last = call + 1 == n_calls
            if ahead and not last:
                calls.advance(snapshot_times((call + 1) * group + 1))
            _, _, group_xs, group_steps, within, finite = calls.collect()
            group_xs, group_steps, within, finite = jax.device_get((group_xs, group_steps, within, finite))
            if batched:  # (B, G, ...) -> (G, B, ...)
                group_xs, group_steps, within, finite = (
                    np.moveaxis(a, 1, 0) for a in (group_xs, group_steps, within, finite)
                )
            for j in range(group):
                k = call * group + j + 1
                steps += int(np.max(group_steps[j]))
                if not np.all(within[j]):
                    status = "max_steps"
                    break
                if not np.all(finite[j]):
                    status = "nonfinite"
                    break
                if j == 0 and not ahead and not last:
                    calls.advance(snapshot_times((call + 1) * group + 1))
                xs.append(group_xs[j])
                ts.append(k * save_every)
                if on_snapshot is not None:
                    on_snapshot(k, ts[-1], xs[-1])
            if status != "ok":
                break
    finally:
        calls.release()
    return Trajectory(
        ts=np.asarray(ts), xs=np.stack(xs), status=status, steps=steps, compile_time_s=compile_time
    )
