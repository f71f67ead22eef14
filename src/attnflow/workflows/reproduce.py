"""Reproduce the paper's experiments (SPEC §6): plan, run, measure, check.

The experiments are data (:mod:`attnflow.workflows.experiments`). :func:`reproduce` plans one *job* per
(experiment, variant, n), runs it, measures every value an expectation can name
(:data:`METRICS`), checks the expectations with the generic
:func:`attnflow.workflows.experiments.evaluate` and hands the outcome to :mod:`attnflow.viz.report`
(``results.json``, ``report.md``, ``report.html``, figures).

- Seeds are batched: a job builds its :class:`~attnflow.workflows.build.Simulation` once (labels, gauges and
  factors do not depend on the seed), stacks the seeds' initial data ``x0 (B, n, d)`` and calls
  :func:`~attnflow.numerics.solve.solve` once with the batch — one compilation per job, none per seed.
  (A batched-seed entry point belongs in ``solve``/``run``; it lives here for now.)
- Jobs run in up to two single-threaded worker processes, longest first (:func:`run_jobs`, through
  :mod:`attnflow.numerics.batch`): XLA runs one small simulation on one core, and threads in one
  process only contend. Those processes run their batches themselves (``ATTNFLOW_CORES=1``).
- Measurements come from the stored snapshots only (metrics, theory, the kernel's energy), never
  from a second simulation: energies and gauge frames of all snapshots and seeds in one jitted call
  each, then the SPEC §4 diagnostics per seed at the report times and at the end.
- Realisation experiments (``kind = "realize_orbit" | "realize_sphere"``) call
  :mod:`attnflow.workflows.realize` once per seed; without that module they are reported as skipped.
- The analytic factors are evaluated once as a matrix for the dense interaction
  (:func:`_with_factor_matrix`): same values, a 3–4× cheaper step for ``toeplitz_cos``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.theory import energy_max
from attnflow.core.factors import MatrixFactor, NoFactor
from attnflow.core.gauges import IdentityGauge
from attnflow.io.config import Config
from attnflow.numerics import batch
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.solve import snapshot_count, solve
from attnflow.numerics.summation import energy
from attnflow.workflows.build import Simulation, build, make_initial
from attnflow.workflows.experiments import (
    Experiment,
    Variant,
    evaluate,
    experiment_ids,
    load_experiments,
    time_label,
)
from attnflow.workflows.run import COLLAPSE_THRESHOLD, ENERGY_TOL

THETA_C = 0.1  # cluster threshold (rad), SPEC §4 default
MEAN_COSINE_TOL = 1e-12  # "mean_cosine non-decreasing" allows this much round-off between snapshots
SERIES_POINTS = 100  # snapshots per seed of the costly per-snapshot series (cluster counts)

Tick = Callable[[int], None]

# Every value a job measures for each seed (``final`` and each report time), with its meaning.
METRICS = {
    **{key: "SPEC §4" for key in (
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
}  # fmt: skip


# --------------------------------------------------------------------------- plan


@dataclasses.dataclass(frozen=True)
class Job:
    """One batch of seeds: an experiment's variant at one size."""

    experiment: Experiment
    variant: Variant
    n: int
    seeds: tuple[int, ...]
    quick: bool

    @property
    def label(self) -> str:
        return " ".join(part for part in (self.experiment.id, self.variant.label) if part)

    def cost(self) -> float:
        """Relative run time, ``steps · seeds · n²`` (the interaction is ``O(n²)`` per step)."""
        if self.experiment.kind == "simulate":
            solver = self.experiment.simulation_config(self.variant, self.n, quick=self.quick).solver
            t_end, dt = solver.t_end, solver.dt
        else:
            p = self.experiment.realize_parameters(quick=self.quick)
            t_end, dt = p.get("t_end", 40.0), p.get("dt", 0.01)
        return t_end / dt * len(self.seeds) * self.n**2

    def units(self) -> int:
        """Progress units: snapshots of a simulation, or seeds of a realisation."""
        if self.experiment.kind != "simulate":
            return len(self.seeds)
        solver = self.experiment.simulation_config(self.variant, self.n, quick=self.quick).solver
        return snapshot_count(solver.t_end, solver.save_every)


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
) -> list[Job]:
    """One job per (experiment, variant, n). ``sizes``/``n_seeds`` override the files (testing)."""
    if sizes is not None and (not sizes or any(int(n) < 2 for n in sizes)):
        raise ValueError(f"reproduce: `--sizes` must be token counts >= 2; got {list(sizes)!r}.")
    if n_seeds is not None and n_seeds < 1:
        raise ValueError(f"reproduce: `--seeds` must be a positive number of seeds; got {n_seeds!r}.")
    jobs = []
    for experiment in experiments:
        named = [e.metric for e in experiment.expect] + [
            e.bound_metric for e in experiment.expect if e.bound_metric
        ]
        unknown = [m for m in (*named, *experiment.report_metrics) if m not in METRICS]
        if unknown:
            raise ValueError(f"{experiment.source}: `expect.metric` and `report_metrics` must name values of "
                             f"{sorted(METRICS)}; got {unknown[0]!r}.")  # fmt: skip
        chosen = experiment.quick if quick else experiment
        seeds = tuple(chosen.seeds)[:n_seeds] if n_seeds is not None else tuple(chosen.seeds)
        for n in tuple(sizes) if sizes is not None else chosen.sizes:
            for variant in experiment.variants:
                jobs.append(Job(experiment, variant, int(n), seeds, quick))
    return jobs


