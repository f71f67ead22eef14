"""One simulation into a run folder: build → solve → store → metrics → figures → status.

``run(config, out_dir)`` validates and builds everything before it touches the disk (bad input
leaves nothing behind), claims the folder (:func:`attnflow.io.run_folder.claimed`: locked while the
run writes, so of two runs into one folder exactly one runs), writes ``config.json``, streams
snapshots into ``trajectory.zarr`` (a killed run keeps every completed snapshot), and finally the
metrics (from the stored snapshots, :func:`attnflow.analysis.summary.summarize`), the figures, and
last the status, in the store and in ``metrics.json``: whatever ends a started run (Ctrl-C, an
error, a full disk while drawing), ``metrics.json`` says so. ``resume=True`` continues a stopped
fixed-step run from its last complete snapshot, bitwise as if it had never stopped.

Layer norms (``model.layer_norm``): post-LN and nGPT evolve the directions ``x`` on the sphere and
are stored as ever. Pre- and peri-LN evolve ``z = r x`` in ``R^d``: the store keeps the directions
``x`` and the radii ``r (t, token)``, the metrics add the radii, and a fixed-step run advances one
snapshot at a time from ``z = r x`` as stored (:func:`attnflow.numerics.layer_norms.solve_radial`),
so that it too resumes bitwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from attnflow.analysis.summary import OnlineSummary, subsample
from attnflow.core.gauges import RoPE
from attnflow.io import run_folder, store
from attnflow.io.atomic import write_json
from attnflow.io.config import Config, ConfigError, resolved_dict
from attnflow.io.version import __version__
from attnflow.numerics.layer_norms import join_state, solve_radial, split_state
from attnflow.numerics.saving import SaveAt
from attnflow.numerics.solve import SolveStatistics, snapshot_count, solve_streaming
from attnflow.numerics.steps import ConstantSteps
from attnflow.viz import plotting
from attnflow.viz.law import write_law_figure
from attnflow.viz.viewer import write_run_viewer
from attnflow.workflows.build import build

Progress = Callable[[int, int], None]  # (snapshots stored, snapshots in all); the first call comes
# before the solve compiles its program, the last (done == total) before the figures are drawn

SCATTER_LIMIT = 8192  # above this n the state figures draw an evenly spaced subsample of tokens
LAW_LIMIT = 8192  # above this n the run also draws the empirical law (law.png, attnflow.viz.law)
LAW_TOKENS = 10**6  # tokens binned for law.png (a subsample above)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A finished run: its folder, its metrics (``metrics.json``) and the solver's statistics
    (``None`` when nothing was left to compute, e.g. a resumed run that had finished)."""

    out_dir: Path
    metrics: dict
    statistics: SolveStatistics | None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a SIGTERM the command line raised as one) stopped a run: its store is closed as
    ``interrupted`` and ``metrics.json`` written; ``kept`` of ``total`` snapshots are in
    ``out_dir`` (``run(..., resume=True)`` continues)."""

    def __init__(self, out_dir: Path, kept: int, total: int) -> None:
        super().__init__(f"interrupted: kept {kept} of {total} snapshots in {str(out_dir)!r}")
        self.out_dir, self.kept, self.total = out_dir, kept, total


def write_figures(out_dir: Path, ts, xs, us, xi, series: dict, *, looks: dict | None = None) -> list[Path]:
    """The run figures of ``out_dir/figures`` from the snapshots ``xs (T, n, d)`` at ``ts (T,)``,
    their gauge frames ``us``, the labels ``xi`` (colours) and the ``series`` block of the metrics
    (over ``ts``; entries with nulls skipped). Only the first and the last snapshot are drawn, so
    ``xs`` and ``us`` may hold just those two (``(2, n, d)``; a run passes no more). ``looks``:
    ``color_label``, ``title``, ``energy_max`` of the figures (:func:`figure_looks`)."""
    first, last = (ts[0], xs[0], us[0]), (ts[-1], xs[-1], us[-1])
    return _write_figures(out_dir, ts=ts, series=series, first=first, last=last, xi=xi, looks=looks)


LABEL_NAMES = {"positions": "position ξ", "prompts": "prompt id", "none": "no label (ξ = 0)"}


def figure_looks(config_name: str, aux_kind: str, seed: int, energy_max) -> dict:
    """What the run figures say: the colour bar's name (the label), the title (config and seed) and
    the closed-form maximum of the energy, drawn when known."""
    return {
        "color_label": LABEL_NAMES.get(aux_kind, "label ξ"),
        "title": f"{config_name} (seed {seed})",
        "energy_max": energy_max,
    }


def _write_figures(
    out_dir: Path, *, ts, series: dict, first: tuple, last: tuple, xi, looks: dict | None = None
) -> list[Path]:
    """The figures from the series over ``ts (T,)`` and two states ``(t, x, u)``, ``first`` and
    ``last``: holds no more than those two (and ``T`` numbers per series), whatever ``T``. Above
    ``SCATTER_LIMIT`` tokens the states are drawn on an evenly spaced subsample, and above
    ``LAW_LIMIT`` the empirical law of the last state is drawn too (``law.png``)."""
    folder = out_dir / "figures"
    xi = np.asarray(xi)
    color = xi if xi.ndim == 1 else xi[:, 0]
    n = first[1].shape[0]
    rows = subsample(n, SCATTER_LIMIT) if n > SCATTER_LIMIT else slice(None)
    states = [(float(t), np.asarray(x, float)[rows], np.asarray(u, float)[rows]) for t, x, u in (first, last)]
    ts = np.asarray(ts, dtype=float)
    arrays = {k: np.asarray(v, dtype=float) for k, v in series.items() if k != "t" and None not in v}
    written = []
    if ts.shape[0] > 1 and arrays:  # the series figures; their states panel is redrawn below
        x_last, u_last = states[1][1], states[1][2]
        written = plotting.write_run_figures(
            folder,
            ts=ts,
            xs=np.broadcast_to(x_last, (ts.shape[0], *x_last.shape)),  # views: no copy per time
            us=np.broadcast_to(u_last, (ts.shape[0], *u_last.shape)),
            color=color[rows],
            series=arrays,
            states=False,
            **(looks or {}),
        )
    pair = states if states[1][0] > states[0][0] else states[:1]
    drawn = plotting.write_run_figures(
        folder,
        ts=np.asarray([t for t, _, _ in pair]),
        xs=np.stack([x for _, x, _ in pair]),
        us=np.stack([u for _, _, u in pair]),
        color=color[rows],
        series={},
        **(looks or {}),
    )
    written = drawn[:1] + written
    if n > LAW_LIMIT:
        sample = subsample(n, LAW_TOKENS)
        t, x, u = last
        law = write_law_figure(
            folder / "law.png", x=x[sample], u=u[sample], color=color[sample], t=float(t), n_total=n
        )
        written.append(law)
    return written


def _stored_rows(config: Config) -> slice:
    """The tokens the store keeps (``storage.token_stride``)."""
    return slice(None, None, config.storage.token_stride)


def _keeps_state(config: Config) -> bool:
    """Whether the store holds every token of every snapshot at the solver's precision (the state
    a resumed run continues from)."""
    storage = config.storage
    return (
        storage.token_stride == 1
        and storage.snapshots == "all"
        and storage.dtype in (None, config.solver.dtype)
    )


def _open_writer(config: Config, sim, out_dir: Path, resolved: dict, *, resume: bool):
    """The store's writer: a new store, or the existing one reopened after its last complete
    snapshot (``resume``; the folder must have been made by the same config). The store holds
    what the ``storage`` section asks (every k-th token, a dtype, all or the final snapshots)."""
    path = out_dir / "trajectory.zarr"
    if not resume:
        write_json(out_dir / "config.json", {**resolved, "attnflow_version": __version__})
        rows, storage = _stored_rows(config), config.storage
        total = snapshot_count(sim.t_end, sim.save_every)
        gauge, rope_angles = _stored_gauge(sim.kernel.gauge, rows)
        return store.TrajectoryWriter(
            path,
            n_snapshots_max=total if storage.snapshots == "all" else min(2, total),
            n=len(range(config.model.n)[rows]),
            d=config.model.d,
            xi=sim.xi[rows],
            gauge=gauge,
            rope_angles=rope_angles,
            attrs={"config": resolved, "attnflow_version": __version__},
            dtype=storage.dtype or config.solver.dtype,
            radii=sim.radial,
        )
    stored = store.open_dataset(path)
    before = json.loads(json.dumps(stored.attrs.get("config")))
    if before != json.loads(json.dumps(resolved)):
        keys = _differing_keys(before or {}, resolved)
        raise ConfigError(
            f"run: `--resume` must continue the run's own config; got one that differs in "
            f"{', '.join(keys[:3]) or 'its layout'}. Pass --overwrite to start again."
        )
    resumable = _fixed_steps(sim) and sim.noise == 0 and _keeps_state(config)
    if not resumable and (stored.sizes["t"] > 1 or not _keeps_state(config)):
        raise ConfigError(
            "run: `--resume` must continue a deterministic fixed-step run whose store keeps its "
            "state (every token and snapshot, at the solver's dtype); got an adaptive, noisy or "
            "thinned one. Pass --overwrite to start again."
        )
    return store.TrajectoryWriter.reopen(path)


def _fixed_steps(sim) -> bool:
    return isinstance(sim.integrator.default_steps(sim.dt, max_steps=1), ConstantSteps)


def _stored_gauge(gauge, rows: slice) -> tuple[np.ndarray | None, np.ndarray | None]:
    """What the store keeps of the gauge, for the stored tokens: ``(matrices, None)``, or for RoPE
    ``(None, angles)`` (``n x m`` numbers instead of ``n x d x d``), or ``(None, None)``."""
    if gauge.is_identity:
        return None, None
    if isinstance(gauge, RoPE):
        return None, np.asarray(gauge.angles, dtype=np.float64)[rows]
    return np.asarray(gauge.matrices())[rows], None


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
    with warnings.catch_warnings(record=True) as advice:  # given once the folder accepts the run:
        warnings.simplefilter("always")  # a refused --resume is one line, not advice and a refusal
        sim = build(config, streamed=True)
    resolved = resolved_dict(config)
    with run_folder.claimed(out_dir, run_folder.RUN, resume=resume, overwrite=overwrite) as claim:
        try:
            return _run_in_folder(
                config, sim, claim.path, resolved, resume=claim.resumed, progress=progress, advice=advice
            )
        except ValueError:  # bad input found by the store before its first write: leave nothing behind
            if not claim.resumed and not (claim.path / "trajectory.zarr").exists():
                claim.discard()
            raise


class _Snapshots:
    """Where each computed snapshot goes, as it arrives: the metrics (every token, every saved time)
    and the store (the ``storage`` section's tokens and times). Holds the first and the latest
    snapshot, nothing more; with ``storage.snapshots = "final"`` the latest is stored at the end
    (``flush``)."""

    def __init__(self, config: Config, sim, writer, summary: OnlineSummary) -> None:
        self.writer, self.summary = writer, summary
        self.rows, self.every = _stored_rows(config), config.storage.snapshots == "all"
        self.save_every = sim.save_every
        self.first: tuple | None = None
        self.pending: tuple | None = None

    def add(self, k: int, x: np.ndarray, r: np.ndarray | None = None) -> None:
        """Snapshot number ``k`` of the whole run (its time ``k · save_every``): the directions
        ``x``, and the radii ``r`` of a pre- or peri-LN run."""
        t = store.snapshot_time(k, self.save_every)
        if self.first is None:
            self.first = (t, np.array(x))
        stored_r = None if r is None else np.array(r[self.rows])
        if self.every or self.writer.n_snapshots == 0:
            self.writer.append(t, x[self.rows], stored_r)  # committed by its time, written last (io.store)
        else:
            self.pending = (t, np.array(x[self.rows]), stored_r)
        self.summary.add([t], x[None], None if r is None else r[None])

    def flush(self) -> None:
        if self.pending is not None and not self.writer.closed:
            self.writer.append(*self.pending)
            self.pending = None


def _run_in_folder(
    config, sim, out_dir: Path, resolved: dict, *, resume: bool, progress, advice=()
) -> RunResult:
    n_snapshots = snapshot_count(sim.t_end, sim.save_every)
    status, statistics, start, writer = "error", None, time.perf_counter(), None
    summary = OnlineSummary(
        sim.kernel,
        groups=sim.groups,
        block_size=sim.block_size,
        energy="expansion" if sim.interaction == "expansion" else "exact",
        tolerance=config.solver.tolerance,
        field=sim.field,
        radial=sim.radial,
    )
    snapshots = None
    try:
        writer = _open_writer(config, sim, out_dir, resolved, resume=resume)
        for said in advice:  # build's warnings, under the caller's filters
            warnings.warn_explicit(said.message, said.category, said.filename, said.lineno)
        snapshots = _Snapshots(config, sim, writer, summary)
        first = writer.n_snapshots - 1 if resume else 0  # the stored snapshot the solve starts from
        x0, r0 = sim.x0, None
        if sim.radial:  # the tokens z = r x, r(0) = 1 (up to round-off: split as stored)
            x0, r0 = split_state(np.asarray(sim.x0))
        if resume:  # the metrics of the stored snapshots, read back block by block
            for ts, xs, rs in store.iter_radial_snapshots(writer.path):
                summary.add(ts, xs, rs)
                snapshots.first = snapshots.first or (float(ts[0]), np.array(xs[0]))
            x0, r0 = summary.last, summary.last_radii
        counter = {"k": first}

        def on_state(k: int, x: np.ndarray, r: np.ndarray | None = None) -> None:
            if resume and k == first:
                return  # the snapshot resumed from, already stored and measured
            snapshots.add(k, x, r)
            if progress is not None:
                progress(k + 1, n_snapshots)

        def on_snapshots(ts: np.ndarray, xs: np.ndarray) -> None:
            for state in xs:
                k = counter["k"]
                counter["k"] += 1
                on_state(k, *(split_state(state) if sim.radial else (state,)))

        if first + 1 < n_snapshots:
            if resume and progress is not None:  # the stored snapshots, reported before the solve
                progress(first + 1, n_snapshots)  # compiles (a fresh run reports x0 first)
            t_end = (n_snapshots - 1 - first) * sim.save_every
            if sim.radial and _fixed_steps(sim):  # one snapshot at a time, from z = r x as stored
                on_state(first, x0, r0)
                statistics = solve_radial(
                    sim.field, x0, r0, on_snapshot=lambda k, x, r: on_state(first + k, x, r),
                    integrator=sim.integrator, dt=sim.dt, t_end=t_end, save_every=sim.save_every,
                )  # fmt: skip
            else:
                statistics = solve_streaming(
                    sim.field,
                    jax.numpy.asarray(x0 if r0 is None else join_state(x0, r0)),
                    on_snapshots=on_snapshots,
                    integrator=sim.integrator,
                    dt=sim.dt,
                    saveat=SaveAt(t_end, sim.save_every),
                    noise=sim.noise,
                    key=sim.key,
                    max_steps=config.solver.max_steps,  # the adaptive bound of the whole run (None: none)
                )
            status = str(statistics.status)
        else:
            status = "ok"
    except KeyboardInterrupt:
        if writer is None:  # stopped while the store was being created: nothing computed yet
            write_json(out_dir / "metrics.json", {"run": {"status": "interrupted", "snapshots": 0}})
            raise RunInterrupted(out_dir, 0, n_snapshots) from None
        _finish(config, sim, out_dir, writer, snapshots, "interrupted", statistics, start, figures=False)
        raise RunInterrupted(out_dir, writer.n_snapshots, n_snapshots) from None
    except BaseException as error:
        if writer is None:  # no store: the folder's config was refused, or the disk failed first
            raise
        _finish(
            config, sim, out_dir, writer, snapshots, "error", statistics, start, figures=False, error=error
        )
        raise
    try:
        metrics = _finish(config, sim, out_dir, writer, snapshots, status, statistics, start, figures=True)
    except KeyboardInterrupt:  # while drawing: recorded as interrupted, every snapshot kept
        raise RunInterrupted(out_dir, writer.n_snapshots, n_snapshots) from None
    return RunResult(out_dir=out_dir, metrics=metrics, statistics=statistics)


def _run_info(config, sim, writer, status, statistics: SolveStatistics | None, start) -> dict:
    """The ``run`` block of ``metrics.json``: what ran, how, and the solver's step statistics
    (``null`` when the solve did not return: interrupted, failed, or nothing left to resume). The
    statistics and times are this process's (a resumed run's: since its snapshot); ``snapshots``
    counts the whole run."""
    counts = statistics.statistics() if statistics is not None else {}
    return (
        {
            "status": status,
            "steps": None if statistics is None else statistics.steps,
            "steps_accepted": counts.get("steps_accepted"),
            "steps_rejected": counts.get("steps_rejected"),
            "evaluations": counts.get("evaluations"),
            "compile_time_s": None if statistics is None else statistics.compile_time_s,
            "snapshots": writer.n_snapshots,
            "stored_tokens": len(range(config.model.n)[_stored_rows(config)]),
            "wall_time_s": time.perf_counter() - start,
            "time_scale": config.model.time_scale,
            # the β that ran: model.beta (gamma log n with beta_scaling 'log_n'), times the square of the
            # RoPE scaling's attention factor (YaRN: 0.1 ln s + 1), recorded with a preset
            "beta": float(sim.kernel.profile.beta),
            "dtype": config.solver.dtype,
            "backend": jax.default_backend(),
            "block_size": sim.block_size,
            "interaction": sim.interaction,  # the path that ran ("auto" resolved)
            "rank": sim.rank,  # features per token of the expansion; null for "exact"
        }
        | ({} if sim.layer_norm == "post" else {"layer_norm": sim.layer_norm})
        | ({} if sim.attention_factor is None else {"attention_factor": sim.attention_factor})
    )


# The gauge frames of the two states drawn: one compiled program (found in the persistent cache by a
# warm process), not one per operation of the gauge's eager ``apply``.
_gauge_frames = jax.jit(jax.vmap(lambda gauge, x: gauge.apply(x), in_axes=(None, 0)))


def _finish(
    config, sim, out_dir, writer, snapshots, status, statistics, start, *, figures: bool, error=None
) -> dict:
    """Metrics, figures, then the status, last: the store's and ``metrics.json``'s. A failure on
    the way (a full disk while drawing) records ``error``, never the run's own status."""
    info = _run_info(config, sim, writer, status, statistics, start)
    if error is not None:
        info["error"] = f"{type(error).__name__}: {error}"
    with run_folder.status_last(out_dir, info, _closer(writer)) as summary:
        if snapshots is not None:
            snapshots.flush()
            info["snapshots"] = writer.n_snapshots
            if snapshots.summary.count > 0:
                summary.update(snapshots.summary.result())
        if figures and summary:
            gauge = sim.kernel.gauge
            xs = np.stack([snapshots.first[1], snapshots.summary.last])  # the two states drawn
            us = np.asarray(_gauge_frames(gauge, xs))
            looks = figure_looks(out_dir.name, config.aux.kind, config.init.seed, summary.get("energy_max"))
            write_figures(out_dir, summary["series"]["t"], xs, us, sim.xi, summary["series"], looks=looks)
            energy = summary["series"].get("energy")
            write_run_viewer(out_dir, n_snapshots=writer.n_snapshots, energy=energy)  # flushed: read back
    return {**summary, "run": info}


