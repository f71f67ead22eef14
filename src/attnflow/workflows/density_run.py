"""One density run into a run folder: build → integrate → store → metrics → figures → status.

``run_density(config, out_dir)`` is ``attnflow run`` for a config with a ``[density]`` section, with
the particles' folder lifecycle (:func:`attnflow.io.run_folder.claimed`, layout
:data:`attnflow.io.density_folder.DENSITY_RUN`): every input is checked before the folder is touched
(:func:`attnflow.workflows.density_build.build_density`: bad input leaves nothing behind), then
``config.json``, then ``density.zarr`` snapshot by snapshot (a killed run keeps every completed
snapshot), then ``metrics.json`` and the figures, and the status last.

The loop advances one snapshot per call of one compiled program (``density_solve.integrate`` with
the particles' RK4 or Euler, identity retraction, and the resolution status), from the state as
stored: a resumed run (``resume=True``) continues from its last stored snapshot through the same
program on the same bits, so it is bitwise the run that never stopped. ``solver.method =
"adaptive"``: Dormand–Prince with error control (the particles' ``AdaptiveSteps`` through their
``advance``, the resolution status as its check), the step-size state carried from one snapshot to
the next (not stored: such a run is not resumed). The first snapshot whose
law is no longer resolved (``under_resolved``) or not finite ends the run at the last resolved one;
the status is the run's (``attnflow.numerics.status.Status``; the command line exits 3).

``metrics.json``: ``series`` over the stored times (``energy``; ``mass_error``, the largest change
of a label's mass since ``t = 0``; ``resolution_tail`` and ``negative_mass``, the resolution
indicators; ``spread``, ``1 − |∫ x dμ|`` of the marginal law, 0 for a Dirac and 1 for a law without
mean; ``slice_spread``, the same averaged over the label slices), their summary, and ``run``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.io import run_folder
from attnflow.io.atomic import write_json
from attnflow.io.config import Config, ConfigError, resolved_dict
from attnflow.io.density_folder import DENSITY_RUN, STORE
from attnflow.io.density_store import DensityWriter, read_density, read_snapshots
from attnflow.io.store import snapshot_time
from attnflow.io.version import __version__
from attnflow.numerics import density_circle as dc
from attnflow.numerics import density_sphere as ds
from attnflow.numerics.density_solve import integrate, run_status
from attnflow.numerics.integrators import Adaptive
from attnflow.numerics.saving import SaveAt
from attnflow.numerics.solve import Problem, advance
from attnflow.numerics.status import Status
from attnflow.numerics.steps import AdaptiveSteps
from attnflow.viz import density as density_figures
from attnflow.workflows.density_build import (
    DensityRun,
    build_density,
    snapshot_arrays,
    state_from_arrays,
)
from attnflow.workflows.run import Progress, RunInterrupted, RunResult

__all__ = ["run_density"]

ENERGY_SLACK = 1e-10  # energy_monotone: no decrease beyond this share of max |E| (the step's error)
_FINAL = ("ok", "under_resolved", "nonfinite")  # a store closed with these has nothing to continue


def run_density(
    config: Config,
    out_dir: str | os.PathLike,
    *,
    progress: Progress | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Solve the density of ``config`` and write the run folder ``out_dir`` (see the module doc).

    ``resume``: continue the density run in ``out_dir`` from its last complete snapshot (bitwise
    the uninterrupted run). ``overwrite``: replace the run in ``out_dir``. Ctrl-C raises
    ``RunInterrupted`` once the store is closed as ``interrupted`` and ``metrics.json`` written."""
    run = build_density(config)
    resolved = resolved_dict(config)

    def check(folder: Path) -> None:  # an earlier run to continue: the same config, a density
        _check_resumable(folder, resolved)

    with run_folder.claimed(out_dir, DENSITY_RUN, resume=resume, overwrite=overwrite, check=check) as claim:
        return _run_in_folder(run, claim.path, resolved, resume=claim.resumed, progress=progress)


