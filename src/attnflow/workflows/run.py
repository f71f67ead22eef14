"""One simulation into a run folder (SPEC §7.3): build → solve → store → metrics → figures.

``run(config, out_dir)`` validates and builds everything before it touches the disk (bad input
leaves nothing behind), then writes ``config.json``, streams snapshots into ``trajectory.zarr``
(a killed run keeps every completed snapshot), and finally writes ``metrics.json`` (atomically)
and ``figures/``. ``summarize`` computes the metrics of a trajectory without re-simulating.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow import __version__
from attnflow.analysis import metrics
from attnflow.analysis.theory import energy_max
from attnflow.core.gauges import IdentityGauge
from attnflow.io import store
from attnflow.io.config import Config, ConfigError, resolved_dict
from attnflow.numerics.solve import Trajectory, snapshot_count, solve
from attnflow.numerics.summation import energy
from attnflow.viz import plotting
from attnflow.workflows.build import Simulation, build

COLLAPSE_THRESHOLD = 0.999
ENERGY_TOL = 1e-10  # relative decrease allowed between snapshots (round-off of the energy sum)
PAIRWISE_LIMIT = 8192  # above this n the O(n²) cluster diagnostics are skipped (null)

Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class RunResult:
    out_dir: Path
    metrics: dict
    trajectory: Trajectory


def gauge_frame(sim: Simulation, xs: np.ndarray) -> np.ndarray:
    """``u = Q(ξ)x`` for every snapshot of ``xs (T, n, d)``."""
    return np.asarray(jax.vmap(sim.kernel.gauge.apply)(jnp.asarray(xs)))


def energy_series(sim: Simulation, xs: np.ndarray) -> np.ndarray:
    fn = jax.jit(lambda x: energy(sim.kernel, x, block_size=sim.block_size))
    return np.array([float(fn(jnp.asarray(x))) for x in xs])


def summarize(sim: Simulation, trajectory: Trajectory, *, theta_c: float = 0.1) -> dict:
    """Every SPEC §4 key for the final snapshot, the ``series`` block (no ``run`` block)."""
    ts, xs = trajectory.ts, trajectory.xs
    us = gauge_frame(sim, xs)
    n = xs.shape[1]
    gauged = not isinstance(sim.kernel.gauge, IdentityGauge)
    q = np.asarray(sim.kernel.gauge.matrices()) if gauged else None
    pairwise = n <= PAIRWISE_LIMIT
    final = metrics.snapshot_summary(xs[-1], q=q, groups=sim.groups, theta_c=theta_c, pairwise=pairwise)
    energies = energy_series(sim, xs)
    e_max = energy_max(sim.kernel)
    mean_cos = np.asarray(metrics.series(xs, metrics.mean_cosine))
    gauge_mean_cos = np.asarray(metrics.series(us, metrics.mean_cosine))
    final.update(
        energy=float(energies[-1]),
        energy_max=e_max,
        energy_gap=None if e_max is None else (e_max - float(energies[-1])) / e_max,
        energy_monotone=metrics.is_monotone(energies, tol=ENERGY_TOL * max(1.0, abs(float(energies[-1])))),
        collapse_time=metrics.collapse_time(ts, mean_cos, threshold=COLLAPSE_THRESHOLD),
        gauge_collapse_time=metrics.collapse_time(ts, gauge_mean_cos, threshold=COLLAPSE_THRESHOLD),
    )
    n_eff = [None] * len(ts) if not pairwise else [metrics.n_eff(x, theta_c=theta_c) for x in xs]
    final["series"] = {
        "t": ts.tolist(),
        "energy": energies.tolist(),
        "mean_cosine": mean_cos.tolist(),
        "gauge_mean_cosine": gauge_mean_cos.tolist(),
        "n_eff": n_eff,
    }
    return final


def _write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _prepare_folder(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"run: `--out` must be a new or empty folder; got {str(out_dir)!r} (not empty).")
    out_dir.mkdir(parents=True, exist_ok=True)


def write_figures(out_dir: Path, ts, xs, us, xi, series: dict) -> list[Path]:
    color = xi if xi.ndim == 1 else xi[:, 0]
    arrays = {k: np.asarray(v, dtype=float) for k, v in series.items() if k != "t" and None not in v}
    return plotting.write_run_figures(out_dir / "figures", ts=ts, xs=xs, us=us, color=color, series=arrays)


def run(config: Config, out_dir: str | os.PathLike, *, progress: Progress | None = None) -> RunResult:
    """Simulate ``config`` and write the run folder ``out_dir``."""
    sim = build(config)
    out_dir = Path(out_dir)
    _prepare_folder(out_dir)
    resolved = resolved_dict(config)
    _write_json(out_dir / "config.json", {**resolved, "attnflow_version": __version__})
    n_snapshots = snapshot_count(sim.t_end, sim.save_every)
    gauged = not isinstance(sim.kernel.gauge, IdentityGauge)
    writer = store.TrajectoryWriter(
        out_dir / "trajectory.zarr",
        n_snapshots_max=n_snapshots,
        n=config.model.n,
        d=config.model.d,
        xi=sim.xi,
        gauge=np.asarray(sim.kernel.gauge.matrices()) if gauged else None,
        attrs={"config": resolved, "attnflow_version": __version__},
        dtype=config.solver.dtype,
    )

    def on_snapshot(k: int, t: float, x: np.ndarray) -> None:
        writer.append(t, x)
        if progress is not None:
            progress(k + 1, n_snapshots)

    start = time.perf_counter()
    trajectory = solve(
        sim.field,
        sim.x0,
        integrator=sim.integrator,
        dt=sim.dt,
        t_end=sim.t_end,
        save_every=sim.save_every,
        noise=sim.noise,
        key=sim.key,
        on_snapshot=on_snapshot,
    )
    wall = time.perf_counter() - start
    writer.close(trajectory.status)
    summary = summarize(sim, trajectory)
    summary["run"] = {
        "status": trajectory.status,
        "steps": trajectory.steps,
        "wall_time_s": wall,
        "time_scale": config.model.time_scale,
        "dtype": config.solver.dtype,
        "backend": jax.default_backend(),
        "block_size": sim.block_size,
    }
    _write_json(out_dir / "metrics.json", summary)
    write_figures(
        out_dir, trajectory.ts, trajectory.xs, gauge_frame(sim, trajectory.xs), sim.xi, summary["series"]
    )
    return RunResult(out_dir=out_dir, metrics=summary, trajectory=trajectory)


def replot(run_dir: str | os.PathLike) -> list[Path]:
    """Redraw the figures of a run folder from its stored trajectory and metrics."""
    run_dir = Path(run_dir)
    if not (run_dir / "trajectory.zarr").exists():
        raise ConfigError(f"plot: `RUN_DIR` must be a run folder with trajectory.zarr; got {str(run_dir)!r}.")
    stored = store.read_trajectory(run_dir / "trajectory.zarr")
    xs = stored.xs
    us = xs if stored.gauge is None else np.einsum("nij,tnj->tni", stored.gauge, xs)
    metrics_path = run_dir / "metrics.json"
    series = json.loads(metrics_path.read_text())["series"] if metrics_path.exists() else {}
    series = {k: v[: len(stored.ts)] for k, v in series.items()}
    return write_figures(run_dir, stored.ts, xs, us, stored.xi, series)
