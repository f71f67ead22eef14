"""Peak memory against the number of snapshots: ``attnflow run`` streams, ``solve`` holds.

    python benchmarks/memory.py                    # n = 256, d = 16, 200 / 2000 / 8000 snapshots
    python benchmarks/memory.py --snapshots 200 2000 --n 256 --d 16

Each case runs in a fresh subprocess (``--child``), which reports its own peak RSS
(``getrusage``) once done: the run workflow (``attnflow.workflows.run.run``: snapshots streamed to
the store and the metrics, figures from two states) and, for contrast, ``attnflow.solve`` (returns
a ``Trajectory`` holding every snapshot). The cases are interleaved (one of each kind per snapshot
count, in turn). Euler steps with ``dt = save_every = 0.01``, the baseline field (exact, no gauge).
Prints a Markdown table; the rows measured are in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _config(n: int, d: int, snapshots: int) -> dict:
    return {
        "model": {"n": n, "d": d},
        "solver": {"method": "euler", "dt": 0.01, "save_every": 0.01, "t_end": 0.01 * snapshots},
    }


def child(kind: str, n: int, d: int, snapshots: int, out: str) -> dict:
    from attnflow.io.config import config_from_dict
    from attnflow.numerics.solve import solve
    from attnflow.workflows.build import build
    from attnflow.workflows.run import run

    config = config_from_dict(_config(n, d, snapshots))
    start = time.perf_counter()
    if kind == "run":
        status = run(config, out).metrics["run"]["status"]
    else:
        sim = build(config)
        trajectory = solve(
            sim.field,
            sim.x0,
            integrator=sim.integrator,
            dt=sim.dt,
            t_end=sim.t_end,
            save_every=sim.save_every,
        )
        status = str(trajectory.status)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_mib": peak_kib / 1024, "wall_s": time.perf_counter() - start, "status": status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--snapshots", type=int, nargs="+", default=[200, 2000, 8000])
    parser.add_argument("--kinds", nargs="+", default=["run", "solve"], choices=["run", "solve"])
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SNAPSHOTS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, snapshots, out = args.child
        print(json.dumps(child(kind, args.n, args.d, int(snapshots), out)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for snapshots in args.snapshots:
            for kind in args.kinds:
                out = Path(tmp) / f"{kind}-{snapshots}"
                command = [sys.executable, __file__, "--n", str(args.n), "--d", str(args.d)]
                command += ["--child", kind, str(snapshots), str(out)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append({"kind": kind, "snapshots": snapshots, **result})
                print(json.dumps(rows[-1]), file=sys.stderr)
    snapshot_mib = args.n * args.d * 8 / 2**20
    print(f"n = {args.n}, d = {args.d}, one snapshot {snapshot_mib * 1024:.0f} KiB")
    print()
    print("| path | snapshots | peak RSS | wall | status |")
    print("|---|---|---|---|---|")
    for row in rows:
        path = "`attnflow run` (streamed)" if row["kind"] == "run" else "`attnflow.solve` (held)"
        cells = [
            path,
            str(row["snapshots"]),
            f"{row['peak_mib']:.0f} MiB",
            f"{row['wall_s']:.1f} s",
            row["status"],
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