# --------------------------------------------------------------------------- results


@dataclasses.dataclass
class FigureData:
    """What the report draws for one job: the first seed's states and series, all seeds' series."""

    color: np.ndarray | None = None
    states: dict[str, tuple[np.ndarray, np.ndarray | None]] = dataclasses.field(default_factory=dict)
    series: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    seed_series: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # (B, T) each
    beta: float = 1.0
    target: tuple[str, np.ndarray, np.ndarray] | None = None  # (kind, target, realised)


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


# --------------------------------------------------------------------------- measure


@partial(jax.jit, static_argnames="block_size")
def _energies(kernel, xs, block_size=None):
    """``E`` of every snapshot and seed, ``xs (T, B, n, d) -> (T, B)``; one snapshot time at once."""
    per_seed = jax.vmap(lambda x: energy(kernel, x, block_size=block_size))
    return jax.lax.map(per_seed, xs)


@jax.jit
def _gauge_frames(gauge, xs):
    return jax.vmap(jax.vmap(gauge.apply))(xs)


_mean_cosines = jax.jit(jax.vmap(jax.vmap(metrics.mean_cosine)))


def _json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    value = float(value)
    return value if np.isfinite(value) else None


def _cyclic_maxima(values: np.ndarray) -> int:
    return int(np.sum((values > np.roll(values, 1)) & (values >= np.roll(values, -1))))


def snapshot_values(x: np.ndarray, u: np.ndarray, q: np.ndarray | None, groups) -> dict[str, Any]:
    """Every snapshot quantity of :data:`METRICS` for one seed's state ``x (n, d)``."""
    n, d = x.shape
    values = metrics.snapshot_summary(x, q=q, groups=groups, theta_c=THETA_C)
    gauge_labels = metrics.cluster_labels(u, theta_c=THETA_C)
    p = np.bincount(gauge_labels) / n
    values.update(gauge_n_clusters=int(gauge_labels.max()) + 1, gauge_n_eff=float(1.0 / np.sum(p * p)))
    if d == 3:
        q_or_eye = np.broadcast_to(np.eye(d), (n, d, d)) if q is None else q
        u_star = np.asarray(metrics.orbit_base_point(x, q_or_eye))
        normal = np.linalg.eigh(x.T @ x)[1][:, 0]
        values.update(
            std_x3=float(np.std(x[:, 2])),
            u_star_3=abs(float(u_star[2])),
            circle_deficit=1.0 - abs(float(u_star[2])),
            circle_azimuth_uniformity=float(metrics.azimuth_uniformity(x, axis=normal)),
            latitude_oscillations=_cyclic_maxima(x[:, 2]),
        )
    return {key: _json(value) for key, value in values.items()}


