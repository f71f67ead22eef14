"""The time loop: ``solve`` orchestrates a pure compiled core (``advance``) between snapshots.

``solve(field, x0, ...)`` advances ``x0`` to ``t_end`` and returns a ``Trajectory`` of the snapshots
at multiples of ``save_every`` (all held in memory). ``solve_streaming(field, x0, on_snapshots=...)``
is the same solve handing each block of snapshots to a consumer as it is computed and keeping
none, so that memory does not grow with the number of snapshots (``attnflow run`` passes its
store and metrics this way); ``solve`` is ``solve_streaming`` with a consumer that keeps them.

What a run is, is one picklable ``Problem``: the field, the method
(``attnflow.numerics.integrators``), the step-size policy (``attnflow.numerics.steps``:
``ConstantSteps`` / ``AdaptiveSteps``), the snapshot options (``attnflow.numerics.saving.SaveAt``)
and the noise. ``advance(problem, carry, t_targets)`` is the pure core: it takes a run through a
group of snapshot times (a ``lax.scan``), each chunk of steps by the policy, and returns the
snapshots with one status code per snapshot (``attnflow.numerics.status``). A run whose status is
no longer ``ok`` is frozen (its carry kept; an adaptive loop does not start).

The orchestration (``solve``): the problem is a pytree (the kernel's numbers, ``dt``,
``save_every``, ``t_end`` and the tolerances are its leaves; the kinds, options and method are its
structure), so ``jax.jit`` keeps one program per structure and every call of a run, and every later
run of the same shapes and options in the process, reuses it (``Trajectory.compile_time_s``, 0 when
reused). The orchestration calls it once per group of snapshots (Python runs once per call, never
once per step), one call ahead of the one being read (the consumer's work, e.g. storage, overlaps
the computation; the status codes travel with the snapshots: one host synchronisation per call),
and stops when no run is ``ok``.

The state is any pytree of arrays: particles ``(n, d)``, or a density's grid values or harmonic
coefficients (``attnflow.numerics.density_solve``; the method with ``retraction="none"``, and
``check``, the density's resolution status, ending a run at its last resolved snapshot). Nothing
here is the particles' own but two defaults: an array ``(B, n, d)`` is a batch (any other state
says so with ``batch=True``) and the calls are sized by ``n²`` pairs (other states: by their size).

Batches ``x0 (B, n, d)`` (seeds; run ``b`` draws its noise from ``split(key, B)[b]``) run where the
placement (:mod:`attnflow.numerics.placement`) puts them: one ``vmap`` on an accelerator; on a CPU
each run is the unbatched program (``lax.map``), so bitwise a single run, and with more than one
core the runs are shared between single-threaded worker processes (``attnflow.numerics.batch``;
the field must pickle, as ``make_vector_field``'s does). A batch in processes does not stream: the
shares come back whole and the consumer gets them at the end, as one block.

Each run of a batch has its own status (``Trajectory.statuses``): a run that goes non-finite
stops (its later snapshots are NaN) while the others go on. ``Trajectory.status`` is the run's
status, or for a batch the first one that is not ``ok``.

Buffers are not donated: the carried state is ``O(n d)`` and the ``n × n`` (or ``n × block``)
intermediates live inside the compiled loop, where XLA allocates them once per call; donating the
state would forbid the one-ahead dispatch above.

Precision: ``x0`` in float32 with a float32 kernel (``solver.dtype = "float32"``) runs the whole
loop in single precision. **Documented bound** (tested in ``tests/test_performance.py``; measured
values in ``benchmarks/RESULTS.md``): ``max |x32 − x64| ≤ 2e-5`` up to t = 20 on the E0/E1 settings,
mean cosines and energies within ``1e-5``. Expectations that need a resolution below ~1e-6 are
float64 ones.
"""

from __future__ import annotations

