"""The density solver on S^1 × labels: a tau = 20 run at 1024 angles × 64 labels (standalone;
``python benchmarks/density.py [--quick] [--full-sphere]``; prints one JSON object). The S^2 part
(lmax = 64 × 16 labels) is timed over 40 steps and projected to tau = 20 unless ``--full-sphere``.

Setting: RoPE positions (``α = 2πξ``, 64 midpoint label nodes on [0, 1)), ``w = 1``, exp profile
β = 1, usa, both time scales; initial law uniform plus a band-limited noise (modes 1..16, RMS 0.01),
one per label. Fixed RK4 steps of ``safe_dt`` (stable for every law; 7.5e3 steps at plain β = 1),
snapshots every 0.5, the resolution status at each. Measured: compile time, wall and CPU time of
the run (best of ``REPEATS``), time per step and per field evaluation, the status and the last
resolved time, mass error and energy change.

The particle run that matches the density's accuracy: the particle law's distance to the density
(``tests/test_density_distance.py``) is ``≈ 2.6 n^{-1/2}`` (W1 per label, β = 1, RoPE and Toeplitz
cosine, t = 0.5), so a W1 of 1e-3 takes ``n ≈ 7e6`` particles, while the grid's own error is
below 1e-8 while the status is ok (spectral). The script prints that estimate with the measured
constant of a short particle run (n = 1024, 4 seeds) for this setting.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from attnflow.analysis import density_distance as dd  # noqa: E402
from attnflow.core import factors, gauges  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics import density_circle as dc  # noqa: E402
from attnflow.numerics import density_sphere as ds  # noqa: E402
from attnflow.numerics.density_solve import integrate  # noqa: E402
from attnflow.numerics.dynamics import make_vector_field  # noqa: E402
from attnflow.numerics.integrators import RK4  # noqa: E402

GRID, LABELS, BETA, T_END, SAVE_EVERY, REPEATS = 1024, 64, 1.0, 20.0, 0.5, 2


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def initial_law(grid: int, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta = dc.grid_angles(grid)
    coefficients = rng.standard_normal((count, 16)) + 1j * rng.standard_normal((count, 16))
    noise = np.real(coefficients @ np.exp(1j * np.outer(np.arange(1, 17), theta)))
    noise /= noise.std(axis=1, keepdims=True)
    return (1.0 + 0.01 * noise) / (2.0 * np.pi)


def density_run(time_scale: str, *, grid: int, count: int, t_end: float) -> dict:
    labels = dc.position_labels(count)
    field = dc.make_circle_field(
        make_profile("exp", beta=BETA, time_scale=time_scale),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, 2.0 * np.pi),
    )
    dt = dc.safe_dt(field)
    per_snapshot = int(np.ceil(SAVE_EVERY / dt))
    dt = SAVE_EVERY / per_snapshot
    snapshots = round(t_end / SAVE_EVERY)
    run = jax.jit(
        lambda field, state: integrate(
            field,
            state,
            integrator=RK4(retraction="none"),
            dt=dt,
            steps_per_snapshot=per_snapshot,
            snapshots=snapshots,
            status=lambda s: dc.status_code(field, s),
        )
    )
    state = dc.CircleDensity(jnp.asarray(initial_law(grid, count)))
    start = time.perf_counter()
    compiled = run.lower(field, state).compile()
    compile_s = time.perf_counter() - start
    walls, cpus = [], []
    for _ in range(REPEATS):
        wall, cpu = time.perf_counter(), _cpu()
        ts, states, codes = compiled(field, state)
        states.f.block_until_ready()
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
    codes = np.asarray(codes)
    resolved = np.flatnonzero(codes == dc.DensityStatus.ok.code)
    mass = np.asarray(jax.vmap(lambda f: field.mass(dc.CircleDensity(f)))(states.f))
    energy = np.asarray(jax.vmap(lambda f: field.energy(dc.CircleDensity(f)))(states.f))
    steps = per_snapshot * snapshots
    return {
        "time_scale": time_scale,
        "grid": grid,
        "labels": count,
        "t_end": t_end,
        "dt": dt,
        "steps": steps,
        "compile_s": round(compile_s, 3),
        "wall_s": round(min(walls), 3),
        "cpu_s": round(min(cpus), 3),
        "step_ms": round(1e3 * min(walls) / steps, 4),
        "evaluation_ms": round(1e3 * min(walls) / (4 * steps), 4),
        "status": str(dc.DensityStatus.from_code(codes[-1])),
        "last_resolved_t": float(np.asarray(ts)[resolved[-1]]),
        "mass_error": float(np.max(np.abs(mass - 1.0))),
        "energy": [float(energy[0]), float(energy[resolved[-1]])],
        "energy_min_increment": float(np.min(np.diff(energy[: resolved[-1] + 1]))),
    }


def particle_constant(*, n: int = 1024, seeds: int = 4, t_end: float = 0.5, dt: float = 0.05) -> dict:
    """``W1 · sqrt(n)`` of particles against the density of the same setting at ``t_end`` (plain)."""
    count = 16
    labels = dc.position_labels(count)
    profile = make_profile("exp", beta=BETA)
    field = dc.make_circle_field(
        profile, grid=256, labels=labels, gauge=dc.rope_circle_gauge(labels, 2.0 * np.pi)
    )
    f0 = initial_law(256, count)
    steps = round(t_end / 1e-3)
    _, states, _ = jax.jit(
        lambda s: integrate(
            field, s, integrator=RK4(retraction="none"), dt=1e-3, steps_per_snapshot=steps, snapshots=1
        )
    )(dc.CircleDensity(jnp.asarray(f0)))
    f_end = np.asarray(states.f[-1])
    per_label = n // count
    index = np.repeat(np.arange(count), per_label)
    xi = np.asarray(labels.nodes)[index]
    kernel = Kernel(gauges.make_rope(xi, 2, [2.0 * np.pi]), factors.NoFactor(n=n), profile)
    vector_field = make_vector_field(kernel)

    @jax.jit
    def particles(x):
        def step(x, _):
            k1 = vector_field(x)
            k2 = vector_field(x + 0.5 * dt * k1)
            k3 = vector_field(x + 0.5 * dt * k2)
            k4 = vector_field(x + dt * k3)
            y = x + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
            return y / jnp.linalg.norm(y, axis=1, keepdims=True), None

        return jax.lax.scan(step, x, None, length=round(t_end / dt))[0]

    distances = []
    for seed in range(seeds):
        theta0 = np.concatenate(dd.sample_density(f0, per_label, np.random.default_rng(seed)))
        x = np.asarray(particles(jnp.asarray(np.stack([np.cos(theta0), np.sin(theta0)], axis=1))))
        theta = np.arctan2(x[:, 1], x[:, 0])
        distances.append(dd.labelled_circle_w1(theta, index, f_end, labels.weights))
    constant = float(np.mean(distances) * np.sqrt(n))
    return {
        "n": n,
        "w1_mean": float(np.mean(distances)),
        "w1_sqrt_n": constant,
        "n_for_w1_1e-3": constant**2 * 1e6,
    }


def sphere_run(*, lmax: int, count: int, t_end: float, timing_steps: int = 40) -> dict:
    """S^2 × labels: ``w = 1`` (the gauge frame), exp β = 1, plain, usa; the uniform law plus a
    random perturbation of degrees 1..8 (RMS ~0.01 of the mean). Fixed RK4 steps of ``safe_dt``.
    With ``t_end = 0`` only ``timing_steps`` steps are timed and the tau = 20 time is projected."""
    labels = dc.position_labels(count)
    field = ds.make_sphere_field(make_profile("exp", beta=BETA), lmax=lmax, labels=labels)
    rng = np.random.default_rng(0)
    a = np.zeros((count, lmax + 1, lmax + 1), dtype=complex)
    a[:, 0, 0] = 1.0 / np.sqrt(4.0 * np.pi)
    for degree in range(1, 9):
        a[:, degree, : degree + 1] = (
            0.01 / np.sqrt(4.0 * np.pi) * rng.standard_normal((count, degree + 1)) / 3.0
        )
    a[:, :, 0] = a[:, :, 0].real
    state = ds.SphereDensity(jnp.asarray(a))
    dt = ds.safe_dt(field)
    steps_total = int(np.ceil(20.0 / dt))
    steps = timing_steps if t_end == 0 else int(np.ceil(t_end / dt))
    run = jax.jit(
        lambda field, state: integrate(
            field,
            state,
            integrator=RK4(retraction="none"),
            dt=dt,
            steps_per_snapshot=steps,
            snapshots=1,
            status=lambda s: ds.status_code(field, s),
        )
    )
    start = time.perf_counter()
    compiled = run.lower(field, state).compile()
    compile_s = time.perf_counter() - start
    wall, cpu = time.perf_counter(), _cpu()
    _, states, codes = compiled(field, state)
    states.a.block_until_ready()
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    mass = np.asarray(field.mass(ds.SphereDensity(states.a[-1])))
    return {
        "lmax": lmax,
        "labels": count,
        "grid": list(np.asarray(field.grid_points()).shape[1:]),
        "dt": dt,
        "steps": steps,
        "compile_s": round(compile_s, 3),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "step_ms": round(1e3 * wall / steps, 3),
        "tau_20_steps": steps_total,
        "tau_20_projected_s": round(wall / steps * steps_total, 1),
        "status": str(dc.DensityStatus.from_code(np.asarray(codes)[-1])),
        "mass_error": float(np.max(np.abs(mass - 1.0))),
    }


def main() -> None:
    quick = "--quick" in sys.argv
    grid, count, t_end = (256, 16, 2.0) if quick else (GRID, LABELS, T_END)
    results = {
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "density": [
            density_run(scale, grid=grid, count=count, t_end=t_end) for scale in ("plain", "rescaled")
        ],
        "particles": particle_constant(n=256 if quick else 1024, seeds=2 if quick else 4),
        # S^2: lmax = 64 × 16 labels timed over 40 steps and projected to tau = 20 (--full-sphere: run it)
        "sphere": sphere_run(
            lmax=16 if quick else 64,
            count=4 if quick else 16,
            t_end=T_END if "--full-sphere" in sys.argv else 0.0,
        ),
    }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
