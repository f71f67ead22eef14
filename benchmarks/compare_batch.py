"""The batch runner against the code it replaced, in one run, interleaved (old, new, old, new, ...).

1. A batch of 10 seeds, n = 256, RK4, dt = 0.01, tau = 20, snapshots every 0.1 (``solve`` with
   ``x0 (10, n, 3)``, default workers): each measurement is a fresh process (start-up, imports,
   the worker processes and compilation included); wall time, and CPU time of the process and all
   its children (``RUSAGE_CHILDREN``).
2. ``attnflow reproduce --quick`` likewise (a fresh CLI process each).

The old code path is another checkout (``--old``, e.g. ``git worktree add /tmp/old 15c0492``),
imported through ``PYTHONPATH`` in its own processes; the new one is this checkout.

    python benchmarks/compare_batch.py --old /tmp/old [--repeats 2] [--skip-reproduce]
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

NEW = Path(__file__).resolve().parents[1]

BATCH = """
import jax, jax.numpy as jnp, numpy as np
import attnflow
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.solve import solve
if __name__ == "__main__":
    n = 256
    kernel = Kernel(gauges.IdentityGauge(n=n, d=3), factors.NoFactor(n), make_profile("exp", beta=1.0))
    x0 = jnp.stack([sphere.sample_uniform(s, n, 3) for s in range(10)])
    traj = solve(dynamics.make_vector_field(kernel), x0, integrator=integrators.RK4(), dt=0.01, t_end=20.0,
                 save_every=0.1)
    assert traj.status == "ok" and traj.xs.shape == (201, 10, n, 3)
    print(float(np.asarray(traj.xs[-1]).sum()))
"""


def measure(tree: Path, command: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):  # reproduce exits 1 when an expectation fails: still timed
        raise RuntimeError(f"{command} in {tree} failed:\n{done.stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "rc": done.returncode,
        "out": done.stdout[-200:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--old", type=Path, required=True, help="checkout of the old code (its src/ is imported)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-reproduce", action="store_true")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": NEW}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "batch.py"
        script.write_text(BATCH)
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                row = {
                    "what": "batch",
                    "code": name,
                    "repeat": repeat,
                    **measure(tree, [sys.executable, str(script)]),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        if not args.skip_reproduce:
            for repeat in range(max(1, args.repeats // 2)):
                for name, tree in trees.items():
                    out = Path(tmp) / f"reproduce_{name}_{repeat}"
                    command = [sys.executable, "-m", "attnflow", "reproduce", "--quick", "--out", str(out)]
                    row = {
                        "what": "reproduce --quick",
                        "code": name,
                        "repeat": repeat,
                        **measure(tree, command),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print("load:", os.getloadavg())
    for what in dict.fromkeys(r["what"] for r in rows):
        old = [r for r in rows if r["what"] == what and r["code"] == "old"]
        new = [r for r in rows if r["what"] == what and r["code"] == "new"]
        for key in ("wall_s", "cpu_s"):
            o, n = (sorted(r[key] for r in rs) for rs in (old, new))
            print(
                f"{what:18s} {key}: old {o}  new {n}  new/old (medians) {n[len(n) // 2] / o[len(o) // 2]:.2f}"
            )


if __name__ == "__main__":
    main()
