"""The accuracy side of the benchmark: bitwise invariance across thread and device settings, float32
against float64, and the random-batch approximation's error (with its time at very large n)."""

from __future__ import annotations

import numpy as np
import references
from engine import DT, best_time, compiled_steps, setup_jax, timed, usa_field

# ----------------------------------------------------------------------------- thread settings


def child_thread(n: int, out: str) -> dict:
    """The same RK4 run (RoPE, automatic block size), saved for a bitwise comparison across settings."""
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics, integrators
    from attnflow.numerics.solve import solve
    from attnflow.workflows.build import auto_block_size

    g = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    kernel = Kernel(g, factors.NoFactor(n), make_profile("exp", beta=1.0))
    field = dynamics.make_vector_field(kernel, block_size=auto_block_size(n))
    x0 = jnp.asarray(references.initial(n, 3, "float64"))
    traj = solve(field, x0, integrator=integrators.RK4(), dt=DT, t_end=0.5, save_every=0.1)
    np.save(out, traj.xs)
    return {"n": n, "devices_seen": jax.local_device_count()}


# ----------------------------------------------------------------------------- float32 accuracy


def measure_float32(ns: list[int], seeds: int) -> list[dict]:
    """float32 against float64 trajectories on the E0/E1 settings (RK4, dt = 0.01, to t = 20)."""
    setup_jax()
    import jax.numpy as jnp

    from attnflow.analysis import metrics
    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics, integrators, summation
    from attnflow.numerics.solve import solve

    def kernel(setting, n, dtype):
        if setting == "E0":
            g = gauges.IdentityGauge(n=n, d=3)
        else:
            freqs = (
                gauges.rope_frequencies(3, kind="full_period", n=n) if setting == "E1a" else np.array([1.0])
            )
            g = gauges.make_rope(np.arange(n), 3, freqs, dtype=dtype)
        return Kernel(g, factors.NoFactor(n), make_profile("exp", beta=1.0, dtype=dtype))

    rows = []
    for setting in ("E0", "E1a", "E1b"):
        for n in ns:
            x0 = np.stack([references.initial(n, 3, "float64", seed=s) for s in range(seeds)])
            xs = {}
            for dtype in (jnp.float64, jnp.float32):
                field = dynamics.make_vector_field(kernel(setting, n, dtype))
                traj = solve(
                    field,
                    jnp.asarray(x0, dtype),
                    integrator=integrators.RK4(),
                    dt=0.01,
                    t_end=20.0,
                    save_every=5.0,
                )
                xs[dtype] = np.asarray(traj.xs, np.float64)
            x64, x32 = xs[jnp.float64], xs[jnp.float32]
            k64 = kernel(setting, n, jnp.float64)
            q = np.asarray(k64.gauge.matrices())

            def gauged(x, q=q):
                return np.einsum("nij,nj->ni", q, x)

            def energy(x, k64=k64):
                return float(summation.energy(k64, jnp.asarray(x)))

            mc = [
                abs(metrics.mean_cosine(x64[-1, s]) - metrics.mean_cosine(x32[-1, s])) for s in range(seeds)
            ]
            gmc = [
                abs(metrics.mean_cosine(gauged(x64[-1, s])) - metrics.mean_cosine(gauged(x32[-1, s])))
                for s in range(seeds)
            ]
            e = [abs(energy(x64[-1, s]) - energy(x32[-1, s])) / energy(x64[-1, s]) for s in range(seeds)]
            row = {
                "setting": setting,
                "n": n,
                "seeds": seeds,
                "state_t5": float(np.abs(x64[1] - x32[1]).max()),
                "state_t20": float(np.abs(x64[-1] - x32[-1]).max()),
                "mean_cosine_t20": float(max(mc)),
                "gauge_mean_cosine_t20": float(max(gmc)),
                "energy_rel_t20": float(max(e)),
            }
            rows.append(row)
            print(
                f"  float32 {setting} n={n}: state t=5 {row['state_t5']:.1e}, t=20 {row['state_t20']:.1e}; "
                f"mean cos {row['mean_cosine_t20']:.1e}; energy {row['energy_rel_t20']:.1e}",
                flush=True,
            )
    return rows


# ----------------------------------------------------------------------------- random batch


def measure_random_batch(n: int, ps: list[int], t_end: float) -> dict:
    """The random-batch approximation against the exact dynamics from the same initial data."""
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, random_batch
    from attnflow.numerics.solve import solve

    kernel, field, _ = usa_field(n, 3, "float64")
    x0 = jnp.asarray(references.initial(n, 3, "float64"))
    opts = dict(integrator=integrators.Euler(), dt=DT, t_end=t_end, save_every=t_end)
    exact = solve(field, x0, **opts)
    run, _ = compiled_steps(field, integrators.Euler(), x0, 10)
    exact_step = best_time(lambda: run(x0).block_until_ready(), 2) / 10
    rows = []
    for p in ps:
        results = []

        def call(p=p, results=results):
            results.append(random_batch.solve_random_batch(kernel, x0, p=p, key=jax.random.key(p), **opts))

        walls = [timed(call)[0] for _ in range(2)]
        err = np.asarray(results[0].xs[-1]) - np.asarray(exact.xs[-1])
        rows.append(
            {
                "p": p,
                "rms_error": float(np.sqrt(np.mean(np.sum(err**2, axis=1)))),
                "max_error": float(np.abs(err).max()),
                "run_s": min(walls),  # each call compiles again: the better of two whole calls
            }
        )
        print(f"  random batch n={n} p={p}: RMS error {rows[-1]['rms_error']:.2e}", flush=True)
    return {"n": n, "t_end": t_end, "exact_step_s": exact_step, "rows": rows}


def child_random_batch_large(n: int, p: int) -> dict:
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, random_batch

    kernel, _, _ = usa_field(n, 3, "float64")
    x0 = jnp.asarray(references.initial(n, 3, "float64"))
    opts = dict(integrator=integrators.Euler(), dt=DT, save_every=DT)
    steps = 5
    wall = timed(
        lambda: random_batch.solve_random_batch(
            kernel, x0, p=p, key=jax.random.key(1), t_end=steps * DT, **opts
        )
    )[0]
    return {"n": n, "p": p, "run_s": wall, "steps": steps}
