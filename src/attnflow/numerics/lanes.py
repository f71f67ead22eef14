"""Work split into a fixed number of lanes, spread over the CPU cores that JAX exposes as devices.

XLA parallelises each operation of a tiled evaluation over the cores; a 256 × 256 tile is too
small for that to pay (measured, 2 cores: one core alone was faster). Coarse parallelism does pay:
the tile pairs are dealt round-robin into ``LANES`` lanes, each lane is a sequential ``lax.scan``
with its own accumulator, and the lanes run on as many CPU devices as divide ``LANES``
(``shard_map``); the partial sums are then added in lane order. The lane layout depends on
``LANES`` only, never on the device count, so the result is bitwise the same on 1, 2, 4 or 8
devices (tested).

A batch of runs (seeds) in one process is dealt to the same devices (``batch_on_devices``): each
run is computed whole on one device, as the unbatched program. (``solve`` sends CPU batches to
worker processes instead, ``attnflow.numerics.workers``, which run their shares this way on one device.)

JAX shows one CPU device unless told otherwise before its backend starts: ``use_cpu_cores()``
does that (the CLI and the benchmark call it; a Python user calls it before the first
computation). Without it everything runs on one device, with identical results.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

CORES_VARIABLE = "ATTNFLOW_CORES"  # caps the cores a process uses (set to 1 in worker processes)
LANES = 8  # fixed: the summation order, hence the rounding, must not depend on the machine
_ONE_DEVICE = contextvars.ContextVar("attnflow_lanes_one_device", default=False)


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (where the OS reports one), at most
    ``$ATTNFLOW_CORES`` when that is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    cap = os.environ.get(CORES_VARIABLE)
    if cap is None:
        return cores
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"environment variable {CORES_VARIABLE} must be a positive integer; got {cap!r}.")
    return min(cores, int(cap))


def use_cpu_cores(count: int | None = None) -> int:
    """Expose ``count`` CPU cores (default: all available) to JAX as devices; returns the count.

    Must run before JAX starts its backend (before the first array is created). Afterwards it
    only checks: it returns the number of CPU devices JAX already has if that equals ``count``
    (or ``count`` is None) and raises ``RuntimeError`` otherwise.
    """
    from jax._src import xla_bridge

    if count is not None and count < 1:
        raise ValueError(f"use_cpu_cores: `count` must be a positive integer; got {count!r}.")
    if xla_bridge.backends_are_initialized():
        have = len(jax.devices("cpu"))
        if count is None or count == have:
            return have
        raise RuntimeError(
            f"use_cpu_cores: JAX has already started with {have} CPU device(s); call "
            f"use_cpu_cores({count}) before the first JAX computation (or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count})."
        )
    count = available_cores() if count is None else count
    jax.config.update("jax_num_cpu_devices", count)
    return count


def lane_devices() -> list:
    """The devices the lanes run on: as many CPU devices as divide ``LANES`` (one on accelerators)."""
    devices = jax.devices()
    if devices[0].platform != "cpu" or _ONE_DEVICE.get():
        return devices[:1]
    count = max(c for c in range(1, LANES + 1) if LANES % c == 0 and c <= len(devices))
    return devices[:count]


def _split(fn, devices, *, gathered: bool):
    """``fn(shared, split)`` on ``devices``: ``shared`` whole on each, ``split`` cut along its first
    axis; the output is whole on each device (``gathered``: ``fn`` gathers it) or cut the same way."""
    return jax.shard_map(
        fn,
        mesh=Mesh(np.array(devices), ("lane",)),
        in_specs=(PartitionSpec(), PartitionSpec("lane")),
        out_specs=PartitionSpec() if gathered else PartitionSpec("lane"),
        check_vma=False,
    )


def deal(items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deal ``items (k, ...)`` round-robin into ``(LANES, ⌈k / LANES⌉, ...)`` lanes, the short lanes
    padded with copies of item 0; also returns the ``(LANES, ⌈k / LANES⌉)`` mask of real items."""
    k = items.shape[0]
    per = -(-k // LANES)
    order = np.arange(per * LANES).reshape(per, LANES).T  # lane l holds items l, l + LANES, ...
    real = order < k
    return items[np.where(real, order, 0)], real


def scan_dealt(add, init):
    """The lane function of a lane of dealt items (``deal``): ``add(operands, acc, item)`` folded over
    the lane's real items in order, from ``init``; the padding items are skipped (``lax.cond``)."""

    def lane_fn(operands, lane):
        def step(acc, entry):
            item, real = entry
            return jax.lax.cond(real, lambda acc: add(operands, acc, item), lambda acc: acc, acc), None

        return jax.lax.scan(step, init(operands), lane)[0]

    return lane_fn


def lane_map(lane_fn, operands, lanes):
    """``stack_l lane_fn(operands, lanes[l])`` over the ``LANES`` lanes, on the lane devices.

    ``lane_fn(operands, lane)`` is one lane's sequential work (a ``lax.scan`` or ``lax.map`` over
    its items); ``operands`` (a pytree) is given whole to every lane, ``lanes`` (a pytree of arrays
    with a leading ``LANES`` axis) is split between the lane devices. Every lane is computed by the
    same program on whichever device, so the stacked result does not depend on the device count.
    """
    devices = lane_devices()

    def run(ops, my_lanes):
        return jax.lax.map(lambda lane: lane_fn(ops, lane), my_lanes)

    if len(devices) == 1:
        return run(operands, lanes)
    gathered = lambda ops, mine: jax.lax.all_gather(run(ops, mine), "lane", tiled=True)  # noqa: E731
    return _split(gathered, devices, gathered=True)(operands, lanes)


def lane_sum(lane_fn, operands, lanes):
    """``Σ_l lane_fn(operands, lanes[l])`` (see ``lane_map``), the partial results added in lane order."""
    partials = lane_map(lane_fn, operands, lanes)
    total = jax.tree.map(lambda p: p[0], partials)
    for lane in range(1, LANES):
        total = jax.tree.map(lambda t, p, lane=lane: t + p[lane], total, partials)
    return total


def share_rows(size: int, count: int) -> np.ndarray:
    """The runs of ``count`` contiguous shares of a batch of ``size`` runs: ``(count, ⌈size /
    count⌉)`` indices, the last share padded with copies of the last run."""
    per = -(-size // count)
    return np.minimum(np.arange(count * per), size - 1).reshape(count, per)


@contextlib.contextmanager
def _one_device():
    """While tracing the share of one device: lanes inside it stay on that device."""
    token = _ONE_DEVICE.set(True)
    try:
        yield
    finally:
        _ONE_DEVICE.reset(token)


def batch_on_devices(fn, in_axes):
    """``fn`` over a batch (``in_axes``: 0 or None per positional argument; outputs batched on axis 0).

    On a CPU the runs are dealt to the lane devices in contiguous shares (the last padded with
    copies of the last run) and each device computes its runs one after the other (``lax.map``):
    every run is the unbatched program, so the results equal single runs bitwise, whatever the
    number of devices. Measured on 2 cores (n = 256, RK4, τ = 10, 10 seeds): 4.4–4.7 s, against
    6.2 s for vmapped shares on the same 2 devices and 9.9 s for one ``vmap`` on one device: XLA's
    CPU backend runs batched products poorly, and rounds them differently for different batch
    sizes. On an accelerator: one ``jax.vmap`` over the batch.
    """
    if jax.devices()[0].platform != "cpu":
        return jax.vmap(fn, in_axes=in_axes)
    batch_positions = [i for i, axis in enumerate(in_axes) if axis == 0]

    def run_shares(shared, runs):  # runs: the batched arguments, (share, ...) each
        def one(run):
            args = list(shared)
            for i, a in zip(batch_positions, run, strict=True):
                args[i] = a
            return fn(*args)

        with _one_device():  # lanes inside a run stay on its device
            return jax.lax.map(one, runs)

    def batched(*args):
        size = jax.tree.leaves(args[batch_positions[0]])[0].shape[0]
        devices = lane_devices()[:size]
        rows = share_rows(size, len(devices)).ravel()
        shared = [None if axis == 0 else a for a, axis in zip(args, in_axes, strict=True)]
        runs = tuple(jax.tree.map(lambda a: a[rows], args[i]) for i in batch_positions)
        if len(devices) == 1:
            return run_shares(shared, runs)
        return jax.tree.map(lambda a: a[:size], _split(run_shares, devices, gathered=False)(shared, runs))

    return batched
