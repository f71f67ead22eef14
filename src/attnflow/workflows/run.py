"""One simulation into a run folder: build → solve → store → metrics → figures.

``run(config, out_dir)`` validates and builds everything before it touches the disk (bad input
leaves nothing behind), then writes ``config.json``, streams snapshots into ``trajectory.zarr``
(a killed run keeps every completed snapshot), and finally writes ``metrics.json`` (atomically)
and ``figures/``. The metrics come from the stored snapshots (:func:`attnflow.analysis.summary.summarize`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from attnflow.analysis.summary import gauge_frames, summarize
from attnflow.io import store
from attnflow.io.atomic import write_json
from attnflow.io.config import Config, ConfigError, resolved_dict
from attnflow.io.version import __version__
from attnflow.numerics.solve import Trajectory, snapshot_count, solve
from attnflow.viz import plotting
from attnflow.workflows.build import build

Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class RunResult:
    out_dir: Path
    metrics: dict
    trajectory: Trajectory


def _prepare_folder(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"run: `--out` must be a new or empty folder; got {str(out_dir)!r} (not empty).")
    out_dir.mkdir(parents=True, exist_ok=True)


def write_figures(out_dir: Path, ts, xs, us, xi, series: dict) -> list[Path]:
    """The run figures of ``out_dir/figures`` from the snapshots, their gauge frames ``us``, the
    labels ``xi`` (colours) and the ``series`` block of the metrics (entries with nulls skipped)."""
    color = xi if xi.ndim == 1 else xi[:, 0]
    arrays = {k: np.asarray(v, dtype=float) for k, v in series.items() if k != "t" and None not in v}
    return plotting.write_run_figures(out_dir / "figures", ts=ts, xs=xs, us=us, color=color, series=arrays)


def run(config: Config, out_dir: str | os.PathLike, *, progress: Progress | None = None) -> RunResult:
    """Simulate ``config`` and write the run folder ``out_dir``."""
    sim = build(config)
    out_dir = Path(out_dir)
    _prepare_folder(out_dir)
    resolved = resolved_dict(config)
    write_json(out_dir / "config.json", {**resolved, "attnflow_version": __version__})
    n_snapshots = snapshot_count(sim.t_end, sim.save_every)
    writer = store.TrajectoryWriter(
        out_dir / "trajectory.zarr",
        n_snapshots_max=n_snapshots,
        n=config.model.n,
        d=config.model.d,
        xi=sim.xi,
        gauge=None if sim.kernel.gauge.is_identity else np.asarray(sim.kernel.gauge.matrices()),
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
    summary = summarize(
        sim.kernel, trajectory.ts, trajectory.xs, groups=sim.groups, block_size=sim.block_size
    )
    summary["run"] = {
        "status": trajectory.status,
        "steps": trajectory.steps,
        "wall_time_s": wall,
        "time_scale": config.model.time_scale,
        "dtype": config.solver.dtype,
        "backend": jax.default_backend(),
        "block_size": sim.block_size,
        "interaction": sim.interaction,  # the path that ran ("auto" resolved)
        "rank": sim.rank,  # features per token of the expansion; null for "exact"
    }
    write_json(out_dir / "metrics.json", summary)
    us = gauge_frames(sim.kernel.gauge, trajectory.xs)
    write_figures(out_dir, trajectory.ts, trajectory.xs, us, sim.xi, summary["series"])
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