def _check_resumable(folder: Path, resolved: dict) -> None:
    if resolved["solver"]["method"] == "adaptive" and (folder / STORE).exists():
        raise ConfigError(
            "run: `--resume` must continue a fixed-step density run (euler, rk4); got an adaptive one, "
            "whose step-size state is not stored. Pass --overwrite to start again."
        )
    if (folder / "trajectory.zarr").exists():
        raise ConfigError(
            f"run: `--resume` must continue a density run; got a particle run's folder {str(folder)!r} "
            "(trajectory.zarr). Pass --overwrite to replace it."
        )
    if not (folder / STORE).exists():
        return  # nothing stored yet: the run starts afresh
    before = read_density(folder / STORE, arrays=()).config
    if before != json.loads(json.dumps(resolved)):
        keys = [key for key in sorted(set(before) | set(resolved)) if before.get(key) != resolved.get(key)]
        raise ConfigError(
            f"run: `--resume` must continue the run's own config; got one that differs in "
            f"{', '.join(keys[:3]) or 'its layout'}. Pass --overwrite to start again."
        )


# --- the compiled pieces --------------------------------------------------------------------------------


def _module(field):
    """The solver module of ``field``: ``density_circle`` or ``density_sphere``."""
    return dc if isinstance(field, dc.CircleDensityField) else ds


@functools.partial(jax.jit, static_argnames=("integrator", "dt", "steps"))
def _advance(field, state, *, integrator, dt: float, steps: int):
    """``state`` one snapshot later (``steps`` steps of ``dt``) and its ``Status`` code; the
    state is the last resolved one when the code is not ``ok``. One program per shape and option
    set, the field an argument (its arrays are not constants of the program)."""
    module = _module(field)
    _, states, codes = integrate(
        field,
        state,
        integrator=integrator,
        dt=dt,
        steps_per_snapshot=steps,
        snapshots=1,
        status=lambda s: module.status_code(field, s),
    )
    return jax.tree.map(lambda leaf: leaf[-1], states), codes[-1]


@jax.jit
def _advance_adaptive(problem: Problem, carry, t_target):
    """``carry`` (state, key, step-size state, status) on to ``t_target`` by error-controlled steps
    (the particles' ``advance``), checked by the resolution status: ``(carry, Status code, stats)``,
    ``stats`` the (accepted, rejected, evaluations) of the way."""
    carry, (_, codes, stats) = advance(problem, carry, jnp.reshape(t_target, (1,)))
    return carry, codes[0], stats[0]


class _Stepper:
    """One snapshot on per call, by the run's fixed steps (``_advance``) or adaptive steps
    (``_advance_adaptive``): ``state, Status, steps taken = stepper(state, t_target)``; the first
    call compiles (``compile_time``)."""

    def __init__(self, run: DensityRun) -> None:
        self.run, self.program, self.carry, self.compile_time = run, None, None, 0.0
        if isinstance(run.integrator, Adaptive):
            self.problem = Problem(
                run.field,
                run.integrator,
                AdaptiveSteps(
                    rtol=run.integrator.rtol,
                    atol=run.integrator.atol,
                    dt0=run.dt,
                    max_steps_total=run.max_steps,
                ),
                SaveAt(run.save_every * (run.snapshots - 1), run.save_every),
                check=run_status,
            )

    def __call__(self, state, t_target: float):
        run, tic = self.run, time.perf_counter()
        if not isinstance(run.integrator, Adaptive):
            if self.program is None:
                options = dict(integrator=run.integrator, dt=run.dt, steps=run.steps_per_snapshot)
                self.program = _advance.lower(run.field, state, **options).compile()
                self.compile_time = time.perf_counter() - tic
            moved, code = self.program(run.field, state)
            return moved, Status.from_codes(code).item(), run.steps_per_snapshot
        if self.carry is None:
            policy = self.problem.stepsize
            self.carry = (state, jax.random.key(0), policy.init(run.integrator, state), np.int32(0))
            target = np.asarray(t_target, np.float64)
            self.program = _advance_adaptive.lower(self.problem, self.carry, target).compile()
            self.compile_time = time.perf_counter() - tic
        self.carry, code, stats = self.program(self.problem, self.carry, np.asarray(t_target, np.float64))
        return self.carry[0], Status.from_codes(int(code)).item(), int(stats[0] + stats[1])


def _resultants(field, state, frames):
    """``∫ x f dx`` per label in the content frame: ``(L, 2)`` on S^1, ``(L, 3)`` on S^2, where
    ``f_l(x) = g_l(Q_l x)`` for the gauge-frame slices ``g_l``: ``Q_lᵀ ∫ u g_l(u) du`` (``frames``:
    the ``Q_l``, ``(L, 3, 3)``; None: no gauge)."""
    if isinstance(field, dc.CircleDensityField):
        theta = 2 * np.pi * jnp.arange(field.grid) / field.grid
        f = state.f
        return 2 * np.pi * jnp.stack([jnp.mean(f * jnp.cos(theta), -1), jnp.mean(f * jnp.sin(theta), -1)], -1)
    r = jnp.einsum("cab,lab,ab->lc", field.grid_points(), field.synthesis(state.a), field.areas())
    return r if frames is None else jnp.einsum("lji,lj->li", frames, r)