import dataclasses
import operator
import pickle
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.numerics import batch, placement, program_cache
from attnflow.numerics.dynamics import VectorField
from attnflow.numerics.integrators import Integrator
from attnflow.numerics.saving import SaveAt, snapshot_count, snapshot_group
from attnflow.numerics.status import Status
from attnflow.numerics.steps import (
    AdaptiveSteps,
    ConstantSteps,
    PIController,
    StepPolicy,
    check_particles,
    check_retraction,
    time_dtype,
)

__all__ = [
    "AdaptiveSteps",
    "ConstantSteps",
    "PIController",
    "Problem",
    "SaveAt",
    "SeedWorkerDied",
    "SnapshotCallback",
    "SnapshotSink",
    "SolveStatistics",
    "Status",
    "Trajectory",
    "advance",
    "integrate",
    "snapshot_count",
    "snapshot_group",
    "solve",
    "solve_streaming",
]

SnapshotCallback = Callable[[int, float, np.ndarray], None]
# a consumer of blocks of snapshots, in order: ``on_snapshots(ts (G,), xs (G, n, d) or (G, B, n, d))``
SnapshotSink = Callable[[np.ndarray, np.ndarray], None]
_OK = Status.ok.code


class _RunRecord:
    """What ``Trajectory`` and ``SolveStatistics`` share: the statuses and step statistics."""

    statuses: np.ndarray
    accepted: np.ndarray | None
    rejected: np.ndarray | None
    evaluations: np.ndarray | None

    @property
    def status(self) -> Status:
        """The status of a run; of a batch, the first that is not ``ok`` (``ok`` if none)."""
        return next((s for s in self.statuses.ravel() if s != Status.ok), Status.ok)

    def statistics(self) -> dict[str, int | list[int]]:
        """``{"steps_accepted", "steps_rejected", "evaluations"}``: integers for a run, lists for a
        batch (JSON-ready)."""
        names = ("steps_accepted", "steps_rejected", "evaluations")
        values = (self.accepted, self.rejected, self.evaluations)
        return {name: np.asarray(v).tolist() for name, v in zip(names, values, strict=True)}


@dataclasses.dataclass(frozen=True)
class Trajectory(_RunRecord):
    """Snapshots ``xs (T, n, d)`` (or ``(T, B, n, d)`` for a batch) at times ``ts (T,)``.

    ``statuses``: ``Status`` per run (shape ``()``, or ``(B,)`` for a batch); a run's snapshots
    after its last ``ok`` one are NaN (a single run's trajectory ends there). ``steps``: the most
    steps (accepted and rejected) any run took; ``accepted``, ``rejected``, ``evaluations``: each
    run's step statistics (``statistics()``: plain integers, for metrics files)."""

    ts: np.ndarray
    xs: np.ndarray
    statuses: np.ndarray
    steps: int
    # per run (shape of ``statuses``): accepted and rejected steps, field evaluations (the stages)
    accepted: np.ndarray | None = None
    rejected: np.ndarray | None = None
    evaluations: np.ndarray | None = None
    # the one-time start-up, excluded from run times: the ahead-of-time compilation (a batch in
    # worker processes: the longest compilation among them; their start is in the wall time)
    compile_time_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class SolveStatistics(_RunRecord):
    """What ``solve_streaming`` returns: a ``Trajectory`` without its snapshots (they went to the
    consumer), plus ``snapshots``, how many were handed on (the initial one included)."""

    statuses: np.ndarray
    steps: int
    accepted: np.ndarray
    rejected: np.ndarray
    evaluations: np.ndarray
    compile_time_s: float
    snapshots: int


@dataclasses.dataclass(frozen=True)
class Problem:
    """Everything a run is, but its initial state and key: picklable when the field is."""

    field: Any  # VectorField, or a stochastic field ``field(x, key)``, or a density's field
    method: Integrator
    stepsize: StepPolicy
    saveat: SaveAt
    noise: float = 0.0
    # ``check(field, state) -> Status code`` at each snapshot a run reaches ``ok`` (a density's
    # resolution: ``density_circle.run_status``); one that is not ``ok`` ends the run there. None:
    # the step's own status only (particles)
    check: Callable | None = None


