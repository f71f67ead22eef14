"""Speed and memory of attnflow, as ratios against references measured in the same run.

    python benchmarks/run.py            # full run (~10–15 min on 2 cores), writes benchmarks/RESULTS.md
    python benchmarks/run.py --quick    # a fast subset (~3 min), prints only (unless --out is given)

References, all measured by this script on the machine it runs on:

- a dense **NumPy reference** of the same step, written the way the published codes are: a Python
  loop over steps, an explicit ``n × n`` matrix per field evaluation
  (``A = exp(β X Xᵀ)``, ``g = A X / n``, tangent projection, Euler or RK4 step, renormalise);
  also an "in-place" NumPy variant (one ``n × n`` buffer, ``exp`` in place) as a stronger baseline;
- the machine's **roofline**: a field evaluation needs ``n²`` exponentials and ``2 n² d``
  multiply-adds, timed at the best measured rates of ``exp`` (NumPy and XLA, all cores) and of a
  large matrix product (NumPy/OpenBLAS and XLA, all cores).

Large sizes and every memory figure run in a fresh subprocess whose peak resident memory is read
with ``/usr/bin/time -v`` (or ``getrusage`` where that tool is missing). Timings are the minimum over
repetitions, NumPy and attnflow interleaved, so that a busy machine penalises both alike; the load
average is recorded next to the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BETA = 1.0
DT = 0.01
NUMPY_MAX_BYTES = 2.5e9  # skip the NumPy reference when one n × n array would exceed this
NUMPY_MAX_STEP_S = 60.0  # ... or when its estimated step time would


# ----------------------------------------------------------------------------- the NumPy reference


def numpy_field(x: np.ndarray, beta: float = BETA) -> np.ndarray:
    """The USA field written as the published codes do: an explicit n × n matrix per evaluation."""
    n = x.shape[0]
    a = np.exp(beta * (x @ x.T))
    g = (a @ x) / n
    return g - np.sum(g * x, axis=1, keepdims=True) * x


def numpy_field_inplace(x: np.ndarray, beta: float = BETA) -> np.ndarray:
    """The same with a single n × n buffer (exp in place): a stronger NumPy baseline."""
    n = x.shape[0]
    a = x @ x.T
    a *= beta
    np.exp(a, out=a)
    g = a @ x
    g /= n
    return g - np.sum(g * x, axis=1, keepdims=True) * x


def numpy_step(field, x: np.ndarray, method: str, dt: float = DT) -> np.ndarray:
    if method == "euler":
        x = x + dt * field(x)
    else:
        k1 = field(x)
        k2 = field(x + 0.5 * dt * k1)
        k3 = field(x + 0.5 * dt * k2)
        k4 = field(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def numpy_run(x: np.ndarray, *, steps: int, save_every_steps: int, field=numpy_field) -> list[np.ndarray]:
    """A whole RK4 run with snapshots, as a Python loop over steps."""
    xs = [x.copy()]
    for k in range(1, steps + 1):
        x = numpy_step(field, x, "rk4")
        if k % save_every_steps == 0:
            xs.append(x.copy())
    return xs


# ----------------------------------------------------------------------------- attnflow pieces


def _jax():
    """JAX with float64 and, as the CLI does, every core as a CPU device (``use_cpu_cores``; the
    count can be forced with ``ATTNFLOW_BENCH_DEVICES``): called before any computation."""
    import jax

    from attnflow.numerics.lanes import use_cpu_cores

    forced = os.environ.get("ATTNFLOW_BENCH_DEVICES")
    use_cpu_cores(int(forced) if forced else None)
    jax.config.update("jax_enable_x64", True)
    return jax


def usa_field(n: int, d: int, dtype: str, block_size="auto"):
    """The baseline USA field (Q = I, w = 1, β = 1) with the automatic block size."""
    _jax()
    import jax.numpy as jnp

    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics
    from attnflow.workflows.build import auto_block_size

    jdtype = jnp.float32 if dtype == "float32" else jnp.float64
    kernel = Kernel(
        gauges.IdentityGauge(n=n, d=d),
        factors.NoFactor(n),
        make_profile("exp", beta=BETA, dtype=jdtype),
    )
    block = auto_block_size(n, jdtype) if block_size == "auto" else block_size
    return kernel, dynamics.make_vector_field(kernel, block_size=block), block


def initial(n: int, d: int, dtype: str, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)


def time_call(fn, reps: int) -> float:
    """Best wall time of ``reps`` calls."""
    return min(timed(fn)[0] for _ in range(reps))


def timed(fn) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one call; cpu is the process time of all threads."""
    c0, start = os.times(), time.perf_counter()
    fn()
    wall, c1 = time.perf_counter() - start, os.times()
    return wall, (c1.user + c1.system) - (c0.user + c0.system)


class Best:
    """Minimum wall and minimum CPU time over repetitions, per step."""

    def __init__(self):
        self.wall, self.cpu = float("inf"), float("inf")

    def add(self, fn, per: int = 1) -> None:
        wall, cpu = timed(fn)
        self.wall, self.cpu = min(self.wall, wall / per), min(self.cpu, cpu / per)


# ----------------------------------------------------------------------------- machine rates