def series_values(ts, energies, mean_cos, gauge_mean_cos, e_max) -> dict[str, Any]:
    """The quantities of a time series up to its last entry (energies and cosines ``(T,)``)."""
    e_last = float(energies[-1])
    return {
        "energy": e_last,
        "energy_max": e_max,
        "energy_gap": None if e_max is None else (e_max - e_last) / e_max,
        "energy_monotone": metrics.is_monotone(energies, tol=ENERGY_TOL * max(1.0, abs(e_last))),
        "energy_max_decrease": metrics.max_decrease(energies),
        "mean_cosine_monotone": metrics.is_monotone(mean_cos, tol=MEAN_COSINE_TOL),
        "mean_cosine_max_decrease": metrics.max_decrease(mean_cos),
        "collapse_time": metrics.collapse_time(ts, mean_cos, threshold=COLLAPSE_THRESHOLD),
        "gauge_collapse_time": metrics.collapse_time(ts, gauge_mean_cos, threshold=COLLAPSE_THRESHOLD),
    }


def _time_indices(ts: np.ndarray, report_times: Sequence[float]) -> dict[str, int]:
    found = {time_label(None): len(ts) - 1}
    for t in report_times:
        k = int(np.argmin(np.abs(ts - t)))
        if abs(ts[k] - t) <= 1e-9 * max(1.0, t):
            found[time_label(t)] = k
    return found