Carry = tuple  # (x, key, step-policy state, status code)


def advance(problem: Problem, carry: Carry, t_targets: jax.Array) -> tuple[Carry, tuple]:
    """The pure core: one run (unbatched) through the snapshot times ``t_targets (G,)``.

    Returns the new carry and ``(xs (G, n, d), codes (G,), stats (G, 3))``, the stats being the
    chunk's (accepted, rejected, evaluations). A run whose status is
    not ``ok`` keeps its carry (its adaptive loop does not start; fixed steps are computed and
    discarded: a ``lax.cond`` here would change how XLA compiles the lanes, and with it the
    last bit of results on several devices)."""
    options = dict(noise=problem.noise, save_every=problem.saveat.save_every)

    def chunk(carry, t_target):
        x, key, state, code = carry
        active = code == _OK
        x_new, key_new, state_new, stats, code_new = problem.stepsize.advance(
            problem.method, problem.field, x, key, state, t_target, active=active, **options
        )
        if problem.check is not None:
            code_new = jnp.where(code_new == _OK, problem.check(problem.field, x_new), code_new)
        keep = lambda new, old: jnp.where(active, new, old)  # noqa: E731
        carry = jax.tree.map(keep, (x_new, key_new, state_new, code_new), (x, key, state, code))
        return carry, (carry[0], carry[3], jnp.where(active, stats, 0).astype(jnp.int32))

    return jax.lax.scan(chunk, carry, t_targets)


def _is_batch(x0, batch: bool | None) -> bool:
    """Whether ``x0``'s leaves carry a leading axis of runs: ``batch``, or (None) an array of
    particle states ``(B, n, d)``."""
    if batch is None:
        return isinstance(x0, jax.Array | np.ndarray) and x0.ndim == 3
    return bool(batch)


def _runs(x0, batched: bool) -> int:
    return jax.tree.leaves(x0)[0].shape[0] if batched else 1


def _work_per_evaluation(x0, batched: bool) -> int:
    """What one field evaluation of one run costs, to size the compiled calls: ``n²`` pairs for
    particles ``(n, d)``, the number of values for any other state (a density's grid or coefficients)."""
    if isinstance(x0, jax.Array | np.ndarray) and x0.ndim == 2 + batched:
        return x0.shape[-2] ** 2
    return sum(leaf.size for leaf in jax.tree.leaves(x0)) // _runs(x0, batched)


def _start(problem: Problem, x0, keys: jax.Array, batched: bool) -> Carry:
    if batched:  # one policy state and one status per run
        state = jax.vmap(lambda x: problem.stepsize.init(problem.method, x))(x0)
        return x0, keys, state, np.zeros((_runs(x0, batched),), np.int32)
    state = problem.stepsize.init(problem.method, x0)
    return x0, keys, state, np.zeros((), np.int32)


def _flatten_problem(problem: Problem):
    """Children: the field's arrays (``program_cache.split_field``), the step policy (its ``dt`` or
    tolerances) and the snapshot times (``t_end``, ``save_every``); static: the field's structure,
    the method, the noise and the check."""
    structure, leaves = program_cache.split_field(problem.field)
    static = (structure, problem.method, problem.noise, problem.check)
    return (leaves, problem.stepsize, problem.saveat), static


def _unflatten_problem(static, children) -> Problem:
    (structure, method, noise, check), (leaves, stepsize, saveat) = static, children
    problem = object.__new__(Problem)  # no validation of traced numbers (as JAX's own dataclasses)
    for name, value in zip(
        ("field", "method", "stepsize", "saveat", "noise", "check"),
        (program_cache.join_field(structure, leaves), method, stepsize, saveat, noise, check),
        strict=True,
    ):
        object.__setattr__(problem, name, value)
    return problem