def machine_rates(dtype: str) -> dict:
    """Best measured exp rate (exps/s) and matrix-product rate (flop/s) on all cores."""
    jax = _jax()
    import jax.numpy as jnp

    cores = os.cpu_count() or 1
    chunk = np.random.default_rng(0).uniform(-2, 0, 32768).astype(dtype)
    reps = 400

    def np_exp_worker(_):
        out = np.empty_like(chunk)
        start = time.perf_counter()
        for _ in range(reps):
            np.exp(chunk, out=out)
        return time.perf_counter() - start

    best_np = 0.0
    with ThreadPoolExecutor(cores) as pool:  # NumPy ufuncs release the GIL: one stream per core
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(np_exp_worker, range(cores)))
            best_np = max(best_np, cores * reps * chunk.size / (time.perf_counter() - start))

    block = jnp.asarray(np.random.default_rng(0).uniform(-2, 0, (256, 4096)).astype(dtype))
    loops = 50

    @jax.jit
    def xla_exp(x):
        def body(i, acc):
            return acc + jnp.sum(jnp.exp(x + acc[:, None] * 1e-30), axis=1)

        return jax.lax.fori_loop(0, loops, body, jnp.zeros_like(x[:, 0]))

    xla_exp(block).block_until_ready()
    t_xla = time_call(lambda: xla_exp(block).block_until_ready(), 5)
    best_xla = loops * block.size / t_xla

    m = 2048
    a = np.random.default_rng(1).standard_normal((m, m)).astype(dtype)
    a @ a
    t_np_mm = time_call(lambda: a @ a, 5)
    aj = jnp.asarray(a)
    mm = jax.jit(jnp.matmul)
    mm(aj, aj).block_until_ready()
    t_xla_mm = time_call(lambda: mm(aj, aj).block_until_ready(), 5)
    flops = 2.0 * m**3
    return {
        "exp_numpy": best_np,
        "exp_xla": best_xla,
        "exp": max(best_np, best_xla),
        "matmul_numpy": flops / t_np_mm,
        "matmul_xla": flops / t_xla_mm,
        "matmul": max(flops / t_np_mm, flops / t_xla_mm),
    }


def roofline_eval_s(n: int, d: int, rates: dict) -> float:
    """Seconds for one field evaluation at the measured rates: n² exps + 2 n² d multiply-adds."""
    return n * n / rates["exp"] + 4.0 * n * n * d / rates["matmul"]


# ----------------------------------------------------------------------------- per-step measurement


def measure_steps(
    n: int,
    d: int,
    dtype: str,
    *,
    reps: int,
    with_numpy: bool,
    target_s: float,
    methods=("euler", "rk4"),
    with_rates: bool = True,
) -> dict:
    """Per-step time of attnflow (compiled loop, steady state) and of the NumPy references; with
    ``with_rates``, the machine rates measured between the repetitions (best of them), so that
    the roofline of the row is timed in the same state of a shared machine as the steps."""
    jax = _jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators
    from attnflow.numerics.solve import integrate

    _, field, block = usa_field(n, d, dtype)
    x0 = initial(n, d, dtype)
    xj = jnp.asarray(x0)
    out = {"n": n, "d": d, "dtype": dtype, "block_size": block}
    numpy_bytes = n * n * np.dtype(dtype).itemsize
    table = {"euler": integrators.Euler(), "rk4": integrators.RK4()}
    for method in ("euler", "rk4"):
        if method not in methods:
            out[method] = None
            continue
        integrator = table[method]

        def compiled(steps, integrator=integrator):
            fn = jax.jit(lambda x: integrate(field, x, integrator=integrator, dt=DT, steps=steps))
            start = time.perf_counter()
            fn = fn.lower(xj).compile()
            return fn, time.perf_counter() - start

        run, compile_s = compiled(1)
        steps = 1
        if target_s > 0:
            one = time_call(lambda run=run: run(xj).block_until_ready(), 1)
            steps = max(1, int(target_s / max(one, 1e-6)))
            if steps > 1:
                run, compile_s = compiled(steps)
        do_numpy = with_numpy and numpy_bytes <= NUMPY_MAX_BYTES
        np_steps = 1
        if do_numpy:
            start = time.perf_counter()
            numpy_step(numpy_field, x0, method)
            np_one = time.perf_counter() - start
            do_numpy = np_one <= NUMPY_MAX_STEP_S
            np_steps = max(1, int(target_s / max(np_one, 1e-6)))
        af, ref, ref2 = Best(), Best(), Best()

        def loop(field, np_steps=np_steps, method=method):
            x = x0
            for _ in range(np_steps):
                x = numpy_step(field, x, method)

        for _ in range(reps):
            af.add(lambda run=run: run(xj).block_until_ready(), steps)
            if do_numpy:
                ref.add(lambda: loop(numpy_field), np_steps)
                ref2.add(lambda: loop(numpy_field_inplace), np_steps)
            if with_rates:
                probe = machine_rates(dtype)
                out["rates"] = {k: max(v, out.get("rates", probe)[k]) for k, v in probe.items()}
        out[method] = {
            "attnflow_s": af.wall,
            "attnflow_cpu_s": af.cpu,
            "numpy_s": ref.wall if do_numpy else None,
            "numpy_cpu_s": ref.cpu if do_numpy else None,
            "numpy_inplace_s": ref2.wall if do_numpy else None,
            "evals": 1 if method == "euler" else 4,
            "compile_s": compile_s,
        }
    if not with_numpy:
        out["numpy_skipped"] = (
            "too slow" if numpy_bytes <= NUMPY_MAX_BYTES else f"{numpy_bytes / 1e9:.0f} GB n × n"
        )
    elif numpy_bytes > NUMPY_MAX_BYTES:
        out["numpy_skipped"] = f"{numpy_bytes / 1e9:.0f} GB n × n"
    return out


