"""Reproduce the paper's experiments: run the jobs, check the expectations, write the report.

The experiments are data (:mod:`attnflow.workflows.experiments`). :func:`reproduce` plans one *job*
per (experiment, variant, n) (:mod:`attnflow.workflows.reproduce_plan`), runs it, measures every
value an expectation can name (:mod:`attnflow.workflows.reproduce_measure`,
:data:`attnflow.io.outcomes.METRICS`), checks the expectations with the generic
:func:`attnflow.workflows.experiments.evaluate` and hands the outcome to :mod:`attnflow.viz.report`
(``results.json``, ``report.md``, ``report.html``, figures).

- One compiled program per structure of the problem, shared by every job of that structure: a job
  builds its :class:`~attnflow.workflows.build.Simulation` once (labels, gauges and factors do not
  depend on the seed) and solves its seeds one by one on a CPU (:func:`_solve_seeds`), so that jobs
  of different seed counts (E6 has more) reuse the same unbatched program
  (:mod:`attnflow.numerics.program_cache`; each run is bitwise the run of a CPU batch); on an
  accelerator the seeds are one batch (``vmap``).
- Jobs run in up to two single-threaded worker processes (:func:`run_jobs`, through
  :mod:`attnflow.numerics.batch`; the quick run's in this process, :func:`default_workers`): XLA
  runs one small simulation on one core, and threads in one process only contend. The jobs of one
  structure (:func:`structure_key`) go to the same process, in order, so that one compilation
  serves them all; the groups run longest first, and the processes share the persistent
  compilation cache of this one when it has one.
- Realisation experiments (``kind = "realize_orbit" | "realize_sphere"``) are batched too: one
  construction with the seeds' initial data stacked, one
  :func:`~attnflow.workflows.realize.realize_batch` call (each seed bitwise as if run alone). Their
  values are measured from the final state, and the gauge frame's collapse rate from the snapshots
  (:func:`~attnflow.workflows.reproduce_rates.realisation_rate_ratio`: it sees β and the clock).
- The folder (:mod:`attnflow.io.reproduce_folder`): a new or empty one, or with ``resume`` /
  ``overwrite`` an earlier reproduce folder (never one holding other files). Each experiment is
  recorded there as soon as its jobs have finished, so that Ctrl-C (:class:`ReproduceInterrupted`)
  loses only the experiments still running; ``resume`` runs the experiments not yet recorded,
  with the settings of the folder's run, and the report covers every recorded experiment.
- The solver and the energies see every kernel in one form (:func:`_tabulated_kernel`): the gauge
  as its matrices ``Q(ξ_i)`` (the identity too), the factor as its matrix ``w`` (``w = 1`` too), for
  the dense interaction. The same values (the analytic factors then cost no ``n × n`` cos or exp
  per evaluation), and the jobs of E0-E6 share one compiled program per size, whatever
  their gauge and factor (the numbers are the program's arguments); measurement and figures keep
  the experiment's own kernel (a gauge frame only where there is a gauge).
- Layer norms: an experiment file may set ``model.layer_norm`` (E15: :func:`_own_layer_norm`); one
  set only by ``overrides`` is refused by ``build`` in one line. The tabulated field keeps the norm
  around it, and the states ``z = r x`` of pre- and peri-LN runs are measured as their directions
  and radii.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics, realisation
from attnflow.analysis.laws import VonMisesMixture, quadrature_cdf, spherical_mixture_samples
from attnflow.analysis.theory import energy_max
from attnflow.core.factors import MatrixFactor, NoFactor
from attnflow.core.gauges import DenseGauge
from attnflow.io import reproduce_folder
from attnflow.io.config import Config
from attnflow.io.outcomes import FigureData, JobResult, Outcome, time_label
from attnflow.numerics import batch, placement, program_cache
from attnflow.numerics.dynamics import AttentionField, make_vector_field
from attnflow.numerics.layer_norms import LayerNormField
from attnflow.numerics.solve import solve
from attnflow.workflows import density_particles, realize
from attnflow.workflows.build import Simulation, build, make_initial
from attnflow.workflows.experiments import evaluate, experiment_ids, load_experiments
from attnflow.workflows.reproduce_measure import (
    householder_frame,
    json_value,
    measure,
    orbit_frame,
    trajectory_states,
)
from attnflow.workflows.reproduce_plan import Job, plan, structure_key
from attnflow.workflows.reproduce_rates import realisation_rate_ratio

Tick = Callable[..., None]  # tick(units) as snapshots are done; tick(0, stage="measuring") then


def _with_seed(config: Config, seed: int) -> Config:
    return config.model_copy(update={"init": config.init.model_copy(update={"seed": seed})})


@jax.jit
def _tables(kernel):
    """``(Q(ξ_i) (n, d, d), w (n, n))`` of a kernel, by one compiled program per structure."""
    q = kernel.gauge.matrices()
    factor = kernel.factor.tabulated()
    w = jnp.ones((kernel.factor.n,) * 2, q.dtype) if isinstance(factor, NoFactor) else factor.w
    return q, w.astype(q.dtype)


def _tabulated_kernel(sim: Simulation, config: Config) -> Simulation:
    """The same simulation with its kernel tabulated: the gauge as ``DenseGauge`` of its matrices,
    the factor as ``MatrixFactor`` (``w = 1`` for no factor), when the interaction is exact and
    dense anyway (no row blocks, no expansion). Same values (``Q = I`` and ``w = 1`` multiply
    exactly); one structure for every gauge and factor, so one compiled program. The factor's
    ``nonnegative`` flag (structure) is kept only where it is used, by the ``sa`` normalisation
    (softmax weights): elsewhere it says nothing about the field, and is False for every factor."""
    if sim.block_size is not None or sim.interaction != "exact":
        return sim
    norm = sim.field if isinstance(sim.field, LayerNormField) else None
    layer = sim.field if norm is None else norm.layer
    if hasattr(layer, "heads") or config.model.sources:  # a layer of heads, or held sources: as built
        return sim
    q, w = _tables(sim.kernel)
    nonnegative = config.model.normalization == "sa" and sim.kernel.factor.nonnegative
    factor = MatrixFactor(w=w, nonnegative=nonnegative)
    kernel = dataclasses.replace(sim.kernel, gauge=DenseGauge(q=q), factor=factor)
    model = config.model
    field = make_vector_field(
        kernel, normalization=model.normalization, causal=model.causal, value=model.value, block_size=None
    )
    if norm is not None:  # the same layer norm around the tabulated field
        field = dataclasses.replace(norm, layer=field)
    return dataclasses.replace(sim, kernel=kernel, field=field)


def _solve_seeds(sim: Simulation, x0: jax.Array, tick: Tick) -> dict:
    """The seeds ``x0 (B, n, d)`` of a job solved with ``sim``: one run at a time on a CPU (the
    unbatched program, shared with every job of the same structure whatever its seed count), one
    batch on an accelerator. Returns ``ts``, ``xs (T, B, n, d)`` (a run that stopped early is NaN
    after its last snapshot), the first status that is not ok, the step statistics summed over the
    seeds and the compile time."""
    options = dict(integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end, save_every=sim.save_every,
                   noise=sim.noise, workers=1, max_steps=sim.max_steps)  # fmt: skip
    if placement.current().vmap_batches:
        runs = [solve(sim.field, x0, key=sim.key, on_snapshot=lambda k, t, x: tick(len(x)), **options)]
    else:  # run b draws its noise from split(key, B)[b], as in a batch
        keys = jax.random.split(sim.key, x0.shape[0])
        runs = [solve(sim.field, x0[b], key=keys[b], on_snapshot=lambda k, t, x: tick(1), **options)
                for b in range(x0.shape[0])]  # fmt: skip
    length = max(len(run.ts) for run in runs)

    def padded(xs):  # (T, n, d) or (T, B, n, d) -> (length, B, n, d)
        xs = xs if xs.ndim == 4 else xs[:, None]
        return np.concatenate([xs, np.full((length - len(xs), *xs.shape[1:]), np.nan, xs.dtype)])

    statuses = [status for run in runs for status in np.ravel(run.statuses)]
    totals = {}
    for name in ("accepted", "rejected", "evaluations"):
        values = [getattr(run, name) for run in runs]
        if all(v is not None for v in values):
            key = "evaluations" if name == "evaluations" else f"steps_{name}"
            totals[key] = int(sum(np.sum(v) for v in values))
    return {
        "ts": max((run.ts for run in runs), key=len),
        "xs": np.concatenate([padded(run.xs) for run in runs], axis=1),
        "status": next((s for s in statuses if s != "ok"), statuses[0]),
        "steps": max(run.steps for run in runs),
        "totals": totals,
        # the solver's own compile time (0 when its program was compiled by an earlier job)
        "compile_s": float(sum(run.compile_time_s for run in runs)),
    }


def _without_gauge(sim: Simulation) -> Simulation:
    """A tabulated simulation (:func:`_tabulated_kernel`) with ``Q = I`` for every token: the same
    structure, so the same compiled program."""
    gauge = sim.kernel.gauge
    if not isinstance(gauge, DenseGauge) or type(sim.field) is not AttentionField:
        raise ValueError("reproduce: `conjugate` needs the paper's field with its gauge as matrices "
                         "(no heads, no row blocks, no expansion)")  # fmt: skip
    eye = jnp.broadcast_to(jnp.eye(gauge.q.shape[-1], dtype=gauge.q.dtype), gauge.q.shape)
    kernel = dataclasses.replace(sim.kernel, gauge=DenseGauge(q=eye))
    return dataclasses.replace(sim, kernel=kernel, field=dataclasses.replace(sim.field, kernel=kernel))


def _aligned(xs: np.ndarray, length: int) -> np.ndarray:
    """``xs (T, B, n, d)`` cut or NaN-padded to ``length`` snapshots (two runs of one grid: a run that
    stopped early is shorter)."""
    xs = xs[:length]
    return np.concatenate([xs, np.full((length - len(xs), *xs.shape[1:]), np.nan, xs.dtype)])


def _own_layer_norm(job: Job) -> bool:
    """Whether the experiment file itself runs a layer norm other than post (E15): ``build`` then
    builds it; one set only by ``overrides`` (``--set``) is refused there, in one line."""
    own = job.experiment.simulation_config(job.variant, job.n, quick=job.quick)
    return own.model.layer_norm != "post"


def _simulate(job: Job, tick: Tick) -> JobResult:
    start = time.perf_counter()
    config = job.simulation_config()
    sim = build(config, layer_norms=_own_layer_norm(job))
    e_max = energy_max(sim.kernel)  # from the analytic factor (the theory dispatches on its type)
    solved_as = _tabulated_kernel(sim, config)
    x0 = jnp.stack([make_initial(_with_seed(config, s), sim.kernel.gauge, sim.x0.dtype) for s in job.seeds])
    ticked = 0

    def counted(units: int) -> None:
        nonlocal ticked
        ticked += units
        tick(units)

    solve_start = time.perf_counter()
    solved = _solve_seeds(solved_as, x0, counted)
    conjugate = None
    if job.experiment.conjugate:  # the flow without the gauge from the gauge frame's initial state
        u0 = jnp.einsum("nij,bnj->bni", solved_as.kernel.gauge.q, x0)
        conjugate = _solve_seeds(_without_gauge(solved_as), u0, counted)
    solve_end = time.perf_counter()
    tick(job.units() - ticked)  # runs that stopped early
    tick(0, stage="measuring")
    compile_s = solved["compile_s"] + (conjugate["compile_s"] if conjugate else 0.0)
    xs, radii = solved["xs"], None
    if sim.radial:  # pre- and peri-LN states z = r x: the directions and the radii
        radii = np.linalg.norm(xs, axis=-1)
        xs = xs / radii[..., None]
    ys = None if conjugate is None else _aligned(conjugate["xs"], len(xs))
    values, figure = measure(sim, solved["ts"], xs, job.seeds, job.experiment, e_max=e_max,
                             tables=solved_as.kernel, radii=radii, conjugate=ys)  # fmt: skip
    end = time.perf_counter()
    timing = {
        "wall_s": end - start,
        "build_s": solve_start - start,
        "compile_s": compile_s,
        "run_s": solve_end - solve_start - compile_s,
        "measure_s": end - solve_end,
        "steps": solved["steps"],  # the totals count the conjugate runs too
        **{k: v + (conjugate["totals"].get(k, 0) if conjugate else 0) for k, v in solved["totals"].items()},
    }
    status = solved["status"] if conjugate is None or solved["status"] != "ok" else conjugate["status"]
    reason = "" if status == "ok" else f"solver stopped: {status}"
    return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, status,
                     reason, values, timing, figure)  # fmt: skip


def _realize(job: Job, tick: Tick) -> JobResult:
    p = job.experiment.realize_parameters(quick=job.quick)
    n, start, values, figure = job.n, time.perf_counter(), [], FigureData(beta=float(p.get("beta", 1.0)))
    common = {key: p[key] for key in ("t_end", "dt", "save_every") if key in p}
    beta, seeds = float(p.get("beta", 1.0)), list(job.seeds)
    if job.experiment.kind == "realize_orbit":
        law = VonMisesMixture(p["weights"], p["kappas"], p["mus"])
        independent_cdf = quadrature_cdf(law.pdf)  # not the series CDF whose inverse made the targets
        target = np.asarray(law.ppf((np.arange(n) + 0.5) / n), dtype=float)
        construction = realisation.orbit_construction(law, n=n, beta=beta, seed=seeds)
    else:
        targets = np.asarray(spherical_mixture_samples(p.get("target_seed", 0), n), dtype=float)
        v0 = np.asarray(p.get("v0", (0.0, 0.0, 1.0)), dtype=float)
        sphere_options = {key: p[key] for key in ("gauge", "sigma") if key in p}
        construction = realisation.sphere_construction(
            targets, v0=v0, beta=beta, seed=seeds, **sphere_options
        )
    # every seed in one call of one compiled program, bitwise the seeds run alone (realize_batch);
    # the gauge as its matrices: E7 (RoPE) and E8 (Householder) share the program of a size
    gauge = DenseGauge(q=construction.kernel.gauge.matrices())
    tabulated = dataclasses.replace(construction.kernel, gauge=gauge)
    construction = dataclasses.replace(construction, kernel=tabulated)
    results = realize.realize_batch(construction, workers=1, **common)
    q, profile = np.asarray(gauge.q, dtype=float), construction.kernel.profile
    for i, (seed, result) in enumerate(zip(job.seeds, results, strict=True)):
        # beta and the clock: the gauge frame's collapse rate against the linearisation's (2 c e^beta)
        us = np.einsum("nij,tnj->tni", q, np.asarray(result.trajectory.xs, dtype=float))
        rate = realisation_rate_ratio(result.trajectory.ts, us, beta=float(profile.beta), c=float(profile.c))
        if job.experiment.kind == "realize_orbit":
            angles = np.asarray(result.relative_angles, dtype=float)
            measured = {
                "circular_ks": metrics.circular_ks(angles, independent_cdf),
                "ks_bound": 1.0 / (2 * n),
                "orbit_residual": float(result.orbit_residual),
            }
            shown = (target, angles)
        else:
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
            collapse_rate_ratio=rate,
            distance_reported=json_value(result.distance),
            bound_reported=json_value(result.bound),
            wasserstein=json_value(getattr(result, "wasserstein", None)),
        )
        values.append({"seed": seed, "final": {k: json_value(v) for k, v in measured.items()}})
        if i == 0:
            kind = "orbit" if job.experiment.kind == "realize_orbit" else "sphere"
            figure.target = (kind, *shown)
            if kind == "orbit":  # the law itself, drawn over the two histograms
                grid = np.linspace(0.0, 2.0 * np.pi, 361)
                figure.density = (grid, np.asarray(law.pdf(grid), dtype=float))
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


def _density(job: Job, tick: Tick) -> JobResult:
    """E16: the particle law against the density solver, and both against the growth rates'
    closed form (:func:`attnflow.workflows.density_particles.reproduce_values`)."""
    start = time.perf_counter()
    values, (index, turn, first, last) = density_particles.reproduce_values(job.n, job.seeds)
    tick(len(job.seeds))
    on_circle = lambda theta: np.stack([np.cos(theta), np.sin(theta)], axis=-1)  # noqa: E731
    states = {time_label(t): (on_circle(theta), on_circle(theta + turn))  # the gauge frame u = R(turn) x
              for t, theta in ((0.0, first), (None, last))}  # fmt: skip
    horizon = np.array([0.0, density_particles.T_END])
    figure = FigureData(color=index.astype(float), states=states, series={"t": horizon})
    wall = time.perf_counter() - start
    timing = {"wall_s": wall, "build_s": 0.0, "compile_s": 0.0, "run_s": wall, "measure_s": 0.0, "steps": 0}
    result = (job.experiment.id, job.variant.name, job.label, job.n, job.seeds, "ok", "")
    return JobResult(*result, values, timing, figure)


def run_job(job: Job, tick: Tick) -> JobResult:
    """Run one job; a failure inside it is recorded as status "error" (its expectations then fail)."""
    try:
        if job.experiment.kind == "density":
            return _density(job, tick)
        return _simulate(job, tick) if job.experiment.kind == "simulate" else _realize(job, tick)
    except Exception as error:  # noqa: BLE001 - one broken experiment must not hide the others
        return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, "error",
                         f"{type(error).__name__}: {error}")  # fmt: skip


def _run_group(jobs: Sequence[Job], cache_folder: str | None) -> list[JobResult]:
    """A worker process's task: jobs of one structure, in order (one compilation serves them),
    with the persistent compilation cache of the parent process when it has one."""
    if cache_folder is not None:
        program_cache.enable_persistent_cache(Path(cache_folder))
    return [run_job(job, lambda units, stage=None: None) for job in jobs]


def default_workers(*, quick: bool = False) -> int:
    """Worker processes: one per available core, at most 2; 1 on an accelerator, and 1 for the quick
    run, whose one-off costs (imports, compilations) exceed its simulations: a second process
    would pay them again (benchmarks/RESULTS.md, "Throughput of reproduce")."""
    if quick or not placement.current().worker_processes:
        return 1
    return batch.worker_count(2, None, where="reproduce")


def iter_jobs(jobs: Sequence[Job], tick: Tick, *, workers: int = 1) -> Iterator[tuple[int, JobResult]]:
    """Run the jobs, in this process or in ``workers`` single-threaded processes; yields ``(index,
    result)`` as each finishes. There the jobs of one structure
    (:func:`~attnflow.workflows.reproduce_plan.structure_key`) are one task, and the tasks run
    longest first (:mod:`attnflow.numerics.batch`); progress then advances per task."""
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            yield i, run_job(job, tick)
        return
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(structure_key(job), []).append(i)
    order = sorted(groups.values(), key=lambda group: -sum(jobs[i].cost() for i in group))
    cache_folder = jax.config.jax_compilation_cache_dir  # None unless a persistent cache is on
    tasks = [([jobs[i] for i in group], cache_folder) for group in order]
    for index, done in batch.run_tasks(_run_group, tasks, workers=min(workers, len(tasks))):
        tick(sum(jobs[i].units() for i in order[index]))
        yield from zip(order[index], done, strict=True)


def run_jobs(jobs: Sequence[Job], tick: Tick, *, workers: int = 1) -> list[JobResult]:
    """The results of :func:`iter_jobs`, in the order of ``jobs``."""
    results: list[JobResult | None] = [None] * len(jobs)
    for i, result in iter_jobs(jobs, tick, workers=workers):
        results[i] = result
    return results


class ReproduceInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a SIGTERM the command line raised as one) stopped reproduce: the experiments
    ``kept`` are recorded in ``out_dir`` (``reproduce(..., resume=True)`` runs the others and
    writes the report)."""

    def __init__(self, out_dir: Path, kept: Sequence[str]) -> None:
        super().__init__(f"interrupted: {id_ranges(kept) or 'no experiment'} kept in {str(out_dir)!r}")
        self.out_dir, self.kept = out_dir, list(kept)


