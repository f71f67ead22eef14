"""Realisations run: simulate a construction, and the ``attnflow realize`` command.

The constructions (gauges, initial data, target checks, measurement) are
:mod:`attnflow.analysis.realisation`. Here :func:`realize` runs one with the USA-AV dynamics
(exp profile, ``c = 1``, RK4) and measures the end state, :func:`realize_batch` runs a batch of
seeds as one call of one compiled program; both take ``mode`` (``"a-priori"``: the gauges fixed
before the run; ``"exact"``: the gauge frame simulated first and the gauges chosen from the
consensus it reaches, so the target is realised to the convergence tolerance from any initial data).
:func:`realize_orbit` and :func:`realize_sphere` build and run in one call; :func:`run_realisation`
is the ``attnflow realize`` command: validate the target file, simulate, write a run folder with
``realisation_distance`` and a target-vs-realised figure.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis.laws import spherical_mixture_samples
from attnflow.analysis.realisation import (
    MODES,
    Construction,
    RealisationResult,
    check_mode,
    check_n,
    check_orbit_samples,
    check_sphere_targets,
    exact_initial,
    frame_kernel,
    measure_realisation,
    orbit_construction,
    sphere_construction,
)
from attnflow.analysis.summary import gauge_frames, summarize
from attnflow.io import run_folder, store
from attnflow.io.arrays import ArrayFileError, load_array
from attnflow.io.atomic import write_json
from attnflow.io.version import __version__
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4
from attnflow.numerics.solve import SnapshotCallback, Trajectory, snapshot_count, solve
from attnflow.viz import plotting
from attnflow.workflows.run import write_figures

__all__ = [
    "KINDS",
    "SUMMARY_KEYS",
    "load_target",
    "mode_errors",
    "realize",
    "realize_batch",
    "realize_orbit",
    "realize_sphere",
    "run_realisation",
]

KINDS = ("sphere", "orbit")
SUMMARY_KEYS = (
    "realisation_mode",
    "realisation_distance",
    "realisation_bound",
    "orbit_residual",
    "realisation_wasserstein",
)


def _solve(kernel, x0, *, t_end, dt, save_every, on_snapshot, workers) -> Trajectory:
    return solve(
        make_vector_field(kernel),
        jnp.asarray(x0),
        integrator=RK4(),
        dt=dt,
        t_end=t_end,
        save_every=save_every,
        on_snapshot=on_snapshot,
        workers=workers,
    )


def _initial(construction: Construction, mode: str, *, t_end, dt, save_every, workers) -> jax.Array:
    """The initial content of the run: the construction's (a-priori), or, in the exact mode, the
    gauge frame simulated first and the content rotated so that it reaches the reference point."""
    if check_mode(mode) == "a-priori":
        return jnp.asarray(construction.x0)
    kernel = construction.kernel
    u0 = (
        jax.vmap(kernel.gauge.apply)(construction.x0)
        if construction.x0.ndim == 3
        else kernel.gauge.apply(construction.x0)
    )
    frame = _solve(
        frame_kernel(kernel), u0, t_end=t_end, dt=dt, save_every=save_every, on_snapshot=None, workers=workers
    )
    u_end = np.asarray(frame.xs[-1])
    u_star = np.sum(u_end, axis=-2)
    u_star = u_star / np.linalg.norm(u_star, axis=-1, keepdims=True)
    return exact_initial(construction, u_star)


def realize(
    construction: Construction,
    *,
    mode: str = "a-priori",
    t_end: float = 40.0,
    dt: float = 0.01,
    save_every: float = 1.0,
    on_snapshot: SnapshotCallback | None = None,
) -> RealisationResult:
    """Run a construction (RK4, ``usa``) and measure the final state against its target.

    ``mode``: ``"a-priori"`` (the construction's gauges and initial data) or ``"exact"`` (the gauge
    frame simulated first, the gauges chosen from the consensus it reaches; two runs of the same
    compiled program, see :mod:`attnflow.analysis.realisation`)."""
    if jnp.ndim(construction.x0) != 2:
        raise ValueError(
            f"realize: `construction.x0` must be one state (n, d) (a batch goes to realize_batch); "
            f"got shape {tuple(jnp.shape(construction.x0))}."
        )
    options = {"t_end": t_end, "dt": dt, "save_every": save_every}
    x0 = _initial(construction, mode, **options, workers=1)
    trajectory = _solve(construction.kernel, x0, **options, on_snapshot=on_snapshot, workers=1)
    return measure_realisation(construction, trajectory)


def realize_batch(
    construction: Construction,
    *,
    mode: str = "a-priori",
    t_end: float = 40.0,
    dt: float = 0.01,
    save_every: float = 1.0,
    workers: int | None = 1,
) -> list[RealisationResult]:
    """:func:`realize` for a construction built with a sequence of seeds (``x0 (B, n, d)``): every
    seed in one call of one compiled program; result ``b`` is bitwise that of seed ``b`` run alone
    on a CPU (a batch there is ``lax.map`` over the unbatched program). ``workers``: as for
    :func:`~attnflow.numerics.solve.solve` (1: in this process)."""
    if jnp.ndim(construction.x0) != 3:
        raise ValueError(
            f"realize_batch: `construction.x0` must be a batch (B, n, d) (a construction built with "
            f"a sequence of seeds); got shape {tuple(jnp.shape(construction.x0))}."
        )
    options = {"t_end": t_end, "dt": dt, "save_every": save_every}
    x0 = _initial(construction, mode, **options, workers=workers)
    batch = _solve(construction.kernel, x0, **options, on_snapshot=None, workers=workers)
    results = []
    for b in range(x0.shape[0]):
        per_run = {  # run b's own statistics, shaped like a single run's (0-d)
            name: None if getattr(batch, name) is None else getattr(batch, name)[b, ...]
            for name in ("accepted", "rejected", "evaluations")
        }
        steps = batch.steps if per_run["accepted"] is None else int(per_run["accepted"] + per_run["rejected"])
        one = dataclasses.replace(
            batch, xs=batch.xs[:, b], statuses=batch.statuses[b, ...], steps=steps, **per_run
        )
        results.append(measure_realisation(dataclasses.replace(construction, x0=x0[b]), one))
    return results


def realize_orbit(
    ppf_or_law,
    *,
    n: int = 256,
    beta: float = 1.0,
    mode: str = "a-priori",
    t_end: float = 40.0,
    dt: float = 0.01,
    seed: int = 0,
    save_every: float = 1.0,
    on_snapshot: SnapshotCallback | None = None,
) -> RealisationResult:
    """Orbit universality (the paper's E7): realise an angle law on a RoPE orbit of ``S^2``.

    ``ppf_or_law``: a law with ``cdf``/``ppf`` (:class:`VonMisesMixture`), 1-d angle samples (their
    :class:`EmpiricalAngleLaw`), or a quantile function. ``distance`` is the circular KS distance of
    the relative angles to the law, ``bound = 1/(2n)``. ``mode="exact"``: the orbit's base point is
    ``e_1``, so the absolute azimuths are the quantiles ``α_i``.
    """
    construction = orbit_construction(ppf_or_law, n=n, beta=beta, seed=seed)
    return realize(
        construction, mode=mode, t_end=t_end, dt=dt, save_every=save_every, on_snapshot=on_snapshot
    )


def realize_sphere(
    targets,
    *,
    v0=None,
    gauge: str = "householder",
    sigma: float = 0.2,
    beta: float = 1.0,
    mode: str = "a-priori",
    t_end: float = 40.0,
    dt: float = 0.01,
    seed: int = 0,
    save_every: float = 1.0,
    on_snapshot: SnapshotCallback | None = None,
) -> RealisationResult:
    """Gauge-level realisation (the paper's E8) of target points ``(n, d)`` (``v0`` default ``e_d``).

    ``distance = max_i |x_i − y_i|``, ``bound = 2|u* − v_0|``; ``wasserstein`` the exact W1.
    ``mode="exact"``: realised to the convergence of the gauge frame, whatever ``sigma``.
    """
    construction = sphere_construction(targets, v0=v0, gauge=gauge, sigma=sigma, beta=beta, seed=seed)
    return realize(
        construction, mode=mode, t_end=t_end, dt=dt, save_every=save_every, on_snapshot=on_snapshot
    )


# --------------------------------------------------------------------------- `attnflow realize`


def _fail(name: str, constraint: str, value) -> ValueError:
    return ValueError(f"realize: `{name}` must be {constraint}; got {value}.")


def load_target(path, kind: str, n: int | None) -> tuple[np.ndarray, int]:
    """Read and check ``--target`` for ``--kind``; returns the array and the token count."""
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), KINDS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"realize: `--kind` must be one of {KINDS}; got {kind!r}.{hint}")
    try:
        array = load_array(path)
    except ArrayFileError as error:
        raise ValueError(f"realize: `--target` {error}.") from None
    where = "realize"
    if kind == "sphere":
        y = check_sphere_targets(array, name="--target", where=f"{where} --kind sphere")
        if n is not None and n != y.shape[0]:
            raise _fail("--n", f"the number of targets ({y.shape[0]}) for --kind sphere, or omitted", n)
        return y, y.shape[0]
    a = check_orbit_samples(array, name="--target", where=f"{where} --kind orbit")
    return a, check_n(a.shape[0] if n is None else n, where, "--n")


def run_realisation(
    target,
    *,
    kind: str,
    out,
    n: int | None = None,
    seed: int = 0,
    beta: float = 1.0,
    mode: str = "a-priori",
    t_end: float = 40.0,
    dt: float = 0.01,
    save_every: float = 0.5,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> dict:
    """``attnflow realize``: check the target, build the construction, simulate into a run folder.

    Everything is validated before the folder is claimed (:mod:`attnflow.io.run_folder`: new or
    empty, or with ``overwrite`` an earlier realize or run folder, replaced). The folder holds
    ``config.json``, ``trajectory.zarr`` (streamed), ``metrics.json`` (every diagnostic of
    :func:`attnflow.analysis.summary.summarize` plus ``realisation_kind``, ``realisation_distance``,
    ``realisation_bound``, ``realisation_mode``, ``u_star``, ``realisation_wasserstein``) and
    ``figures/`` (the run figures and ``target.png``). Returns the metrics.
    """
    data, n_tokens = load_target(target, kind, n)
    check_mode(mode, "realize --mode")
    out = Path(out)
    run_folder.check_claim(out, run_folder.REALIZE, overwrite=overwrite)  # before the construction
    if kind == "orbit":
        construction = orbit_construction(data, n=n_tokens, beta=beta, seed=seed)
    else:
        construction = sphere_construction(data, beta=beta, seed=seed)
    kernel = construction.kernel
    d = kernel.gauge.d
    config = {
        "realize": {
            "kind": kind,
            "mode": mode,
            "target": str(Path(target).resolve()),
            "n_targets": int(data.shape[0]),
        },
        "model": {"n": n_tokens, "d": d, "beta": beta, "time_scale": "plain", "profile": "exp"},
        "gauge": {"kind": "orbit (RoPE about e_3)" if kind == "orbit" else "householder", "v0": None},
        "init": {"kind": "uniform" if kind == "orbit" else "cap", "seed": seed, "sigma": 0.2},
        "solver": {"method": "rk4", "dt": dt, "t_end": t_end, "save_every": save_every, "dtype": "float64"},
    }
    if kind == "sphere":
        config["gauge"]["v0"] = construction.v0.tolist()
    else:
        config["init"].pop("sigma")
        del config["gauge"]["v0"]
    with run_folder.claimed(out, run_folder.REALIZE, overwrite=overwrite):
        write_json(out / "config.json", {**config, "attnflow_version": __version__})
        q = np.asarray(kernel.gauge.matrices())
        total = snapshot_count(t_end, save_every)
        writer = store.TrajectoryWriter(
            out / "trajectory.zarr",
            n_snapshots_max=total,
            n=n_tokens,
            d=d,
            xi=construction.xi,
            gauge=q,
            attrs={"config": config, "attnflow_version": __version__},
        )

        def on_snapshot(k: int, t: float, x: np.ndarray) -> None:
            writer.append(t, x)
            if progress is not None:
                progress(k + 1, total)

        start = time.perf_counter()
        with writer:
            result = realize(
                construction, mode=mode, t_end=t_end, dt=dt, save_every=save_every, on_snapshot=on_snapshot
            )
            writer.close(result.trajectory.status)
        wall = time.perf_counter() - start
        summary = summarize(kernel, result.trajectory.ts, result.trajectory.xs)
        summary.update(
            realisation_kind=kind,
            realisation_mode=mode,
            realisation_distance=float(result.distance),
            realisation_bound=float(result.bound),
            u_star=[float(v) for v in result.u_star],
            realisation_wasserstein=result.wasserstein,
        )
        summary["run"] = {
            "status": result.trajectory.status,
            "steps": result.trajectory.steps,
            "wall_time_s": wall,
            "time_scale": "plain",
            "dtype": "float64",
            "backend": jax.default_backend(),
            "block_size": None,
        }
        write_json(out / "metrics.json", summary)
        xs = result.trajectory.xs
        us = gauge_frames(kernel.gauge, xs)
        write_figures(out, result.trajectory.ts, xs, us, construction.xi, summary["series"])
        realised = result.x if kind == "sphere" else result.relative_angles
        plotting.write_target_figure(out / "figures" / "target.png", data, realised, kind=kind)
    return summary


# --------------------------------------------------------------------------- the two modes compared


def mode_errors(
    *,
    sizes: Sequence[int],
    sigmas: Sequence[float],
    seeds: Sequence[int],
    target_seed: int = 0,
    beta: float = 1.0,
    t_end: float = 40.0,
    dt: float = 0.01,
) -> list[dict]:
    """E8's realisation (spherical mixture targets, Householder gauges, cap initial data of width
    ``sigma`` around ``v_0 = e_3``) in both modes: one row per (mode, n, sigma, seed) with
    ``base_point_distance`` ``|u* − v_0|``, ``wasserstein`` (exact W1 to the targets),
    ``max_target_distance`` ``max_i |x_i − y_i|`` and ``orbit_residual``."""
    rows = []
    for n in sizes:
        targets = np.asarray(spherical_mixture_samples(target_seed, n), dtype=float)
        for sigma in sigmas:
            construction = sphere_construction(targets, sigma=sigma, beta=beta, seed=list(seeds))
            for mode in MODES:
                results = realize_batch(construction, mode=mode, t_end=t_end, dt=dt, save_every=t_end)
                for seed, result in zip(seeds, results, strict=True):
                    rows.append(
                        {
                            "mode": mode,
                            "n": int(n),
                            "sigma": float(sigma),
                            "seed": int(seed),
                            "base_point_distance": float(np.linalg.norm(result.u_star - construction.v0)),
                            "wasserstein": float(result.wasserstein),
                            "max_target_distance": float(result.distance),
                            "orbit_residual": float(result.orbit_residual),
                        }
                    )
    return rows
