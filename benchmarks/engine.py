"""The attnflow side of the benchmark: the field, its evaluation path, the machine rates XLA reaches,
and the measurements (each a function returning plain data, run in this process or in a child).

Only public entry points of attnflow are used: ``numerics.solve.solve`` and ``integrate``, the
kernel and field factories, ``workflows.build.auto_block_size`` (the automatic block size),
``numerics.summation`` (which path a size takes) and ``numerics.lanes.use_cpu_cores``.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import references
import work

BETA = references.BETA
DT = references.DT
RATE_TILE = 128  # the exp rate is measured on tiles of the engine's float64 tile edge
RATE_MATRIX = 1024  # the matmul rate on products of this size (per lane device) and twice it (one device)


# ----------------------------------------------------------------------------- set-up and clocks


def replace_section(path, begin: str, end: str, block: str) -> None:
    """Put ``block`` (a section from its ``begin`` marker to its ``end`` marker) where that section
    of the results file ``path`` is, or append it the first time; the other sections stay."""
    text = path.read_text()
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def setup_jax():
    """JAX with float64 and, as the CLI does, every available core as a CPU device
    (``use_cpu_cores``; ``ATTNFLOW_BENCH_DEVICES`` forces the count): before any computation."""
    import jax

    from attnflow.numerics.lanes import use_cpu_cores

    forced = os.environ.get("ATTNFLOW_BENCH_DEVICES")
    use_cpu_cores(int(forced) if forced else None)
    jax.config.update("jax_enable_x64", True)
    return jax


def cpu_s() -> float:
    """CPU seconds (user + system) of this process, all threads, and of its waited-for children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def timed(fn) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one call of ``fn``."""
    c0, start = cpu_s(), time.perf_counter()
    fn()
    return time.perf_counter() - start, cpu_s() - c0


def live_children_cpu_s() -> float:
    """CPU seconds of this process's live children (Linux ``/proc``; 0 elsewhere): a cross-check for
    worker processes that are not waited for, whose time ``RUSAGE_CHILDREN`` would miss."""
    ticks, me, total = os.sysconf("SC_CLK_TCK"), os.getpid(), 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # fields after the name: state, ppid, ..., utime (11), stime (12)
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


class Best:
    """Minimum wall and minimum CPU time over repetitions, per step."""

    def __init__(self):
        self.wall, self.cpu = float("inf"), float("inf")

    def add(self, fn, per: int = 1) -> None:
        wall, cpu = timed(fn)
        self.wall, self.cpu = min(self.wall, wall / per), min(self.cpu, cpu / per)


# ----------------------------------------------------------------------------- the field and its path


def _jdtype(dtype: str):
    import jax.numpy as jnp

    return jnp.float32 if dtype == "float32" else jnp.float64


def usa_field(n: int, d: int, dtype: str, block_size="auto"):
    """The baseline USA field (Q = I, w = 1, β = 1) with the automatic block size (or ``block_size``)."""
    setup_jax()
    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics
    from attnflow.workflows.build import auto_block_size

    jdtype = _jdtype(dtype)
    kernel = Kernel(
        gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n), make_profile("exp", beta=BETA, dtype=jdtype)
    )
    block = auto_block_size(n, jdtype) if block_size == "auto" else block_size
    return kernel, dynamics.make_vector_field(kernel, block_size=block), block


def engine_path(n: int, dtype: str, block: int | None) -> tuple[str, int | None]:
    """The evaluation path ``attention_sum`` takes for ``n`` tokens with ``block``: ("dense", None),
    ("unrolled tiles", tile), ("tiles", block) or ("rows", block) (see ``work``)."""
    from attnflow.numerics.summation import dense_tile, symmetric_tiles

    jdtype = _jdtype(dtype)
    if block is None or block >= n:
        tile = dense_tile(n, jdtype)
        return ("dense", None) if tile is None else ("unrolled tiles", tile)
    return ("tiles" if symmetric_tiles(jdtype) else "rows", block)


def evaluation_work(n: int, d: int, dtype: str, block: int | None) -> dict:
    """The path and the work of one field evaluation (``work.evaluation_work``) as plain data."""
    from attnflow.numerics.summation import VALUE_COLUMNS

    path, tile = engine_path(n, dtype, block)
    dv = work.padded_columns(d, VALUE_COLUMNS)  # gradient values u (n, d), padded
    w = work.evaluation_work(n, d, path=path, block=tile, dv=dv)
    return {
        "path": path,
        "tile": tile,
        "value_columns": dv,
        "exps": w.exps,
        "flops": w.flops,
        "items": w.items,
    }


# ----------------------------------------------------------------------------- machine rates (XLA)


def lane_device_count() -> int:
    """The CPU devices the tile lanes run on: as many as divide the 8 lanes (see ``numerics.lanes``)."""
    jax = setup_jax()
    return max(c for c in (1, 2, 4, 8) if c <= len(jax.devices()))


def best_time(fn, reps: int) -> float:
    fn()  # warm-up (compilation)
    return min(timed(fn)[0] for _ in range(reps))


def engine_rates(dtype: str, *, reps: int = 5) -> dict:
    """The exp and matrix-product rates XLA reaches on this machine in ``dtype``, configured as the
    engine is (one CPU device per core, float64 enabled):

    - exp: the elementwise pass of a tile, ``exp(β(s − 1))`` summed, on ``RATE_TILE²`` tiles, one
      stream per lane device at once (``shard_map``; each a ``fori_loop``), one such stream alone
      times the number of lane devices (what perfect lanes would reach; robust to other load on
      the machine), and on one large array on one device (XLA's own threads); the best of the
      three, in exponentials per second;
    - matmul: one ``RATE_MATRIX²`` product per lane device at once, and one ``(2·RATE_MATRIX)²``
      product on one device; the better, in flop/s (``2 m³`` per product).
    """
    jax = setup_jax()
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()[: lane_device_count()]
    count = len(devices)
    mesh = Mesh(np.array(devices), ("lane",))
    rng = np.random.default_rng(0)
    jdtype = _jdtype(dtype)
    tiny = jnp.asarray(1e-30, jdtype)  # keeps the loop body dependent on the carry (no hoisting)

    def exp_loop(s, loops):
        def body(_, acc):
            return acc + jnp.sum(jnp.exp(BETA * (s + acc * tiny - 1.0)))

        return jax.lax.fori_loop(0, loops, body, jnp.zeros((), s.dtype))

    def on_lanes(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("lane"), out_specs=P("lane"), check_vma=False))

    tile_loops = 2000
    tiles = jnp.asarray(rng.uniform(-1, 1, (count, RATE_TILE, RATE_TILE)), jdtype)
    lanes_exp = on_lanes(lambda s: exp_loop(s[0], tile_loops)[None])
    t_lanes = best_time(lambda: lanes_exp(tiles).block_until_ready(), reps)
    stream = jax.jit(lambda s: exp_loop(s, tile_loops))
    t_stream = best_time(lambda: stream(tiles[0]).block_until_ready(), reps)
    big = jnp.asarray(rng.uniform(-1, 1, (1024, 1024)), jdtype)
    big_loops = 30
    one_exp = jax.jit(lambda s: exp_loop(s, big_loops))
    t_one = best_time(lambda: one_exp(big).block_until_ready(), reps)
    exp_lanes = count * tile_loops * RATE_TILE**2 / t_lanes
    exp_one = big_loops * big.size / t_one
    exp_stream = count * tile_loops * RATE_TILE**2 / t_stream  # one stream alone, times the lane devices

    m = RATE_MATRIX
    mats = jnp.asarray(rng.standard_normal((count, m, m)), jdtype)
    lanes_mm = on_lanes(lambda a: a @ a)
    t_mm_lanes = best_time(lambda: lanes_mm(mats).block_until_ready(), reps)
    one = jnp.asarray(rng.standard_normal((2 * m, 2 * m)), jdtype)
    one_mm = jax.jit(lambda a: a @ a)
    t_mm_one = best_time(lambda: one_mm(one).block_until_ready(), reps)
    mm_lanes = count * 2.0 * m**3 / t_mm_lanes
    mm_one = 2.0 * (2 * m) ** 3 / t_mm_one
    return {
        "devices": count,
        "exp_lanes": exp_lanes,
        "exp_one_device": exp_one,
        "exp_stream_scaled": exp_stream,
        "exp": max(exp_lanes, exp_one, exp_stream),
        "matmul_lanes": mm_lanes,
        "matmul_one_device": mm_one,
        "matmul": max(mm_lanes, mm_one),
    }


def best_rates(*measured: dict) -> dict:
    """The best of several rate measurements, entry by entry (the fastest the machine was seen to be)."""
    return {k: max(m[k] for m in measured) for k in measured[0]}


# ----------------------------------------------------------------------------- per step


def compiled_steps(field, integrator, xj, steps: int):
    jax = setup_jax()
    from attnflow.numerics.solve import integrate

    start = time.perf_counter()
    fn = jax.jit(lambda x: integrate(field, x, integrator=integrator, dt=DT, steps=steps)).lower(xj).compile()
    return fn, time.perf_counter() - start


def measure_steps(
    n: int,
    d: int,
    dtype: str,
    *,
    reps: int,
    target_s: float,
    methods: list[str],
    naive: list[str],
    blocked: list[str],
) -> dict:
    """Per-step times of attnflow (``integrate`` compiled for a fixed number of steps, steady state),
    of the naive dense NumPy step (for the methods in ``naive``) and of the blocked NumPy step (in
    ``blocked``), interleaved repetitions, the best of each. ``target_s``: each timed call runs
    about that long (several steps); 0: one step per call and no warm-up call (the largest sizes)."""
    setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators

    _, field, block = usa_field(n, d, dtype)
    path = evaluation_work(n, d, dtype, block)
    x0 = references.initial(n, d, dtype)
    xj = jnp.asarray(x0)
    out = {"n": n, "d": d, "dtype": dtype, "block_size": block, "work": path}
    table = {"euler": integrators.Euler(), "rk4": integrators.RK4()}

    def naive_fn(x):
        return references.naive_field(x)

    def blocked_fn(x):
        return references.blocked_field(x, path=path["path"], block=path["tile"])

    for method in methods:
        run, compile_s = compiled_steps(field, table[method], xj, 1)
        steps = 1
        if target_s > 0:
            one = min(timed(lambda run=run: run(xj).block_until_ready())[0] for _ in range(2))
            steps = max(1, int(target_s / max(one, 1e-6)))
            if steps > 1:
                run, compile_s = compiled_steps(field, table[method], xj, steps)
                run(xj).block_until_ready()
        refs = {
            name: fn
            for name, fn, wanted in (("naive", naive_fn, naive), ("blocked", blocked_fn, blocked))
            if method in wanted
        }
        ref_steps = {}
        for name, fn in refs.items():
            if target_s > 0:
                one = timed(lambda fn=fn, method=method: references.step(fn, x0, method))[0]
                ref_steps[name] = max(1, int(target_s / max(one, 1e-6)))
            else:
                ref_steps[name] = 1
        best = {name: Best() for name in ("attnflow", *refs)}

        def loop(fn, count, method=method):
            x = x0
            for _ in range(count):
                x = references.step(fn, x, method)

        for _ in range(reps):
            best["attnflow"].add(lambda run=run: run(xj).block_until_ready(), steps)
            for name, fn in refs.items():
                best[name].add(lambda fn=fn, c=ref_steps[name]: loop(fn, c), ref_steps[name])
        out[method] = {
            "evaluations": len(table[method].tableau.b),
            "compile_s": compile_s,
            **{f"{name}_s": b.wall for name, b in best.items()},
            **{f"{name}_cpu_s": b.cpu for name, b in best.items()},
        }
    return out


# ----------------------------------------------------------------------------- whole runs


def _startup_s(traj):
    """The one-time start-up ``solve`` reports (compilation; worker start-up for a batch), if any."""
    value = getattr(traj, "compile_time_s", None)
    return None if value is None else float(value)


def measure_single_run(n: int, t_end: float, reps: int) -> dict:
    """One seed, RK4, snapshots every 0.1: the ``solve`` call timed whole (wall and CPU, children
    included), its start-up (compilation) as ``solve`` reports it, and the naive NumPy run, in this
    process, interleaved; the best of ``reps``."""
    setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators
    from attnflow.numerics.solve import solve

    _, field, _ = usa_field(n, 3, "float64")
    x0 = references.initial(n, 3, "float64")
    steps = int(round(t_end / DT))
    record: dict = {}
    for _ in range(reps):
        result = {}

        def run(result=result):
            result["traj"] = solve(
                field, jnp.asarray(x0), integrator=integrators.RK4(), dt=DT, t_end=t_end, save_every=0.1
            )

        wall, cpu = timed(run)
        traj = result["traj"]

        def reference(result=result):
            result["ref"] = references.naive_run(x0, steps=steps, save_every_steps=10)

        ref_wall, ref_cpu = timed(reference)
        startup = _startup_s(traj)
        for key, value in (
            ("attnflow_s", wall),
            ("attnflow_cpu_s", cpu),
            ("startup_s", startup),
            ("numpy_s", ref_wall),
            ("numpy_cpu_s", ref_cpu),
        ):
            if value is not None:
                record[key] = min(record.get(key, float("inf")), value)
        record["max_diff"] = float(np.abs(traj.xs[-1] - result["ref"][-1]).max())
        record["status"] = str(traj.status)
    return {"n": n, "t_end": t_end, **record}


def child_batch_attnflow(n: int, t_end: float, seeds: int) -> dict:
    """A fresh process's whole batch run: ``solve`` on ``(seeds, n, 3)`` (the engine's batch runner)."""
    start = time.perf_counter()
    setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators
    from attnflow.numerics.solve import solve

    _, field, _ = usa_field(n, 3, "float64")
    x0 = np.stack([references.initial(n, 3, "float64", seed=s) for s in range(seeds)])
    imported = time.perf_counter() - start
    result = []
    wall, cpu = timed(
        lambda: result.append(
            solve(field, jnp.asarray(x0), integrator=integrators.RK4(), dt=DT, t_end=t_end, save_every=0.1)
        )
    )
    traj = result[0]
    return {
        "import_s": imported,
        "solve_s": wall,
        "solve_cpu_s": cpu,
        "startup_s": _startup_s(traj),
        "status": str(traj.status),
        "self_and_waited_cpu_s": cpu_s(),
        "live_children_cpu_s": live_children_cpu_s(),
    }


def _numpy_seed(args) -> np.ndarray:
    n, t_end, seed = args
    x0 = references.initial(n, 3, "float64", seed=seed)
    return references.naive_run(x0, steps=int(round(t_end / DT)), save_every_steps=10)[-1]


def child_batch_numpy(n: int, t_end: float, seeds: int, processes: int) -> dict:
    """A fresh process's naive NumPy runs of ``seeds`` seeds over ``processes`` spawned processes
    (one BLAS thread each, inherited from the benchmark's environment)."""
    import multiprocessing

    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        finals = pool.map(_numpy_seed, [(n, t_end, s) for s in range(seeds)])
    return {
        "pool_s": time.perf_counter() - start,
        "seeds_done": len(finals),
        "self_and_waited_cpu_s": cpu_s(),
    }


# ----------------------------------------------------------------------------- memory and large n


def child_memory(n: int, engine: str, steps: int, energy: bool) -> dict:
    """A short Euler run through ``solve`` (attnflow) or the naive NumPy loop: peak memory, step time."""
    x0 = references.initial(n, 3, "float64")
    if engine == "numpy":
        start = time.perf_counter()
        x = x0
        for _ in range(steps):
            x = references.step(references.naive_field, x, "euler")
        return {"n": n, "engine": engine, "step_s": (time.perf_counter() - start) / steps}
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics import integrators, summation
    from attnflow.numerics.solve import solve

    kernel, field, block = usa_field(n, 3, "float64")
    start = time.perf_counter()
    traj = solve(
        field, jnp.asarray(x0), integrator=integrators.Euler(), dt=DT, t_end=steps * DT, save_every=DT
    )
    wall = time.perf_counter() - start
    startup = _startup_s(traj)
    out = {
        "n": n,
        "engine": engine,
        "block_size": block,
        "steps": steps,
        "run_s": wall,
        "startup_s": startup,
        "step_s": (wall - (startup or 0.0)) / steps,
        "step_includes_startup": startup is None,
        "status": str(traj.status),
    }
    if energy:
        fn = jax.jit(lambda x: summation.energy(kernel, x, block_size=block))
        fn(jnp.asarray(x0)).block_until_ready()
        out["energy_s"] = timed(lambda: fn(jnp.asarray(x0)).block_until_ready())[0]
    return out


# ----------------------------------------------------------------------------- block sizes


def measure_blocks(ns: list[int], blocks: list, reps: int, dtype: str = "float64") -> list[dict]:
    """One field evaluation per (n, block): dense (``None``) or blocked (float64 tiles, float32 rows)."""
    jax = setup_jax()
    import jax.numpy as jnp

    rows = []
    for n in ns:
        x = jnp.asarray(references.initial(n, 3, dtype))
        for block in blocks:
            if (block is not None and block >= n) or (block is None and n > 4096):
                continue
            _, field, _ = usa_field(n, 3, dtype, block_size=block)
            f = jax.jit(field)
            t = best_time(lambda f=f, x=x: f(x).block_until_ready(), reps if n < 16384 else 2)
            rows.append({"n": n, "dtype": dtype, "block": block, "eval_s": t})
            print(f"  {dtype} n={n:6d} block={block!s:>5}: {t * 1e3:9.2f} ms per evaluation", flush=True)
    return rows
