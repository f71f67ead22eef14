"""Speed and memory of attnflow, as ratios against references and limits measured in the same run.

    python benchmarks/run.py            # full run (~10 min on 2 cores): writes RESULTS.md and RESULTS.json
    python benchmarks/run.py --quick    # a smoke-test subset (1–2 min): prints only (unless --out is given)
    python benchmarks/run.py --render benchmarks/RESULTS.json   # redraw the report from saved data

What is measured (``benchmarks/README.md`` says more):

- per step: attnflow's compiled loop against a naive dense NumPy step and a blocked NumPy step
  (the engine's tiles or row blocks in NumPy), and against the limit of the work the engine's path
  actually does (``work.evaluation_work``) at the exp and matmul rates XLA reaches on this machine
  (``engine.engine_rates``);
- whole runs: one seed, the ``solve`` call timed whole (start-up reported separately); ten seeds
  in a fresh process each (start-up included), attnflow's batch runner against the naive NumPy
  runs over as many processes, and per CPU-second (children included);
- peak memory of fresh subprocesses, the block-size sweep, bitwise thread/device invariance,
  float32 against float64, the random-batch approximation's error.

The NumPy references run on one BLAS thread (set below, before NumPy loads; the multithreaded
OpenBLAS is slower on the tile products): ×NumPy in CPU time is the per-core comparison.
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import accuracy  # noqa: E402
import engine  # noqa: E402
import numpy as np  # noqa: E402
import report  # noqa: E402
import work  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NUMPY_MAX_BYTES = 2.5e9  # no naive NumPy step where one n × n array would exceed this


# ----------------------------------------------------------------------------- subprocesses


def child_main(kind: str, params: str) -> None:
    """Entry point of the measuring subprocesses (``--child KIND JSON``): prints ``RESULT {json}``."""
    import resource

    functions = {
        "steps": engine.measure_steps,
        "memory": engine.child_memory,
        "thread": accuracy.child_thread,
        "batch_attnflow": engine.child_batch_attnflow,
        "batch_numpy": engine.child_batch_numpy,
        "random_batch_large": accuracy.child_random_batch_large,
    }
    if kind not in functions:
        raise SystemExit(f"run.py: `--child` must be one of {sorted(functions)}; got {kind!r}.")
    result = functions[kind](**json.loads(params))
    result["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + work.dumps(result).replace("\n", ""), flush=True)


def run_child(
    kind: str, params: dict, *, env_extra: dict | None = None, prefix: list[str] | None = None
) -> dict:
    """Run a measuring subprocess; adds its peak RSS (``/usr/bin/time -v`` where present) and, as
    seen from here, its wall time and CPU time (``RUSAGE_CHILDREN``: the child and every descendant
    it waited for, e.g. worker processes)."""
    import resource

    env = {**os.environ, **(env_extra or {})}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(params)]
    time_tool = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if time_tool:
        cmd = [time_tool, "-v", *cmd]
    cmd = (prefix or []) + cmd

    def children_cpu():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    cpu0, start = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {kind} {params} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    result["max_rss_mb"] = int(match.group(1)) / 1024 if match else result["ru_maxrss_mb"]
    result["process_wall_s"], result["process_cpu_s"] = wall, cpu
    return result


# ----------------------------------------------------------------------------- machine


def machine_description() -> dict:
    """Date, CPU model, cores and affinity, memory, versions, the engine's devices."""
    model = platform.processor() or ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    jax = engine.setup_jax()
    import jaxlib

    import attnflow

    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = None
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "uname": " ".join(platform.uname()),
        "cpu": model,
        "cores": os.cpu_count(),
        "affinity": affinity,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": _blas_name(),
        "numpy_blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "attnflow": attnflow.__version__,
        "commit": commit,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu_devices": len(jax.devices()),
        "lane_devices": engine.lane_device_count(),
    }


def _blas_name() -> str:
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- plans