jax.tree_util.register_pytree_node(Problem, _flatten_problem, _unflatten_problem)


@partial(jax.jit, static_argnums=(1, 2))
def _program(problem: Problem, batched: bool, vmapped: bool, carry: Carry, t_targets: jax.Array):
    """The compiled call: ``advance`` for one run, or over a batch (``lax.map`` of the unbatched
    program on a CPU, ``vmap`` on an accelerator); one program per structure of the problem."""
    program_cache.count_trace()

    def one(carry, t_targets):
        return advance(problem, carry, t_targets)

    if not batched:
        return one(carry, t_targets)
    if vmapped:
        return jax.vmap(one, in_axes=(0, None))(carry, t_targets)
    return jax.lax.map(lambda c: one(c, t_targets), carry)


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
    """The state after ``steps`` fixed steps of ``dt`` from ``x0``: ``advance`` with one snapshot, a
    pure JAX function for use inside ``jit``/``vmap``: batches of parameters that the field closes
    over are one ``vmap`` away, e.g.::

        def final(beta):
            kernel = Kernel(gauge, factor, Profile("exp", beta, c))
            return integrate(make_vector_field(kernel), x0, integrator=RK4(), dt=0.01, steps=2000)

        xs = jax.jit(jax.vmap(final))(jnp.array([1.0, 2.0, 4.0]))  # (3, n, d)

    (``Profile`` fields are traced arrays, so one compilation serves every ``beta``.)
    """
    try:
        count = None if isinstance(steps, bool) else operator.index(steps)
    except TypeError:  # 2.7 steps: not a count
        count = None
    if count is None or count < 1:
        raise ValueError(f"integrate: `steps` must be an integer >= 1; got {steps!r}.")
    check_retraction(integrator, field)
    check_particles(field, x0, False, where="integrate")
    span = count * dt
    problem = Problem(field, integrator, ConstantSteps(dt), SaveAt(span, span), noise)
    key = jax.random.key(0) if key is None else key
    carry, _ = advance(problem, _start(problem, x0, key, False), jnp.asarray([span], time_dtype(x0)))
    return carry[0]


def _run(problem: Problem, x0, keys: jax.Array, on_snapshots: SnapshotSink, batched: bool):
    """The orchestration in this process: hands each block of snapshots to ``on_snapshots`` as it is
    fetched and keeps none; returns ``(codes, stats (runs, 3), compile_time_s, snapshots)``."""
    saveat, runs = problem.saveat, _runs(x0, batched)
    stages = problem.stepsize.evaluations_per_save(problem.method, saveat.save_every)
    group = saveat.group(None if stages is None else stages * runs * _work_per_evaluation(x0, batched))
    codes, stats = np.zeros((runs,) if batched else (), np.int32), np.zeros((runs, 3), np.int64)
    on_snapshots(np.zeros(1), jax.tree.map(lambda leaf: np.asarray(leaf)[None], x0))
    delivered = 1
    real = time_dtype(x0)

    def times(call: int) -> np.ndarray:  # made on the host: no program
        return np.asarray([saveat.time(call * group + j + 1) for j in range(group)], real)

    carry = _start(problem, x0, keys, batched)
    program = partial(_program, problem, batched, placement.current().vmap_batches)
    with program_cache.compile_clock() as clock:
        out = program(carry, times(0))  # compiles (or finds) the program, then dispatches the call
    compile_time = clock.seconds
    n_calls = saveat.chunks // group
    for call in range(n_calls):
        following = program(out[0], times(call + 1)) if call + 1 < n_calls else None  # one call ahead
        fetched = jax.device_get(out[1])
        if batched:  # (B, G, ...) -> (G, B, ...)
            fetched = jax.tree.map(lambda a: np.moveaxis(a, 1, 0), fetched)
        group_xs, group_codes, group_stats = fetched
        alive = group_codes == _OK  # (G,) or (G, B)
        ended = ~alive.reshape(group, -1).any(axis=1)  # snapshots at which no run is ok any more
        kept = int(np.argmax(ended)) if ended.any() else group  # snapshots before the first of them
        counted = min(kept + 1, group)  # the stats of the failing chunk count, as its status does
        stats = stats + group_stats[:counted].reshape(counted, runs, 3).sum(axis=0)
        codes = group_codes[counted - 1]
        if kept:
            block = _first_snapshots(group_xs, kept, alive[:kept] if batched else None)
            ks = call * group + 1 + np.arange(kept)
            on_snapshots(np.asarray([saveat.time(int(k)) for k in ks]), block)
            delivered += kept
        if kept < group:
            break
        out = following
    return codes, stats, compile_time, delivered