def _closer(writer) -> Callable[[dict], None]:
    """Close the store with the run's status; the metric series go into the store only when they
    cover every snapshot."""

    def close(metrics: dict) -> None:
        if writer.closed:
            return
        series = metrics.get("series")
        if not (series and len(series.get("t", [])) == writer.n_snapshots):
            series = None
        writer.close(metrics["run"]["status"], series=series)

    return close


def replot(run_dir: str | os.PathLike) -> list[Path]:
    """Redraw the figures of a run folder from its store (first and last snapshot, read lazily)
    and the series of its ``metrics.json`` (a density run's folder:
    :func:`attnflow.workflows.density_run.replot`)."""
    run_dir = Path(run_dir)
    if not (run_dir / "trajectory.zarr").exists():
        wanted = "a run folder with trajectory.zarr or density.zarr"
        raise ConfigError(f"plot: `RUN_DIR` must be {wanted}; got {str(run_dir)!r}.")
    ds = store.open_dataset(run_dir / "trajectory.zarr")
    ts = ds["t"].values
    gauge = store.read_gauge(run_dir / "trajectory.zarr")

    def state(k: int) -> tuple:
        x = ds["x"][k].values
        return float(ts[k]), x, (x if gauge is None else gauge.frame(x))

    metrics_path = run_dir / "metrics.json"
    series = json.loads(metrics_path.read_text()).get("series", {}) if metrics_path.exists() else {}
    times = series.get("t") or ts
    figures = _write_figures(
        run_dir, ts=times, series=series, first=state(0), last=state(-1), xi=ds["xi"].values
    )
    return [*figures, write_run_viewer(run_dir, n_snapshots=len(ts))]
