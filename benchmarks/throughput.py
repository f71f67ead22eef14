"""The reproduction's cost, old against new, in one run (fresh processes, interleaved).

0. ``--cli``: the command a user runs, ``attnflow reproduce [--quick]``, of an old checkout
   (``--old-tree``, e.g. ``git archive ecb71e2 | tar -x -C /tmp/old``: main before adaptive steps)
   against this tree, alternated, each in a fresh process with an empty compilation cache
   (``ATTNFLOW_CACHE_DIR``): wall time, CPU time of the process and all its children, the rows of
   ``results.json`` that FAIL, and the load. ``--workers`` is passed on when given.
0'. ``--startup``: start-up of ``attnflow run`` (the time from starting the process to the first
   snapshot after t = 0, and to the end) of one shape, in a fresh process with an empty
   compilation cache and then in another with the cache the first one left (the persistent cache),
   alternated; also the time to import the command line alone.
1. ``reproduce`` (``--quick``: the CI variant; without it: the full one) with the old settings
   (every simulation fixed-step RK4 at its file's ``dt``: the override ``solver.method=rk4``) and
   with the files' settings (adaptive Dormand–Prince where the files say so), each in a fresh
   process: wall time, CPU time of the process and all its children (``RUSAGE_CHILDREN``), the
   number of failed expectations and the solver's step statistics (field evaluations, compile s).
2. A second ``solve`` of the same shape in one process: compile time over the first's.

    python benchmarks/throughput.py --quick [--only E0,E5] [--repeats 1] [--workers 1]
    python benchmarks/throughput.py --cli --old-tree /tmp/old --quick [--repeats 2] [--workers 1]
    python benchmarks/throughput.py --startup [--repeats 3]

Prints one JSON object (ratios old / new); the numbers go to RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SETTINGS = {"old (rk4)": ["solver.method=rk4"], "new (files)": []}

REPRODUCE = """
import json, sys
from attnflow.workflows.reproduce import reproduce
options = json.loads(sys.argv[1])
outcome = reproduce(options.pop("out"), **options)
totals = {}
for job in outcome.jobs:
    for key in ("evaluations", "steps_accepted", "steps_rejected", "compile_s", "run_s", "measure_s"):
        totals[key] = totals.get(key, 0) + job.timing.get(key, 0)
failed = sorted(f"{r['experiment']} {r.get('variant') or ''} n={r['n']} #{r['index']}"
                for r in outcome.failures)
print(json.dumps({"failures": len(outcome.failures), "failed": failed, "totals": totals}))
"""

SECOND_SOLVE = """
import json
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.solve import solve
n, times = 64, []
for beta in (1.0, 2.0):
    kernel = Kernel(gauges.IdentityGauge(n=n, d=3), factors.NoFactor(n), make_profile("exp", beta=beta))
    traj = solve(dynamics.make_vector_field(kernel), sphere.sample_uniform(int(beta), n, 3),
                 integrator=integrators.Adaptive(), dt=0.01, t_end=2.0, save_every=0.1)
    times.append(traj.compile_time_s)
print(json.dumps({"first_compile_s": times[0], "second_compile_s": times[1], "ratio": times[1] / times[0]}))
"""


def measure(code: str, *args: str, tree: Path = HERE) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark process failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        **json.loads(done.stdout.strip().splitlines()[-1]),
    }


CLI = "from attnflow.cli import app; app()"

STARTUP = """
import json, sys, time
stamps = {}
import attnflow.cli as cli  # the command line's imports
stamps["cli_imported"] = time.time()
import attnflow.workflows.run as run_module
import attnflow.numerics.solve as solve_module
from attnflow.numerics import program_cache

stamps["imported"] = time.time()
simulate, build, open_writer = run_module.run, run_module.build, run_module._open_writer


def stamped(name, function, after=None):
    # the first call's start and end (the first after the stamp ``after``, where one is named)
    def call(*args, **options):
        counts = after is None or after in stamps
        if counts:
            stamps.setdefault(name + "_start", time.time())
        result = function(*args, **options)
        if counts:
            stamps.setdefault(name, time.time())
        return result

    return call


def timed(config, out, *, progress=None, **options):
    def note(done, total):
        if done == 1:  # x0 stored and measured
            stamps.setdefault("x0_measured", time.time())
        if done >= 2 and "first_snapshot" not in stamps:  # the first snapshot after t = 0
            stamps["first_snapshot"], stamps["first_snapshot_cpu"] = time.time(), time.process_time()
        if progress is not None:
            progress(done, total)

    return simulate(config, out, progress=note, **options)


run_module.run = timed
run_module.build = stamped("built", build)
run_module._open_writer = stamped("store_opened", open_writer)
if hasattr(program_cache, "compiled"):  # a tree with its own program cache: the solver's compile
    program_cache.compiled = stamped("program_ready", program_cache.compiled, after="x0_measured")