# ----------------------------------------------------------------------------- whole runs (n = 256)


def measure_whole_runs(n: int, t_end: float, seeds: int, reps: int) -> dict:
    """RK4 runs of τ = t_end with snapshots every 0.1: attnflow ``solve`` vs the NumPy loop.

    The batch runs in worker processes, one per core (``attnflow.numerics.workers``), as ``solve`` does by
    default on a CPU; their CPU time is not this process's, so the batch reports none. Its start-up
    (``compile_s``) is the export and compilation of the program in the workers; the first
    repetition also starts the workers (``first_compile_s``).

    attnflow's run time excludes the one-time compilation: it is read from the snapshot callbacks,
    from the first one after the initial snapshot (snapshot ``k₁``: small runs group several
    snapshots per compiled call) to the last (snapshot ``K``), scaled by ``K / (K − k₁)``; when one
    call holds every snapshot, it is the whole wall time less the compilation.
    """
    _jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators
    from attnflow.numerics.solve import solve

    _, field, _ = usa_field(n, 3, "float64")
    steps = int(round(t_end / DT))
    x0s = [initial(n, 3, "float64", seed=s) for s in range(seeds)]
    single, batch = {}, {}
    for _ in range(reps):
        for x0, record in ((x0s[0], single), (np.stack(x0s), batch)):
            marks = {}

            def mark(k, t, x, marks=marks):
                if k >= 1:
                    marks.setdefault("first", (time.perf_counter(), os.times(), k))
                    marks["last"] = (time.perf_counter(), os.times(), k)

            start = time.perf_counter()
            traj = solve(
                field,
                jnp.asarray(x0),
                integrator=integrators.RK4(),
                dt=DT,
                t_end=t_end,
                save_every=0.1,
                on_snapshot=mark,
            )
            wall = time.perf_counter() - start
            (w1, c1, k1), (w2, c2, k2) = marks["first"], marks["last"]
            if k2 > k1:
                scale = k2 / (k2 - k1)
                run_wall, run_cpu = (w2 - w1) * scale, (c2.user + c2.system - c1.user - c1.system) * scale
                if record is batch:
                    run_cpu = float("nan")  # spent in the worker processes
            else:  # one compiled call for the whole run: wall time less compilation, no CPU time
                run_wall, run_cpu = wall - traj.compile_time_s, float("nan")
            ref_wall, ref_cpu = timed(
                lambda x0=x0: [numpy_run(x, steps=steps, save_every_steps=10) for x in x0.reshape(-1, n, 3)]
            )
            for key, value in (
                ("attnflow_s", run_wall),
                ("attnflow_cpu_s", run_cpu),
                ("attnflow_total_s", wall),
                ("compile_s", traj.compile_time_s),
                ("numpy_s", ref_wall),
                ("numpy_cpu_s", ref_cpu),
            ):
                record[key] = min(record.get(key, float("inf")), value)
            record.setdefault("first_compile_s", traj.compile_time_s)
            if record is single and "max_diff" not in single:
                reference = numpy_run(x0s[0], steps=steps, save_every_steps=10)[-1]
                single["max_diff"] = float(np.abs(traj.xs[-1] - reference).max())
    return {"n": n, "t_end": t_end, "seeds": seeds, "single": single, "batch": batch}


# ----------------------------------------------------------------------------- block size tuning


def measure_blocks(ns: list[int], blocks: list, reps: int, dtype: str = "float64") -> list[dict]:
    """One field evaluation per (n, block): dense (``None``) or blocked (float64 tiles, float32 rows)."""
    jax = _jax()
    import jax.numpy as jnp

    rows = []
    for n in ns:
        x = jnp.asarray(initial(n, 3, dtype))
        for block in blocks:
            if block is not None and block >= n:
                continue
            if block is None and n > 4096:
                continue
            _, field, _ = usa_field(n, 3, dtype, block_size=block)
            f = jax.jit(field)
            f(x).block_until_ready()
            t = time_call(lambda f=f, x=x: f(x).block_until_ready(), reps)
            rows.append({"n": n, "dtype": dtype, "block": block, "eval_s": t})
            print(f"  {dtype} n={n:6d} block={block!s:>5}: {t * 1e3:9.2f} ms per evaluation", flush=True)
    return rows


# ----------------------------------------------------------------------------- float32 accuracy


