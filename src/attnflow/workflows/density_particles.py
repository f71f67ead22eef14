"""Particles against the density: the same labelled setting on S^1 solved as a law and as n tokens.

The setting: RoPE (``α = 2πξ``) with the Toeplitz cosine factor on :data:`LABELS` = 3 position nodes
(the midpoint rule on [0, 1)), the exp profile at ``β = 1``, usa, and an initial law per label, a von
Mises bump (κ = 1) centred at ``πξ``: in the gauge frame the labels' bumps sit at ``−πξ``, so the
mean-field flow moves and sharpens each label's law differently (a bump centred at ``2πξ`` would not
move at all: in the gauge frame every label's law would be the same, and the Toeplitz cosine's
weights sum to zero over the nodes), and no symmetry leaves the finite-n noise to decide where it
goes. (With four nodes every pair of labels that interacts, ``w ≠ 0``, would be 0 or π apart, where
``Q_iᵀQ_j`` is symmetric: a simulator with ``Qᵀ`` for ``Q`` would move exactly like the real one.)

The density runs on :data:`GRID` angles (its resolution indicator stays at round-off); the
particles are ``n/LABELS`` tokens per node, their initial angles drawn iid from the node's initial
density, moved by attnflow's RK4 (``solve``). The distance is W1 per label on the circle, averaged
over the labels (:func:`attnflow.analysis.density_distance.labelled_circle_w1`): the sampling noise
carried by the flow, ``~ n^{-1/2}`` (RK4 at ``dt = 0.05`` errs about 1e-6).

Both solvers are also checked against the closed form of the growth rates about the uniform law
(w = 1, no gauge, usa, c = 1): mode ``k`` grows at ``σ_k = k² I_k(β)/β``
(:func:`growth_rate_errors`; the particles from ``n`` equispaced tokens displaced by ``ε cos kφ``,
the density from ``1/2π + ε cos kθ``). reproduce's E16 runs these rows (:func:`reproduce_values`).

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
from attnflow.numerics.status import Status

__all__ = [
    "DENSITY_METRICS",
    "GRID",
    "LABELS",
    "SIZES",
    "Comparison",
    "compare",
    "density_law",
    "growth_rate_errors",
    "initial_law",
    "particle_laws",
    "reproduce_values",
]

GRID, LABELS, OMEGA, BETA, T_END, DT = 128, 3, 2.0 * np.pi, 1.0, 2.0, 0.05
SIZES = (192, 768, 3072)  # tokens: 64 per label and up
SEEDS = 8
GROWTH_MODES, GROWTH_EPS, GROWTH_T, GROWTH_DT, GROWTH_TOKENS = (1, 2, 3, 4), 1e-5, 2.0, 0.01, 64

# What reproduce's E16 measures (reproduce_values), with their meaning.
DENSITY_METRICS = {
    "density_w1_scaled": "sqrt(n) times the W1 distance per label (averaged over the labels) between the "
    "particle law at tau = 2 and the density: the sampling noise carried by the flow, about constant in n",
    "density_mass_error": "max over the labels of |mass - 1| of the density at tau = 2",
    "density_growth_error": "max over the modes k = 1..4 of |sigma_k measured / (k^2 I_k(beta)/beta) - 1| "
    "for the density solver about the uniform law",
    "particle_growth_error": "the same for 64 equispaced particles displaced in mode k (through solve)",
}


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
    status = Status.from_codes(codes[-1]).item()
    if status != Status.ok:
        raise RuntimeError(f"density_particles: the density run ended {status.name}, not ok.")
    return f0, np.asarray(states.f[-1])


def particle_laws(n: int, seeds: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(label index (m,), initial and final angles (len(seeds), m) each)``: one run per seed of
    ``m`` tokens, ``n`` rounded down to a multiple of :data:`LABELS` (at least one token per label),
    the same number per node, from iid draws of the initial law, moved by RK4 to ``T_END``."""
    labels, profile, f0 = _setting()
    per_label = max(n // LABELS, 1)
    index = np.repeat(np.arange(LABELS), per_label)
    xi = np.asarray(labels.nodes)[index]
    kernel = Kernel(
        gauges.make_rope(xi, 2, [OMEGA]),
        factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(OMEGA)),
        profile,
    )
    draws = np.stack(
        [
            np.concatenate(density_distance.sample_density(f0, per_label, np.random.default_rng(s)))
            for s in seeds
        ]
    )
    x0 = np.stack([np.cos(draws), np.sin(draws)], axis=-1)
    field = make_vector_field(kernel)
    run = solve(field, jnp.asarray(x0), integrator=RK4(), dt=DT, t_end=T_END, save_every=T_END, workers=1)
    ends = np.asarray(run.xs[-1])
    return index, draws, np.arctan2(ends[..., 1], ends[..., 0])


