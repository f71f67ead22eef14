"""The energy along the equiangular reduction (E14's energy rows): the closed form against the energy
of equiangular tokens, and the rows against a real and a wrong simulator."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import mutants
from attnflow.analysis import theory
from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import summation
from attnflow.workflows import experiments, reproduce
from attnflow.workflows.reproduce_plan import plan


@pytest.mark.parametrize(
    ("rho", "beta", "time_scale"), [(0.1, 1.0, "plain"), (-0.2, 4.0, "plain"), (0.7, 2.0, "rescaled")]
)
def test_the_closed_form_is_the_energy_of_equiangular_tokens(rho, beta, time_scale):
    n = 5
    gram = (1.0 - rho) * np.eye(n) + rho * np.ones((n, n))  # positive definite for rho > -1/(n - 1)
    x = np.linalg.cholesky(gram)  # rows: unit vectors with pairwise cosines rho
    profile = make_profile("exp", beta=beta, time_scale=time_scale)
    kernel = Kernel(gauges.IdentityGauge(n=n, d=n), factors.NoFactor(n=n), profile)
    measured = float(summation.energy(kernel, jnp.asarray(x)))
    closed = float(theory.equiangular_energy(rho, n=n, beta=beta, c=float(profile.c)))
    assert abs(measured / closed - 1.0) <= 1e-14  # a sum of n^2 exponentials: round-off


def _rows(experiment, result):
    return [
        r for r in experiments.evaluate(experiment, [result]) if r["metric"] == "equiangular_energy_error"
    ]


def test_the_energy_rows_pass_the_real_flow_and_fail_a_clock_at_double_speed():
    (experiment,) = experiments.load_experiments(["E14"])
    job = next(j for j in plan([experiment], quick=True) if j.variant.name == "usa")
    real = reproduce.run_job(job, lambda units, stage=None: None)
    rows = _rows(experiment, real)
    assert [r["at"] for r in rows] == ["t=1", "t=2"]
    assert all(
        r["status"] == "PASS" and r["measured"] <= 1e-10 for r in rows
    )  # <= 1.1e-11 measured (every variant)
    with mutants.installed("time x 2"):
        wrong = reproduce.run_job(dataclasses.replace(job), lambda units, stage=None: None)
    rows = _rows(experiment, wrong)
    assert (
        all(r["status"] == "FAIL" for r in rows) and rows[0]["measured"] > 1e-2
    )  # 0.059 and 2.9e-4 measured
