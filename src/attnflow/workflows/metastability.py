"""Metastability measured: plateau lifetimes against β, the merges, and the noisy threshold.

The setting is E6's (``workflows/paper/E6.toml``, variant "usa": d = 3, uniform initial data,
Dormand–Prince 5(4) at rtol 1e-8) at several β, run on the rescaled time scale (``c = e^{−β}``,
so the solver's time is ``s = t e^β`` directly: the same trajectory as E6's plain time scale,
reparametrised). Every run ends at the same ``s_end`` with the same number of samples, so the
plateaus of every β are measured alike (:func:`attnflow.analysis.plateaus.detect_plateaus`).

- :func:`plateau_runs`: the seeds of one β in one batch; per seed the plateaus (energy, entry,
  exit, cluster count, closest-cluster angle) and the merges between them;
- :func:`lifetime_study`: several β; the fits of ``log T`` (:func:`~attnflow.analysis.plateaus.
  lifetime_fits`) and the fraction of merges of the two closest clusters;
- :func:`lifetime_rows`: one row per plateau (a table for a CSV file);
- ``python -m attnflow.workflows.metastability --out DIR`` writes both figures of
  ``docs/metastability.md``, the tables and the numbers (``metastability.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis.plateaus import (
    LifetimeFits,
    Merge,
    Plateau,
    closest_pair_fraction,
    detect_plateaus,
    is_metastable,
    lifetime_fits,
    merge_events,
)
from attnflow.io.atomic import write_json, write_text
from attnflow.numerics.solve import solve
from attnflow.numerics.summation import energy
from attnflow.viz.metastability import write_lifetime_figure, write_threshold_figure
from attnflow.workflows.build import build, make_initial
from attnflow.workflows.experiments import load_experiments
from attnflow.workflows.noise_threshold import ThresholdStudy, threshold_rows, threshold_study

__all__ = ["LifetimeStudy", "PlateauRun", "lifetime_rows", "lifetime_study", "main", "plateau_runs"]

BETAS = (2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
S_END = 20000.0  # rescaled time of every run: the longest plateaus at β = 7 last ~1e4
SAMPLES = 4000  # snapshots per run (s step 5: the shortest plateaus last ~20)


@dataclasses.dataclass(frozen=True)
class PlateauRun:
    beta: float
    seed: int
    plateaus: tuple[Plateau, ...]
    merges: tuple[Merge, ...]


@dataclasses.dataclass(frozen=True)
class LifetimeStudy:
    runs: tuple[PlateauRun, ...]
    fits: LifetimeFits
    closest_fraction: float | None  # merges of the two closest clusters / all merges
    merges: int
    n: int


_energies = jax.jit(jax.vmap(jax.vmap(energy, in_axes=(None, 0)), in_axes=(None, 0)))


def plateau_runs(
    beta: float,
    *,
    n: int = 64,
    seeds: Sequence[int] = range(16),
    s_end: float = S_END,
    samples: int = SAMPLES,
) -> list[PlateauRun]:
    """The E6 ("usa") setting at ``beta`` for every seed (one batch), up to rescaled time ``s_end``
    with ``samples`` snapshots: the plateaus and merges of each seed."""
    experiment = load_experiments(["E6"])[0]
    variant = next(v for v in experiment.variants if v.name == "usa")
    overrides = [f"model.beta={beta!r}", 'model.time_scale="rescaled"', f"solver.t_end={s_end!r}",
                 f"solver.save_every={s_end / samples!r}"]  # fmt: skip
    config = experiment.simulation_config(variant, n, overrides=overrides)
    sim = build(config)
    with_seed = lambda s: config.model_copy(update={"init": config.init.model_copy(update={"seed": s})})  # noqa: E731
    x0 = jnp.stack([make_initial(with_seed(s), sim.kernel.gauge, sim.x0.dtype) for s in seeds])
    trajectory = solve(sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                       save_every=sim.save_every, workers=1)  # fmt: skip
    if trajectory.status != "ok":
        raise ValueError(f"plateau_runs: the runs at beta = {beta!r} must finish; got {trajectory.status}.")
    xs = np.asarray(trajectory.xs)  # (T, B, n, d)
    energies = np.asarray(_energies(sim.kernel, jnp.asarray(xs)))
    runs = []
    for b, seed in enumerate(seeds):
        plateaus = detect_plateaus(trajectory.ts, energies[:, b], xs[:, b])
        merges = tuple(merge_events(plateaus, xs[:, b]))
        runs.append(PlateauRun(float(beta), int(seed), tuple(plateaus), merges))
    return runs


def lifetime_study(
    betas: Sequence[float] = BETAS,
    *,
    n: int = 64,
    seeds: Sequence[int] = range(16),
    s_end: float = S_END,
    samples: int = SAMPLES,
) -> LifetimeStudy:
    """:func:`plateau_runs` at every β, the lifetime fits and the pairing fraction."""
    options = {"n": n, "seeds": seeds, "s_end": s_end, "samples": samples}
    runs = [run for beta in betas for run in plateau_runs(beta, **options)]
    merges = [m for run in runs for m in run.merges]
    fits = lifetime_fits([r.beta for r in runs for _ in r.plateaus], [p for r in runs for p in r.plateaus])
    return LifetimeStudy(tuple(runs), fits, closest_pair_fraction(merges), len(merges), n)


def lifetime_rows(runs: Sequence[PlateauRun]) -> list[dict]:
    """One row per plateau: β, seed, index, energy, entry, exit, lifetime, clusters, closest angle,
    censored, metastable (counted in the fits), and whether the merge that ended it joined the two
    closest clusters."""
    rows = []
    for run in runs:
        closest = {m.before: m.closest_pair for m in run.merges}
        for k, p in enumerate(run.plateaus):
            rows.append({"beta": run.beta, "seed": run.seed, "plateau": k, "energy": p.energy,
                         "entry": p.entry, "exit": p.exit, "lifetime": p.lifetime, "n_clusters": p.n_clusters,
                         "closest_angle": p.closest_angle, "censored": p.censored,
                         "metastable": is_metastable(p),
                         "closest_pair_merge": closest.get(k)})  # fmt: skip
    return rows


def _csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    cell = lambda v: "" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [",".join(rows[0])] + [",".join(cell(v) for v in row.values()) for row in rows]
    return "\n".join(lines) + "\n"


def _summary(study: LifetimeStudy, threshold: ThresholdStudy) -> dict:
    fit = lambda f: dataclasses.asdict(f)  # noqa: E731
    return {
        "lifetimes": {"n": study.n, "betas": sorted({r.beta for r in study.runs}),
                      "seeds": len({r.seed for r in study.runs}),
                      "plateaus": sum(len(r.plateaus) for r in study.runs),
                      "fit_beta": fit(study.fits.beta), "fit_barrier": fit(study.fits.barrier),
                      "clusters": study.fits.clusters, "merges": study.merges,
                      "closest_pair_fraction": study.closest_fraction},
        "noise_threshold": [{"beta": p.beta, "k": p.k, "kappa_predicted": p.kappa_predicted,
                             "kappa_measured": p.kappa_measured,
                             "relative_error": abs(p.kappa_measured / p.kappa_predicted - 1.0)}
                            for p in threshold.points],
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict:
    """``python -m attnflow.workflows.metastability --out DIR [--quick]``: the lifetime and threshold
    studies, their figures (``plateau_lifetimes.png``, ``noise_threshold.png``), tables
    (``plateaus.csv``, ``noise_threshold.csv``) and numbers (``metastability.json``)."""
    prog = "python -m attnflow.workflows.metastability"
    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the figures and tables")
    parser.add_argument("--quick", action="store_true", help="small sizes (n = 32, fewer beta and seeds)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        study = lifetime_study((2.0, 3.0, 4.0, 5.0), n=32, seeds=range(8), s_end=5000.0, samples=2000)
        threshold = threshold_study(betas=(1.0,), n=64, seeds=64, kappa_factors=(0.8, 0.9, 1.1, 1.25))
    else:
        study, threshold = lifetime_study(), threshold_study(n=64, seeds=128)
    write_text(args.out / "plateaus.csv", _csv(lifetime_rows(study.runs)))
    write_text(args.out / "noise_threshold.csv", _csv(threshold_rows(threshold)))
    summary = _summary(study, threshold)
    write_json(args.out / "metastability.json", summary)
    write_lifetime_figure(args.out / "plateau_lifetimes.png", lifetime_rows(study.runs), study.fits)
    write_threshold_figure(args.out / "noise_threshold.png", threshold_rows(threshold))
    return summary


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
