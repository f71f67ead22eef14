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


# A run built on an accelerator with 4 devices, on 4 host devices in a child process (the device
# count is fixed before JAX starts): RoPE, a distance bias and a causal mask on 13 tokens (the last
# of the 4 shards padded), then a layer of heads; both runs are whole `attnflow run` folders.
PLACED_CONFIGS = {
    "paper": {
        "model": {"n": 13, "d": 4, "beta": 2.0, "causal": True},
        "gauge": {"kind": "rope", "frequencies": "roformer"},
        "factor": {"kind": "distance_bias", "slope": 0.5},
        "solver": {"method": "rk4", "dt": 0.05, "t_end": 0.5, "save_every": 0.25},
    },
    "heads": {
        "model": {"n": 13, "d": 4, "beta": 1.0},
        "attention": {"heads": 2, "head_dim": 2, "weights": "gaussian", "seed": 3},
        "solver": {"method": "rk4", "dt": 0.05, "t_end": 0.5, "save_every": 0.25},
    },
}


def _placed_runs(out: str) -> None:
    """The child: each config run on the CPU placement and on a 4-device GPU placement (folders
    ``out/NAME-cpu``, ``out/NAME-gpu``); prints the sharded fields' type names."""
    import json
    from pathlib import Path

    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import build
    from attnflow.workflows.run import run

    names, batches = {}, {}
    for name, data in PLACED_CONFIGS.items():
        config = config_from_dict(data)
        run(config, Path(out) / f"{name}-cpu")
        sim = build(config)
        seeds = np.stack([np.asarray(sim.x0), np.asarray(sim.x0)[::-1]])  # two states: a batch
        options = dict(integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end, save_every=sim.save_every)
        one_by_one = solve(sim.field, seeds, workers=1, **options).xs
        with placement.placed(placement.Placement("gpu", devices=4)):
            sharded = build(config).field
            names[name] = type(sharded).__name__
            run(config, Path(out) / f"{name}-gpu")
            batch = solve(sharded, seeds, **options).xs  # one vmap over the sharded field
        batches[name] = float(np.max(np.abs(batch - one_by_one)))
    print(json.dumps({"fields": names, "batches": batches}))


@pytest.mark.slow
def test_a_run_on_an_accelerator_with_four_devices_shards_its_tokens_and_equals_the_cpu_run(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import zarr

    here = str(Path(__file__).resolve().parent)
    code = "import sys; sys.path.insert(0, sys.argv[1]); import test_placement as tests; " + (
        "tests._placed_runs(sys.argv[2])"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_ENABLE_X64": "1"}
    done = subprocess.run([sys.executable, "-c", code, here, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.splitlines()[-1])
    assert child["fields"] == {"paper": "ShardedField", "heads": "ShardedField"}
    assert max(child["batches"].values()) <= 1e-12, child["batches"]
    for name in PLACED_CONFIGS:
        cpu, gpu = (
            zarr.open_group(tmp_path / f"{name}-{where}" / "trajectory.zarr", mode="r")
            for where in ("cpu", "gpu")
        )
        xs_cpu, xs_gpu = np.asarray(cpu["x"]), np.asarray(gpu["x"])
        assert xs_cpu.shape == xs_gpu.shape == (3, 13, 4)
        assert (
            np.max(np.abs(xs_cpu[-1] - xs_cpu[0])) > 1e-2
        )  # the tokens moved: agreement is not of a still state
        np.testing.assert_allclose(xs_gpu, xs_cpu, rtol=0, atol=1e-12)
        metrics = [
            json.loads((tmp_path / f"{name}-{where}" / "metrics.json").read_text())
            for where in ("cpu", "gpu")
        ]
        assert metrics[0]["run"]["status"] == metrics[1]["run"]["status"] == "ok"
        assert abs(metrics[0]["energy"] - metrics[1]["energy"]) <= 1e-12 * max(1.0, abs(metrics[0]["energy"]))


def test_the_placement_shards_tokens_only_on_an_accelerator_with_more_than_one_device():
    assert not placement.Placement("cpu", devices=4).shards_tokens
    assert not placement.Placement("gpu").shards_tokens
    assert placement.Placement("tpu", devices=2).shards_tokens
    with pytest.raises(ValueError, match=r"^placement: `devices` must be a whole number >= 1; got 0\.$"):
        placement.Placement("gpu", devices=0)