def step_plan(quick: bool) -> list[dict]:
    """The per-step rows: fewer repetitions and methods for the largest sizes."""
    if quick:
        return [
            dict(
                n=n,
                d=3,
                dtype="float64",
                reps=2,
                target_s=0.1,
                methods=["euler", "rk4"],
                naive=["euler"],
                blocked=["euler"],
            )
            for n in (256, 1024, 4096)
        ]
    rows = []
    for d in (3, 64):
        for dtype in ("float64", "float32"):
            for n in (256, 1024, 4096, 16384, 65536):
                if n <= 4096:
                    plan = dict(
                        reps=3,
                        target_s=0.2,
                        methods=["euler", "rk4"],
                        naive=["euler", "rk4"],
                        blocked=["euler", "rk4"],
                    )
                elif n == 16384:
                    plan = dict(
                        reps=1, target_s=0.0, methods=["euler", "rk4"], naive=["euler"], blocked=["euler"]
                    )
                else:  # 65536: no n × n NumPy array fits; the blocked NumPy step only where it takes seconds
                    plan = dict(
                        reps=1, target_s=0.0, methods=["euler"], naive=[], blocked=["euler"] if d == 3 else []
                    )
                if n * n * np.dtype(dtype).itemsize > NUMPY_MAX_BYTES:
                    plan["naive"] = []
                rows.append(dict(n=n, d=d, dtype=dtype, **plan))
    return rows


def measure_batches(n: int, t_end: float, seeds: int) -> dict:
    """Ten seeds in a fresh process each, start-up included: attnflow's batch ``solve`` and the naive
    NumPy runs over as many processes as attnflow's runner uses (the process's cores, at most ``seeds``)."""
    processes = min(available_cores(), seeds)
    ours = run_child("batch_attnflow", dict(n=n, t_end=t_end, seeds=seeds))
    ref = run_child("batch_numpy", dict(n=n, t_end=t_end, seeds=seeds, processes=processes))
    # the workers' CPU time reaches RUSAGE_CHILDREN only if they were waited for: cross-check
    seen = ours["self_and_waited_cpu_s"] + ours["live_children_cpu_s"]
    ours["process_cpu_s"] = max(ours["process_cpu_s"], seen)
    return {"n": n, "t_end": t_end, "seeds": seeds, "processes": processes, "attnflow": ours, "numpy": ref}


