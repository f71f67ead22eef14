"""One simulation into a run folder: build → solve → store → metrics → figures → status.

``run(config, out_dir)`` validates and builds everything before it touches the disk (bad input
leaves nothing behind), claims the folder (``.attnflow-run``, created exclusively and locked while
the run writes: two runs into one folder, exactly one runs), writes ``config.json``, streams
snapshots into ``trajectory.zarr`` (a killed run keeps every completed snapshot), and finally the
metrics (from the stored snapshots, :func:`attnflow.analysis.summary.summarize`), the figures, and
last the status, in the store and in ``metrics.json``: whatever ends a started run (Ctrl-C, an
error, a full disk while drawing), ``metrics.json`` says so. ``resume=True`` continues a stopped
fixed-step run from its last complete snapshot, bitwise as if it had never stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

from attnflow.analysis.summary import gauge_frames, summarize
from attnflow.io import store
from attnflow.io.atomic import write_json
from attnflow.io.config import Config, ConfigError, resolved_dict
from attnflow.io.version import __version__
from attnflow.numerics.saving import SaveAt
from attnflow.numerics.solve import Trajectory, snapshot_count, solve
from attnflow.numerics.steps import ConstantSteps
from attnflow.viz import plotting
from attnflow.workflows.build import build

Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class RunResult:
    out_dir: Path
    metrics: dict
    trajectory: Trajectory


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run: its store is closed as ``interrupted`` and ``metrics.json`` written;
    ``kept`` of ``total`` snapshots are in ``out_dir`` (``run(..., resume=True)`` continues)."""

    def __init__(self, out_dir: Path, kept: int, total: int) -> None:
        super().__init__(f"interrupted: kept {kept} of {total} snapshots in {str(out_dir)!r}")
        self.out_dir, self.kept, self.total = out_dir, kept, total


MARKER = ".attnflow-run"  # created exclusively by the run that owns the folder; locked while it writes
_OWN_ENTRIES = (MARKER, "config.json", "metrics.json", "trajectory.zarr", "figures")


def _is_own(name: str) -> bool:
    """A run's file, or a temporary one a killed write left (``.metrics.json.<hex>.tmp``,
    ``.trajectory.zarr.<hex>.partial``)."""
    return name in _OWN_ENTRIES or any(name.startswith(f".{own}.") for own in _OWN_ENTRIES)


def _claim_folder(out_dir: Path, *, resume: bool, overwrite: bool) -> tuple[int, bool]:
    """Make ``out_dir`` this run's: create the marker exclusively (a new run) or open it (resume,
    overwrite), and lock it for the run's lifetime (the lock dies with the process, SIGKILL
    included). Returns the locked descriptor, and whether there is a store to resume (a run stopped
    before its store existed starts again). Two runs into one folder: exactly one gets it."""
    where = f"run: `--out` {str(out_dir)!r}"
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / MARKER
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        fresh = True
    except FileExistsError:
        if not (resume or overwrite):
            raise ConfigError(
                f"{where} must be a new or empty folder; got a run folder. Pass --resume to continue "
                "it or --overwrite to replace it."
            ) from None
        fd, fresh = os.open(marker, os.O_WRONLY), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{where} must not be in use; got a folder another run is writing now.") from None
    others = sorted(p.name for p in out_dir.iterdir() if p.name != MARKER)
    foreign = [name for name in others if not _is_own(name)]
    problem = None
    if fresh and others and not (resume or overwrite):
        problem = f"must be a new or empty folder; got {len(others)} entries (not empty)"
    elif foreign and (overwrite or not fresh):
        problem = f"must hold only a run's files to be replaced or resumed; got {foreign[0]!r}"
    elif resume and fresh and "trajectory.zarr" not in others:
        problem = "must hold a run to resume; got none (start a new run instead)"
    if problem is not None:
        if fresh:
            marker.unlink()
        os.close(fd)
        raise ConfigError(f"{where} {problem}.")
    starts_again = resume and "trajectory.zarr" not in others  # stopped before its first snapshot
    if overwrite or starts_again:
        for name in others:
            path = out_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return fd, resume and not starts_again