@jax.jit
def _measure(field, state, frames):
    """The metrics of one snapshot (scalars; ``mass`` per label)."""
    tail, negative = _module(field).resolution(field, state)
    r = _resultants(field, state, frames)
    weights = field.labels.weights
    return {
        "energy": field.energy(state),
        "mass": field.mass(state),
        "resolution_tail": tail,
        "negative_mass": negative,
        "spread": 1.0 - jnp.linalg.norm(weights @ r),
        "slice_spread": jnp.sum(weights * (1.0 - jnp.linalg.norm(r, axis=-1))),
    }


class _Series:
    """The metric series of the snapshots measured so far (``mass_error`` against snapshot 0's masses)."""

    KEYS = ("energy", "mass_error", "resolution_tail", "negative_mass", "spread", "slice_spread")

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {"t": [], **{key: [] for key in self.KEYS}}
        self.mass0: np.ndarray | None = None

    def add(self, t: float, measured: dict) -> None:
        measured = jax.device_get(measured)
        mass = np.asarray(measured["mass"], dtype=np.float64)
        self.mass0 = mass if self.mass0 is None else self.mass0
        self.values["t"].append(float(t))
        self.values["mass_error"].append(float(np.max(np.abs(mass - self.mass0))))
        for key in self.KEYS:
            if key != "mass_error":
                self.values[key].append(float(measured[key]))

    def summary(self) -> dict:
        v = self.values
        if not v["t"]:
            return {}
        energy = np.asarray(v["energy"])
        slack = ENERGY_SLACK * max(1e-300, float(np.max(np.abs(energy))))
        return {
            "energy": v["energy"][-1],
            "energy_initial": v["energy"][0],
            "energy_monotone": bool(np.all(np.diff(energy) >= -slack)),
            "mass_error": max(v["mass_error"]),
            "resolution_tail": max(v["resolution_tail"]),
            "negative_mass": max(v["negative_mass"]),
            "spread": v["spread"][-1],
            "slice_spread": v["slice_spread"][-1],
            "series": v,
        }


# --- the run -----------------------------------------------------------------------------------------


def _run_in_folder(run: DensityRun, out_dir: Path, resolved: dict, *, resume: bool, progress) -> RunResult:
    start, status, writer, steps, compile_time = time.perf_counter(), "error", None, 0, None
    series, path = _Series(), out_dir / STORE
    frames = None if run.frames is None else jnp.asarray(run.frames)

    def measure(field, state):
        return _measure(field, state, frames)

    try:
        if resume:
            stored = read_density(path, arrays=())
            for k in range(stored.ts.shape[0]):  # the stored snapshots' metrics, read back one by one
                ts, arrays = read_snapshots(path, [k])
                series.add(
                    ts[0], measure(run.field, state_from_arrays(run, {n: a[0] for n, a in arrays.items()}))
                )
            state = state_from_arrays(
                run, {n: a[0] for n, a in read_snapshots(path, [len(series.values["t"]) - 1])[1].items()}
            )
            if stored.status in _FINAL:  # an ended run: nothing to continue, its status stands
                metrics = _finish(run, out_dir, None, series, stored.status, steps, None, start, figures=True)
                return RunResult(out_dir=out_dir, metrics=metrics, statistics=None)
            writer = DensityWriter.reopen(path)
        else:
            write_json(out_dir / "config.json", {**resolved, "attnflow_version": __version__})
            writer = DensityWriter(
                path,
                n_snapshots_max=run.snapshots,
                arrays=run.arrays,
                coords=run.coords,
                attrs={"config": resolved, "domain": run.domain, "attnflow_version": __version__},
            )
            state = run.state0
            writer.append(0.0, snapshot_arrays(run, state))
            series.add(0.0, measure(run.field, state))
        if progress is not None:
            progress(writer.n_snapshots, run.snapshots)
        outcome, stepper = Status.ok, _Stepper(run)
        for k in range(writer.n_snapshots, run.snapshots):
            t = snapshot_time(k, run.save_every)
            moved, outcome, taken = stepper(state, t)
            compile_time, steps = stepper.compile_time, steps + taken
            if outcome != Status.ok:
                break  # the law left the grid's resolution (or the reals): stop at the last resolved one
            state = moved
            writer.append(t, snapshot_arrays(run, state))
            series.add(t, measure(run.field, state))
            if progress is not None:
                progress(k + 1, run.snapshots)
        status = str(outcome)
    except KeyboardInterrupt:
        if writer is None:
            if not resume:  # stopped before the store: nothing computed
                write_json(out_dir / "metrics.json", {"run": {"status": "interrupted", "snapshots": 0}})
            raise RunInterrupted(out_dir, 0, run.snapshots) from None
        _finish(run, out_dir, writer, series, "interrupted", steps, compile_time, start, figures=False)
        raise RunInterrupted(out_dir, writer.n_snapshots, run.snapshots) from None
    except BaseException as error:
        if writer is not None:
            _finish(
                run, out_dir, writer, series, "error", steps, compile_time, start, figures=False, error=error
            )
        raise
    try:
        metrics = _finish(run, out_dir, writer, series, status, steps, compile_time, start, figures=True)
    except KeyboardInterrupt:
        raise RunInterrupted(out_dir, writer.n_snapshots, run.snapshots) from None
    return RunResult(out_dir=out_dir, metrics=metrics, statistics=None)