def _first_snapshots(xs, kept: int, alive: np.ndarray | None):
    """The first ``kept`` snapshots of every leaf of ``xs (G, ...)``; of a batch ``(G, B, ...)``
    (``alive (kept, B)``: whether each run was still ``ok``), a stopped run's are NaN."""

    def first(leaf: np.ndarray) -> np.ndarray:
        if alive is None:
            return leaf[:kept]
        mask = alive.reshape(alive.shape + (1,) * (leaf.ndim - alive.ndim))
        return np.where(mask, leaf[:kept], np.asarray(np.nan, leaf.dtype))

    return jax.tree.map(first, xs)


class _Collector:
    """A sink that keeps every block (``solve``, and a worker's share of a batch)."""

    def __init__(self, then: SnapshotCallback | None = None) -> None:
        self.ts: list[np.ndarray] = []
        self.xs: list[np.ndarray] = []
        self.then = then

    def __call__(self, ts: np.ndarray, xs: np.ndarray) -> None:
        self.ts.append(np.asarray(ts, dtype=float))
        self.xs.append(xs)
        if self.then is not None:
            start = sum(len(t) for t in self.ts[:-1])
            for j, t in enumerate(ts):
                self.then(start + j, float(t), xs[j])

    def arrays(self):
        """``(ts, xs)``: the times and every leaf of the state stacked over the snapshots."""
        return np.concatenate(self.ts), jax.tree.map(lambda *blocks: np.concatenate(blocks), *self.xs)


def _run_share(problem: Problem, x0, keys: jax.Array):
    """A worker process's task: its share of a batch, solved as in ``_run``: ``(ts, xs, codes,
    stats, compile_time_s)``."""
    collector = _Collector()
    codes, stats, compile_time, _ = _run(problem, jax.tree.map(jnp.asarray, x0), keys, collector, True)
    return (*collector.arrays(), codes, stats, compile_time)


def _processes(problem: Problem, x0, workers: int | None) -> int:
    """Worker processes for a batch: 1 (this process) on accelerators or for a field that does not
    pickle (unless ``workers`` asks for more: then an error)."""
    count = batch.worker_count(_runs(x0, True), workers)
    if count == 1 or not placement.current().worker_processes:
        return 1
    try:
        pickle.dumps(problem)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        if workers is None:
            return 1
        raise ValueError(
            f"solve: `field` must pickle to run a batch in {count} worker processes (build it with "
            f"make_vector_field, or pass workers=1); got {problem.field!r} ({error})."
        ) from None
    return count


class SeedWorkerDied(BrokenProcessPool):
    """A worker process of a CPU batch died (killed, out of memory) before returning its seeds: the
    batch has no result. A failure of the machine, not of the input; the message is one line."""