@contextlib.contextmanager
def _interrupts_between_writes() -> Iterator[Callable[[], contextlib.AbstractContextManager]]:
    """SIGINT raises KeyboardInterrupt at once, except during a snapshot write, which completes
    first (the write's background I/O is never abandoned half-way). Yields ``writing()``, the
    context of one write. Outside the main thread signals cannot be handled: a plain context."""
    if threading.current_thread() is not threading.main_thread():
        yield contextlib.nullcontext
        return
    state = {"writing": False, "pending": False}

    def handler(signum, frame):  # noqa: ARG001
        state["pending"] = True  # also raised after the next write, should this one be swallowed
        if not state["writing"]:  # (an exception in a garbage-collector callback is only printed)
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def writing():
        state["writing"] = True
        try:
            yield
        finally:
            state["writing"] = False
        if state["pending"]:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield writing
    finally:
        signal.signal(signal.SIGINT, previous)


def write_figures(out_dir: Path, ts, xs, us, xi, series: dict) -> list[Path]:
    """The run figures of ``out_dir/figures`` from the snapshots, their gauge frames ``us``, the
    labels ``xi`` (colours) and the ``series`` block of the metrics (entries with nulls skipped)."""
    color = xi if xi.ndim == 1 else xi[:, 0]
    arrays = {k: np.asarray(v, dtype=float) for k, v in series.items() if k != "t" and None not in v}
    return plotting.write_run_figures(out_dir / "figures", ts=ts, xs=xs, us=us, color=color, series=arrays)


def _open_writer(config: Config, sim, out_dir: Path, resolved: dict, *, resume: bool):
    """The store's writer: a new store, or the existing one reopened after its last complete
    snapshot (``resume``; the folder must have been made by the same config)."""
    path = out_dir / "trajectory.zarr"
    if not resume:
        write_json(out_dir / "config.json", {**resolved, "attnflow_version": __version__})
        return store.TrajectoryWriter(
            path,
            n_snapshots_max=snapshot_count(sim.t_end, sim.save_every),
            n=config.model.n,
            d=config.model.d,
            xi=sim.xi,
            gauge=None if sim.kernel.gauge.is_identity else np.asarray(sim.kernel.gauge.matrices()),
            attrs={"config": resolved, "attnflow_version": __version__},
            dtype=config.solver.dtype,
        )
    stored = store.read_trajectory(path)
    before = json.loads(json.dumps(stored.attrs.get("config")))
    if before != json.loads(json.dumps(resolved)):
        keys = _differing_keys(before or {}, resolved)
        raise ConfigError(
            f"run: `--resume` must continue the run's own config; got one that differs in "
            f"{', '.join(keys[:3]) or 'its layout'}. Pass --overwrite to start again."
        )
    fixed = isinstance(sim.integrator.default_steps(sim.dt, max_steps=1), ConstantSteps)
    resumable = fixed and sim.noise == 0
    if stored.ts.shape[0] > 1 and not resumable:
        raise ConfigError(
            "run: `--resume` must continue a deterministic fixed-step run (its state is the last "
            "snapshot); got an adaptive or noisy one. Pass --overwrite to start again."
        )
    return store.TrajectoryWriter.reopen(path)