def id_ranges(ids: Sequence[str]) -> str:
    """``E0-E3, E5`` for ``[E0, E1, E2, E3, E5]`` (ids ``<letters><number>``, in the given order)."""
    parts: list[list[str]] = []
    for eid in ids:
        head, number = eid.rstrip("0123456789"), eid[len(eid.rstrip("0123456789")) :]
        last = parts[-1][-1] if parts else ""
        last_head, last_number = last.rstrip("0123456789"), last[len(last.rstrip("0123456789")) :]
        if parts and number and last_number and head == last_head and int(number) == int(last_number) + 1:
            parts[-1].append(eid)
        else:
            parts.append([eid])
    return ", ".join(p[0] if len(p) == 1 else f"{p[0]}-{p[-1]}" for p in parts)


def resume_command(out_dir: str | Path, settings: dict, only: Sequence[str] | None) -> str:
    """The command line that continues a reproduce run with ``settings`` into ``out_dir``."""
    words = ["attnflow", "reproduce"] + (["--quick"] if settings["quick"] else [])
    words += ["--only", ",".join(only)] if only else []
    words += ["--sizes", ",".join(map(str, settings["sizes"]))] if settings["sizes"] else []
    words += ["--seeds", str(settings["seeds"])] if settings["seeds"] is not None else []
    words += [word for value in settings["overrides"] for word in ("--set", value)]
    return shlex.join([*words, "--out", str(out_dir), "--resume"])