def measure(
    sim: Simulation, ts: np.ndarray, xs: np.ndarray, seeds, experiment: Experiment, *, e_max: float | None
) -> tuple[list, FigureData]:
    """Per-seed values at the report times and at the end, from snapshots ``xs (T, B, n, d)``;
    ``e_max`` is the theory's maximal energy (:func:`attnflow.analysis.theory.energy_max`) or None."""
    gauged = not isinstance(sim.kernel.gauge, IdentityGauge)
    us = np.asarray(_gauge_frames(sim.kernel.gauge, jnp.asarray(xs))) if gauged else xs
    energies = np.asarray(_energies(sim.kernel, jnp.asarray(xs), block_size=sim.block_size))
    mean_cos = np.asarray(_mean_cosines(jnp.asarray(xs)))
    gauge_mean_cos = np.asarray(_mean_cosines(jnp.asarray(us))) if gauged else mean_cos
    q = np.asarray(sim.kernel.gauge.matrices()) if gauged else None
    indices = _time_indices(ts, experiment.report_times)
    values = []
    for b, seed in enumerate(seeds):
        per_time, cache = {"seed": seed}, {}
        for label, k in indices.items():
            if k not in cache:
                window = (ts[: k + 1], energies[: k + 1, b], mean_cos[: k + 1, b], gauge_mean_cos[: k + 1, b])
                series = {key: _json(v) for key, v in series_values(*window, e_max).items()}
                cache[k] = snapshot_values(xs[k, b], us[k, b], q, sim.groups) | series
            per_time[label] = cache[k]
        values.append(per_time)
    figure = FigureData(
        color=sim.xi if sim.xi.ndim == 1 else sim.xi[:, 0],
        states={label: (xs[k, 0], us[k, 0] if gauged else None) for label, k in indices.items()},
        series={"t": ts, "energy": energies[:, 0], "mean_cosine": mean_cos[:, 0],
                "gauge_mean_cosine": gauge_mean_cos[:, 0]},
        seed_series={"energy": energies.T},
        beta=float(sim.kernel.profile.beta),
    )  # fmt: skip
    if "gauge_n_clusters" in experiment.series_metrics:
        # A cluster count costs O(n²) in NumPy per snapshot: at most SERIES_POINTS of them per seed.
        stride = max(1, -(-(len(ts) - 1) // SERIES_POINTS))
        picked = np.unique(np.r_[np.arange(0, len(ts), stride), len(ts) - 1])
        counts = [[metrics.n_clusters(us[k, b], theta_c=THETA_C) for k in picked] for b in range(len(seeds))]
        figure.series["gauge_n_clusters_t"] = ts[picked]
        figure.seed_series["gauge_n_clusters"] = np.asarray(counts)
    return values, figure


# --------------------------------------------------------------------------- run


def _with_seed(config: Config, seed: int) -> Config:
    return config.model_copy(update={"init": config.init.model_copy(update={"seed": seed})})


def _with_factor_matrix(sim: Simulation, config: Config) -> Simulation:
    """The same simulation with the factor evaluated once, as a matrix, when the interaction is
    dense anyway (no row blocks). The analytic factors recompute ``w`` at every field evaluation
    (an ``n × n`` cos or exp); for ``toeplitz_cos`` that made a step 3–4× slower than without a
    factor. (The place for this is ``factors``: e.g. ``cos(a − b) = cos a cos b + sin a sin b``.)
    """
    factor = sim.kernel.factor
    if isinstance(factor, NoFactor | MatrixFactor) or sim.block_size is not None:
        return sim
    kernel = dataclasses.replace(
        sim.kernel, factor=MatrixFactor(w=factor.matrix(), nonnegative=factor.nonnegative)
    )
    model = config.model
    field = make_vector_field(
        kernel, normalization=model.normalization, causal=model.causal, value=model.value, block_size=None
    )
    return dataclasses.replace(sim, kernel=kernel, field=field)


def _simulate(job: Job, tick: Tick) -> JobResult:
    start = time.perf_counter()
    config = job.experiment.simulation_config(job.variant, job.n, quick=job.quick)
    sim = build(config)
    e_max = energy_max(sim.kernel)  # from the analytic factor (the theory dispatches on its type)
    sim = _with_factor_matrix(sim, config)
    x0 = jnp.stack([make_initial(_with_seed(config, s), sim.kernel.gauge, sim.x0.dtype) for s in job.seeds])
    stamps = []

    def on_snapshot(k: int, t: float, x: np.ndarray) -> None:
        stamps.append(time.perf_counter())
        tick(1)

    solve_start = time.perf_counter()
    trajectory = solve(
        sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end, save_every=sim.save_every,
        noise=sim.noise, key=sim.key, on_snapshot=on_snapshot,
    )  # fmt: skip
    solve_end = time.perf_counter()
    tick(job.units() - len(stamps))  # a run that stopped early
    # The solver's own compile time when it reports one, else the first chunk's excess over a typical one.
    chunks = np.diff(stamps)
    compile_s = float(getattr(trajectory, "compile_time_s", 0.0) or 0.0)
    if compile_s == 0.0 and len(chunks) > 1:
        compile_s = max(0.0, chunks[0] - float(np.median(chunks[1:])))
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
    }
    reason = "" if trajectory.status == "ok" else f"solver stopped: {trajectory.status}"
    return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, trajectory.status,
                     reason, values, timing, figure)  # fmt: skip


def _trajectory_states(trajectory, t_end: float) -> dict[str, np.ndarray]:
    """States at τ = 0, 20 and the end from a realisation's trajectory (a Trajectory or (T, n, d))."""
    xs = np.asarray(getattr(trajectory, "xs", trajectory))
    if xs.ndim != 3:
        return {}
    ts = np.asarray(getattr(trajectory, "ts", np.linspace(0.0, t_end, len(xs))))
    return {label: xs[k] for label, k in _time_indices(ts, (0.0, 20.0)).items()}


def _householder_frame(x: np.ndarray, targets: np.ndarray, v0: np.ndarray) -> np.ndarray | None:
    """``u_i = Q_i x_i`` with ``Q_i = I − 2wwᵀ/|w|²``, ``w = g_i − v_0`` (SPEC §3.2), if it fits."""
    w = targets - v0
    norms = np.sum(w * w, axis=1, keepdims=True)
    safe = np.where(norms > 0, norms, 1.0)
    reflect = lambda y: y - 2.0 * w * np.sum(w * y, axis=1, keepdims=True) / safe  # noqa: E731
    return reflect(x) if np.allclose(reflect(targets), v0, atol=1e-9) else None