def _differing_keys(before: dict, after: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _differing_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys


def run(
    config: Config,
    out_dir: str | os.PathLike,
    *,
    progress: Progress | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Simulate ``config`` and write the run folder ``out_dir``.

    ``resume``: continue the run already in ``out_dir`` from its last complete snapshot (a killed
    or interrupted fixed-step run; the result is bitwise that of an uninterrupted run).
    ``overwrite``: replace the run already in ``out_dir``. Whatever happens once the run has
    started, ``metrics.json`` records its status, written last (after the figures); Ctrl-C raises
    ``RunInterrupted`` once the store is closed as ``interrupted``.
    """
    if resume and overwrite:
        raise ConfigError("run: `--resume` and `--overwrite` must not be given together; got both.")
    sim = build(config)
    out_dir = Path(out_dir)
    resolved = resolved_dict(config)
    lock, resume = _claim_folder(out_dir, resume=resume, overwrite=overwrite)
    try:
        return _run_in_folder(config, sim, out_dir, resolved, resume=resume, progress=progress)
    finally:
        os.close(lock)


def _run_in_folder(config, sim, out_dir: Path, resolved: dict, *, resume: bool, progress) -> RunResult:
    n_snapshots = snapshot_count(sim.t_end, sim.save_every)
    status, steps, trajectory, start, writer = "error", None, None, time.perf_counter(), None
    try:
        with _interrupts_between_writes() as writing:
            writer = _open_writer(config, sim, out_dir, resolved, resume=resume)
            first = writer.n_snapshots - 1 if resume else 0  # the stored snapshot the solve starts from

            def on_snapshot(k: int, t: float, x: np.ndarray) -> None:  # noqa: ARG001
                if resume and k == 0:
                    return  # the snapshot resumed from, already stored
                with writing():
                    writer.append((first + k) * sim.save_every, x)  # the times of the whole run
                if progress is not None:
                    progress(first + k + 1, n_snapshots)

            if first + 1 < n_snapshots:
                stored = store.read_trajectory(writer.path) if resume else None
                x0 = sim.x0 if stored is None else jax.numpy.asarray(stored.xs[-1])
                trajectory = solve(
                    sim.field,
                    x0,
                    integrator=sim.integrator,
                    dt=sim.dt,
                    saveat=SaveAt((n_snapshots - 1 - first) * sim.save_every, sim.save_every),
                    noise=sim.noise,
                    key=sim.key,
                    on_snapshot=on_snapshot,
                )
                status, steps = str(trajectory.status), trajectory.steps
            else:
                status, steps = "ok", 0
    except KeyboardInterrupt:
        if writer is None:  # stopped while the store was being created: nothing computed yet
            write_json(out_dir / "metrics.json", {"run": {"status": "interrupted", "snapshots": 0}})
            raise RunInterrupted(out_dir, 0, n_snapshots) from None
        _finish(config, sim, out_dir, writer, "interrupted", steps, start, figures=False)
        raise RunInterrupted(out_dir, writer.n_snapshots, n_snapshots) from None
    except BaseException as error:
        if writer is None:  # no store: the folder's config was refused, or the disk failed first
            raise
        _finish(config, sim, out_dir, writer, "error", steps, start, figures=False, error=error)
        raise
    summary = _finish(config, sim, out_dir, writer, status, steps, start, figures=True)
    return RunResult(out_dir=out_dir, metrics=summary, trajectory=trajectory)


def _finish(config, sim, out_dir, writer, status, steps, start, *, figures: bool, error=None) -> dict:
    """Metrics, figures, then the status, last: the store's and ``metrics.json``'s. A failure on
    the way (a full disk while drawing) records ``error``, never the run's own status."""
    info = {
        "status": status,
        "steps": steps,
        "snapshots": writer.n_snapshots,
        "wall_time_s": time.perf_counter() - start,
        "time_scale": config.model.time_scale,
        "dtype": config.solver.dtype,
        "backend": jax.default_backend(),
        "block_size": sim.block_size,
        "interaction": sim.interaction,  # the path that ran ("auto" resolved)
        "rank": sim.rank,  # features per token of the expansion; null for "exact"
    }
    if error is not None:
        info["error"] = f"{type(error).__name__}: {error}"
    summary: dict = {}
    try:
        stored = store.read_trajectory(writer.path)
        if stored.ts.shape[0] > 0:
            summary = summarize(
                sim.kernel, stored.ts, stored.xs, groups=sim.groups, block_size=sim.block_size
            )
        if figures:
            us = gauge_frames(sim.kernel.gauge, stored.xs)
            write_figures(out_dir, stored.ts, stored.xs, us, sim.xi, summary["series"])
    except BaseException as failure:
        info.update(status="error", error=f"{type(failure).__name__}: {failure}")
        _record(out_dir, writer, {**summary, "run": info})
        raise
    _record(out_dir, writer, {**summary, "run": info})
    return {**summary, "run": info}


def _record(out_dir: Path, writer, summary: dict) -> None:
    """Close the store and write ``metrics.json`` with the final status (best effort after a failure
    of the machine: the store's status is then what a reader sees)."""
    status = summary["run"]["status"]
    if not writer.closed:
        with contextlib.suppress(Exception):
            writer.close(status)
    write_json(out_dir / "metrics.json", summary)


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
