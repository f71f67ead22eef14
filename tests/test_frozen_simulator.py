"""Every expectation of the reproduction can fail: a simulator that never moves fails at least one
row of every experiment and of every variant (the quick settings, in this process)."""

import sys

import numpy as np
import pytest

import attnflow.numerics.solve as solve_module
from attnflow.numerics.solve import Trajectory, snapshot_count
from attnflow.numerics.status import Status
from attnflow.workflows import experiments as experiment_files
from attnflow.workflows import realize, reproduce  # noqa: F401  (realize: patched below)


def frozen_solve(field, x0, *, t_end, save_every, on_snapshot=None, **options):
    """``solve`` of a simulator that never moves: every snapshot is ``x0``."""
    count = snapshot_count(t_end, save_every)
    ts = np.arange(count) * save_every
    x0 = np.asarray(x0)
    xs = np.broadcast_to(x0, (count, *x0.shape)).copy()
    if on_snapshot is not None:
        for k in range(count):
            on_snapshot(k, float(ts[k]), xs[k])
    batch = x0.shape[:-2]  # () for one run, (B,) for a batch of seeds
    statuses = np.full(batch, Status.ok, dtype=object)
    zeros = np.zeros(batch, dtype=int)
    return Trajectory(
        ts=ts, xs=xs, statuses=statuses, steps=0, accepted=zeros, rejected=zeros, evaluations=zeros
    )


@pytest.fixture
def frozen(monkeypatch):
    """Replace ``solve`` wherever attnflow imported it (the workflows call it by name)."""
    replaced, original = 0, solve_module.solve
    for name, module in list(sys.modules.items()):
        if name.startswith("attnflow.") and getattr(module, "solve", None) is original:
            monkeypatch.setattr(module, "solve", frozen_solve)
            replaced += 1
    assert replaced >= 3  # numerics.solve itself, the simulated experiments, the realisations


@pytest.mark.slow
def test_a_frozen_simulator_fails_a_row_of_every_experiment_and_variant(frozen):
    experiments = experiment_files.load_experiments()
    jobs = reproduce.plan(experiments, quick=True)
    results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=1)
    # the frozen runs themselves finished: a failure must come from the expectations, not an error
    assert all(r.status == "ok" for r in results), [(r.experiment, r.status, r.reason) for r in results]
    for experiment in experiments:
        rows = experiment_files.evaluate(experiment, [r for r in results if r.experiment == experiment.id])
        for variant in experiment.variants:
            statuses = [row["status"] for row in rows if row["variant"] == variant.name]
            assert statuses, (experiment.id, variant.name)
            assert "FAIL" in statuses, f"{experiment.id} {variant.name or ''}: every row passes frozen"


# The claim each attention experiment's variants make, which a simulator that never moves must fail
# (not only a side row): the first token's point reached, the logit axis, E rising or falling, the orbit.
LAYER_CLAIMS = {
    ("E10", "random"): "first_token_distance",
    ("E10", "identity"): "first_token_distance",
    ("E10", "strict"): "first_token_distance",
    ("E11", "gradient"): "qk_axis_alignment",
    ("E11", "gaussian"): "energy_max_decrease",
    ("E12", ""): "first_token_distance",
    ("E13", ""): "orbit_residual",
}


def test_a_frozen_simulator_fails_the_claim_of_every_attention_experiment(frozen):
    experiments = experiment_files.load_experiments(sorted({eid for eid, _ in LAYER_CLAIMS}))
    assert {(e.id, v.name) for e in experiments for v in e.variants} == set(LAYER_CLAIMS)
    results = reproduce.run_jobs(reproduce.plan(experiments, quick=True), lambda units, stage=None: None)
    assert all(r.status == "ok" for r in results), [(r.experiment, r.status, r.reason) for r in results]
    for experiment in experiments:
        rows = experiment_files.evaluate(experiment, [r for r in results if r.experiment == experiment.id])
        for variant in experiment.variants:
            failed = [r["metric"] for r in rows if r["variant"] == variant.name and r["status"] == "FAIL"]
            assert LAYER_CLAIMS[experiment.id, variant.name] in failed, (experiment.id, variant.name, failed)
