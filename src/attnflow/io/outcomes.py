"""The records of a reproduce run, written by :mod:`attnflow.workflows.reproduce` and read by the
report (:mod:`attnflow.viz.report`) and the evaluator of expectations.

- :data:`METRICS`: every value a job measures for each seed, with its meaning (the names an
  experiment file's expectations may use);
- :func:`time_label`: the key of the values measured at a time (``"final"``, ``"t=20"``);
- :class:`FigureData`, :class:`JobResult`: what one job measured and what the report draws;
- :class:`Outcome`: a whole run (experiments, jobs, expectation rows, wall time).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["METRICS", "MEAN_COSINE_TOL", "FigureData", "JobResult", "Outcome", "time_label"]

MEAN_COSINE_TOL = 1e-12  # "mean_cosine non-decreasing" allows this much round-off between snapshots

# Every value a job measures for each seed (``final`` and each report time), with its meaning.
METRICS = {
    **{key: "diagnostic of attnflow.analysis.metrics / summary" for key in (
        "mean_cosine", "resultant_deficit", "min_cosine", "n_clusters", "n_eff", "gauge_mean_cosine",
        "gauge_resultant_deficit", "orbit_residual", "conditional_spread", "marginal_spread",
        "azimuth_uniformity", "planarity", "energy", "energy_max", "energy_gap", "energy_monotone",
        "collapse_time", "gauge_collapse_time")},
    "gauge_n_clusters": "n_clusters of the gauge frame u_i = Q(xi_i) x_i",
    "gauge_n_eff": "n_eff of the gauge frame",
    "energy_max_decrease": "largest drop of E between saved times",
    "mean_cosine_monotone": f"mean_cosine non-decreasing over saved times (tolerance {MEAN_COSINE_TOL:g})",
    "mean_cosine_max_decrease": "largest drop of mean_cosine between saved times",
    "std_x3": "standard deviation over tokens of the third coordinate x_3",
    "u_star_3": "|u*_3|, u* = normalise(mean of the gauge frame)",
    "circle_deficit": "1 - |u*_3| (the value of 1 - |m| on a uniform latitude circle)",
    "circle_azimuth_uniformity": "azimuth_uniformity about the least singular direction of X",
    "latitude_oscillations": "local maxima of x_3 along the token order (cyclic)",
    "circular_ks": "circular KS distance of the relative angles to the target law",
    "ks_bound": "1 / (2n)",
    "orbit_residual_reported": "orbit_residual reported by realize",
    "distance_reported": "realisation distance reported by realize",
    "bound_reported": "bound reported by realize",
    "wasserstein": "W1 (geodesic) between realised points and target samples, reported by realize",
    "max_target_distance": "max_i |x_i - g(xi_i)|",
    "base_point_distance": "|u* - v_0|",
    "twice_base_point_distance": "2 |u* - v_0|",
    "n_plateaus": "plateaus of the energy staircase up to the time (attnflow.analysis.plateaus)",
    "plateau_longest": "longest plateau lifetime (exit - entry, the run's time unit; 0 without plateau)",
    "plateau_first_entry": "entry time of the first plateau (when the first clusters have formed)",
    "plateau_last_lifetime": "lifetime of the last plateau (the state the run ends in, censored at its end)",
}  # fmt: skip


def time_label(t: float | None) -> str:
    """Key of the values measured at time ``t`` (``"final"`` for the last snapshot)."""
    return "final" if t is None else f"t={t:g}"


@dataclasses.dataclass
class FigureData:
    """What the report draws for one job: the first seed's states and series, all seeds' series."""

    color: np.ndarray | None = None
    states: dict[str, tuple[np.ndarray, np.ndarray | None]] = dataclasses.field(default_factory=dict)
    series: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    seed_series: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # (B, T) each
    beta: float = 1.0
    target: tuple[str, np.ndarray, np.ndarray] | None = None  # (kind, target, realised)
    density: tuple[np.ndarray, np.ndarray] | None = None  # the target law's (angles, pdf) on a grid


@dataclasses.dataclass
class JobResult:
    experiment: str
    variant: str
    label: str
    n: int
    seeds: tuple[int, ...]
    status: str  # "ok" | "nonfinite" | "max_steps" | "skipped" | "error"
    reason: str = ""
    values: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # per seed
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    figure: FigureData = dataclasses.field(default_factory=FigureData)


@dataclasses.dataclass
class Outcome:
    """Everything :mod:`attnflow.viz.report` writes: the experiments (``Experiment`` records of
    :mod:`attnflow.workflows.experiments`), the jobs' results and the expectation rows."""

    experiments: list[Any]
    jobs: list[JobResult]
    rows: list[dict[str, Any]]
    quick: bool
    wall_s: float

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["status"] == "FAIL"]
