"""Plateau lifetimes measured on the E6 setting at several β (workflows.metastability): the slope of
log T against β is positive and explains the data, lifetimes follow the barrier β (1 − cos δ) with
slope ~1, and merges join the two closest clusters."""

import math

import numpy as np
import pytest

from attnflow.analysis.plateaus import is_metastable
from attnflow.workflows.metastability import lifetime_rows, lifetime_study

BETAS = (2.0, 3.0, 4.0, 5.0)


@pytest.fixture(scope="module")
def study():
    # n = 32, 8 seeds, rescaled time 5000 (2000 samples): 72 plateaus, 32 metastable, 37 merges
    return lifetime_study(BETAS, n=32, seeds=range(8), s_end=5000.0, samples=2000)


def test_log_lifetime_grows_linearly_with_beta(study):
    fit = study.fits.beta  # plateaus with 2 clusters
    assert fit.points >= 12  # enough plateaus for a slope
    assert fit.slope - 2.0 * fit.slope_stderr > 0.0  # positive at two standard errors
    assert fit.r2 >= 0.3  # 0.44 here: per-plateau scatter, the angle between the clusters varies by seed


def test_lifetimes_follow_the_barrier_with_slope_one(study):
    """T ≈ C e^{β (1 − cos δ)}: the slope against the barrier is 1 within 0.4 (the angle δ is taken at
    the middle of the plateau and drifts; prefactors depend on the cluster masses), r² >= 0.6."""
    fit = study.fits.barrier
    assert fit.points >= 25
    assert abs(fit.slope - 1.0) <= 0.4 and fit.r2 >= 0.6


def test_merges_join_the_closest_clusters(study):
    assert study.merges >= 20
    assert study.closest_fraction >= 0.85  # 36/37 at this size; the exceptions are near-ties


def test_rows_are_one_per_plateau_with_consistent_times(study):
    rows = lifetime_rows(study.runs)
    assert len(rows) == sum(len(run.plateaus) for run in study.runs)
    assert {row["beta"] for row in rows} == set(BETAS)
    for row, plateau in zip(rows, [p for run in study.runs for p in run.plateaus], strict=True):
        assert 0.0 < row["entry"] < row["exit"] <= 5000.0 + 1e-9
        assert row["lifetime"] == pytest.approx(row["exit"] - row["entry"])
        assert math.log(row["exit"] / row["entry"]) >= 0.1  # MIN_LENGTH e-folds
        assert row["metastable"] == is_metastable(plateau)
    # plateaus of one seed follow each other and their energies rise (merges raise E)
    for run in study.runs:
        exits = [p.exit for p in run.plateaus]
        entries = [p.entry for p in run.plateaus]
        assert all(a < b for a, b in zip(exits, entries[1:], strict=False))
        assert np.all(np.diff([p.energy for p in run.plateaus]) > 0)
