"""Reference samples for the two-sample rows of ``attnflow reproduce``, and the power of those rows.

A value whose law has no closed form (the time at which iid uniform tokens collapse, E0) is checked
against a *reference sample*: the same value measured by the real simulator, with the experiment's
own settings, on seeds that no experiment runs (1000 and up). The sample is stored in the
experiment's file (``[reference.<name>]``, :class:`~attnflow.workflows.experiments.ReferenceSample`);
a row with ``scope = "two-sample"`` passes when the two-sample Kolmogorov–Smirnov test of its
seeds' values against the sample of its size gives ``p >= bound``
(:func:`~attnflow.workflows.experiments.two_sample_p`). Unlike a window, the test sees the whole law,
and any other experiment equal to it in law can use the same sample (E1's gauge frame, by
conjugacy).

:func:`power` is the probability that such a row fails when every time is scaled by a factor (a
clock at half or double speed scales every time by exactly 2 or 1/2), estimated by drawing the
seeds' values from the reference sample itself, scaled. Write a sample (the TOML table on stdout)::

    python -m attnflow.workflows.reproduce_reference E0 collapse_time --seeds 1000-1039
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import numpy as np

from attnflow.workflows import reproduce
from attnflow.workflows.experiments import load_experiments, two_sample_p
from attnflow.workflows.reproduce_plan import plan

__all__ = ["measure_sample", "power", "sample_table"]


def measure_sample(
    experiment_id: str,
    metric: str,
    seeds: Sequence[int],
    *,
    sizes: Sequence[int] | None = None,
    workers: int = 1,
) -> dict[int, list[float | None]]:
    """``{n: [value of each seed]}``: ``metric`` of the experiment's final state for ``seeds``, at its
    full sizes (or ``sizes``), run as ``attnflow reproduce`` runs it (its first variant)."""
    (experiment,) = load_experiments([experiment_id])
    first = experiment.variants[0].name
    jobs = [dataclasses.replace(job, seeds=tuple(seeds)) for job in plan([experiment], sizes=sizes)
            if job.variant.name == first]  # fmt: skip
    results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=workers)
    failed = [f"n = {r.n}: {r.reason}" for r in results if r.status != "ok"]
    if failed:
        raise RuntimeError(f"reference sample of {experiment_id}: runs failed ({'; '.join(failed)})")
    return {r.n: [v["final"].get(metric) for v in r.values] for r in results}


def power(
    reference: Sequence[float],
    k: int,
    factor: float,
    *,
    level: float,
    t_max: float,
    draws: int = 2000,
    seed: int = 0,
) -> float:
    """The share of ``draws`` samples of ``k`` values, drawn with replacement from ``reference`` and
    multiplied by ``factor``, that the two-sample row rejects at ``level``: its p-value is below, or a
    value is past ``t_max`` (the run's end: the value is then missing, and the row fails)."""
    reference = np.asarray(reference, dtype=float)
    rng = np.random.default_rng(seed)
    rejected = 0
    for _ in range(draws):
        values = factor * rng.choice(reference, size=k, replace=True)
        rejected += bool(np.any(values > t_max)) or two_sample_p(values, reference) < level
    return rejected / draws


def sample_table(name: str, metric: str, seeds: Sequence[int], values: dict[int, list]) -> str:
    """The ``[reference.<name>]`` table of an experiment file for ``values`` (per size)."""
    rows = [f"[reference.{name}]", f'metric = "{metric}"', f"seeds = [{seeds[0]}, {seeds[-1]}]",
            f"[reference.{name}.values]"]  # fmt: skip
    for n, sample in sorted(values.items()):
        rows.append(f"{n} = [{', '.join(f'{float(v):.10g}' for v in sample)}]")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="an experiment id, e.g. E0")
    parser.add_argument("metric", help="a measured value of its final state, e.g. collapse_time")
    parser.add_argument("--seeds", default="1000-1039", help="first-last (default 1000-1039)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    values = measure_sample(args.experiment, args.metric, seeds, workers=args.workers)
    missing = {n: sum(v is None for v in sample) for n, sample in values.items() if None in sample}
    if missing:
        parser.exit(1, f"reference: seeds without a value of {args.metric} (per n): {missing}\n")
    print(sample_table(args.metric, args.metric, seeds, values))


if __name__ == "__main__":
    main()