def _run_in_processes(problem: Problem, x0, keys: jax.Array, count: int):
    runs = _runs(x0, True)
    shares = np.array_split(np.arange(runs), count)
    host = jax.tree.map(np.asarray, x0)
    tasks = [(problem, jax.tree.map(lambda leaf, r=rows: leaf[r], host), keys[rows]) for rows in shares]
    parts = [None] * count
    try:
        for index, part in batch.run_tasks(_run_share, tasks, workers=count):
            parts[index] = part
    except BrokenProcessPool:
        lost = ", ".join(f"{r[0]}-{r[-1]}" for r, part in zip(shares, parts, strict=True) if part is None)
        raise SeedWorkerDied(
            f"solve: a seed worker process died (killed, out of memory, or it could not start: a "
            f'script must call solve under `if __name__ == "__main__":`) before returning seeds '
            f"{lost} of {runs}, so the batch has no result; rerun it, with workers=1 to solve "
            "it in this process or fewer seeds per process."
        ) from None
    ts = max((p[0] for p in parts), key=len)

    def padded(xs):  # a share that stopped early: NaN snapshots, like a stopped run in one process
        return np.concatenate([xs, np.full((len(ts) - len(xs), *xs.shape[1:]), np.nan, xs.dtype)])

    xs = jax.tree.map(
        lambda *shares: np.concatenate([padded(x) for x in shares], axis=1), *(p[1] for p in parts)
    )
    codes = np.concatenate([p[2] for p in parts])
    return ts, xs, codes, np.concatenate([p[3] for p in parts]), max(p[4] for p in parts)


def solve_streaming(
    field: VectorField,
    x0: jax.Array,
    *,
    on_snapshots: SnapshotSink,
    integrator: Integrator,
    dt: float | None = None,
    t_end: float | None = None,
    save_every: float | None = None,
    noise: float = 0.0,
    key: jax.Array | None = None,
    max_steps_per_snapshot: int = 1_000_000,
    max_steps: int | None = None,
    snapshots_per_call: int | None = None,
    workers: int | None = None,
    saveat: SaveAt | None = None,
    stepsize: StepPolicy | None = None,
    batch: bool | None = None,
    check: Callable | None = None,
) -> SolveStatistics:
    """``solve`` without keeping the snapshots: each block ``(ts (G,), xs (G, n, d))`` (or
    ``(G, B, n, d)`` for a batch) goes to ``on_snapshots`` as soon as it is computed, in order, the
    initial state first, and nothing of it is held here afterwards, so the memory of a run does not
    grow with its number of snapshots (a block is at most one compiled call's snapshots,
    ``SaveAt.snapshots_per_call``). Returns the statuses and step statistics.

    A CPU batch solved in worker processes is the exception: the shares come back whole, and are
    handed on as one block at the end. The other options are ``solve``'s.
    """
    saveat = saveat if saveat is not None else SaveAt(t_end, save_every, snapshots_per_call)
    if stepsize is None:
        if dt is None:
            raise ValueError("solve: `dt` must be given (or a `stepsize` policy); got None.")
        stepsize = integrator.default_steps(dt, max_steps=max_steps_per_snapshot, max_steps_total=max_steps)
    stepsize.check(integrator, field, noise=noise, save_every=saveat.save_every)
    if max_steps is not None and isinstance(stepsize, ConstantSteps):
        needed = saveat.chunks * stepsize.steps_per_save(saveat.save_every)
        if needed > max_steps:
            raise ValueError(
                f"solve: `max_steps` = {max_steps} is fewer than the {needed} fixed steps of dt = "
                f"{stepsize.dt!r} to t_end = {saveat.t_end!r}: raise it, or take longer steps."
            )
    problem = Problem(field, integrator, stepsize, saveat, noise, check)
    key = jax.random.key(0) if key is None else key
    batched = _is_batch(x0, batch)
    check_particles(field, x0, batched, where="solve")
    keys = jax.random.split(key, _runs(x0, batched)) if batched else key
    count = _processes(problem, x0, workers) if batched else 1
    if count == 1:
        codes, stats, compile_time, snapshots = _run(problem, x0, keys, on_snapshots, batched)
    else:
        ts, xs, codes, stats, compile_time = _run_in_processes(problem, x0, keys, count)
        on_snapshots(ts, xs)
        snapshots = len(ts)
    per_run = stats if batched else stats[0]
    return SolveStatistics(
        statuses=Status.from_codes(codes), steps=int((stats[:, 0] + stats[:, 1]).max()),
        accepted=per_run[..., 0], rejected=per_run[..., 1], evaluations=per_run[..., 2],
        compile_time_s=compile_time, snapshots=snapshots,
    )  # fmt: skip