def measure_threads(ns: list[int], quick: bool) -> dict:
    """The same RK4 run under several thread and CPU-device settings, against one device (bitwise)."""
    one = {"ATTNFLOW_BENCH_DEVICES": "1"}
    variants = {"one CPU device": (one, None), "2 CPU devices": ({"ATTNFLOW_BENCH_DEVICES": "2"}, None)}
    if not quick:
        variants["Eigen single-threaded"] = ({**one, "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, None)
        variants["8 CPU devices"] = ({"ATTNFLOW_BENCH_DEVICES": "8"}, None)
    if shutil.which("taskset"):
        variants["one core (taskset -c 0)"] = (one, ["taskset", "-c", "0"])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in ns:
            arrays = {}
            for name, (env, prefix) in variants.items():
                path = str(Path(tmp) / f"{n}_{len(arrays)}.npy")
                run_child("thread", dict(n=n, out=path), env_extra=env, prefix=prefix)
                arrays[name] = np.load(path)
            reference = arrays["one CPU device"]
            results[n] = {name: float(np.abs(a - reference).max()) for name, a in arrays.items()}
            print(f"  n={n}: max |difference| vs one device: {results[n]}", flush=True)
    return results


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke-test subset (prints; writes only with --out)"
    )
    parser.add_argument("--out", type=Path, default=None, help="Markdown report (default: RESULTS.md here)")
    parser.add_argument("--render", type=Path, default=None, help="redraw the report from a RESULTS.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return
    if args.render is not None:
        text = report.render(json.loads(args.render.read_text()))
        target = args.out if args.out is not None else args.render.with_suffix(".md")
        work.write_report(target, text)
        print(text + f"\nwritten {target}")
        return
    quick = args.quick
    out = args.out if args.out is not None else (None if quick else HERE / "RESULTS.md")
    command = "python benchmarks/run.py" + (" --quick" if quick else "")
    started, load_start = time.perf_counter(), os.getloadavg()
    info = machine_description()
    print(f"attnflow benchmark ({'quick' if quick else 'full'}) — {info['date']}\n{info['uname']}")
    print(f"CPU: {info['cpu']}, {info['cores']} cores, affinity {info['affinity']}; load {load_start}")

    marks = []  # (section, start): the time each section takes, reported with the results

    def begin(title: str) -> None:
        marks.append((title, time.perf_counter()))
        print(f"\n[{len(marks)}] {title}", flush=True)

    dtypes = ["float64"] if quick else ["float64", "float32"]
    begin("machine rates (XLA, as the engine is configured)")
    rate_runs = []  # measured three times (start, after the per-step rows, end): the machine is shared

    def measure_rates(when: str) -> None:
        measured = {dt: engine.engine_rates(dt, reps=3 if quick else 5) for dt in dtypes}
        rate_runs.append({"when": when, **measured})
        for dt, r in measured.items():
            print(f"  {when}, {dt}: exp {r['exp'] / 1e9:.2f} G/s, matmul {r['matmul'] / 1e9:.1f} GFLOP/s")

    measure_rates("start")

    begin("per step")
    step_rows = []
    for params in step_plan(quick):
        row = run_child("steps", params)
        step_rows.append(row)
        summary = ", ".join(
            f"{m} {report.fmt_t(row[m]['attnflow_s'])} (naive {report.fmt_t(row[m].get('naive_s'))}, "
            f"blocked {report.fmt_t(row[m].get('blocked_s'))})"
            for m in params["methods"]
        )
        print(
            f"  n={row['n']:6d} d={row['d']:2d} {row['dtype']} {row['work']['path']}: {summary}", flush=True
        )

    measure_rates("after the per-step rows")

    begin("whole runs, n = 256, d = 3, RK4, dt = 0.01")
    t_end = 2.0 if quick else 20.0
    single = engine.measure_single_run(256, t_end, 1 if quick else 2)
    print(
        f"  one seed: solve {report.fmt_t(single['attnflow_s'])} (start-up "
        f"{report.fmt_t(single.get('startup_s'))}), NumPy {report.fmt_t(single['numpy_s'])}",
        flush=True,
    )
    batches = measure_batches(256, t_end, 10)
    print(
        f"  10 seeds in fresh processes: attnflow {report.fmt_t(batches['attnflow']['process_wall_s'])}, "
        f"NumPy on {batches['processes']} processes {report.fmt_t(batches['numpy']['process_wall_s'])}",
        flush=True,
    )

    begin("memory and large n (fresh subprocesses, Euler through solve)")
    mem_plan = (
        [(4096, 3, True)]
        if quick
        else [(4096, 5, True), (16384, 2, True), (65536, 1, True), (100_000, 1, False)]
    )
    mem_rows = [run_child("memory", dict(n=n, engine="attnflow", steps=s, energy=e)) for n, s, e in mem_plan]
    for n in [4096] if quick else [4096, 16384]:
        mem_rows.append(run_child("memory", dict(n=n, engine="numpy", steps=1, energy=False)))
    for row in mem_rows:
        print(
            f"  {row['engine']:8s} n={row['n']:6d}: peak RSS {row['max_rss_mb']:.0f} MB, "
            f"step {report.fmt_t(row['step_s'])}",
            flush=True,
        )
    base = run_child("memory", dict(n=64, engine="attnflow", steps=1, energy=False))

    begin("block size (one evaluation, d = 3)")
    if quick:
        block_rows = engine.measure_blocks([4096], [None, 128, 256], 2)
    else:
        block_rows = engine.measure_blocks([1024, 4096, 16384], [None, 64, 128, 256, 512], 3)
        block_rows += engine.measure_blocks([2048, 4096, 16384], [None, 128, 256, 512], 3, "float32")

    begin("thread and device settings (bitwise comparison of the same RK4 run)")
    thread_results = measure_threads([256] if quick else [256, 2048], quick)

    begin("float32 vs float64 (RK4 dt = 0.01, to t = 20)")
    f32_rows = accuracy.measure_float32([64] if quick else [64, 128, 256], 3 if quick else 10)

    begin("random-batch approximation (Euler, dt = 0.01) — an approximation, not the model")
    rb = accuracy.measure_random_batch(1024 if quick else 4096, [16, 64] if quick else [16, 64, 256], 1.0)
    rb["large"] = None if quick else run_child("random_batch_large", dict(n=100_000, p=64))

    begin("machine rates again")
    measure_rates("end")
    rates = {dt: engine.best_rates(*(run[dt] for run in rate_runs)) for dt in dtypes}
    ends = [start for _, start in marks[1:]] + [time.perf_counter()]
    results = dict(
        command=command,
        sections_s={title: end - start for (title, start), end in zip(marks, ends, strict=True)},
        info=info,
        loads=(load_start, os.getloadavg()),
        elapsed_s=time.perf_counter() - started,
        rates=rates,
        rate_runs=rate_runs,
        steps=step_rows,
        single=single,
        batches=batches,
        memory=mem_rows,
        baseline=base,
        blocks=block_rows,
        threads=thread_results,
        float32=f32_rows,
        random_batch=rb,
        quick=quick,
    )
    if out is not None:  # the raw data first: the report can be redrawn from it (--render)
        work.write_json(out.with_suffix(".json"), results)
    text = report.render(json.loads(work.dumps(results)))  # exactly what the JSON holds
    print("\n" + text)
    if out is not None:
        work.write_report(out, text)
        print(f"written {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