def measure_float32(ns: list[int], seeds: int) -> list[dict]:
    _jax()
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
            x0 = np.stack([initial(n, 3, "float64", seed=s) for s in range(seeds)])
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
                xs[dtype] = traj.xs.astype(np.float64)
            x64, x32 = xs[jnp.float64], xs[jnp.float32]
            k64 = kernel(setting, n, jnp.float64)
            q = np.asarray(k64.gauge.matrices())
            mc = [
                abs(metrics.mean_cosine(x64[-1, s]) - metrics.mean_cosine(x32[-1, s])) for s in range(seeds)
            ]
            gmc = [
                abs(
                    metrics.mean_cosine(np.einsum("nij,nj->ni", q, x64[-1, s]))
                    - metrics.mean_cosine(np.einsum("nij,nj->ni", q, x32[-1, s]))
                )
                for s in range(seeds)
            ]
            e = [
                abs(
                    float(summation.energy(k64, jnp.asarray(a[-1, s])))
                    - float(summation.energy(k64, jnp.asarray(b[-1, s])))
                )
                / float(summation.energy(k64, jnp.asarray(a[-1, s])))
                for s in range(seeds)
                for a, b in [(x64, x32)]
            ]
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
    jax = _jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, random_batch
    from attnflow.numerics.solve import solve

    kernel, field, _ = usa_field(n, 3, "float64")
    x0 = jnp.asarray(initial(n, 3, "float64"))
    opts = dict(integrator=integrators.Euler(), dt=DT, t_end=t_end, save_every=t_end)
    steps = int(round(t_end / DT))
    start = time.perf_counter()
    exact = solve(field, x0, **opts)
    exact_s = (time.perf_counter() - start - exact.compile_time_s) / steps
    rows = []
    for p in ps:
        start = time.perf_counter()
        approx = random_batch.solve_random_batch(kernel, x0, p=p, key=jax.random.key(p), **opts)
        wall = time.perf_counter() - start
        start = time.perf_counter()
        random_batch.solve_random_batch(kernel, x0, p=p, key=jax.random.key(p), **opts)
        warm = time.perf_counter() - start  # recompiles too: report the better of the two
        err = approx.xs[-1] - exact.xs[-1]
        rows.append(
            {
                "p": p,
                "rms_error": float(np.sqrt(np.mean(np.sum(err**2, axis=1)))),
                "max_error": float(np.abs(err).max()),
                "run_s": min(wall, warm),
            }
        )
        print(f"  random batch n={n} p={p}: RMS error {rows[-1]['rms_error']:.2e}", flush=True)
    return {"n": n, "t_end": t_end, "exact_step_s": exact_s, "rows": rows}


# ----------------------------------------------------------------------------- subprocess children


def child_main(args: list[str]) -> None:
    """Entry point of the measuring subprocesses (``--child KIND JSON``)."""
    kind, params = args[0], json.loads(args[1])
    if kind == "steps":
        result = measure_steps(**params)
    elif kind == "memory":
        result = child_memory(**params)
    elif kind == "thread":
        result = child_thread(**params)
    elif kind == "random_batch_large":
        result = child_random_batch_large(**params)
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    result["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


def child_memory(n: int, engine: str, steps: int) -> dict:
    """A short Euler run through ``solve`` (attnflow) or the NumPy loop, for peak memory and step time."""
    x0 = initial(n, 3, "float64")
    if engine == "numpy":
        start = time.perf_counter()
        x = x0
        for _ in range(steps):
            x = numpy_step(numpy_field, x, "euler")
        return {"n": n, "engine": engine, "step_s": (time.perf_counter() - start) / steps}
    _jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, summation
    from attnflow.numerics.solve import solve

    kernel, field, block = usa_field(n, 3, "float64")
    start = time.perf_counter()
    traj = solve(
        field, jnp.asarray(x0), integrator=integrators.Euler(), dt=DT, t_end=steps * DT, save_every=DT
    )
    wall = time.perf_counter() - start
    energy = __import__("jax").jit(lambda x: summation.energy(kernel, x, block_size=block))
    energy(jnp.asarray(x0)).block_until_ready()
    energy_s = time_call(lambda: energy(jnp.asarray(x0)).block_until_ready(), 1)
    return {
        "n": n,
        "engine": engine,
        "block_size": block,
        "step_s": (wall - traj.compile_time_s) / steps,
        "compile_s": traj.compile_time_s,
        "energy_s": energy_s,
        "status": traj.status,
    }


def child_thread(n: int, out: str) -> dict:
    _jax()
    import jax
    import jax.numpy as jnp

    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics, integrators
    from attnflow.numerics.solve import solve
    from attnflow.workflows.build import auto_block_size

    g = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    kernel = Kernel(g, factors.NoFactor(n), make_profile("exp", beta=1.0))
    field = dynamics.make_vector_field(kernel, block_size=auto_block_size(n))
    x0 = jnp.asarray(initial(n, 3, "float64"))
    traj = solve(field, x0, integrator=integrators.RK4(), dt=DT, t_end=0.5, save_every=0.1)
    np.save(out, traj.xs)
    return {"n": n, "devices_seen": jax.local_device_count()}


def child_random_batch_large(n: int, p: int) -> dict:
    jax = _jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, random_batch

    kernel, _, _ = usa_field(n, 3, "float64")
    x0 = jnp.asarray(initial(n, 3, "float64"))
    opts = dict(integrator=integrators.Euler(), dt=DT, save_every=DT)
    random_batch.solve_random_batch(kernel, x0, p=p, key=jax.random.key(0), t_end=DT, **opts)  # warm-up
    start = time.perf_counter()
    steps = 5
    traj = random_batch.solve_random_batch(kernel, x0, p=p, key=jax.random.key(1), t_end=steps * DT, **opts)
    return {"n": n, "p": p, "run_s": time.perf_counter() - start, "steps": steps, "status": traj.status}


def run_child(
    kind: str, params: dict, *, env_extra: dict | None = None, prefix: list[str] | None = None
) -> dict:
    env = {**os.environ, **(env_extra or {})}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(params)]
    time_tool = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if time_tool:
        cmd = [time_tool, "-v", *cmd]
    cmd = (prefix or []) + cmd
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {kind} {params} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    result["max_rss_mb"] = int(match.group(1)) / 1024 if match else result["ru_maxrss_mb"]
    return result


