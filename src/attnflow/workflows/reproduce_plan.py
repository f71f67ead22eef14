"""Planning a reproduce run: one job per (experiment, variant, n), the command-line parsers.

A :class:`Job` is one batch of seeds of an experiment's variant at one size; :func:`plan` lists
them (checking that every metric an experiment names is measured, :data:`attnflow.io.outcomes.METRICS`
or :data:`attnflow.workflows.reproduce_measure.LAYER_METRICS` or ``CONJUGATE_METRICS`` or
:data:`attnflow.workflows.reproduce_rates.THEORY_METRICS`);
:func:`structure_key` says which jobs can share one compiled program.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence

from attnflow.io.outcomes import METRICS
from attnflow.numerics.solve import snapshot_count
from attnflow.workflows.density_particles import DENSITY_METRICS
from attnflow.workflows.experiments import Experiment, Variant, experiment_ids
from attnflow.workflows.reproduce_measure import CONJUGATE_METRICS, LAYER_METRICS
from attnflow.workflows.reproduce_rates import THEORY_METRICS

# every name an expectation may use
MEASURED = {**METRICS, **LAYER_METRICS, **THEORY_METRICS, **CONJUGATE_METRICS, **DENSITY_METRICS}

__all__ = ["Job", "parse_only", "parse_sizes", "plan", "structure_key"]


@dataclasses.dataclass(frozen=True)
class Job:
    """One batch of seeds: an experiment's variant at one size."""

    experiment: Experiment
    variant: Variant
    n: int
    seeds: tuple[int, ...]
    quick: bool
    overrides: tuple[str, ...] = ()  # config overrides of every simulation, e.g. ("solver.method=rk4",)

    def simulation_config(self):
        """The validated config of this job's simulation (seed 0)."""
        return self.experiment.simulation_config(
            self.variant, self.n, quick=self.quick, overrides=self.overrides
        )

    @property
    def label(self) -> str:
        return " ".join(part for part in (self.experiment.id, self.variant.label) if part)

    def cost(self) -> float:
        """Relative run time, ``steps · seeds · n²`` (the interaction is ``O(n²)`` per step)."""
        if self.experiment.kind == "simulate":
            solver = self.simulation_config().solver
            t_end, dt = solver.t_end, solver.dt
        else:
            p = self.experiment.realize_parameters(quick=self.quick)
            t_end, dt = p.get("t_end", 40.0), p.get("dt", 0.01)
        return t_end / dt * len(self.seeds) * self.n**2 * (2 if self.experiment.conjugate else 1)

    def units(self) -> int:
        """Progress units: snapshots of each seed of a simulation (twice for a ``conjugate`` one), or
        seeds of a realisation."""
        if self.experiment.kind != "simulate":
            return len(self.seeds)
        solver = self.simulation_config().solver
        runs = 2 if self.experiment.conjugate else 1
        return snapshot_count(solver.t_end, solver.save_every) * len(self.seeds) * runs


# The factors as reproduce solves them (a matrix, ``reproduce._tabulated_kernel``; its sign is
# structure only for the ``sa`` normalisation).
_FACTOR_STRUCTURE = {"none": "matrix", "distance_bias": "matrix", "toeplitz_cos": "matrix", "file": "matrix"}
# Numbers that are arguments of the compiled program (or only set the initial state), not structure.
_NUMBERS = {"model": ("beta",), "solver": ("dt", "t_end", "save_every", "rtol", "atol")}


def structure_key(job: Job) -> tuple:
    """What decides a job's compiled programs: the size, the model's options, the solver's options
    (every gauge is solved as its matrices and every factor as a matrix). Jobs with equal keys share
    their compilations when they run in one process; a key finer or coarser than the programs'
    only costs a compilation, never a result."""
    if job.experiment.kind != "simulate":
        return (job.experiment.kind, job.n)
    config = job.simulation_config()
    model = config.model.model_dump(exclude=set(_NUMBERS["model"]))
    solver = config.solver.model_dump(exclude=set(_NUMBERS["solver"]))
    factor = config.factor.kind
    return (
        "simulate",
        job.n,
        tuple(sorted(model.items())),
        _FACTOR_STRUCTURE.get(factor, factor),
        tuple(sorted((k, repr(v)) for k, v in solver.items())),
    )


def parse_only(only: str | None) -> list[str] | None:
    """``"E1,E3"`` → ``["E1", "E3"]``, checked against the packaged experiments."""
    if only is None:
        return None
    ids, wanted = experiment_ids(), [part.strip() for part in only.split(",") if part.strip()]
    for item in wanted or [only]:
        if item not in ids:
            close = difflib.get_close_matches(item, ids, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"reproduce: `--only` must be a comma-separated list of experiment ids "
                f"({', '.join(ids)}); got {item!r}.{hint}"
            )
    return wanted


def parse_sizes(sizes: str | None) -> list[int] | None:
    """``"32,64"`` → ``[32, 64]`` (the hidden testing option ``--sizes``)."""
    if sizes is None:
        return None
    try:
        values = [int(part) for part in sizes.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(n < 2 for n in values):
        raise ValueError(f"reproduce: `--sizes` must be comma-separated token counts >= 2; got {sizes!r}.")
    return values


def plan(
    experiments: Sequence[Experiment],
    *,
    quick: bool = False,
    sizes: Sequence[int] | None = None,
    n_seeds: int | None = None,
    overrides: Sequence[str] = (),
) -> list[Job]:
    """One job per (experiment, variant, n). ``sizes``/``n_seeds`` override the files (testing);
    ``overrides`` (``key=value``) apply to every simulation (e.g. ``solver.method=rk4``: the fixed
    steps of the files' ``dt``)."""
    if sizes is not None and (not sizes or any(int(n) < 2 for n in sizes)):
        raise ValueError(f"reproduce: `--sizes` must be token counts >= 2; got {list(sizes)!r}.")
    if n_seeds is not None and n_seeds < 1:
        raise ValueError(f"reproduce: `--seeds` must be a positive number of seeds; got {n_seeds!r}.")
    jobs = []
    for experiment in experiments:
        named = [e.metric for e in experiment.expect] + [
            e.bound_metric for e in experiment.expect if e.bound_metric
        ]
        unknown = [m for m in (*named, *experiment.report_metrics) if m not in MEASURED]
        if unknown:
            raise ValueError(f"{experiment.source}: `expect.metric` and `report_metrics` must name values of "
                             f"{sorted(MEASURED)}; got {unknown[0]!r}.")  # fmt: skip
        chosen = experiment.quick if quick else experiment
        seeds = tuple(chosen.seeds)[:n_seeds] if n_seeds is not None else tuple(chosen.seeds)
        for n in tuple(sizes) if sizes is not None else chosen.sizes:
            for variant in experiment.variants:
                jobs.append(Job(experiment, variant, int(n), seeds, quick, tuple(overrides)))
    return jobs
