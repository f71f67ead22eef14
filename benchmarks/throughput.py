"""The reproduction's cost, old settings against new, in one run (fresh processes, interleaved).

1. ``reproduce`` (``--quick``: the CI variant; without it: the full one) with the old settings
   (every simulation fixed-step RK4 at its file's ``dt``: the override ``solver.method=rk4``) and
   with the files' settings (adaptive Dormand–Prince where the files say so), each in a fresh
   process: wall time, CPU time of the process and all its children (``RUSAGE_CHILDREN``), the
   number of failed expectations and the solver's step statistics (field evaluations, compile s).
2. A second ``solve`` of the same shape in one process: compile time over the first's.

    python benchmarks/throughput.py --quick [--only E0,E5] [--repeats 1] [--workers 1]

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
    args = parser.parse_args()
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
