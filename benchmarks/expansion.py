"""The expansion path against the exact tiled path (standalone; ``python benchmarks/expansion.py``).

1. One RK4 step (4 field evaluations) at n = 16384, d = 3, beta = 1, tolerance 1e-8: expansion
   against ``make_vector_field(kernel, block_size=128)``, interleaved in one process, best of
   ``REPEATS``, wall and CPU time, and their ratios.
2. Time per RK4 step of the expansion for n from 1e4 to 1e6, each n in a fresh subprocess (so its
   peak RSS is its own), and the exponent of a log-log fit.
3. Accuracy: the measured field error (relative to the field's scale) against the tolerance and
   the closed-form tail bound, n = 2048, d = 3, "usa" and "sa", on the sphere.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from attnflow.core import factors, gauges, sphere  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics import dynamics, expansion  # noqa: E402
from attnflow.numerics import polynomial_features as pf  # noqa: E402

REPEATS = 3
DT = 0.01


def make_kernel(n: int, d: int, beta: float) -> Kernel:
    return Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=beta))


def expansion_field(kernel: Kernel, *, normalization: str = "usa", tolerance: float):
    """The wired path: ``make_vector_field(..., interaction="expansion")``."""
    return dynamics.make_vector_field(
        kernel, normalization=normalization, interaction="expansion", tolerance=tolerance
    )


def rk4_step(field):
    def step(x):
        k1 = field(x)
        k2 = field(x + 0.5 * DT * k1)
        k3 = field(x + 0.5 * DT * k2)
        k4 = field(x + DT * k3)
        return sphere.normalize(x + DT / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4))

    return jax.jit(step)


def timed(fn, x) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(x).block_until_ready()
    return time.perf_counter() - wall, time.process_time() - cpu


def rk4_ratio(n: int = 16384, d: int = 3, beta: float = 1.0, tolerance: float = 1e-8) -> dict:
    kernel = make_kernel(n, d, beta)
    x = sphere.sample_uniform(jax.random.key(0), n, d)
    steps = {
        "exact": rk4_step(dynamics.make_vector_field(kernel, block_size=128)),
        "expansion": rk4_step(expansion_field(kernel, tolerance=tolerance)),
    }
    for step in steps.values():
        step(x).block_until_ready()
    best = {name: (np.inf, np.inf) for name in steps}
    for _ in range(REPEATS):
        for name, step in steps.items():
            wall, cpu = timed(step, x)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    difference = float(jnp.max(jnp.abs(steps["exact"](x) - steps["expansion"](x))))
    return {
        "n": n,
        "rank": expansion.expansion_rank(d, beta, tolerance),
        "exact_wall_s": best["exact"][0],
        "exact_cpu_s": best["exact"][1],
        "expansion_wall_s": best["expansion"][0],
        "expansion_cpu_s": best["expansion"][1],
        "ratio_wall": best["exact"][0] / best["expansion"][0],
        "ratio_cpu": best["exact"][1] / best["expansion"][1],
        "step_difference": difference,
    }


def single(n: int, d: int = 3, beta: float = 1.0, tolerance: float = 1e-8) -> dict:
    """One n: the best of ``REPEATS`` RK4 steps of the expansion and the peak RSS of the process."""
    step = rk4_step(expansion_field(make_kernel(n, d, beta), tolerance=tolerance))
    x = sphere.sample_uniform(jax.random.key(1), n, d)
    step(x).block_until_ready()
    runs = [timed(step, x) for _ in range(REPEATS)]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {
        "n": n,
        "wall_s": min(r[0] for r in runs),
        "cpu_s": min(r[1] for r in runs),
        "peak_rss_mb": rss_mb,
    }


def scaling(sizes=(10_000, 31_623, 100_000, 316_228, 1_000_000)) -> list[dict]:
    rows = []
    for n in sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--single", str(n)], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def accuracy(n: int = 2048, d: int = 3) -> list[dict]:
    rows = []
    x = sphere.sample_uniform(jax.random.key(2), n, d)
    for normalization in ("usa", "sa"):
        for beta in (0.5, 1.0, 4.0, 9.0):
            kernel = make_kernel(n, d, beta)
            exact = jax.jit(dynamics.make_vector_field(kernel, normalization=normalization))(x)
            for tolerance in (1e-6, 1e-10, 1e-13):
                try:
                    degree = expansion.expansion_degree(beta, tolerance, normalization=normalization)
                    field = jax.jit(expansion_field(kernel, normalization=normalization, tolerance=tolerance))
                    approx = field(x)
                except ValueError as error:
                    rows.append(
                        {
                            "normalization": normalization,
                            "beta": beta,
                            "tolerance": tolerance,
                            "error": str(error),
                        }
                    )
                    continue
                scale = float(kernel.profile.scale) if normalization == "usa" else 1.0
                measured = float(jnp.max(jnp.linalg.norm(approx - exact, axis=1))) / scale
                rows.append(
                    {
                        "normalization": normalization,
                        "beta": beta,
                        "tolerance": tolerance,
                        "degree": degree,
                        "rank": pf.rank(d, degree),
                        "bound": pf.tail_bound(beta, degree),
                        "measured": measured,
                        "tolerance_over_measured": tolerance / max(measured, 1e-300),
                    }
                )
    return rows


def main():
    print(f"# load: {os.getloadavg()}, cpus: {os.cpu_count()}, jax {jax.__version__}")
    ratio = rk4_ratio()
    print("## RK4 step, n = 16384, d = 3, beta = 1, tolerance 1e-8")
    print(json.dumps(ratio, indent=1))
    rows = scaling()
    print("## expansion RK4 step against n (each n in a fresh process)")
    for row in rows:
        print(json.dumps(row))
    ns = np.array([r["n"] for r in rows], float)
    for key in ("wall_s", "cpu_s"):
        slope = np.polyfit(np.log(ns), np.log([r[key] for r in rows]), 1)[0]
        print(f"exponent ({key}): {slope:.3f}")
    print("## accuracy, n = 2048, d = 3 (measured = max_i |Δv_i| / field scale)")
    for row in accuracy():
        print(json.dumps(row))
    print(f"# load: {os.getloadavg()}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--single":
        print(json.dumps(single(int(sys.argv[2]))))
    else:
        main()
