"""Reproduce the paper's experiments: run the jobs, check the expectations, write the report.

The experiments are data (:mod:`attnflow.workflows.experiments`). :func:`reproduce` plans one *job*
per (experiment, variant, n) (:mod:`attnflow.workflows.reproduce_plan`), runs it, measures every
value an expectation can name (:mod:`attnflow.workflows.reproduce_measure`,
:data:`attnflow.io.outcomes.METRICS`), checks the expectations with the generic
:func:`attnflow.workflows.experiments.evaluate` and hands the outcome to :mod:`attnflow.viz.report`
(``results.json``, ``report.md``, ``report.html``, figures).

- Seeds are batched: a job builds its :class:`~attnflow.workflows.build.Simulation` once (labels, gauges and
  factors do not depend on the seed), stacks the seeds' initial data ``x0 (B, n, d)`` and calls
  :func:`~attnflow.numerics.solve.solve` once with the batch — one compilation per job, none per seed.
- Jobs run in up to two single-threaded worker processes, longest first (:func:`run_jobs`, through
  :mod:`attnflow.numerics.batch`): XLA runs one small simulation on one core, and threads in one
  process only contend. Those processes run their batches themselves (``ATTNFLOW_CORES=1``).
- Realisation experiments (``kind = "realize_orbit" | "realize_sphere"``) call
  :mod:`attnflow.workflows.realize` once per seed.
- The analytic factors are evaluated once as a matrix for the dense interaction
  (:func:`_with_factor_matrix`, the factor's ``tabulated``): same values, a cheaper step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.laws import VonMisesMixture, quadrature_cdf, spherical_mixture_samples
from attnflow.analysis.theory import energy_max
from attnflow.io.config import Config
from attnflow.io.outcomes import FigureData, JobResult, Outcome
from attnflow.numerics import batch
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.solve import solve
from attnflow.workflows import realize
from attnflow.workflows.build import Simulation, build, make_initial
from attnflow.workflows.experiments import evaluate, load_experiments
from attnflow.workflows.reproduce_measure import (
    householder_frame,
    json_value,
    measure,
    orbit_frame,
    trajectory_states,
)
from attnflow.workflows.reproduce_plan import Job, plan

Tick = Callable[[int], None]


def _with_seed(config: Config, seed: int) -> Config:
    return config.model_copy(update={"init": config.init.model_copy(update={"seed": seed})})


def _with_factor_matrix(sim: Simulation, config: Config) -> Simulation:
    """The same simulation with the factor evaluated once, as a matrix (the factor's ``tabulated``),
    when the interaction is exact and dense anyway (no row blocks, no expansion). The analytic
    factors recompute ``w`` at every field evaluation (an ``n × n`` cos or exp); a table is read."""
    factor = sim.kernel.factor.tabulated()
    if factor is sim.kernel.factor or sim.block_size is not None or sim.interaction != "exact":
        return sim
    kernel = dataclasses.replace(sim.kernel, factor=factor)
    model = config.model
    field = make_vector_field(
        kernel, normalization=model.normalization, causal=model.causal, value=model.value, block_size=None
    )
    return dataclasses.replace(sim, kernel=kernel, field=field)


def _step_totals(trajectory) -> dict[str, int]:
    """The job's step statistics summed over its seeds (accepted, rejected, field evaluations)."""
    names = ("steps_accepted", "steps_rejected", "evaluations")
    values = (trajectory.accepted, trajectory.rejected, trajectory.evaluations)
    return {name: int(np.sum(v)) for name, v in zip(names, values, strict=True) if v is not None}


def _simulate(job: Job, tick: Tick) -> JobResult:
    start = time.perf_counter()
    config = job.simulation_config()
    sim = build(config)
    e_max = energy_max(sim.kernel)  # from the analytic factor (the theory dispatches on its type)
    sim = _with_factor_matrix(sim, config)
    x0 = jnp.stack([make_initial(_with_seed(config, s), sim.kernel.gauge, sim.x0.dtype) for s in job.seeds])
    stamps = []

    def on_snapshot(k: int, t: float, x: np.ndarray) -> None:
        stamps.append(time.perf_counter())
        tick(1)

    solve_start = time.perf_counter()
    # The seeds of a job run in this process (workers=1): the jobs are what runs in parallel
    # (run_jobs), and a process keeps its compiled programs for the next job of the same shapes.
    trajectory = solve(
        sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end, save_every=sim.save_every,
        noise=sim.noise, key=sim.key, on_snapshot=on_snapshot, workers=1,
    )  # fmt: skip
    solve_end = time.perf_counter()
    tick(job.units() - len(stamps))  # a run that stopped early
    # the solver's own compile time (0 when its program was compiled by an earlier job of this process)
    compile_s = float(trajectory.compile_time_s)
    xs = trajectory.xs if trajectory.xs.ndim == 4 else trajectory.xs[:, None]
    values, figure = measure(sim, trajectory.ts, xs, job.seeds, job.experiment, e_max=e_max)
    end = time.perf_counter()
    timing = {
        "wall_s": end - start,
        "build_s": solve_start - start,
        "compile_s": compile_s,
        "run_s": solve_end - solve_start - compile_s,
        "measure_s": end - solve_end,
        "steps": trajectory.steps,
        **_step_totals(trajectory),
    }
    reason = "" if trajectory.status == "ok" else f"solver stopped: {trajectory.status}"
    return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, trajectory.status,
                     reason, values, timing, figure)  # fmt: skip