else:  # jax.jit's cache: the solver program's first call (trace, compile or load, dispatch)
    solve_module._program = stamped("program_ready", solve_module._program, after="x0_measured")
try:
    cli.app(["run", sys.argv[1], "--out", sys.argv[2]], standalone_mode=False)
finally:
    stamps["end"] = time.time()
    print(json.dumps(stamps))
"""

# The stages of a start-up, each timed from the end of the one before (the first from the process
# start): the command line's imports, the run workflow's, the persistent cache turned on and the
# config read, the build, the store created, x0 measured, the solver's program traced and compiled
# or loaded, its first call.
STAGES = (
    ("python + import attnflow.cli", "cli_imported"),
    ("import attnflow.workflows.run", "imported"),
    ("cache on, config read", "built_start"),
    ("build", "built"),
    ("store created", "store_opened"),
    ("x0 stored and measured", "x0_measured"),
    ("solver program (trace, lower, compile or load)", "program_ready"),
    ("first steps, first snapshot", "first_snapshot"),
)


STARTUP_CONFIG = """
[model]
n = 64
d = 3
[aux]
kind = "positions"
[gauge]
kind = "rope"
[solver]
method = "adaptive"
t_end = 1.0
save_every = 0.1
"""


def _child_cpu(before) -> float:
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli_reproduce(tree: Path, out: Path, cache: Path, args: list[str]) -> dict:
    """``attnflow reproduce`` of ``tree`` in a fresh process with the empty cache folder ``cache``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "ATTNFLOW_CACHE_DIR": str(cache)}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLI, "reproduce", "--out", str(out), *args], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    wall, cpu = time.perf_counter() - start, _child_cpu(before)
    try:
        counts = json.loads((out / "results.json").read_text())["counts"]
    except (OSError, ValueError, KeyError):
        counts = None
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": done.returncode, "counts": counts,
            "load": [round(v, 2) for v in os.getloadavg()]}  # fmt: skip


def cli_comparison(args) -> dict:
    if args.old_tree is None:
        raise SystemExit("throughput.py --cli: `--old-tree` must name a checkout of the old code; got None.")
    extra = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    extra += ["--workers", str(args.workers)] if args.workers is not None else []
    trees = {"old": args.old_tree, "new": HERE}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, tree in trees.items():  # alternated: old, new, old, new, ...
                folder = Path(tmp) / f"{name}-{repeat}"
                runs[name].append(cli_reproduce(tree, folder / "out", folder / "cache", extra))
                print(name, runs[name][-1], file=sys.stderr)
    best = {name: min(r["cpu_s"] for r in rs) for name, rs in runs.items()}
    ratios = [o["cpu_s"] / n["cpu_s"] for o, n in zip(runs["old"], runs["new"], strict=True)]
    return {
        "command": "attnflow reproduce " + " ".join(extra),
        "old_tree": str(args.old_tree),
        "load_before": [round(v, 2) for v in load],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "runs": runs,
        "cpu_ratio_old_over_new_best": round(best["old"] / best["new"], 2),
        "cpu_ratio_old_over_new_pairs": [round(r, 2) for r in ratios],
        "wall_ratio_old_over_new_pairs": [
            round(o["wall_s"] / n["wall_s"], 2) for o, n in zip(runs["old"], runs["new"], strict=True)
        ],
    }


def startup(args) -> dict:
    """Cold (empty cache) and warm (the cache a cold process left) ``attnflow run``, alternated:
    wall time to the end of the imports and to the first snapshot after t = 0, the process's CPU
    time to that snapshot and in all, and the wall time of each stage (``STAGES``). With
    ``--old-tree``, that tree's cold and warm pair alternates with this one's."""
    if args.old_tree is None:
        return _startup_summary([_startup_once(HERE) for _ in range(args.repeats)])
    trees = {"old": args.old_tree, "new": HERE}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():  # alternated: old, new, old, new, ...
            runs[name].append(_startup_once(tree))
    return {
        "trees": {name: str(tree) for name, tree in trees.items()},
        "load": [round(v, 2) for v in os.getloadavg()],
        **{name: _startup_summary(repeats) for name, repeats in runs.items()},
    }


