"""The expansion path against the exact tiled path, in the setting of ``attnflow run`` (standalone).

    python benchmarks/expansion.py               # everything (~10 min on a quiet 2-core machine)
    python benchmarks/expansion.py --products    # 1. only
    python benchmarks/expansion.py --steps       # 2. and 3. only

The command line exposes every CPU core to JAX as a device (``use_cpu_cores()``) before JAX
starts, and so does this script; the exact path then deals its tile pairs into lanes over the
devices, the expansion its chunks; the block size is the automatic one; the tolerance is the
configuration's default (``solver.tolerance = 1e-10``). d = 3, float64, gradient values
(``w = 3`` value columns).

1. Products at n = 10^6, beta = 1, 4, 9: one pass of the moments (``Σ_j F(k_j) ⊗ y_j``) and one
   of their evaluation (``F(q_i) · M``), useful GFLOP/s (``2 R w n`` per pass, ``R`` the rank),
   against one plain ``jnp.dot`` of two square matrices of about the same flops, on one device,
   and against the products as they were before the split features (the reference ``per_monomial``:
   the ``(c, R)`` monomial features of a chunk, one ``(R, c) @ (c, w)`` product each, one chunk after
   another). Interleaved, best of ``REPEATS``, wall and CPU time.
2. One RK4 step (4 field evaluations) at n = 16384, beta = 1, 4, 9: the exact tiled path against
   the expansion, interleaved in one process, best of ``REPEATS``, wall and CPU, and their ratios.
3. The step at n = 16384 on one device and on two (fresh processes, alternated), the exact path
   at beta = 1 and the expansion at beta = 4: wall, CPU, and the CPU time of the busiest threads
   (``/proc``, Linux): whether a core idles.
4. (full run only) Time per RK4 step of the expansion for n from 1e4 to 1e6, each n in a fresh
   process, the exponent of a log-log fit; the measured field error against the tolerance.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from attnflow.numerics.lanes import use_cpu_cores

if __name__ == "__main__":  # as `attnflow run` does, before JAX starts (not when imported: gpu.py)
    devices = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else None
    use_cpu_cores(None if devices is None else int(devices))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

from attnflow.core import factors, gauges, sphere  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics import dynamics, expansion  # noqa: E402
from attnflow.numerics import polynomial_features as pf  # noqa: E402
from attnflow.workflows.build import auto_block_size  # noqa: E402

REPEATS = 5
DT = 0.01
TOLERANCE = 1e-10  # the configuration's default solver.tolerance
BETAS = (1.0, 4.0, 9.0)


def make_kernel(n: int, d: int, beta: float) -> Kernel:
    return Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=beta))


def make_field(kernel: Kernel, interaction: str, *, normalization: str = "usa", tolerance: float = TOLERANCE):
    """The field as ``attnflow run`` builds it: the automatic block size, the interaction chosen."""
    return dynamics.make_vector_field(
        kernel,
        normalization=normalization,
        block_size=auto_block_size(kernel.n),
        interaction=interaction,
        tolerance=tolerance,
    )


def rk4_step(field):
    def step(x):
        k1 = field(x)
        k2 = field(x + 0.5 * DT * k1)
        k3 = field(x + 0.5 * DT * k2)
        k4 = field(x + DT * k3)
        return sphere.normalize(x + DT / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4))

    return jax.jit(step)


def timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - wall, time.process_time() - cpu


def best_of(calls: dict, repeats: int = REPEATS) -> dict:
    """``{name: (fn, args)}`` called in turn ``repeats`` times after a warm-up: the best wall and
    the best CPU time of each."""
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
    best = {name: [np.inf, np.inf] for name in calls}
    for _ in range(repeats):
        for name, (fn, args) in calls.items():
            wall, cpu = timed(fn, *args)
            best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
    return best


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# 1. products -------------------------------------------------------------------------------------


def per_monomial(plan_degree: int, weights, k, y, q, chunk: int):
    """The products before the split features (reference): moments ``Σ_c F_cᵀ y_c`` with the
    ``(c, R)`` monomial features of each chunk, then ``F(q_c) · (weights ⊙ M)`` chunk by chunk."""
    chunked = lambda a: expansion._chunked(a, chunk)  # noqa: E731

    def moments(k, y):
        def accumulate(m, c):
            return m + pf.monomial_features(c[0], plan_degree).T @ c[1], None

        init = jnp.zeros((weights.shape[0], y.shape[1]), k.dtype)
        return jax.lax.scan(accumulate, init, (chunked(k), chunked(y)))[0]

    def evaluate(q, m):
        weighted = m * weights[:, None]
        return jax.lax.map(lambda c: pf.monomial_features(c, plan_degree) @ weighted, chunked(q))

    return jax.jit(moments), jax.jit(evaluate)


def engine_passes(plan, chunk: int):
    """The engine's two passes of a global sum (``expansion._global_sum``): the moments over chunks
    dealt into lanes, and their evaluation."""

    def moments(k, y):
        a = jnp.ones((k.shape[0], 1), k.dtype)
        return expansion._lane_moments(plan, *(expansion._chunked(t, chunk) for t in (k, y, a)))

    def evaluate(q, m):
        a = jnp.ones((q.shape[0], 1), q.dtype)
        chunks = expansion._chunked(q, chunk), expansion._chunked(a, chunk)
        return expansion._lane_evaluate(plan, *chunks, plan.weighted(m))

    return jax.jit(moments), jax.jit(evaluate)


def products(n: int = 1_000_000, d: int = 3, w: int = 3, betas=BETAS) -> list[dict]:
    rows = []
    k = sphere.sample_uniform(jax.random.key(0), n, d)
    y = jax.random.normal(jax.random.key(1), (n, w))
    for beta in betas:
        degree = expansion.expansion_degree(beta, TOLERANCE)
        plan = expansion._Plan(beta, degree, d, k.dtype)
        exponents = pf.monomial_exponents(d, degree)
        weights = jnp.asarray(pf.feature_weights(exponents, pf.monomial_coefficients(beta, degree)))
        useful = 2.0 * plan.rank * w * n
        performed = 2.0 * plan.weights.size * w * n
        side = int(round((useful / 2.0) ** (1.0 / 3.0)))
        a = jax.random.normal(jax.random.key(2), (side, side))
        old_chunk = int(min(n, max(64, expansion.CHUNK_ENTRIES // plan.rank)))  # as before
        old_moments, old_evaluate = per_monomial(degree, weights, k, y, k, old_chunk)
        new_chunk = expansion._lane_chunk(plan, n, w)
        new_moments, new_evaluate = engine_passes(plan, new_chunk)
        m_old, m_new = old_moments(k, y), new_moments(k, y)
        before = uptime()
        best = best_of(
            {
                "matmul": (jax.jit(jnp.dot), (a, a)),
                "per_monomial_moments": (old_moments, (k, y)),
                "per_monomial_evaluation": (old_evaluate, (k, m_old)),
                "moments": (new_moments, (k, y)),
                "evaluation": (new_evaluate, (k, m_new)),
            },
            repeats=3,
        )
        after = uptime()
        # the same sums both ways (a check, not a timing): relative difference of the evaluations
        ref = np.asarray(old_evaluate(k, m_old)).reshape(-1, w)[:n]
        new = np.asarray(new_evaluate(k, m_new)).reshape(-1, w)[:n]
        row = {
            "beta": beta,
            "degree": degree,
            "rank": plan.rank,
            "performed_over_useful": performed / useful,
            "matmul_side": side,
            "chunk_before": old_chunk,
            "chunk": new_chunk,
            "difference": float(np.max(np.abs(new - ref)) / np.max(np.abs(ref))),
            "uptime_before": before,
            "uptime_after": after,
        }
        for name, (wall, cpu) in best.items():
            flops = 2.0 * side**3 if name == "matmul" else useful
            row[name] = {
                "wall_s": wall,
                "cpu_s": cpu,
                "gflops_wall": flops / wall / 1e9,
                "gflops_cpu": flops / cpu / 1e9,
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# 2. RK4 steps ------------------------------------------------------------------------------------


def rk4_ratios(n: int = 16384, d: int = 3, betas=BETAS) -> list[dict]:
    rows = []
    x = sphere.sample_uniform(jax.random.key(0), n, d)
    for beta in betas:
        kernel = make_kernel(n, d, beta)
        steps = {name: rk4_step(make_field(kernel, name)) for name in ("exact", "expansion")}
        before = uptime()
        best = best_of({name: (step, (x,)) for name, step in steps.items()})
        after = uptime()
        exact, approx = best["exact"], best["expansion"]
        row = {
            "n": n,
            "beta": beta,
            "tolerance": TOLERANCE,
            "rank": expansion.expansion_rank(d, beta, TOLERANCE),
            "block_size": auto_block_size(n),
            "devices": len(jax.devices()),
            "exact_wall_s": exact[0],
            "exact_cpu_s": exact[1],
            "expansion_wall_s": approx[0],
            "expansion_cpu_s": approx[1],
            "ratio_wall": exact[0] / approx[0],
            "ratio_cpu": exact[1] / approx[1],
            "step_difference": float(jnp.max(jnp.abs(steps["exact"](x) - steps["expansion"](x)))),
            "uptime_before": before,
            "uptime_after": after,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# 3. the exact path on one device and on two -------------------------------------------------------


def _thread_ticks() -> dict:
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def step_threads(interaction: str, n: int = 16384, d: int = 3, beta: float = 1.0) -> dict:
    """This process's RK4 step on ``interaction``: wall and CPU per step, and the CPU seconds per
    step of its busiest threads (over a few seconds of steps: the kernel counts in 10 ms ticks)."""
    steps = 3 if interaction == "exact" else 30
    step = rk4_step(make_field(make_kernel(n, d, beta), interaction))
    x = sphere.sample_uniform(jax.random.key(0), n, d)
    step(x).block_until_ready()
    before, wall, cpu = _thread_ticks(), time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(x).block_until_ready()
    wall, cpu = (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps
    after, hz = _thread_ticks(), os.sysconf("SC_CLK_TCK")
    busy = sorted(((after[t] - before.get(t, 0)) / hz / steps for t in after), reverse=True)
    return {
        "interaction": interaction,
        "beta": beta,
        "devices": len(jax.devices()),
        "wall_s": wall,
        "cpu_s": cpu,
        "busiest_threads_cpu_s": busy[:3],
    }


def device_counts(rounds: int = 2) -> list[dict]:
    """The exact path (beta = 1) and the expansion (beta = 4) on one device and on two, each in a
    fresh process, alternated."""
    rows = []
    for _ in range(rounds):
        for interaction, beta in (("exact", "1"), ("expansion", "4")):
            for devices in (1, 2):
                command = [sys.executable, __file__, "--threads", interaction, beta, "--devices"]
                out = subprocess.run([*command, str(devices)], capture_output=True, text=True, check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1]) | {"uptime": uptime()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# 4. scaling and accuracy (full run) ---------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` (Linux; ``ru_maxrss`` keeps the peak of the
    parent at the fork across the ``exec``), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024.0
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def single(n: int, d: int = 3, beta: float = 1.0) -> dict:
    """One n: the best of ``REPEATS`` RK4 steps of the expansion and the peak RSS of the process."""
    step = rk4_step(make_field(make_kernel(n, d, beta), "expansion"))
    x = sphere.sample_uniform(jax.random.key(1), n, d)
    step(x).block_until_ready()
    runs = [timed(step, x) for _ in range(REPEATS)]
    rss_mb = peak_rss_mb()
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
        print(json.dumps(rows[-1]), flush=True)
    return rows


def accuracy(n: int = 2048, d: int = 3) -> list[dict]:
    rows = []
    x = sphere.sample_uniform(jax.random.key(2), n, d)
    for normalization in ("usa", "sa"):
        for beta in (0.5, 1.0, 4.0, 9.0):
            kernel = make_kernel(n, d, beta)
            exact = jax.jit(dynamics.make_vector_field(kernel, normalization=normalization))(x)
            for tolerance in (1e-6, 1e-10, 1e-13):
                row = {"normalization": normalization, "beta": beta, "tolerance": tolerance}
                try:
                    degree = expansion.expansion_degree(beta, tolerance, normalization=normalization)
                    field = make_field(kernel, "expansion", normalization=normalization, tolerance=tolerance)
                    approx = jax.jit(field)(x)
                except ValueError as error:
                    rows.append(row | {"error": str(error)})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                scale = float(kernel.profile.scale) if normalization == "usa" else 1.0
                measured = float(jnp.max(jnp.linalg.norm(approx - exact, axis=1))) / scale
                rows.append(
                    row
                    | {
                        "degree": degree,
                        "rank": pf.rank(d, degree),
                        "bound": pf.tail_bound(beta, degree),
                        "measured": measured,
                        "tolerance_over_measured": tolerance / max(measured, 1e-300),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(args: list[str]) -> None:
    everything = not ({"--products", "--steps"} & set(args))
    print(f"# {uptime()}; cpus {os.cpu_count()}; JAX {jax.__version__}; devices {len(jax.devices())}")
    if everything or "--products" in args:
        print("## 1. products, n = 10^6, d = 3, w = 3, tolerance 1e-10")
        products()
    if everything or "--steps" in args:
        print("## 2. RK4 step, n = 16384, d = 3, the CLI's setting")
        rk4_ratios()
        print("## 3. the step on one and two devices (fresh processes): CPU seconds of the busiest threads")
        device_counts()
    if everything:
        print("## 4. expansion RK4 step against n (each n in a fresh process)")
        rows = scaling()
        ns = np.array([r["n"] for r in rows], float)
        for key in ("wall_s", "cpu_s"):
            slope = np.polyfit(np.log(ns), np.log([r[key] for r in rows]), 1)[0]
            print(f"exponent ({key}): {slope:.3f}")
        print("## accuracy, n = 2048, d = 3 (measured = max_i |Δv_i| / field scale)")
        accuracy()
    print(f"# {uptime()}")


if __name__ == "__main__":
    if "--single" in sys.argv:
        print(json.dumps(single(int(sys.argv[sys.argv.index("--single") + 1]))))
    elif "--threads" in sys.argv:
        at = sys.argv.index("--threads")
        print(json.dumps(step_threads(sys.argv[at + 1], beta=float(sys.argv[at + 2]))))
    else:
        main(sys.argv[1:])