def reproduce(
    out_dir: str | Path,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    n_seeds: int | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    overrides: Sequence[str] = (),
    resume: bool = False,
    overwrite: bool = False,
    started: float | None = None,
) -> Outcome:
    """Run the experiments, evaluate every expectation, write the report into ``out_dir``.

    ``started``: the ``time.perf_counter()`` at which the command started (its start-up then counts
    too); None: now. The one wall time every output names runs from there to the drawn report.

    ``overrides`` (``key=value``) apply to every simulated run, e.g. ``("solver.method=rk4",)``
    for fixed steps of each file's ``dt`` (benchmarks compare it with the files' settings).

    ``workers``: processes that run jobs (default :func:`default_workers`; 1 runs everything here).
    ``progress(done, total)`` is called as snapshots (jobs here) or tasks (in worker processes)
    are done; ``on_stage("measuring")`` when a job run here has its snapshots and measures them,
    ``on_stage("drawing")`` before the report is drawn.

    The folder (:mod:`attnflow.io.reproduce_folder`): ``out_dir`` must be new or empty, unless
    ``resume`` (continue the reproduce run there, with the same settings: the experiments it
    completed are not run again) or ``overwrite`` (remove what reproduce wrote there, nothing
    else); a folder holding other files is refused (``OutFolderError``, before anything is
    written). Each experiment is recorded as it finishes; Ctrl-C raises
    :class:`ReproduceInterrupted` naming those kept. The report covers every experiment recorded
    in the folder (with ``resume``, those of earlier runs too).
    """
    from attnflow.viz import report  # matplotlib is imported only when a report is written

    start = time.perf_counter() if started is None else float(started)
    out_dir = Path(out_dir)
    experiments = load_experiments(only)
    for job in plan(experiments, quick=quick, sizes=sizes, n_seeds=n_seeds, overrides=overrides):
        job.units()  # bad input (an experiment file, an override) is refused before the folder is touched
    workers = default_workers(quick=quick) if workers is None else workers
    if workers < 1:
        raise ValueError(f"reproduce: `--workers` must be a positive number of processes; got {workers!r}.")
    settings = reproduce_folder.make_settings(quick=quick, sizes=sizes, n_seeds=n_seeds, overrides=overrides)
    order = {eid: k for k, eid in enumerate(experiment_ids())}

    def in_order(ids) -> list[str]:
        return sorted(ids, key=lambda eid: (order.get(eid, len(order)), eid))

    with reproduce_folder.claimed(out_dir, settings, resume=resume, overwrite=overwrite):
        records: dict[str, reproduce_folder.Record] = {}
        try:
            reproduce_folder.prepare_folder(out_dir, settings)
            for eid, record in reproduce_folder.read_records(out_dir).items():
                if all(job.status != "error" for job in record[0]):  # an experiment in error runs again
                    records[eid] = record
            missing = [e for e in experiments if e.id not in records]
            options = dict(quick=quick, sizes=sizes, n_seeds=n_seeds, overrides=overrides)
            _run_missing(out_dir, missing, records, progress, on_stage, workers=workers, **options)
            shown = load_experiments(in_order(records))  # a record whose experiment file is gone: left out
            ids = [e.id for e in shown]
            jobs = [job for eid in ids for job in records[eid][0]]
            rows = [row for eid in ids for row in records[eid][1]]
            outcome = Outcome(shown, jobs, rows, quick, time.perf_counter() - start)
            if on_stage is not None:
                on_stage("drawing")
            # one clock: the wall time from this start to the drawn report, in every output
            clock = lambda: time.perf_counter() - start  # noqa: E731
            reproduce_folder.write_report(out_dir, lambda: report.write_report(out_dir, outcome, clock=clock))
        except KeyboardInterrupt:
            raise ReproduceInterrupted(out_dir, in_order(records)) from None
    return outcome


