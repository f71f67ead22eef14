"""Particles against the density: the same labelled setting on S^1 solved as a law and as n tokens.

The setting: RoPE (``α = 2πξ``) with the Toeplitz cosine factor on :data:`LABELS` position nodes
(the midpoint rule on [0, 1)), the exp profile at ``β = 1``, usa, and an initial law per label, a von
Mises bump (κ = 1) centred at ``πξ``: in the gauge frame the labels' bumps sit at ``−πξ``, so the
mean-field flow moves and sharpens each label's law differently (a bump centred at ``2πξ`` would not
move at all: in the gauge frame every label's law would be the same, and the Toeplitz cosine's
weights sum to zero over the four nodes), and no symmetry leaves the finite-n noise to decide where
it goes. The density runs on :data:`GRID` angles (its
resolution indicator stays at round-off); the particles are ``n/LABELS`` tokens per node, their
initial angles drawn iid from the node's initial density, moved by attnflow's RK4 (``solve``). The
distance is W1 per label on the circle, averaged over the labels
(:func:`attnflow.analysis.density_distance.labelled_circle_w1`): the sampling noise carried by the
flow, ``~ n^{-1/2}`` (RK4 at ``dt = 0.05`` errs about 1e-6).

``python -m attnflow.workflows.density_particles --out DIR`` writes ``distances.json``, ``table.md``
and ``density_particles.png`` (the densities beside a particle histogram, the distance against n
with its fitted slope).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from attnflow.analysis import density_distance
from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.atomic import write_json, write_text
from attnflow.numerics import density_circle
from attnflow.numerics.density_solve import integrate
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4
from attnflow.numerics.solve import solve

__all__ = ["GRID", "LABELS", "SIZES", "Comparison", "compare", "density_law", "initial_law", "particle_laws"]

GRID, LABELS, OMEGA, BETA, T_END, DT = 128, 4, 2.0 * np.pi, 1.0, 2.0, 0.05
SIZES = (256, 1024, 4096)  # tokens: 64 per label and up
SEEDS = 8


def initial_law(labels) -> np.ndarray:
    """``f0 (LABELS, GRID)``: per label node ``ξ``, the von Mises density (κ = 1) centred at ``πξ``."""
    theta = density_circle.grid_angles(GRID)
    centres = np.pi * np.asarray(labels.nodes)[:, None]
    return np.exp(np.cos(theta - centres) - 1.0) / (2.0 * np.pi * scipy.special.i0e(1.0))


def _setting():
    labels = density_circle.position_labels(LABELS)
    return labels, make_profile("exp", beta=BETA), initial_law(labels)


@functools.lru_cache(maxsize=1)
def density_law() -> tuple[np.ndarray, np.ndarray]:
    """``(f0, f(T_END))``, each ``(LABELS, GRID)``: the density solved by RK4 at ``DT/5``."""
    labels, profile, f0 = _setting()
    field = density_circle.make_circle_field(
        profile,
        grid=GRID,
        labels=labels,
        gauge=density_circle.rope_circle_gauge(labels, OMEGA),
        factor=factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(OMEGA)),
    )
    steps = round(5 * T_END / DT)
    _, states, codes = jax.jit(
        lambda state: integrate(
            field, state, integrator=RK4(retraction="none"), dt=DT / 5, steps_per_snapshot=steps,
            snapshots=1, status=lambda x: density_circle.status_code(field, x),
        )
    )(density_circle.CircleDensity(jnp.asarray(f0)))  # fmt: skip
    status = density_circle.DensityStatus.from_code(int(codes[-1]))
    if status != density_circle.DensityStatus.ok:
        raise RuntimeError(f"density_particles: the density run ended {status.name}, not ok.")
    return f0, np.asarray(states.f[-1])


def particle_laws(n: int, seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """``(label index (n,), final angles (seeds, n))``: ``seeds`` runs of ``n`` tokens (``n/LABELS``
    per node) from iid draws of the initial law, moved by RK4 to ``T_END``."""
    labels, profile, f0 = _setting()
    per_label = n // LABELS
    index = np.repeat(np.arange(LABELS), per_label)
    xi = np.asarray(labels.nodes)[index]
    kernel = Kernel(
        gauges.make_rope(xi, 2, [OMEGA]),
        factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(OMEGA)),
        profile,
    )
    draws = [
        np.concatenate(density_distance.sample_density(f0, per_label, np.random.default_rng(s)))
        for s in range(seeds)
    ]
    x0 = np.stack([np.stack([np.cos(t), np.sin(t)], axis=-1) for t in draws])
    field = make_vector_field(kernel)
    run = solve(field, jnp.asarray(x0), integrator=RK4(), dt=DT, t_end=T_END, save_every=T_END, workers=1)
    ends = np.asarray(run.xs[-1])
    return index, np.arctan2(ends[..., 1], ends[..., 0])


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The distances (``(len(sizes), seeds)``), their fitted slope in ``log n`` and the run's cost."""

    sizes: tuple[int, ...]
    distances: np.ndarray
    slope: float
    cpu_s: float
    wall_s: float


def compare(sizes: Sequence[int] = SIZES, seeds: int = SEEDS) -> Comparison:
    """W1 per label (averaged over the labels) between each particle run and the density at ``T_END``."""
    wall, cpu = time.perf_counter(), time.process_time()
    labels, _, _ = _setting()
    _, f_end = density_law()
    rows = []
    for n in sizes:
        index, theta = particle_laws(n, seeds)
        rows.append([density_distance.labelled_circle_w1(t, index, f_end, labels.weights) for t in theta])
    distances = np.asarray(rows)
    slope = float(np.polyfit(np.log(sizes), np.log(distances.mean(axis=1)), 1)[0])
    return Comparison(tuple(sizes), distances, slope, time.process_time() - cpu, time.perf_counter() - wall)


def _table(result: Comparison) -> str:
    lines = ["| n | mean W1 over seeds | min | max |", "|---:|---:|---:|---:|"]
    for n, row in zip(result.sizes, result.distances, strict=True):
        lines.append(f"| {n} | {row.mean():.3e} | {row.min():.3e} | {row.max():.3e} |")
    seeds = result.distances.shape[1]
    lines.append(f"\nFitted slope of log W1 against log n: {result.slope:.3f} ({seeds} seeds per n).")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    from attnflow.viz.density_particles import plot_comparison

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for distances.json, table.md and the figure"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = compare(args.sizes, args.seeds)
    write_json(args.out / "distances.json", {
        "sizes": list(result.sizes), "distances": result.distances.tolist(), "slope": result.slope,
        "cpu_s": result.cpu_s, "wall_s": result.wall_s,
    })  # fmt: skip
    write_text(args.out / "table.md", _table(result))
    f0, f_end = density_law()
    index, theta = particle_laws(max(result.sizes), 1)
    plot_comparison(f0, f_end, index, theta[0], result, args.out / "density_particles.png")
    print(_table(result), end="")


if __name__ == "__main__":
    main()
