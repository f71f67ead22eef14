"""Towards the mean-field law: one experiment's setting at growing n, and the distances between
the empirical laws of successive sizes.

Uniform initial data are a poor probe of the limit: the uniform law is stationary for the
mean-field flow of every kernel of the family (the attraction averages out), so at finite n the
fluctuations of size ``n^{-1/2}`` decide where the tokens go and the final law stays random as n
grows. Here the initial law is chosen off every symmetry, in the gauge frame:
``u0 = normalize(e_d + sigma g + drift (cos 2πs, sin 2πs, 0, ...))`` with ``g`` standard Gaussian
and ``s`` the label's phase (:func:`~attnflow.analysis.distances.label_phase`), then
``x0 = Q(xi)ᵀ u0``. Its mean-field flow is deterministic, so the empirical law at ``t_end``
converges, and the sliced 1-Wasserstein distance between independent samples of sizes ``m < n``
shrinks like ``m^{-1/2}``.

``python -m attnflow.workflows.mean_field --out DIR`` runs E1 (a), E3 and E5 at
n = 256, 4096, 10^5, 10^6 with the expansion (O(n) per evaluation) and writes one ``.npz`` per
run (kept: a rerun skips finished sizes), ``distances.json``, ``table.md`` and ``laws.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from attnflow.analysis.distances import label_phase, labelled_points, sliced_w1
from attnflow.io.atomic import read_record, write_json, write_record, write_text
from attnflow.numerics.solve import solve
from attnflow.viz.mean_field import plot_laws
from attnflow.workflows.build import build
from attnflow.workflows.experiments import load_experiments

__all__ = ["SETTINGS", "SIZES", "FinalLaw", "distance_rows", "initial_state", "run_setting"]

SETTINGS = (("E1", "a"), ("E3", ""), ("E5", ""))  # (experiment, variant name)
SIZES = (256, 4096, 100_000, 1_000_000)


@dataclasses.dataclass(frozen=True)
class FinalLaw:
    """The final state of one run: labels, tokens, and what the run cost."""

    setting: str
    n: int
    xi: np.ndarray
    x: np.ndarray
    status: str
    wall_s: float
    cpu_s: float
    accepted: int
    evaluations: int


def initial_state(gauge, xi: np.ndarray, d: int, *, seed: int, sigma: float, drift: float) -> np.ndarray:
    """``x0 = Q(xi)ᵀ normalize(e_d + sigma g + drift (cos 2πs, sin 2πs, 0, ...))`` (module docstring).

    The stream depends on ``(seed, n)``: samples of different sizes are independent (a nested
    sample would share its first tokens with the larger one, under other labels)."""
    rng = np.random.default_rng([seed, xi.size])
    angle = 2.0 * np.pi * label_phase(xi)
    u0 = sigma * rng.standard_normal((xi.size, d))
    u0[:, -1] += 1.0
    u0[:, 0] += drift * np.cos(angle)
    u0[:, 1] += drift * np.sin(angle)
    u0 /= np.linalg.norm(u0, axis=1, keepdims=True)
    return np.asarray(gauge.apply_transpose(jnp.asarray(u0)))


def run_setting(
    experiment_id: str,
    variant_name: str,
    n: int,
    *,
    t_end: float = 20.0,
    tolerance: float = 1e-8,
    rtol: float = 1e-6,
    seed: int = 0,
    sigma: float = 0.6,
    drift: float = 0.5,
) -> FinalLaw:
    """Run one experiment's setting at ``n`` tokens from :func:`initial_state` with the expansion
    and adaptive steps; only the final state is kept."""
    (experiment,) = load_experiments([experiment_id])
    variant = next(v for v in experiment.variants if v.name == variant_name)
    overrides = [
        f"solver.t_end={t_end}",
        f"solver.save_every={t_end}",
        'solver.method="adaptive"',
        'solver.interaction="expansion"',
        f"solver.tolerance={tolerance}",
        f"solver.rtol={rtol}",
        f"solver.atol={rtol * 1e-2}",
    ]
    sim = build(experiment.simulation_config(variant, n, overrides=overrides))
    x0 = initial_state(sim.kernel.gauge, sim.xi, sim.x0.shape[1], seed=seed, sigma=sigma, drift=drift)
    wall, cpu = time.perf_counter(), time.process_time()
    trajectory = solve(
        sim.field,
        jnp.asarray(x0),
        integrator=sim.integrator,
        dt=sim.dt,
        t_end=t_end,
        save_every=t_end,
        workers=1,
    )
    x = np.asarray(trajectory.xs[-1])
    return FinalLaw(
        setting=f"{experiment_id}{variant_name}",
        n=n,
        xi=np.asarray(sim.xi, dtype=np.float64),
        x=x,
        status=str(trajectory.status),
        wall_s=time.perf_counter() - wall,
        cpu_s=time.process_time() - cpu,
        accepted=int(trajectory.accepted),
        evaluations=int(trajectory.evaluations),
    )


def distance_rows(laws: Sequence[FinalLaw], *, directions: int = 64) -> list[dict]:
    """For each setting, sorted by n: the sliced W1 between successive sizes (``to`` the next
    size) and to the largest size (``to_largest``), on the labelled points."""
    rows = []
    for setting in dict.fromkeys(law.setting for law in laws):
        chain = sorted((law for law in laws if law.setting == setting), key=lambda law: law.n)
        points = [labelled_points(law.xi, law.x) for law in chain]
        for k, law in enumerate(chain[:-1]):
            rows.append(
                {
                    "setting": setting,
                    "n": law.n,
                    "next_n": chain[k + 1].n,
                    "to_next": sliced_w1(points[k], points[k + 1], directions=directions),
                    "to_largest": sliced_w1(points[k], points[-1], directions=directions),
                }
            )
    return rows


def _table(laws: Sequence[FinalLaw], rows: Sequence[dict]) -> str:
    lines = [
        "| setting | n | status | steps | evaluations | wall (s) | CPU (s) | W1 to next size "
        "| W1 to largest |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r["setting"], r["n"]): r for r in rows}
    for law in sorted(laws, key=lambda law: (law.setting, law.n)):
        row = by_key.get((law.setting, law.n))
        to_next = f"{row['to_next']:.2e} (n = {row['next_n']:,})" if row else ""
        to_largest = f"{row['to_largest']:.2e}" if row else ""
        lines.append(
            f"| {law.setting} | {law.n:,} | {law.status} | {law.accepted} | {law.evaluations} | "
            f"{law.wall_s:.1f} | {law.cpu_s:.1f} | {to_next} | {to_largest} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnflow.workflows.mean_field", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder (finished runs are kept)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--only", nargs="+", default=[e + v for e, v in SETTINGS], help="e.g. E1a E3")
    parser.add_argument("--t-end", type=float, default=20.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    laws = []
    for experiment_id, variant in SETTINGS:
        if experiment_id + variant not in args.only:
            continue
        for n in sorted(args.sizes):
            path = args.out / f"{experiment_id}{variant}_n{n}.npz"
            if not path.exists():
                write_record(path, run_setting(experiment_id, variant, n, t_end=args.t_end))
            laws.append(read_record(FinalLaw, path))
            law = laws[-1]
            print(
                f"{law.setting} n = {n:,}: {law.status}, {law.accepted} steps, {law.wall_s:.1f} s", flush=True
            )
    rows = distance_rows(laws)
    write_json(args.out / "distances.json", {"load": os.getloadavg(), "rows": rows})
    write_text(args.out / "table.md", _table(laws, rows))
    plot_laws(laws, rows, args.out / "laws.png")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
