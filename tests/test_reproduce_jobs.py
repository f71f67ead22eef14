"""How reproduce runs its jobs cheaply: seeds one by one (bitwise a batch), jobs grouped by the
structure of their programs, measurement without a compilation per job shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.analysis import metrics
from attnflow.io.config_load import config_from_dict
from attnflow.numerics.solve import solve
from attnflow.numerics.summation import energy
from attnflow.workflows import reproduce, reproduce_measure
from attnflow.workflows.build import build, make_initial
from attnflow.workflows.experiments import load_experiments
from attnflow.workflows.reproduce_plan import plan, structure_key

ROPE = {
    "model": {"n": 8, "d": 3},
    "aux": {"kind": "positions"},
    "gauge": {"kind": "rope"},
    "solver": {"method": "adaptive", "t_end": 1.0, "save_every": 0.25},
}


def _seeds(config, seeds):
    sim = build(config)
    x0 = jnp.stack(
        [make_initial(config.model_copy(update={"init": config.init.model_copy(update={"seed": s})}),
                      sim.kernel.gauge, sim.x0.dtype) for s in seeds]
    )  # fmt: skip
    return sim, x0


def test_seeds_one_by_one_are_bitwise_the_batch():
    config = config_from_dict(ROPE)
    sim, x0 = _seeds(config, (0, 1, 2))
    ticks = []
    solved = reproduce._solve_seeds(sim, x0, ticks.append)
    batch = solve(sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                  save_every=sim.save_every, key=sim.key, workers=1)  # fmt: skip
    assert np.array_equal(solved["xs"], batch.xs)  # the CPU batch is the unbatched program per run
    assert np.array_equal(solved["ts"], batch.ts)
    assert solved["status"] == "ok"
    assert solved["totals"]["evaluations"] == int(np.sum(batch.evaluations))
    assert sum(ticks) == 3 * len(batch.ts)  # one unit per snapshot of each seed (Job.units)


def test_jobs_of_one_structure_share_a_key_and_others_do_not():
    jobs = {job.label: job for job in plan(load_experiments(), quick=True)}
    key = {label: structure_key(job) for label, job in jobs.items()}
    # every gauge solved as its matrices, every factor as a matrix: beta, rtol, seed counts, the
    # gauge and the factor's values are not structure
    shared = [
        "E0",
        "E6 USA",
        "E1 (a) full_period",
        "E1 (b) theta = 1 rad",
        "E6 RoPE",
        "E2",
        "E3",
        "E4 m = 1",
        "E5",
    ]
    assert len({key[label] for label in shared}) == 1
    assert key["E9"] != key["E1 (a) full_period"]  # value = logits_only is another program
    assert key["E0"] != key["E7"]
    bigger = [job for job in plan(load_experiments(["E0"]), sizes=[16])]
    assert structure_key(bigger[0]) != key["E0"]  # n is structure


def test_measurement_in_numpy_and_fixed_chunks_matches_the_per_state_values():
    config = config_from_dict(ROPE)
    sim, x0 = _seeds(config, (0, 1, 2))
    xs = np.asarray(solve(sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                          save_every=sim.save_every, workers=1).xs)  # fmt: skip
    # (T, B) = (5, 3): 15 states, one padded chunk
    per_state = np.array([[float(energy(sim.kernel, jnp.asarray(x))) for x in row] for row in xs])
    energies = reproduce_measure._energies(sim.kernel, xs)
    np.testing.assert_allclose(energies, per_state, rtol=1e-13, atol=0)  # the same sums, vmapped
    compiled = reproduce_measure._energy_chunk._cache_size()
    reproduce_measure._energies(sim.kernel, np.concatenate([xs, xs], axis=1))  # other T·B
    assert reproduce_measure._energy_chunk._cache_size() == compiled  # no new compilation
    q = np.asarray(sim.kernel.gauge.matrices())
    us = reproduce_measure._gauge_frames(q, xs)
    apply = jax.vmap(jax.vmap(sim.kernel.gauge.apply))
    np.testing.assert_allclose(us, np.asarray(apply(jnp.asarray(xs))), atol=1e-14)  # round-off
    cosines = np.array([[float(metrics.mean_cosine(x)) for x in row] for row in us])
    np.testing.assert_allclose(reproduce_measure._mean_cosines(us), cosines, atol=1e-14)  # round-off


def test_on_an_accelerator_the_seeds_are_one_batch():
    # The accelerator branch, run on the CPU (numerics.placement): solve then vmaps the batch (the
    # same arithmetic per run, in other fused operations: 1e-9 = the adaptive steps' tolerance).
    from attnflow.numerics import placement

    config = config_from_dict(ROPE)
    sim, x0 = _seeds(config, (0, 1))
    ticks = []
    one_by_one = reproduce._solve_seeds(sim, x0, ticks.append)
    assert ticks == [1] * 2 * 5  # one unit per seed and snapshot
    ticks.clear()
    with placement.placed(placement.Placement("gpu")):
        batched = reproduce._solve_seeds(sim, x0, ticks.append)
    assert ticks == [2] * 5  # B units per batched snapshot: the one-batch branch ran
    assert batched["xs"].shape == one_by_one["xs"].shape == (5, 2, 8, 3)
    np.testing.assert_allclose(batched["xs"], one_by_one["xs"], atol=1e-9)
    assert batched["status"] == "ok"


def test_solver_max_steps_reaches_reproduce_s_solves():
    config = config_from_dict({**ROPE, "solver": {**ROPE.get("solver", {}), "max_steps": 3}})
    sim, x0 = _seeds(config, (0,))
    assert sim.max_steps == 3 and type(sim.integrator).__name__ == "Adaptive"
    solved = reproduce._solve_seeds(sim, x0, lambda units: None)
    assert solved["status"] == "max_steps" and solved["totals"]["steps_accepted"] <= 3


def test_jobs_in_worker_processes_come_back_in_order_with_the_same_values():
    jobs = plan(load_experiments(["E0", "E1"]), sizes=[8], n_seeds=1)  # E1's two variants: one group
    here = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=1)
    ticks = []
    there = reproduce.run_jobs(jobs, ticks.append, workers=2)
    assert [r.label for r in there] == [job.label for job in jobs]
    assert sum(ticks) == sum(job.units() for job in jobs)
    for a, b in zip(here, there, strict=True):
        assert b.status == "ok"
        # the same programs on one thread or several: equal to round-off of the energy's sums
        np.testing.assert_allclose(b.values[0]["final"]["energy"], a.values[0]["final"]["energy"], rtol=1e-12)


@pytest.mark.slow
def test_gauges_and_factors_solved_as_matrices_share_one_program_with_the_same_values():
    from attnflow.numerics import program_cache

    jobs = plan(load_experiments(["E0", "E1", "E2", "E4", "E5"]), sizes=[8], n_seeds=1)
    jobs = [job for job in jobs if job.label != "E4 m = 5"]  # E4's m = 1 is enough
    program_cache.clear()
    runs = []
    for job in jobs:
        config = job.simulation_config()
        sim, x0 = _seeds(config, job.seeds)
        tabulated = reproduce._tabulated_kernel(sim, config)
        assert type(tabulated.kernel.gauge).__name__ == "DenseGauge"
        assert type(tabulated.kernel.factor).__name__ == "MatrixFactor"
        runs.append((sim, x0, reproduce._solve_seeds(tabulated, x0, lambda units: None)))
    # identity, RoPE, dense gauges; no factor, a bias, a sign-changing cosine: one program
    assert program_cache.info()["misses"] == 1
    for sim, x0, solved in runs:
        own = solve(sim.field, x0[0], integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                    save_every=sim.save_every, key=sim.key, workers=1)  # fmt: skip
        # Q = I and w = 1 multiply exactly, the others are the same numbers tabulated: the runs
        # differ by round-off, amplified by the adaptive steps (the files' rtol, 1e-6)
        np.testing.assert_allclose(solved["xs"][:, 0], own.xs, atol=1e-6)