def _startup_once(tree: Path) -> dict:
    rows: dict[str, list[dict]] = {"cold": [], "warm": [], "import": []}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "startup.toml"
        config.write_text(STARTUP_CONFIG)
        for repeat in range(1):  # one cold/warm pair per call (alternated by the caller)
            cache = Path(tmp) / f"cache-{repeat}"
            cache.mkdir(mode=0o700)
            for name in ("cold", "warm"):
                env = {**os.environ, "PYTHONPATH": str(tree / "src"), "ATTNFLOW_CACHE_DIR": str(cache)}
                out = Path(tmp) / f"run-{repeat}-{name}"
                before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
                done = subprocess.run([sys.executable, "-c", STARTUP, str(config), str(out)], env=env,
                                      capture_output=True, text=True, check=False)  # fmt: skip
                cpu = _child_cpu(before)
                if done.returncode != 0:
                    raise RuntimeError(f"startup process failed:\n{done.stderr[-3000:]}")
                stamps = json.loads(done.stdout.strip().splitlines()[-1])
                stages, previous = {}, start
                for stage, stamp in STAGES:
                    stages[stage] = round(stamps[stamp] - previous, 3)
                    previous = stamps[stamp]
                rows[name].append({
                    "import_s": round(stamps["imported"] - start, 3),
                    "first_snapshot_s": round(stamps["first_snapshot"] - start, 3),
                    "total_s": round(stamps["end"] - start, 3),
                    "cpu_first_snapshot_s": round(stamps["first_snapshot_cpu"], 2),
                    "cpu_s": round(cpu, 2),
                    "stages_s": stages,
                    "load": round(os.getloadavg()[0], 2),
                })  # fmt: skip
                print(name, rows[name][-1], file=sys.stderr)
            env = {**os.environ, "PYTHONPATH": str(tree / "src")}
            start = time.time()
            subprocess.run([sys.executable, "-c", "import attnflow.cli"], env=env, check=True)
            rows["import"].append({"python_and_import_cli_s": round(time.time() - start, 3)})
    return rows


def _startup_summary(repeats: list[dict]) -> dict:
    rows = {kind: [r for one in repeats for r in one[kind]] for kind in ("cold", "warm", "import")}
    best = {name: min(r["first_snapshot_s"] for r in rows[name]) for name in ("cold", "warm")}
    pairs = list(zip(rows["cold"], rows["warm"], strict=True))
    return {
        "shape": "n = 64, d = 3, RoPE, adaptive DP5, t_end = 1, save_every = 0.1",
        "load": [round(v, 2) for v in os.getloadavg()],
        "runs": rows,
        "startup_ratio_cold_over_warm_best": round(best["cold"] / best["warm"], 2),
        "startup_ratio_cold_over_warm_pairs": [
            round(c["first_snapshot_s"] / w["first_snapshot_s"], 2) for c, w in pairs
        ],
        "after_imports_ratio_pairs": [
            round((c["first_snapshot_s"] - c["import_s"]) / (w["first_snapshot_s"] - w["import_s"]), 2)
            for c, w in pairs
        ],
        "cpu_first_snapshot_ratio_pairs": [
            round(c["cpu_first_snapshot_s"] / w["cpu_first_snapshot_s"], 2) for c, w in pairs
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reproduce --quick (the CI variant)")
    parser.add_argument("--only", default=None, help="experiment ids, e.g. E0,E5")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=None, help="reproduce's job processes (default: its own)"
    )
    parser.add_argument(
        "--old-tree",
        type=Path,
        default=None,
        help="a checkout of the old code (git worktree add /tmp/old main): also timed, as it is",
    )
    parser.add_argument("--new", default="", help="overrides of the new setting (default: the files')")
    parser.add_argument("--cli", action="store_true", help="reproduce of --old-tree vs this tree")
    parser.add_argument("--startup", action="store_true", help="attnflow run start-up, empty and warm cache")
    args = parser.parse_args()
    if args.cli or args.startup:
        print(json.dumps(cli_comparison(args) if args.cli else startup(args), indent=1))
        return
    SETTINGS["new (files)"] = [o for o in args.new.split(",") if o]
    only = args.only.split(",") if args.only else None
    load = os.getloadavg()
    if args.old_tree is not None:
        SETTINGS["old code"] = []
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, overrides in SETTINGS.items():  # interleaved: old, new, old, new, ...
                out = f"{tmp}/{repeat}-{len(results[name])}-{name[:3]}"
                options = dict(
                    out=out, quick=args.quick, only=only, workers=args.workers, overrides=overrides
                )
                tree = HERE
                if name == "old code":  # its reproduce has no overrides: the files' settings of then
                    del options["overrides"]
                    tree = args.old_tree
                results[name].append(measure(REPRODUCE, json.dumps(options), tree=tree))
                print(name, results[name][-1], file=sys.stderr)
    best = {name: min(runs, key=lambda r: r["cpu_s"]) for name, runs in results.items()}
    old, new = best["old (rk4)"], best["new (files)"]
    summary = {
        "variant": "quick" if args.quick else "full",
        "only": only,
        "load_before": [round(v, 2) for v in load],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "runs": results,
        "cpu_ratio_old_over_new": round(old["cpu_s"] / new["cpu_s"], 2),
        "cpu_ratio_old_code_over_new": (
            round(best["old code"]["cpu_s"] / new["cpu_s"], 2) if "old code" in best else None
        ),
        "wall_ratio_old_over_new": round(old["wall_s"] / new["wall_s"], 2),
        "evaluation_ratio_old_over_new": round(
            old["totals"]["evaluations"] / max(1, new["totals"]["evaluations"]), 2
        ),
        "second_solve": measure(SECOND_SOLVE),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
