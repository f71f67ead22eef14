"""Streaming snapshots: ``solve_streaming`` hands them on block by block and keeps none, so the
memory of a solve, and of ``attnflow run``, does not grow with the number of snapshots."""

import gc
import tracemalloc

import jax
import numpy as np
import pytest

from attnflow.core import gauges, sphere
from attnflow.core.factors import NoFactor
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.config import config_from_dict
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import make_integrator
from attnflow.numerics.solve import solve, solve_streaming
from attnflow.workflows import run as run_module

N, D = 256, 16
SNAPSHOT_BYTES = N * D * 8


def _field(n=N, d=D):
    profile = make_profile("exp", beta=1.0)
    kernel = Kernel(gauge=gauges.IdentityGauge(n=n, d=d), factor=NoFactor(n=n), profile=profile)
    return make_vector_field(kernel)


def _peak(fn) -> int:
    """Peak bytes traced (NumPy arrays included) while ``fn()`` runs, above what was held before."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_streamed_blocks_are_solve_s_snapshots_bitwise():
    field, x0 = _field(32, 3), sphere.sample_uniform(0, 32, 3)
    options = dict(
        integrator=make_integrator("rk4"), dt=0.05, t_end=2.0, save_every=0.1, snapshots_per_call=5
    )
    blocks = []
    stats = solve_streaming(
        field, x0, on_snapshots=lambda ts, xs: blocks.append((ts, np.array(xs))), **options
    )
    trajectory = solve(field, x0, **options)
    assert [len(ts) for ts, _ in blocks] == [1, 5, 5, 5, 5]  # the initial state, then one call each
    np.testing.assert_array_equal(np.concatenate([ts for ts, _ in blocks]), trajectory.ts)
    np.testing.assert_array_equal(np.concatenate([xs for _, xs in blocks]), trajectory.xs)
    assert stats.snapshots == 21 and stats.statistics() == trajectory.statistics()
    assert stats.status == trajectory.status


def test_a_stopped_run_streams_up_to_its_last_ok_snapshot():
    field, x0 = _field(16, 3), sphere.sample_uniform(1, 16, 3)
    x0 = x0.at[3].set(np.nan)  # non-finite from the start: the first chunk fails
    seen = []
    stats = solve_streaming(
        field,
        x0,
        on_snapshots=lambda ts, xs: seen.extend(ts),
        integrator=make_integrator("euler"),
        dt=0.1,
        t_end=1.0,
        save_every=0.1,
        snapshots_per_call=5,
    )
    assert str(stats.status) == "nonfinite" and seen == [0.0] and stats.snapshots == 1


def _solve_peak(snapshots: int, *, streaming: bool) -> int:
    field, x0 = _field(), sphere.sample_uniform(0, N, D)
    options = dict(integrator=make_integrator("euler"), dt=0.01, t_end=0.01 * snapshots, save_every=0.01)
    solve_streaming(field, x0, on_snapshots=lambda ts, xs: None, **options)  # compiled before measuring
    if streaming:
        return _peak(lambda: solve_streaming(field, x0, on_snapshots=lambda ts, xs: None, **options))
    return _peak(lambda: solve(field, x0, **options))


def test_streaming_memory_does_not_grow_with_the_snapshots():
    few, many = _solve_peak(20, streaming=True), _solve_peak(400, streaming=True)
    # 380 more snapshots held would be 380 * 32 KiB; a compiled call's group (<= 64) bounds it
    assert many - few < 64 * SNAPSHOT_BYTES
    # the contrast: solve() keeps every snapshot (and stacks them), as documented
    held = _solve_peak(400, streaming=False) - _solve_peak(20, streaming=False)
    assert held > 380 * SNAPSHOT_BYTES


SMALL_RUN = {
    "model": {"n": N, "d": D},
    "solver": {"method": "euler", "dt": 0.01, "save_every": 0.01},
}


# four whole runs of 120 and 400 snapshots (figures and store included), two under tracemalloc:
# about 40 s; the default run keeps solve_streaming's memory test above
@pytest.mark.slow
def test_a_run_s_memory_does_not_grow_with_the_snapshots(tmp_path):
    def peak(snapshots: int) -> int:
        config = config_from_dict({**SMALL_RUN, "solver": {**SMALL_RUN["solver"], "t_end": 0.01 * snapshots}})
        run_module.run(config, tmp_path / f"warm{snapshots}")  # compiled and imported before measuring
        return _peak(lambda: run_module.run(config, tmp_path / f"run{snapshots}"))

    few, many = peak(120), peak(400)  # both above the viewer's 101 snapshots (it reads no more)
    # the stacked snapshots, read back, would add 280 * 32 KiB (and copies); the series a few floats
    assert many - few < 28 * SNAPSHOT_BYTES


def test_run_records_the_solver_s_step_statistics(tmp_path):
    config = config_from_dict({"model": {"n": 16}, "solver": {"method": "adaptive", "t_end": 1.0}})
    metrics = run_module.run(config, tmp_path / "run").metrics["run"]
    assert metrics["steps_accepted"] + metrics["steps_rejected"] == metrics["steps"] > 0
    assert metrics["evaluations"] >= 6 * metrics["steps"]  # Dormand-Prince: 6 new stages per trial step
    assert metrics["compile_time_s"] >= 0.0


@pytest.mark.parametrize("batched", [False, True])
def test_solve_on_snapshot_is_called_for_every_snapshot_in_order(batched):
    field, x0 = _field(8, 3), sphere.sample_uniform(2, 8, 3)
    x0 = jax.numpy.stack([x0, x0]) if batched else x0
    seen = []
    trajectory = solve(
        field,
        x0,
        integrator=make_integrator("rk4"),
        dt=0.1,
        t_end=1.0,
        save_every=0.1,
        snapshots_per_call=2,
        workers=1,
        on_snapshot=lambda k, t, x: seen.append((k, t, np.array(x))),
    )
    assert [k for k, _, _ in seen] == list(range(11))
    np.testing.assert_array_equal(np.stack([x for _, _, x in seen]), trajectory.xs)