def _realize(job: Job, tick: Tick) -> JobResult:
    p = job.experiment.realize_parameters(quick=job.quick)
    n, start, values, figure = job.n, time.perf_counter(), [], FigureData(beta=float(p.get("beta", 1.0)))
    common = {key: p[key] for key in ("beta", "t_end", "dt", "save_every") if key in p}
    if job.experiment.kind == "realize_orbit":
        law = VonMisesMixture(p["weights"], p["kappas"], p["mus"])
        independent_cdf = quadrature_cdf(law.pdf)  # not the series CDF whose inverse made the targets
        target = np.asarray(law.ppf((np.arange(n) + 0.5) / n), dtype=float)
    else:
        targets = np.asarray(spherical_mixture_samples(p.get("target_seed", 0), n), dtype=float)
        v0 = np.asarray(p.get("v0", (0.0, 0.0, 1.0)), dtype=float)
        sphere_options = {key: p[key] for key in ("gauge", "sigma") if key in p}
    for i, seed in enumerate(job.seeds):
        if job.experiment.kind == "realize_orbit":
            result = realize.realize_orbit(law, n=n, seed=seed, **common)
            angles = np.asarray(result.relative_angles, dtype=float)
            measured = {
                "circular_ks": metrics.circular_ks(angles, independent_cdf),
                "ks_bound": 1.0 / (2 * n),
                "orbit_residual": float(result.orbit_residual),
            }
            shown = (target, angles)
        else:
            result = realize.realize_sphere(targets, v0=v0, seed=seed, **sphere_options, **common)
            x, u_star = np.asarray(result.x, dtype=float), np.asarray(result.u_star, dtype=float)
            gap = float(np.linalg.norm(u_star - v0))
            measured = {
                "max_target_distance": float(np.max(np.linalg.norm(x - targets, axis=1))),
                "base_point_distance": gap,
                "twice_base_point_distance": 2.0 * gap,
                "orbit_residual_reported": json_value(getattr(result, "orbit_residual", None)),
            }
            shown = (targets, x)
        measured.update(
            distance_reported=json_value(result.distance),
            bound_reported=json_value(result.bound),
            wasserstein=json_value(getattr(result, "wasserstein", None)),
        )
        values.append({"seed": seed, "final": {k: json_value(v) for k, v in measured.items()}})
        if i == 0:
            kind = "orbit" if job.experiment.kind == "realize_orbit" else "sphere"
            figure.target = (kind, *shown)
            states = trajectory_states(result.trajectory, float(p.get("t_end", 40.0)))
            for label, x_k in states.items():
                if kind == "sphere":
                    u_k = householder_frame(x_k, targets, v0)
                else:
                    u_k = orbit_frame(x_k, target, np.asarray(result.x))
                figure.states[label] = (x_k, u_k)
        tick(1)
    timing = {"wall_s": time.perf_counter() - start, "build_s": 0.0, "compile_s": 0.0,
              "run_s": time.perf_counter() - start, "measure_s": 0.0, "steps": 0}  # fmt: skip
    return JobResult(job.experiment.id, job.variant.name, job.label, n, job.seeds, "ok", "", values, timing,
                     figure)  # fmt: skip


def run_job(job: Job, tick: Tick) -> JobResult:
    """Run one job; a failure inside it is recorded as status "error" (its expectations then fail)."""
    try:
        return _simulate(job, tick) if job.experiment.kind == "simulate" else _realize(job, tick)
    except Exception as error:  # noqa: BLE001 - one broken experiment must not hide the others
        return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, "error",
                         f"{type(error).__name__}: {error}")  # fmt: skip


def _run_quietly(job: Job) -> JobResult:
    return run_job(job, lambda units: None)


def default_workers() -> int:
    """Worker processes: one per available core, at most 2 (1 on an accelerator)."""
    return 1 if jax.default_backend() != "cpu" else batch.worker_count(2, None, where="reproduce")


def run_jobs(jobs: Sequence[Job], tick: Tick, *, workers: int = 1) -> list[JobResult]:
    """Run the jobs, in this process or in ``workers`` single-threaded processes, longest first
    (:mod:`attnflow.numerics.batch`); progress then advances per finished job."""
    if workers <= 1 or len(jobs) <= 1:
        return [run_job(job, tick) for job in jobs]
    results: list[JobResult | None] = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].cost())
    for index, result in batch.run_tasks(_run_quietly, [(jobs[i],) for i in order], workers=workers):
        results[order[index]] = result
        tick(jobs[order[index]].units())
    return results


def reproduce(
    out_dir: str | Path,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    n_seeds: int | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    overrides: Sequence[str] = (),
) -> Outcome:
    """Run the experiments, evaluate every expectation, write the report into ``out_dir``.

    ``overrides`` (``key=value``) apply to every simulated run, e.g. ``("solver.method=rk4",)``
    for fixed steps of each file's ``dt`` (benchmarks compare it with the files' settings).

    ``workers``: processes that run jobs (default :func:`default_workers`; 1 runs everything here).
    """
    from attnflow.viz import report  # matplotlib is imported only when a report is written

    start = time.perf_counter()
    experiments = load_experiments(only)
    jobs = plan(experiments, quick=quick, sizes=sizes, n_seeds=n_seeds, overrides=overrides)
    total, done = sum(job.units() for job in jobs), 0

    def tick(units: int) -> None:
        nonlocal done
        done += units
        if progress is not None:
            progress(done, total)

    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"reproduce: `--workers` must be a positive number of processes; got {workers!r}.")
    results = run_jobs(jobs, tick, workers=workers)
    rows = [row for e in experiments for row in evaluate(e, [r for r in results if r.experiment == e.id])]
    outcome = Outcome(experiments, results, rows, quick, time.perf_counter() - start)
    report.write_report(Path(out_dir), outcome)
    outcome.wall_s = time.perf_counter() - start
    return outcome
