"""The mutant x experiment table of docs/mutants.md: every wrong simulator of tests/mutants.py run
against every experiment of ``attnflow reproduce`` (full sizes, or ``--quick``), in this process.

    .venv/bin/python scripts/mutants_table.py [--quick] [--only E0,E1] [--mutants "beta x 2,sign flipped"]

A cell is the first row that fails (its metric), "cannot act" where the mutant's field is the real
one at every run's initial state, or PASS where every row passes (the cells listed in
tests/mutants.py BLIND, with their reasons). The run stops, per cell, at the first failing job, so a
full-size table costs a fraction of 14 full reproductions (one per mutant).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import mutants  # noqa: E402
from attnflow.workflows import experiments as experiment_files  # noqa: E402


def markdown(cells: dict, ids: list[str], names: list[str]) -> str:
    lines = ["| mutant | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
    for name in names:
        shown = []
        for eid in ids:
            status, failed = cells[name, eid]
            if status == "FAIL":
                metrics = sorted({row[2] for row in failed})
                shown.append("FAIL: " + ", ".join(metrics[:2]) + (" ..." if len(metrics) > 2 else ""))
            elif status == "cannot act":
                shown.append("·")
            else:
                shown.append("**PASS** (blind)" if (name, eid) in mutants.BLIND else "**PASS**")
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the --quick sizes and seeds")
    parser.add_argument("--only", default=None, help="comma-separated experiment ids")
    parser.add_argument("--mutants", default=None, help="comma-separated mutant names")
    args = parser.parse_args()
    experiments = experiment_files.load_experiments(args.only.split(",") if args.only else None)
    names = args.mutants.split(",") if args.mutants else list(mutants.MUTANTS)
    unknown = [name for name in names if name not in mutants.MUTANTS]
    if unknown:
        parser.error(f"`--mutants` must name mutants of {list(mutants.MUTANTS)}; got {unknown}.")
    start = time.perf_counter()

    def progress(name, eid, cell):  # one line per cell as it is done (a long run loses nothing)
        print(f"{name} / {eid}: {cell[0]} {sorted({row[2] for row in cell[1]})}", file=sys.stderr, flush=True)

    cells = mutants.table(experiments, quick=args.quick, names=names, on_cell=progress)
    print(markdown(cells, [e.id for e in experiments], names))
    print(f"\n({'quick' if args.quick else 'full'} sizes, {time.perf_counter() - start:.0f} s)")
    for (name, eid), (status, failed) in cells.items():
        if status == "FAIL":
            print(f"{name} / {eid}: {failed[0][3]} (variant {failed[0][0] or '-'}, n = {failed[0][1]})")


if __name__ == "__main__":
    main()