def solve(
    field: VectorField,
    x0: jax.Array,
    *,
    integrator: Integrator,
    dt: float | None = None,
    t_end: float | None = None,
    save_every: float | None = None,
    noise: float = 0.0,
    key: jax.Array | None = None,
    on_snapshot: SnapshotCallback | None = None,
    max_steps_per_snapshot: int = 1_000_000,
    max_steps: int | None = None,
    snapshots_per_call: int | None = None,
    workers: int | None = None,
    saveat: SaveAt | None = None,
    stepsize: StepPolicy | None = None,
    batch: bool | None = None,
    check: Callable | None = None,
) -> Trajectory:
    """Integrate ``dx/dt = field(x)`` from ``x0`` (``(n, d)``, or a batch ``(B, n, d)``) and store
    snapshots every ``save_every`` up to ``t_end``.

    ``dt``: the step, or the first trial step of an adaptive method (``integrator.default_steps``);
    ``stepsize`` (``ConstantSteps``/``AdaptiveSteps``) replaces it. ``saveat`` (``SaveAt``) replaces
    ``t_end``, ``save_every`` and ``snapshots_per_call`` (snapshots per compiled call; results do
    not depend on it). ``noise``: the diffusion ``sqrt(2 noise) P_x dW`` (fixed steps only).
    ``on_snapshot(k, t, x)``: called in order for each stored snapshot, the initial one included.
    ``max_steps``: a bound on the steps of the whole run (adaptive: trial steps, the run then
    stops with status ``max_steps``; fixed: their known number, checked before the run starts).
    ``workers``: processes for a CPU batch (None: one per available core, at most one per run;
    1: in this process); results do not depend on it (bitwise).

    The state may be any pytree of arrays (a density: ``density_circle.CircleDensity``, with the
    method's ``retraction="none"``); ``xs`` then has its structure, every leaf stacked over the
    snapshots. ``batch``: whether its leaves carry a leading axis of runs (None: an array
    ``(B, n, d)`` of particle states is a batch, anything else one run). ``check(field, x)``: a
    ``Status`` code checked at each snapshot (a density's resolution: ``run_status`` of
    ``density_circle`` or ``density_sphere``); the first that is not ``ok`` ends the run there, as a
    non-finite state does.

    The returned ``Trajectory`` holds every snapshot in memory (``T n d`` numbers, and once more
    while they are stacked). For runs whose snapshots do not fit, or should not be held,
    ``solve_streaming`` hands them to a consumer block by block instead (``attnflow run`` does so).
    """
    collector = _Collector(then=on_snapshot)
    result = solve_streaming(
        field, x0, on_snapshots=collector, integrator=integrator, dt=dt, t_end=t_end,
        save_every=save_every, noise=noise, key=key, max_steps_per_snapshot=max_steps_per_snapshot,
        max_steps=max_steps, snapshots_per_call=snapshots_per_call, workers=workers, saveat=saveat,
        stepsize=stepsize, batch=batch, check=check,
    )  # fmt: skip
    ts, xs = collector.arrays()
    return Trajectory(
        ts=ts, xs=xs, statuses=result.statuses, steps=result.steps, accepted=result.accepted,
        rejected=result.rejected, evaluations=result.evaluations, compile_time_s=result.compile_time_s,
    )  # fmt: skip