def _run_info(run: DensityRun, writer, series: _Series, status, steps, compile_time, start) -> dict:
    count = len(series.values["t"])
    info = {
        "status": status,
        "kind": "density",
        "domain": run.domain,
        "labels": run.labels.size,
        "steps": steps,
        "snapshots": count if writer is None else writer.n_snapshots,
        "dt": run.dt,
        "safe_dt": run.safe_dt,
        "beta": run.beta,
        "compile_time_s": compile_time,
        "wall_time_s": time.perf_counter() - start,
        "backend": jax.default_backend(),
    }
    info["grid" if run.domain == "circle" else "lmax"] = (
        run.field.grid if run.domain == "circle" else run.field.lmax
    )
    return info


def _finish(
    run, out_dir, writer, series, status, steps, compile_time, start, *, figures: bool, error=None
) -> dict:
    """Metrics, figures, then the status last: the store's, then ``metrics.json``'s. A failure
    while drawing records ``error`` (Ctrl-C: ``interrupted``)."""
    info = _run_info(run, writer, series, status, steps, compile_time, start)
    if error is not None:
        info["error"] = f"{type(error).__name__}: {error}"
    with run_folder.status_last(out_dir, info, functools.partial(_close, writer)) as summary:
        summary.update(series.summary())
        if figures and summary:
            coords = {name: values for name, (_, values, _) in run.coords.items()}
            _write_figures(out_dir, summary["series"], coords)
    return {**summary, "run": info}


def _close(writer, metrics: dict) -> None:
    if writer is not None and not writer.closed:
        writer.close(metrics["run"]["status"])


def _write_figures(out_dir: Path, series: dict, coords: dict[str, np.ndarray]) -> list[Path]:
    """The law at a few snapshots and, where ``series`` has more than the times, the metric series;
    ``coords`` the store's coordinates (``theta``, ``label`` on the circle, ``lat``, ``lon`` on the
    sphere)."""
    folder, path = out_dir / "figures", out_dir / STORE
    ts, arrays = read_snapshots(path, density_figures.figure_times(len(series["t"])))
    circle = "theta" in coords
    title = f"{out_dir.name}: density on S^{1 if circle else 2}"
    if circle:
        law = density_figures.write_circle_figure(
            folder / "density.png", theta=coords["theta"], labels=coords["label"], weights=coords["weight"],
            ts=ts, fs=arrays["f"], title=title,
        )  # fmt: skip
    else:
        law = density_figures.write_sphere_figure(
            folder / "density.png", lat=coords["lat"], lon=coords["lon"], weights=coords["weight"],
            ts=ts, fs=arrays["f"], title=title,
        )  # fmt: skip
    if set(series) == {"t"}:
        return [law]
    return [law, density_figures.write_series_figure(folder / "series.png", series, title=title)]


def replot(run_dir: str | os.PathLike) -> list[Path]:
    """Redraw the figures of a density run folder from its store and the series of its
    ``metrics.json`` (only the law's figure where a killed run left no ``metrics.json``)."""
    run_dir = Path(run_dir)
    stored = read_density(run_dir / STORE, arrays=())
    metrics_path = run_dir / "metrics.json"
    series = json.loads(metrics_path.read_text()).get("series", {}) if metrics_path.exists() else {}
    return _write_figures(run_dir, series or {"t": list(stored.ts)}, stored.coords)