# ----------------------------------------------------------------------------- report


def machine_description() -> dict:
    model = platform.processor() or ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    jax = _jax()
    import jaxlib

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "uname": " ".join(platform.uname()),
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "jax": f"{jax.__version__} (jaxlib {jaxlib.__version__})",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "devices": len(__import__("attnflow.numerics.lanes", fromlist=["lane_devices"]).lane_devices()),
        "blas": _blas_name(),
    }


def _blas_name() -> str:
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def fmt_t(seconds) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def fmt_r(ratio) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a fast subset (prints; writes only with --out)")
    parser.add_argument("--out", type=Path, default=None, help="Markdown report (default: RESULTS.md here)")
    parser.add_argument("--render", type=Path, default=None, help="redraw the report from a RESULTS.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    if args.render is not None:
        results = json.loads(args.render.read_text())
        results["threads"] = {int(k): v for k, v in results["threads"].items()}
        report = render(results)
        target = args.out if args.out is not None else args.render.with_suffix(".md")
        target.write_text(report)
        print(report + f"\nwritten {target}")
        return
    out = args.out if args.out is not None else (None if args.quick else HERE / "RESULTS.md")
    quick = args.quick
    started, load_start = time.perf_counter(), os.getloadavg()
    info = machine_description()
    print(f"attnflow benchmark ({'quick' if quick else 'full'}) — {info['date']}\n{info['uname']}")
    print(f"CPU: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB; load {load_start}")

    print("\n[1] machine rates (all cores)")
    rates = {dt: machine_rates(dt) for dt in ("float64", "float32")}
    if not quick:  # measured again at the end; the best of the two is the roofline
        rates_first = rates
    for dt, r in rates.items():
        print(f"  {dt}: exp {r['exp'] / 1e9:.2f} G/s, matmul {r['matmul'] / 1e9:.1f} GFLOP/s", flush=True)

    print("\n[2] per step")
    ns = [256, 1024, 4096] if quick else [256, 1024, 4096, 16384, 65536]
    step_rows = []
    for d in [3] if quick else [3, 64]:
        for dtype in ["float64"] if quick else ["float64", "float32"]:
            for n in ns:
                big = n >= 16384
                params = dict(
                    n=n,
                    d=d,
                    dtype=dtype,
                    with_rates=n < 65536,
                    reps=1 if big else 3,
                    with_numpy=n < 65536,
                    target_s=0.0 if big else (0.2 if quick else 0.5),
                    methods=("euler",) if (n >= 65536 and d > 3) else ("euler", "rk4"),
                )
                row = run_child("steps", params)
                step_rows.append(row)
                e, r4 = row["euler"], row["rk4"] or {}
                print(
                    f"  n={n:6d} d={d:2d} {dtype}: euler {fmt_t(e['attnflow_s'])} "
                    f"(NumPy {fmt_t(e['numpy_s'])}); rk4 {fmt_t(r4.get('attnflow_s'))} "
                    f"(NumPy {fmt_t(r4.get('numpy_s'))}); RSS {row['max_rss_mb']:.0f} MB",
                    flush=True,
                )

    print("\n[3] whole runs, n = 256, d = 3, RK4, dt = 0.01")
    whole = measure_whole_runs(256, 2.0 if quick else 20.0, 10, 1 if quick else 2)
    for name in ("single", "batch"):
        r = whole[name]
        print(
            f"  {name}: attnflow {fmt_t(r['attnflow_s'])} (+ compile {fmt_t(r['compile_s'])}), "
            f"NumPy {fmt_t(r['numpy_s'])} -> {r['numpy_s'] / r['attnflow_s']:.2f}×",
            flush=True,
        )

    print("\n[4] memory and large n (subprocess, Euler through solve)")
    mem_rows = []
    for n in [4096, 16384] if quick else [4096, 16384, 65536, 100_000]:
        mem_rows.append(run_child("memory", dict(n=n, engine="attnflow", steps=2 if n >= 65536 else 5)))
    for n in [4096] if quick else [4096, 16384]:
        mem_rows.append(run_child("memory", dict(n=n, engine="numpy", steps=2)))
    for row in mem_rows:
        print(
            f"  {row['engine']:8s} n={row['n']:6d}: peak RSS {row['max_rss_mb']:.0f} MB, "
            f"step {fmt_t(row['step_s'])}",
            flush=True,
        )
    base = run_child("memory", dict(n=64, engine="attnflow", steps=2))

    print("\n[5] block size (one evaluation, d = 3)")
    if quick:
        block_rows = measure_blocks([4096], [None, 128, 256], 3)
    else:
        block_rows = measure_blocks([512, 1024, 4096, 16384], [None, 64, 128, 256, 512], 5)
        block_rows += measure_blocks([1024, 2048, 4096, 16384], [None, 128, 256, 512], 5, "float32")

    print("\n[6] thread and device settings (bitwise comparison of the same RK4 run)")
    thread_results = measure_threads()

    print("\n[7] float32 vs float64 (RK4 dt = 0.01, to t = 20)")
    f32_rows = measure_float32([64] if quick else [64, 128, 256], 3 if quick else 10)

    print("\n[8] random-batch approximation (Euler, dt = 0.01) — an approximation, not the model")
    rb = measure_random_batch(1024 if quick else 4096, [16, 64, 256], 1.0)
    rb["large"] = None if quick else run_child("random_batch_large", dict(n=100_000, p=64))

    if not quick:
        print("\n[9] machine rates again")
        again = {dt: machine_rates(dt) for dt in ("float64", "float32")}
        rates = {dt: {k: max(v, again[dt][k]) for k, v in rates_first[dt].items()} for dt in rates_first}
    results = dict(
        info=info,
        rates=rates,
        steps=step_rows,
        whole=whole,
        memory=mem_rows,
        baseline=base,
        blocks=block_rows,
        threads=thread_results,
        float32=f32_rows,
        random_batch=rb,
        quick=quick,
        elapsed=time.perf_counter() - started,
        loads=(load_start, os.getloadavg()),
    )
    if out is not None:  # the raw data first: the report can be redrawn from it (--render)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    report = render(results)
    print("\n" + report)
    if out is not None:
        out.write_text(report)
        print(f"written {out} and {out.with_suffix('.json')}")


def measure_threads() -> dict:
    """The same RK4 run under several thread and CPU-device settings, against one device."""
    results = {}
    one = {"ATTNFLOW_BENCH_DEVICES": "1"}
    cores = os.cpu_count() or 1
    variants = {
        "default (one device)": (one, None),
        "Eigen single-threaded": ({**one, "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, None),
        "2 CPU devices": ({"ATTNFLOW_BENCH_DEVICES": "2"}, None),
        "8 CPU devices": ({"ATTNFLOW_BENCH_DEVICES": "8"}, None),
    }
    if cores not in (1, 2, 8):
        variants[f"{cores} CPU devices"] = ({"ATTNFLOW_BENCH_DEVICES": str(cores)}, None)
    if shutil.which("taskset"):
        variants["one core (taskset -c 0)"] = (one, ["taskset", "-c", "0"])
    with tempfile.TemporaryDirectory() as tmp:
        for n in (256, 2048):
            arrays = {}
            for name, (env, prefix) in variants.items():
                path = str(Path(tmp) / f"{n}_{len(arrays)}.npy")
                run_child("thread", dict(n=n, out=path), env_extra=env, prefix=prefix)
                arrays[name] = np.load(path)
            reference = arrays["default (one device)"]
            results[n] = {name: float(np.abs(a - reference).max()) for name, a in arrays.items()}
            print(f"  n={n}: max |difference| vs one device: {results[n]}", flush=True)
    return results


def _ratio(a, b):
    """``a / b``, or None where either is missing (None, not finite) or ``b`` is 0."""
    if a is None or b is None or not (np.isfinite(a) and np.isfinite(b)) or b == 0:
        return None
    return a / b


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def render(res: dict) -> str:
    info, rates = res["info"], res["rates"]
    loads = [tuple(round(v, 2) for v in load) for load in res["loads"]]
    quick = " --quick" if res["quick"] else ""
    lines = [
        "# attnflow benchmark results",
        "",
        f"Produced by `python benchmarks/run.py{quick}` on {info['date']} ({res['elapsed'] / 60:.1f} min);",
        "every number below comes from that run (raw data: `RESULTS.json`).",
        "",
        f"- `uname -a`: `{info['uname']}`",
        f"- CPU: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB RAM",
        f"- Python {info['python']}, NumPy {info['numpy']} ({info['blas']}), JAX {info['jax']}",
        f"- `XLA_FLAGS`: `{info['xla_flags'] or '(unset)'}`; attnflow runs on {info.get('devices', 1)} CPU "
        "device(s) (`attnflow.use_cpu_cores()`, as the CLI does: the tile lanes of `numerics.lanes`)",
        f"- load average (1, 5, 15 min): {loads[0]} at the start, {loads[1]} at the end. The machine is",
        "  shared; wall times are the minimum over repetitions with NumPy and attnflow interleaved, and the",
        "  process CPU time (all threads) is given next to them as a contention-robust cross-check.",
        "",
        "## Machine rates (all cores)",
        "",
    ]
    lines += _table(
        ["dtype", "exp NumPy", "exp XLA", "matmul NumPy", "matmul XLA"],
        [
            [
                dt,
                f"{r['exp_numpy'] / 1e9:.2f} G/s",
                f"{r['exp_xla'] / 1e9:.2f} G/s",
                f"{r['matmul_numpy'] / 1e9:.1f} GFLOP/s",
                f"{r['matmul_xla'] / 1e9:.1f} GFLOP/s",
            ]
            for dt, r in rates.items()
        ],
    )
    lines += [
        "",
        "Roofline of one field evaluation at the best of these rates: `n²/exp + 4 n² d/matmul` (n²",
        "exponentials and 2 n² d multiply-adds); a step costs 1 (Euler) or 4 (RK4) evaluations.",
        "",
        "## Per step",
        "",
        "attnflow: the compiled loop (`numerics.solve.integrate`: steady state, compilation excluded),",
        "automatic block size. NumPy: the published-code form (explicit `exp(β X Xᵀ)` per evaluation, a",
        "Python loop over steps); in-place: the same with one n × n buffer. ×NumPy = NumPy time / attnflow",
        "time (wall; CPU-time ratio in brackets); roofline = attnflow time / roofline time, the roofline at",
        "the rates measured in the same subprocess between the repetitions (best of them; the machine is",
        "shared and its speed drifts over minutes), or, for n = 65 536, at the rates of the table above.",
        "",
    ]
    rows = []
    for row in res["steps"]:
        e = row["euler"]
        r4 = row["rk4"] or {"attnflow_s": None, "numpy_s": None, "attnflow_cpu_s": None, "numpy_cpu_s": None}
        roof = roofline_eval_s(row["n"], row["d"], row.get("rates") or rates[row["dtype"]])
        reason = row.get("numpy_skipped") or "too slow"

        def speed(m):
            wall, cpu = _ratio(m["numpy_s"], m["attnflow_s"]), _ratio(m["numpy_cpu_s"], m["attnflow_cpu_s"])
            if wall is None:
                return "—"
            return f"{wall:.1f}×" + ("" if cpu is None else f" ({cpu:.1f}×)")

        rows.append(
            [
                row["n"],
                row["d"],
                row["dtype"],
                row["block_size"] or "dense",
                fmt_t(e["attnflow_s"]),
                fmt_t(e["numpy_s"]) if e["numpy_s"] is not None else f"skipped: {reason}",
                fmt_t(e["numpy_inplace_s"]),
                speed(e),
                fmt_r(e["attnflow_s"] / roof),
                fmt_t(r4["attnflow_s"]) if r4["attnflow_s"] else "not run",
                fmt_t(r4["numpy_s"]),
                speed(r4),
                fmt_r(_ratio(r4["attnflow_s"], 4 * roof)),
                f"{row['max_rss_mb']:.0f} MB",
            ]
        )
    header = ["n", "d", "dtype", "block", "Euler", "NumPy", "in-place", "×NumPy", "roofline"]
    lines += _table(header + ["RK4", "NumPy RK4", "×NumPy", "roofline", "process peak RSS*"], rows)
    lines += [
        "",
        "\\* of the measuring subprocess, NumPy reference included (its n × n arrays dominate from",
        "n = 4096); attnflow alone: see the memory table below.",
    ]
    whole = res["whole"]
    s, b = whole["single"], whole["batch"]
    lines += [
        "",
        f"## Whole runs: n = {whole['n']}, d = 3, RK4, dt = 0.01, τ = {whole['t_end']:g}, "
        "snapshots every 0.1",
        "",
    ]
    lines += _table(
        ["", "attnflow run", "start-up (once)", "NumPy loop", "×NumPy wall", "×NumPy CPU"],
        [
            [
                label,
                fmt_t(r["attnflow_s"]),
                fmt_t(r["compile_s"]),
                fmt_t(r["numpy_s"]),
                fmt_r(r["numpy_s"] / r["attnflow_s"]),
                fmt_r(_ratio(r["numpy_cpu_s"], r["attnflow_cpu_s"])),
            ]
            for label, r in (
                ("one seed", s),
                (f"{whole['seeds']} seeds (one batched solve in workers vs sequential NumPy runs)", b),
            )
        ],
    )
    lines += [
        "",
        "Start-up: compilation; for the batch, exporting the program to the worker processes (one per",
        "core, `numerics.workers`) and compiling it there. The workers start once per Python session,",
        f"with the first batch: its start-up was {fmt_t(b.get('first_compile_s'))}. The batch's CPU",
        "time is spent in the workers, not counted here.",
        "",
        f"Final states of attnflow and the NumPy loop agree to {s['max_diff']:.1e}.",
        "",
        "## Memory and large n (a fresh subprocess per row; peak RSS from `/usr/bin/time -v`)",
        "",
    ]
    lines += _table(
        ["engine", "n", "block", "peak RSS", "Euler step", "one energy evaluation"],
        [
            [
                r["engine"],
                r["n"],
                r.get("block_size") or ("dense" if r["engine"] == "attnflow" else "n × n"),
                f"{r['max_rss_mb']:.0f} MB",
                fmt_t(r["step_s"]),
                fmt_t(r.get("energy_s")),
            ]
            for r in res["memory"]
        ],
    )
    lines += [
        "",
        f"Baseline: a tiny attnflow run (n = 64) peaks at {res['baseline']['max_rss_mb']:.0f} MB (JAX/XLA).",
        "One energy evaluation costs about one field evaluation; `run.energy_series` evaluates it once per",
        "snapshot, 1/40 of the RK4 work at the defaults (save_every = 0.1, dt = 0.01): not dominant.",
        "",
        "## Block size (one field evaluation, d = 3)",
        "",
        "float64 blocks are symmetric tiles (block × block), float32 blocks are row blocks (block rows).",
        "",
    ]
    lines += _table(
        ["dtype", "n", "block", "time"],
        [
            [r.get("dtype", "float64"), r["n"], r["block"] or "dense", fmt_t(r["eval_s"])]
            for r in res["blocks"]
        ],
    )
    lines += ["", "## Thread and device settings (same RK4 run, τ = 0.5, RoPE, automatic block size)", ""]
    for n, diffs in res["threads"].items():
        parts = ", ".join(f"{k}: {v:.1e}" for k, v in diffs.items())
        lines.append(f"- n = {n}: max |difference| vs one CPU device — {parts}")
    lines += ["", "## float32 vs float64 (RK4, dt = 0.01; max over tokens and seeds)", ""]
    lines += _table(
        [
            "setting",
            "n",
            "seeds",
            "state t = 5",
            "state t = 20",
            "mean cos t = 20",
            "gauge mean cos",
            "energy",
        ],
        [
            [
                r["setting"],
                r["n"],
                r["seeds"],
                f"{r['state_t5']:.1e}",
                f"{r['state_t20']:.1e}",
                f"{r['mean_cosine_t20']:.1e}",
                f"{r['gauge_mean_cosine_t20']:.1e}",
                f"{r['energy_rel_t20']:.1e} rel.",
            ]
            for r in res["float32"]
        ],
    )
    rb = res["random_batch"]
    lines += [
        "",
        f"## Random-batch approximation (n = {rb['n']}, Euler, dt = 0.01, to t = {rb['t_end']:g})",
        "",
        f"An approximation, not the model. Exact dynamics: {fmt_t(rb['exact_step_s'])} per step. Error",
        "against the exact trajectory from the same initial data (RMS over tokens of |x_RB − x|).",
        "",
    ]
    lines += _table(
        ["p", "RMS error", "max error", "whole run incl. compilation"],
        [[r["p"], f"{r['rms_error']:.2e}", f"{r['max_error']:.2e}", fmt_t(r["run_s"])] for r in rb["rows"]],
    )
    if rb.get("large"):
        big = rb["large"]
        lines += [
            "",
            f"n = 100 000, p = 64: {fmt_t(big['run_s'] / big['steps'])} per Euler step "
            f"(incl. compilation), peak RSS {big['max_rss_mb']:.0f} MB.",
        ]
    lines += ["", "## Targets (issue 5)", ""] + targets(res)
    return "\n".join(lines) + "\n"


def targets(res: dict) -> list[str]:
    out, rates = [], res["rates"]

    def verdict(ok):
        return "met" if ok else "**missed**"

    for row in res["steps"]:
        if (row["n"], row["d"], row["dtype"]) != (4096, 3, "float64"):
            continue
        for method in ("euler", "rk4"):
            m = row[method]
            speed = _ratio(m["numpy_s"], m["attnflow_s"])
            row_rates = row.get("rates") or rates["float64"]
            roof = m["attnflow_s"] / (m["evals"] * roofline_eval_s(4096, 3, row_rates))
            out.append(
                f"- n = 4096, d = 3, float64, {method}: {fmt_r(speed)} faster than NumPy "
                f"(≥ 3×: {verdict(speed is not None and speed >= 3)}); {roof:.2f}× the roofline "
                f"(≤ 2×: {verdict(roof <= 2)})"
            )
    whole = res["whole"]
    s, b = whole["single"], whole["batch"]
    one, many = s["numpy_s"] / s["attnflow_s"], b["numpy_s"] / b["attnflow_s"]
    out.append(
        f"- n = 256, RK4, τ = {whole['t_end']:g}: one run {one:.2f}× faster than the NumPy loop, compilation "
        f"({fmt_t(s['compile_s'])}) excluded (≥ 2×: {verdict(one >= 2)})"
    )
    out.append(
        f"- {whole['seeds']} seeds batched: {many:.2f}× faster than {whole['seeds']} sequential NumPy runs "
        f"(≥ 3×: {verdict(many >= 3)})"
    )
    for row in res["memory"]:
        if row["engine"] == "attnflow" and row["n"] >= 65536:
            goal = f"< 2 GB: {verdict(row['max_rss_mb'] < 2048)}" if row["n"] == 65536 else "usable"
            out.append(
                f"- n = {row['n']}, d = 3: peak RSS {row['max_rss_mb']:.0f} MB ({goal}), "
                f"{fmt_t(row['step_s'])} per Euler step"
            )
    return out


if __name__ == "__main__":
    main()
