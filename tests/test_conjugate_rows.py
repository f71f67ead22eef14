"""E1 against E0 seed by seed: a ``conjugate`` experiment solves each seed a second time with its
gauge taken out (E0's simulator) from its gauge frame's initial state, and ``conjugate_gap`` measures
how far the gauge frame strays from that flow (zero up to the solver's error, by conjugacy)."""

import dataclasses

import numpy as np
import pytest

import mutants
from attnflow.io.config_errors import ConfigError
from attnflow.numerics import program_cache
from attnflow.workflows import experiments, reproduce
from attnflow.workflows.build import build
from attnflow.workflows.reproduce_plan import plan


def _e1_job():
    (experiment,) = experiments.load_experiments(["E1"])
    job = next(j for j in plan([experiment], quick=True) if j.variant.name == "a")
    return experiment, dataclasses.replace(job, seeds=(0,))


def _gap_row(experiment, result):
    rows = [r for r in experiments.evaluate(experiment, [result]) if r["metric"] == "conjugate_gap"]
    assert len(rows) == 1
    return rows[0]


def test_e1_gauge_frame_is_e0_flow_from_its_initial_state():
    experiment, job = _e1_job()
    assert experiment.conjugate and job.units() == 2 * len(job.seeds) * 201  # the seeds twice
    result = reproduce.run_job(job, lambda units, stage=None: None)
    gap = result.values[0]["final"]["conjugate_gap"]
    assert 0.0 < gap <= 1e-5  # rtol 1e-7: the two runs take different steps, not different flows
    assert _gap_row(experiment, result)["status"] == "PASS"


def test_the_gap_sees_a_gauge_that_is_not_the_one_measured():
    experiment, job = _e1_job()
    with mutants.installed("Q^T for Q"):
        result = reproduce.run_job(job, lambda units, stage=None: None)
    assert result.values[0]["final"]["conjugate_gap"] > 0.1
    assert _gap_row(experiment, result)["status"] == "FAIL"


def test_the_ungauged_run_is_the_same_program_with_q_the_identity():
    _, job = _e1_job()
    config = job.simulation_config()
    sim = reproduce._tabulated_kernel(build(config), config)
    plain = reproduce._without_gauge(sim)
    assert np.array_equal(np.asarray(plain.kernel.gauge.q), np.broadcast_to(np.eye(3), (64, 3, 3)))
    assert program_cache.split_field(plain.field)[0] == program_cache.split_field(sim.field)[0]
    with pytest.raises(ValueError, match="`conjugate` needs the paper's field"):
        reproduce._without_gauge(build(config))  # a RoPE gauge, not its matrices


def test_conjugate_needs_a_gauge(tmp_path):
    text = (experiments._experiments_folder() / "E0.toml").read_text()
    path = tmp_path / "E0.toml"
    path.write_text(text.replace('shape = "Dirac"\n', 'shape = "Dirac"\nconjugate = true\n', 1))
    with pytest.raises(ConfigError, match="conjugate.*false for a run without a gauge"):
        experiments.load_experiment(path)