def _orbit_frame(x: np.ndarray, alpha: np.ndarray, final: np.ndarray) -> np.ndarray | None:
    """``u_i = R_z(−α_i) x_i`` (SPEC §3.1: ``x_i = R(α_i)ᵀu*`` sits at azimuth ``az(u*) + α_i``), kept
    only if it is the gauge frame of this run: the final state collapses in it."""
    rotate = lambda y, a: np.stack(  # noqa: E731
        [np.cos(a) * y[:, 0] + np.sin(a) * y[:, 1], -np.sin(a) * y[:, 0] + np.cos(a) * y[:, 1], y[:, 2]],
        axis=1,
    )
    return rotate(x, alpha) if float(metrics.mean_cosine(rotate(final, alpha))) > COLLAPSE_THRESHOLD else None


def _realize(job: Job, tick: Tick) -> JobResult:
    if importlib.util.find_spec("attnflow.workflows.realize") is None:
        tick(job.units())
        return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, "skipped",
                         "needs attnflow.workflows.realize (not available yet)")  # fmt: skip
    realize = importlib.import_module("attnflow.workflows.realize")
    p = job.experiment.realize_parameters(quick=job.quick)
    n, start, values, figure = job.n, time.perf_counter(), [], FigureData(beta=float(p.get("beta", 1.0)))
    common = {key: p[key] for key in ("beta", "t_end", "dt", "save_every") if key in p}
    if job.experiment.kind == "realize_orbit":
        law = realize.VonMisesMixture(p["weights"], p["kappas"], p["mus"])
        target = np.asarray(law.ppf((np.arange(n) + 0.5) / n), dtype=float)
    else:
        targets = np.asarray(realize.spherical_mixture_samples(p.get("target_seed", 0), n), dtype=float)
        v0 = np.asarray(p.get("v0", (0.0, 0.0, 1.0)), dtype=float)
        sphere_options = {key: p[key] for key in ("gauge", "sigma") if key in p}
    for i, seed in enumerate(job.seeds):
        if job.experiment.kind == "realize_orbit":
            result = realize.realize_orbit(law, n=n, seed=seed, **common)
            angles = np.asarray(result.relative_angles, dtype=float)
            measured = {
                "circular_ks": metrics.circular_ks(angles, law.cdf),
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
                "orbit_residual_reported": _json(getattr(result, "orbit_residual", None)),
            }
            shown = (targets, x)
        measured.update(
            distance_reported=_json(result.distance),
            bound_reported=_json(result.bound),
            wasserstein=_json(getattr(result, "wasserstein", None)),
        )
        values.append({"seed": seed, "final": {k: _json(v) for k, v in measured.items()}})
        if i == 0:
            kind = "orbit" if job.experiment.kind == "realize_orbit" else "sphere"
            figure.target = (kind, *shown)
            states = _trajectory_states(result.trajectory, float(p.get("t_end", 40.0)))
            for label, x_k in states.items():
                if kind == "sphere":
                    u_k = _householder_frame(x_k, targets, v0)
                else:
                    u_k = _orbit_frame(x_k, target, np.asarray(result.x))
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


# --------------------------------------------------------------------------- orchestrate


@dataclasses.dataclass
class Outcome:
    """Everything :mod:`attnflow.viz.report` writes: the jobs' results and the expectation rows."""

    experiments: list[Experiment]
    jobs: list[JobResult]
    rows: list[dict[str, Any]]
    quick: bool
    wall_s: float

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["status"] == "FAIL"]


def reproduce(
    out_dir: str | Path,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    n_seeds: int | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Run the experiments, evaluate every expectation, write the report into ``out_dir``.

    ``workers``: processes that run jobs (default :func:`default_workers`; 1 runs everything here).
    """
    from attnflow.viz import report  # matplotlib is imported only when a report is written

    start = time.perf_counter()
    experiments = load_experiments(only)
    jobs = plan(experiments, quick=quick, sizes=sizes, n_seeds=n_seeds)
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
