"""One placement decision (numerics.placement): detected once, read by solve and the lanes; the
accelerator branches (a batch as one vmap, no worker processes, lanes on one device) run here on
the CPU under ``placed`` and agree with the CPU branches."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.numerics import dynamics, integrators, lanes, placement, program_cache
from attnflow.numerics.solve import solve
from helpers_core import factor_distance_bias, gauge_rope_full_period, make_kernel, uniform


def test_the_cpu_is_detected_once_and_overridden_inside_a_block():
    here = placement.current()
    assert here == placement.Placement("cpu") and not here.accelerator and here.worker_processes
    with placement.placed(placement.Placement("gpu")) as gpu:
        assert placement.current() is gpu and gpu.vmap_batches and not gpu.worker_processes
        assert len(lanes.lane_devices()) == 1
    assert placement.current() is here
    message = r"^placement: `platform` must be one of \('cpu', 'gpu', 'tpu'\); got 'qpu'\.$"
    with pytest.raises(ValueError, match=message):
        placement.Placement("qpu")


def test_a_batch_on_an_accelerator_is_one_vmap_equal_to_the_cpu_runs():
    n = 10
    kernel = make_kernel(gauge_rope_full_period(n), factor_distance_bias(n), beta=2.0)
    field = dynamics.make_vector_field(kernel)
    x0 = np.stack([uniform(n, 3, seed=s) for s in (1, 2, 3)])
    opts = dict(integrator=integrators.RK4(), dt=0.05, t_end=0.5, save_every=0.25)
    cpu = solve(field, x0, workers=1, **opts)
    program_cache.clear()
    with placement.placed(placement.Placement("gpu")):
        # workers=None: on an accelerator the batch stays in this process whatever the cores
        accelerated = solve(field, x0, **opts)
    assert program_cache.info()["misses"] == 1  # its own (vmapped) program
    # the same arithmetic per seed; XLA may fuse the batched program differently (round-off)
    np.testing.assert_allclose(accelerated.xs, cpu.xs, rtol=0, atol=1e-13)
