"""Work split into a fixed number of lanes, spread over the CPU cores that JAX exposes as devices.

XLA parallelises each operation of a tiled evaluation over the cores; a 256 × 256 tile is too
small for that to pay (``benchmarks/RESULTS.md``). Coarse parallelism does pay:
the tile pairs are dealt round-robin into ``LANES`` lanes, each lane is a sequential ``lax.scan``
with its own accumulator, and the lanes run on as many CPU devices as divide ``LANES``
(``shard_map``); the partial sums are then added in lane order. The lane layout depends on
``LANES`` only, never on the device count, so the result is bitwise the same on 1, 2, 4 or 8
devices (tested).

JAX shows one CPU device unless told otherwise before its backend starts: ``use_cpu_cores()``
does that (the CLI and the benchmark call it; a Python user calls it before the first
computation). Without it everything runs on one device, with identical results.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from attnflow.numerics import placement
from attnflow.numerics.batch import available_cores

LANES = 8  # fixed: the summation order, hence the rounding, must not depend on the machine


def use_cpu_cores(count: int | None = None) -> int:
    """Expose ``count`` CPU cores (default: all available) to JAX as devices; returns the count.

    Must run before JAX starts its backend (before the first array is created). Afterwards it
    only checks: it returns the number of CPU devices JAX already has if that equals ``count``
    (or ``count`` is None) and raises ``RuntimeError`` otherwise.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"use_cpu_cores: `count` must be a positive integer; got {count!r}.")
    want = available_cores() if count is None else count
    try:
        jax.config.update("jax_num_cpu_devices", want)
    except RuntimeError:  # the backend has started: the device count is fixed
        have = len(jax.devices("cpu"))
        if count is None or count == have:
            return have
        raise RuntimeError(
            f"use_cpu_cores: JAX has already started with {have} CPU device(s); call "
            f"use_cpu_cores({count}) before the first JAX computation (or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count})."
        ) from None
    return want


def lane_devices() -> list:
    """The devices the lanes run on: as many CPU devices as divide ``LANES`` (one on accelerators)."""
    devices = jax.devices()
    if placement.current().accelerator:
        return devices[:1]
    count = max(c for c in range(1, LANES + 1) if LANES % c == 0 and c <= len(devices))
    return devices[:count]


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
    return jax.shard_map(
        lambda ops, mine: jax.lax.all_gather(run(ops, mine), "lane", tiled=True),
        mesh=Mesh(np.array(devices), ("lane",)),
        in_specs=(PartitionSpec(), PartitionSpec("lane")),
        out_specs=PartitionSpec(),
        check_vma=False,
    )(operands, lanes)


def lane_sum(lane_fn, operands, lanes):
    """``Σ_l lane_fn(operands, lanes[l])`` (see ``lane_map``), the partial results added in lane order."""
    partials = lane_map(lane_fn, operands, lanes)
    total = jax.tree.map(lambda p: p[0], partials)
    for lane in range(1, LANES):
        total = jax.tree.map(lambda t, p, lane=lane: t + p[lane], total, partials)
    return total