def _mode_rates(start: np.ndarray, end: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """``log(|c_k(T)| / |c_k(0)|) / GROWTH_T`` for each mode of :data:`GROWTH_MODES`, ``c_k`` the
    ``k``-th Fourier coefficient over ``phases`` of each row (row ``i``: the run of mode ``i``)."""
    modes = np.asarray(GROWTH_MODES)[:, None]
    coefficient = lambda values: np.abs(np.mean(values * np.exp(-1j * modes * phases), axis=1))  # noqa: E731
    return np.log(coefficient(end) / coefficient(start)) / GROWTH_T


@functools.lru_cache(maxsize=2)
def _density_growth_rates(beta: float) -> np.ndarray:
    """The density solver's rates of :data:`GROWTH_MODES` (one run per mode, vmapped: independent
    runs), solved once per ``beta`` in a process: they depend on no particle simulator (the mutation
    test and reproduce's seeds ask for them again)."""
    modes = np.asarray(GROWTH_MODES)
    field = density_circle.make_circle_field(
        make_profile("exp", beta=beta), grid=GRID // 2, labels=density_circle.position_labels(1)
    )
    theta = density_circle.grid_angles(GRID // 2)
    f0 = 1.0 / (2.0 * np.pi) + GROWTH_EPS * np.cos(modes[:, None] * theta)[:, None, :]
    final = jax.jit(jax.vmap(lambda f: integrate(
        field, density_circle.CircleDensity(f), integrator=RK4(retraction="none"), dt=GROWTH_DT,
        steps_per_snapshot=round(GROWTH_T / GROWTH_DT), snapshots=1,
    )[1].f[-1]))(jnp.asarray(f0))  # fmt: skip
    rates = _mode_rates(f0[:, 0], np.asarray(final)[:, 0], theta)
    rates.setflags(write=False)  # shared by every caller
    return rates


def growth_rate_errors(beta: float = BETA) -> dict[str, float]:
    """``max_k |σ_k measured / σ_k − 1|`` over :data:`GROWTH_MODES` for the density solver
    (``"density"``) and for the particles (``"particles"``, :data:`GROWTH_TOKENS` equispaced tokens,
    through ``solve``), ``σ_k = k² I_k(β)/β`` (w = 1, no gauge, usa, c = 1). One run per mode, of
    amplitude :data:`GROWTH_EPS` (its square feeds modes 0 and 2k only), to ``GROWTH_T`` by RK4 at
    ``GROWTH_DT``: the RK4 error ``(σ dt)^4/120``, the nonlinearity and the round-off are below 1e-8."""
    modes = np.asarray(GROWTH_MODES)
    exact = modes**2 * scipy.special.iv(modes, beta) / beta
    profile = make_profile("exp", beta=beta)
    density = _density_growth_rates(beta)
    # the particles: equispaced tokens displaced by eps cos(k phi), one run per mode (a batch)
    phases = 2.0 * np.pi * np.arange(GROWTH_TOKENS) / GROWTH_TOKENS
    angles = phases + GROWTH_EPS * np.cos(modes[:, None] * phases)
    x0 = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    kernel = Kernel(gauges.IdentityGauge(n=GROWTH_TOKENS, d=2), factors.NoFactor(n=GROWTH_TOKENS), profile)
    run = solve(make_vector_field(kernel), jnp.asarray(x0), integrator=RK4(), dt=GROWTH_DT, t_end=GROWTH_T,
                save_every=GROWTH_T, workers=1)  # fmt: skip
    ends = np.asarray(run.xs[-1])
    moved = np.angle(np.exp(1j * (np.arctan2(ends[..., 1], ends[..., 0]) - phases)))
    particles = _mode_rates(angles - phases, moved, phases)
    return {
        "density": float(np.max(np.abs(density / exact - 1.0))),
        "particles": float(np.max(np.abs(particles / exact - 1.0))),
    }


def reproduce_values(
    n: int, seeds: Sequence[int]
) -> tuple[list[dict], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """E16's values (:data:`DENSITY_METRICS`) for ``seeds`` runs of ``n`` tokens (as
    :func:`particle_laws` rounds it), with the first seed's ``(label index, RoPE angle, initial
    angles, final angles)`` of each token for the figure."""
    labels, _, _ = _setting()
    f0, f_end = density_law()
    mass_error = float(np.max(np.abs(2.0 * np.pi * f_end.mean(axis=1) - 1.0)))
    errors = growth_rate_errors()
    index, start, end = particle_laws(n, seeds)
    values = []
    for seed, theta in zip(seeds, end, strict=True):
        w1 = density_distance.labelled_circle_w1(theta, index, f_end, labels.weights)
        final = {
            "density_w1_scaled": float(np.sqrt(len(index)) * w1),
            "density_mass_error": mass_error,
            "density_growth_error": errors["density"],
            "particle_growth_error": errors["particles"],
        }
        values.append({"seed": seed, "final": final})
    turn = OMEGA * np.asarray(labels.nodes)[index]  # each token's RoPE angle: u = R(turn) x
    return values, (index, turn, start[0], end[0])


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
        index, _, theta = particle_laws(n, range(seeds))
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
    index, _, theta = particle_laws(max(result.sizes), [0])
    plot_comparison(f0, f_end, index, theta[0], result, args.out / "density_particles.png")
    print(_table(result), end="")


if __name__ == "__main__":
    main()
