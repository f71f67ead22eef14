"""The density solver's speed (issue 26, section 4), standalone: ``python benchmarks/density.py
[--quick] [--parts circle sphere particles]``; prints one JSON object. Every number is measured in
this run; nothing is projected.

**circle**: S^1 × labels, a tau = 20 run at 1024 angles × 64 labels. RoPE positions (``α = 2πξ``,
64 midpoint label nodes on [0, 1)), ``w = 1``, exp profile β = 1, usa, both time scales; initial law
uniform plus a band-limited noise (modes 1..16, RMS 0.01), one per label. Fixed RK4 steps of
``safe_dt`` (stable for every law), snapshots every 0.5 with the resolution status at each.

**sphere**: S^2 × labels, a tau = 20 run at lmax = 64 × 16 labels (``w = 1``, the gauge frame, exp
β = 1, plain, usa; the uniform law plus a random perturbation of degrees 1..8, RMS ~0.01 of the
mean). Fixed RK4 steps of ``safe_dt``, snapshots every 0.5 with the status at each.

For both: compile time, then one timed run (wall and CPU seconds of this process, all threads), time
per step, the status and the last resolved time, the mass error and the energy change.

**particles**: the particle law against the density in the comparison setting of
:mod:`attnflow.workflows.density_particles` (3 label nodes, RoPE and the Toeplitz cosine, β = 1,
tau = 2; reproduce's E16 measures ``sqrt(n) · W1 ≈ 2.5``). The particles are moved by the step of
``solve`` (``RK4()``, the sphere retraction, dt = 0.05) from the workflow's iid draws, one compiled
program per n, timed run by run; their W1 to the density is the workflow's (W1 per label, averaged
over the labels). The density of the same setting at several grids, each timed, and its own distance
(W1, from the exact CDFs) to a finer reference run (GRID_REFERENCE angles, dt/2). What the script
reports as ``consequence`` (the n that reaches a given W1, ``(C/W1)^2``, and the cost of that run
from the measured cost per step and pair) follows from the measured numbers; it is not a run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from attnflow.numerics.status import Status  # noqa: E402
from attnflow.workflows import density_particles as dp  # noqa: E402

GRID, LABELS, BETA, T_END, SAVE_EVERY = 1024, 64, 1.0, 20.0, 0.5
SPHERE_LMAX, SPHERE_LABELS = 64, 16
# the particle comparison (density_particles' setting): tokens, seeds per size, density grids
PARTICLE_SIZES, PARTICLE_SEEDS = (192, 768, 3072, 12288), 4
DENSITY_GRIDS, GRID_REFERENCE = (36, 48, 64, 96, 128), 512  # the field refuses grid < 36 at β = 1


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _timed(compiled, *args):
    """``(outputs, wall_s, cpu_s, load before, load after)`` of one call, outputs ready."""
    load, wall, cpu = _load(), time.perf_counter(), _cpu()
    out = jax.block_until_ready(compiled(*args))
    return out, time.perf_counter() - wall, _cpu() - cpu, load, _load()


def _note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _compile(function, *args):
    start = time.perf_counter()
    compiled = jax.jit(function).lower(*args).compile()
    return compiled, round(time.perf_counter() - start, 3)


def initial_law(grid: int, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta = dc.grid_angles(grid)
    coefficients = rng.standard_normal((count, 16)) + 1j * rng.standard_normal((count, 16))
    noise = np.real(coefficients @ np.exp(1j * np.outer(np.arange(1, 17), theta)))
    noise /= noise.std(axis=1, keepdims=True)
    return (1.0 + 0.01 * noise) / (2.0 * np.pi)


def _summary(ts, codes, mass, energy) -> dict:
    codes = np.asarray(codes)
    resolved = np.flatnonzero(codes == Status.ok.code)
    last = resolved[-1]
    return {
        "status": str(Status.from_codes(codes[-1]).item()),
        "last_resolved_t": float(np.asarray(ts)[last]),
        "mass_error": float(np.max(np.abs(np.asarray(mass) - 1.0))),
        "energy_start_end": [float(energy[0]), float(energy[last])],
        "energy_change": float(energy[last] - energy[0]),
        "energy_min_increment": float(np.min(np.diff(energy[: last + 1]))) if last > 0 else None,
    }


def circle_run(time_scale: str, *, grid: int, count: int, t_end: float) -> dict:
    labels = dc.position_labels(count)
    field = dc.make_circle_field(
        make_profile("exp", beta=BETA, time_scale=time_scale),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, 2.0 * np.pi),
    )
    per_snapshot = int(np.ceil(SAVE_EVERY / dc.safe_dt(field)))
    dt, snapshots = SAVE_EVERY / per_snapshot, round(t_end / SAVE_EVERY)
    run = lambda field, state: integrate(  # noqa: E731
        field, state, integrator=RK4(retraction="none"), dt=dt, steps_per_snapshot=per_snapshot,
        snapshots=snapshots, status=lambda s: dc.status_code(field, s),
    )  # fmt: skip
    state = dc.CircleDensity(jnp.asarray(initial_law(grid, count)))
    compiled, compile_s = _compile(run, field, state)
    _note(f"circle {time_scale}: {per_snapshot * snapshots} steps")
    (ts, states, codes), wall, cpu, load0, load1 = _timed(compiled, field, state)
    _note(f"circle {time_scale}: {wall:.1f} s wall, {cpu:.1f} CPU-s")
    mass = jax.vmap(lambda f: field.mass(dc.CircleDensity(f)))(states.f)
    energy = np.asarray(jax.vmap(lambda f: field.energy(dc.CircleDensity(f)))(states.f))
    steps = per_snapshot * snapshots
    return {
        "time_scale": time_scale, "grid": grid, "labels": count, "t_end": t_end, "dt": dt,
        "steps": steps, "status_checks": snapshots, "compile_s": compile_s, "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3), "load_before_after": [load0, load1],
        "step_ms": round(1e3 * wall / steps, 4), **_summary(ts, codes, mass, energy),
    }  # fmt: skip


def sphere_run(*, lmax: int, count: int, t_end: float) -> dict:
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
    per_snapshot = int(np.ceil(SAVE_EVERY / ds.safe_dt(field)))
    dt, snapshots = SAVE_EVERY / per_snapshot, round(t_end / SAVE_EVERY)
    run = lambda field, state: integrate(  # noqa: E731
        field, state, integrator=RK4(retraction="none"), dt=dt, steps_per_snapshot=per_snapshot,
        snapshots=snapshots, status=lambda s: ds.status_code(field, s),
    )  # fmt: skip
    compiled, compile_s = _compile(run, field, state)
    _note(f"sphere: {per_snapshot * snapshots} steps")
    (ts, states, codes), wall, cpu, load0, load1 = _timed(compiled, field, state)
    _note(f"sphere: {wall:.1f} s wall, {cpu:.1f} CPU-s")
    mass = jax.vmap(lambda a: field.mass(ds.SphereDensity(a)))(states.a)
    energy = np.asarray(jax.vmap(lambda a: field.energy(ds.SphereDensity(a)))(states.a))
    steps = per_snapshot * snapshots
    return {
        "lmax": lmax, "labels": count, "grid": list(np.asarray(field.grid_points()).shape[1:]),
        "t_end": t_end, "dt": dt, "steps": steps, "status_checks": snapshots, "compile_s": compile_s,
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_before_after": [load0, load1],
        "step_ms": round(1e3 * wall / steps, 3), **_summary(ts, codes, mass, energy),
    }  # fmt: skip


def _comparison_density(grid: int, dt: float) -> tuple[np.ndarray, dict]:
    """density_particles' density at ``grid`` angles (its initial law sampled there), RK4 at ``dt``
    to its T_END: ``(f_end, timing)``."""
    labels = dc.position_labels(dp.LABELS)
    field = dc.make_circle_field(
        make_profile("exp", beta=dp.BETA), grid=grid, labels=labels,
        gauge=dc.rope_circle_gauge(labels, dp.OMEGA),
        factor=factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(dp.OMEGA)),
    )  # fmt: skip
    theta = dc.grid_angles(grid)
    centres = np.pi * np.asarray(labels.nodes)[:, None]
    f0 = np.exp(np.cos(theta - centres)) / (2.0 * np.pi * np.i0(1.0))  # dp.initial_law at `grid`
    steps = round(dp.T_END / dt)
    # no status inside the run (an under-resolved run would be frozen at its last resolved law: the
    # distance is that of the run itself); the status of the final law is reported beside it
    run = lambda state: integrate(  # noqa: E731
        field, state, integrator=RK4(retraction="none"), dt=dt, steps_per_snapshot=steps, snapshots=1
    )  # fmt: skip
    state = dc.CircleDensity(jnp.asarray(f0))
    compiled, compile_s = _compile(run, state)
    (_, states, _), wall, cpu, _, _ = _timed(compiled, state)
    final = dc.CircleDensity(states.f[-1])
    tail, negative = dc.resolution(field, final)
    timing = {"grid": grid, "dt": dt, "steps": steps, "compile_s": compile_s, "wall_s": wall, "cpu_s": cpu,
              "final_status": str(Status.from_codes(dc.status_code(field, final)).item()),
              "final_tail": float(tail), "final_negative": float(negative)}  # fmt: skip
    return np.asarray(final.f), timing


def _particle_program(n: int):
    """The compiled RK4 run of density_particles' tokens (``n`` rounded down to a multiple of 3), by
    the step ``solve`` takes (``RK4()``: the sphere retraction) at its DT to its T_END."""
    labels = dc.position_labels(dp.LABELS)
    per_label = n // dp.LABELS
    index = np.repeat(np.arange(dp.LABELS), per_label)
    xi = np.asarray(labels.nodes)[index]
    kernel = Kernel(
        gauges.make_rope(xi, 2, [dp.OMEGA]),
        factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(dp.OMEGA)),
        make_profile("exp", beta=dp.BETA),
    )
    field, method, steps = make_vector_field(kernel), RK4(), round(dp.T_END / dp.DT)

    def run(x):
        return jax.lax.scan(lambda x, _: (method.step(field, x, dp.DT), None), x, None, length=steps)[0]

    compiled, compile_s = _compile(run, jnp.zeros((len(index), 2)))
    return compiled, compile_s, index, per_label, steps


def particle_comparison(sizes, seeds: int, grids) -> dict:
    labels = dc.position_labels(dp.LABELS)
    f0_ref, f_ref = dp.density_law()  # the workflow's density (GRID angles, dt = DT/5): E16's limit
    reference, reference_timing = _comparison_density(GRID_REFERENCE, dp.DT / 10)
    theta_fine, cdf_ref = dd.density_cdf(reference)

    def density_w1(f) -> float:  # W1 per label, averaged with the label weights, from exact CDFs
        _, cdf = dd.density_cdf(f, fine=theta_fine.size)
        rows = zip(np.asarray(labels.weights), cdf, cdf_ref, strict=True)
        return float(sum(w * dd._circle_w1_cdfs(theta_fine, c, r) for w, c, r in rows))

    density = []
    for grid in grids:
        f_end, timing = _comparison_density(grid, dp.DT / 5)
        density.append({**timing, "w1_to_reference": density_w1(f_end)})
    particles = []
    for n in sizes:
        compiled, compile_s, index, per_label, steps = _particle_program(n)
        runs = []
        for seed in range(seeds):
            draws = np.concatenate(dd.sample_density(f0_ref, per_label, np.random.default_rng(seed)))
            x0 = jnp.asarray(np.stack([np.cos(draws), np.sin(draws)], axis=1))
            x, wall, cpu, load0, load1 = _timed(compiled, x0)
            theta = np.arctan2(np.asarray(x)[:, 1], np.asarray(x)[:, 0])
            w1 = dd.labelled_circle_w1(theta, index, f_ref, labels.weights)
            _note(f"particles n = {len(index)}, seed {seed}: {wall:.1f} s wall, {cpu:.1f} CPU-s")
            runs.append({"wall_s": wall, "cpu_s": cpu, "w1": w1, "load": [load0, load1]})
        m = len(index)
        w1 = np.asarray([r["w1"] for r in runs])
        particles.append({
            "n": m, "steps": steps, "compile_s": compile_s,
            "wall_s_median": float(np.median([r["wall_s"] for r in runs])),
            "cpu_s_median": float(np.median([r["cpu_s"] for r in runs])),
            "w1_mean": float(w1.mean()), "w1_min_max": [float(w1.min()), float(w1.max())],
            "sqrt_n_w1": float(np.sqrt(m) * w1.mean()), "runs": runs,
        })  # fmt: skip
    n = np.asarray([p["n"] for p in particles], dtype=float)
    cpu = np.asarray([p["cpu_s_median"] for p in particles])
    constant = float(np.mean([p["sqrt_n_w1"] for p in particles]))
    exponent = float(np.polyfit(np.log(n[-2:]), np.log(cpu[-2:]), 1)[0]) if len(n) > 1 else None
    per_pair_step = float(cpu[-1] / (n[-1] ** 2 * particles[-1]["steps"]))  # CPU-s per pair and step
    consequence = {}
    for target in (1e-2, 1e-3, 1e-6):
        needed = (constant / target) ** 2
        consequence[f"{target:g}"] = {
            "n": float(needed),
            "particle_cpu_s": per_pair_step * needed**2 * particles[-1]["steps"],
        }
    return {
        "setting": "density_particles: 3 label nodes, RoPE + ToeplitzCos, exp beta = 1, usa, tau = 2",
        "reference": {**reference_timing, "grid": GRID_REFERENCE},
        "workflow_density_w1_to_reference": density_w1(f_ref),
        "density": density,
        "particles": particles,
        "measured": {
            "sqrt_n_w1_mean_over_sizes": constant,
            "cpu_exponent_between_largest_two_n": exponent,
            "cpu_s_per_pair_step_at_largest_n": per_pair_step,
        },
        "consequence_not_run": consequence,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--parts", nargs="+", default=["circle", "sphere", "particles"],
                        choices=["circle", "sphere", "particles"])  # fmt: skip
    args = parser.parse_args()
    quick = args.quick
    results = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "load_average_before": list(np.round(os.getloadavg(), 2)),
    }
    if "circle" in args.parts:
        grid, count, t_end = (256, 16, 2.0) if quick else (GRID, LABELS, T_END)
        results["circle"] = [
            circle_run(scale, grid=grid, count=count, t_end=t_end) for scale in ("plain", "rescaled")
        ]
    if "sphere" in args.parts:
        results["sphere"] = sphere_run(
            lmax=16 if quick else SPHERE_LMAX,
            count=4 if quick else SPHERE_LABELS,
            t_end=2.0 if quick else T_END,
        )
    if "particles" in args.parts:
        results["particles"] = particle_comparison(
            (48, 96) if quick else PARTICLE_SIZES,
            2 if quick else PARTICLE_SEEDS,
            (36, 48) if quick else DENSITY_GRIDS,
        )
    results["load_average_after"] = list(np.round(os.getloadavg(), 2))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