def _run_missing(
    out_dir: Path,
    experiments: Sequence,
    records: dict,
    progress: Callable[[int, int], None] | None,
    on_stage: Callable[[str], None] | None,
    *,
    workers: int,
    **options,
) -> None:
    """Run ``experiments``, recording each in ``out_dir`` (and in ``records``) as it finishes."""
    jobs = plan(experiments, **options)
    total, done = sum(job.units() for job in jobs), 0

    def tick(units: int, stage: str | None = None) -> None:
        nonlocal done
        done += units
        if stage is not None:
            if on_stage is not None:
                on_stage(stage)
        elif progress is not None:
            progress(done, total)

    pending = {e.id: sum(job.experiment.id == e.id for job in jobs) for e in experiments}
    finished: dict[str, list[tuple[int, JobResult]]] = {e.id: [] for e in experiments}
    for e in experiments:
        if pending[e.id] == 0:  # nothing to run (e.g. no size left): recorded as is
            records[e.id] = ([], evaluate(e, []))
            reproduce_folder.write_record(out_dir, e.id, *records[e.id])
    for i, result in iter_jobs(jobs, tick, workers=workers):
        eid = jobs[i].experiment.id
        finished[eid].append((i, result))
        if len(finished[eid]) == pending[eid]:
            results = [r for _, r in sorted(finished[eid], key=lambda item: item[0])]
            experiment = next(e for e in experiments if e.id == eid)
            records[eid] = (results, evaluate(experiment, results))
            reproduce_folder.write_record(out_dir, eid, *records[eid])
