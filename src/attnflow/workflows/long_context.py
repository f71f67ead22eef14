"""Long contexts: the softmax with ``β = γ log n`` (``model.beta_scaling = "log_n"``), the final
law against ``γ``.

Tokens iid uniform on ``S^{d−1}`` (``init.kind = "uniform"``), no labels, the softmax
(``model.normalization = "sa"``: row ``i`` divided by ``Σ_j e^{β s_ij}``, so the time scale ``c``
cancels and ``t`` counts layers), adaptive steps to ``t_end`` = :data:`T_END`.

The prediction (Scalable-Softmax; Chen, Lin, Polyanskiy and Rigollet): token ``i`` gives itself
the weight ``e^{β} = n^γ`` and the others together ``Σ_{j≠i} e^{β s_ij} ≈ (n − 1) M_d(β)``, with
``M_d(β) = E e^{β⟨x, y⟩}`` for two independent uniform points (:func:`log_mass`). Its own weight
adds nothing to its velocity (``P_x x = 0``), only to the denominator, so when it dominates
attention is the identity and the tokens stay where they are; when the others dominate the tokens
move at speed of order one and cluster. The crossover :func:`critical_gamma` solves
``n^γ = (n − 1) M_d(γ log n)``. For near-orthogonal tokens (``d`` large, ``M_d ≈ e^{β²/2d}``) it
tends to 1, the ``γ_c = 1/(1 − ρ)`` of equiangular tokens at ``ρ = 0``; in low ``d`` the nearest
tokens sit at cosine ``1 − O(n^{−2/(d−1)})``, ``M_d(β) e^{−β} ∝ β^{−(d−1)/2}`` and the crossover
runs away, ``γ* ∝ n^{2/(d−1)} / log n``: no transition at a fixed ``γ``.

Measured per run (:class:`LongContextRun`): the mean cosine on snapshots every ``t_end/20`` and
its final value (1 on a Dirac), the overlap ``q = (1/n) Σ_i ⟨x_i(T), x_i(0)⟩`` (1 when the tokens
have not moved), the clusters at angle :data:`THETA_C` among :data:`SAMPLE` evenly spaced tokens
(:func:`~attnflow.analysis.metrics.n_clusters`; as many as the sample when frozen), and the
self-weight ``e^{β} / Σ_j e^{β s_ij}`` averaged over :data:`ROWS` rows, initially (against its
prediction ``1 / (1 + (n − 1) M_d(β) e^{−β})``) and finally. At a finite depth the collapse is
seen below :func:`horizon_gamma`, above ``γ*``.

Three families (:data:`FAMILIES`): ``d = 32`` with every pair summed (``γ*`` between 1.07 and
1.15); ``d = 3`` at small n and large γ (``γ*`` = 7.6 to 74); ``d = 2`` up to ``n = 10^5`` with the
expansion above :data:`EXACT_UP_TO` tokens (``solver.interaction = "expansion"``, ``O(n)`` per
evaluation; ``γ* > 150``).

``python -m attnflow.workflows.long_context --out DIR [--quick]`` writes one ``.npz`` per run
under ``DIR/runs`` (kept: a rerun with the same ``t_end`` skips it), ``results.json`` (the study's
machine, date and CPU seconds, the rows), ``table.md`` and ``long_context.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, hyp0f1, ive

from attnflow.analysis.metrics import mean_cosine, n_clusters
from attnflow.io.atomic import read_record, write_json, write_record, write_text
from attnflow.io.config import config_from_dict
from attnflow.io.provenance import StudyClock
from attnflow.numerics.solve import solve_streaming
from attnflow.workflows.build import build, model_beta
from attnflow.workflows.context_study import crossing_time

__all__ = [
    "EXACT_UP_TO",
    "FAMILIES",
    "QUICK",
    "ROWS",
    "SAMPLE",
    "THETA_C",
    "T_END",
    "LongContextRun",
    "critical_gamma",
    "horizon_gamma",
    "mean_rate",
    "log_mass",
    "midpoint_gamma",
    "predicted_self_weight",
    "run_long_context",
    "study_config",
    "summary_rows",
]

T_END = 20.0
EXACT_UP_TO = 4096  # above: the expansion
TOLERANCE = 1e-6  # the expansion's bound, relative to the field's scale
RTOL = 1e-5  # the adaptive steps'
SAMPLE = 2048  # tokens for the cluster count
ROWS = 512  # rows for the measured self-weight
THETA_C = 0.1  # cluster angle (radians)
MODE_ONE_FROM_D = 8  # horizon_gamma (a mode-1 estimate) is reported from this d up
FAMILIES = {  # d: (sizes, gammas)
    32: ((64, 256, 1024, 2048), (0.5, 0.8, 1.0, 1.2, 1.35, 1.5, 1.75, 2.0, 3.0)),
    3: ((64, 256, 1024), (4.0, 8.0, 16.0, 32.0, 64.0)),
    2: ((64, 1024, 16384, 100_000), (0.5, 1.0, 2.0)),
}
QUICK = {32: ((64, 256), (0.5, 1.0, 1.5, 3.0)), 3: ((64, 256), (4.0, 16.0)), 2: ((64, 1024), (0.5, 2.0))}


@dataclasses.dataclass(frozen=True)
class LongContextRun:
    """One run: its setting, the β that ran, the mean cosine series, the final values, its cost."""

    d: int
    n: int
    gamma: float
    beta: float
    seed: int
    t_end: float
    interaction: str
    ts: np.ndarray  # (T,)
    mean_cosine: np.ndarray  # (T,)
    overlap: float  # (1/n) Σ ⟨x_i(T), x_i(0)⟩
    clusters: int  # among `sample` evenly spaced tokens of the final state
    sample: int
    self_weight: float  # the measured mean initial e^β / Σ_j e^{β s_ij}
    final_self_weight: float  # the same on the final state
    status: str
    steps: int
    wall_s: float
    cpu_s: float


SERIES_UP_TO = 50.0  # β: scipy's ₀F₁ is accurate below, its asymptotic branch is not trusted above


def log_mass(d: int, beta: float) -> float:
    """``log M_d(β)``, ``M_d(β) = E e^{β⟨x, y⟩} = ₀F₁(; d/2; β²/4) = Γ(d/2) (2/β)^{d/2−1} I_{d/2−1}(β)``
    for ``x, y`` independent and uniform on ``S^{d−1}``: the series up to β = :data:`SERIES_UP_TO`
    (the Bessel form underflows at small β and large d), the scaled Bessel function above."""
    if beta <= SERIES_UP_TO:
        return math.log(float(hyp0f1(d / 2, beta * beta / 4)))
    nu = d / 2 - 1
    scaled = float(ive(nu, beta))  # I_ν(β) e^{−β}; past scipy's range its first asymptotic terms
    log_scaled = (
        math.log(scaled)
        if math.isfinite(scaled) and scaled > 0.0
        else -0.5 * math.log(2.0 * math.pi * beta) - (4.0 * nu * nu - 1.0) / (8.0 * beta)
    )
    return float(gammaln(d / 2) + nu * math.log(2.0 / beta) + log_scaled + beta)


def predicted_self_weight(n: int, d: int, beta: float) -> float:
    """``e^β / (e^β + (n − 1) M_d(β))``: a token's share of its own softmax row, the others iid."""
    return 1.0 / (1.0 + math.exp(math.log(n - 1) + log_mass(d, beta) - beta))


def mean_rate(d: int, beta: float) -> float:
    """The growth rate of the mean ``m`` of a law near the uniform one under the softmax flow
    without the self-term, ``λ = E_β[1 − s²]`` (``s`` the cosine under ``e^{βs}`` times the uniform
    law's): ``(d − 1)/d`` at β = 0. From ``M'' / M``, ``M'' = F(d/2 + 1)/d + β² F(d/2 + 2)/(d(d + 2))``
    with ``F(c) = ₀F₁(; c; β²/4)``; for β <= :data:`SERIES_UP_TO`."""
    if not 0.0 <= beta <= SERIES_UP_TO:
        raise ValueError(f"mean_rate: `beta` must be in [0, {SERIES_UP_TO:g}]; got {beta!r}.")
    z = beta * beta / 4
    second = hyp0f1(d / 2 + 1, z) / d + beta * beta * hyp0f1(d / 2 + 2, z) / (d * (d + 2))
    return float(1.0 - second / hyp0f1(d / 2, z))


def critical_gamma(n: int, d: int) -> float:
    """The ``γ`` at which ``n^γ = (n − 1) M_d(γ log n)``: the self-weight is one half."""
    log_n = math.log(n)

    def excess(gamma: float) -> float:
        return gamma * log_n - math.log(n - 1) - log_mass(d, gamma * log_n)

    high = 2.0
    while excess(high) < 0.0:  # the excess is increasing in γ; it changes sign once
        high *= 2.0
    return float(brentq(excess, 1e-3, high, xtol=1e-10))


def horizon_gamma(n: int, d: int, t_end: float) -> float:
    """The ``γ`` above which the mean does not grow from its initial ``n^{−1/2}`` to order one by
    ``t_end``: ``(1 − p) λ(β) t_end = ½ log n`` with ``p`` :func:`predicted_self_weight` (its own
    weight slows a token by ``1 − p``) and ``λ`` :func:`mean_rate`. A mode-1 estimate, for large
    ``d`` (in low ``d`` finer modes grow first); NaN when no ``γ`` with β <= 50 solves it."""
    log_n = math.log(n)

    def excess(gamma: float) -> float:
        beta = gamma * log_n
        return (1.0 - predicted_self_weight(n, d, beta)) * mean_rate(d, beta) * t_end - 0.5 * log_n

    low, high = 1e-3, SERIES_UP_TO / log_n
    if excess(low) <= 0.0 or excess(high) >= 0.0:
        return math.nan
    return float(brentq(excess, low, high, xtol=1e-10))


def study_config(n: int, d: int, gamma: float, *, seed: int = 0, t_end: float = T_END) -> dict:
    """The config of one run, as plain data (module docstring)."""
    return {
        "model": {"n": n, "d": d, "beta_scaling": "log_n", "gamma": gamma, "normalization": "sa"},
        "init": {"kind": "uniform", "seed": seed},
        "solver": {
            "method": "adaptive",
            "dt": 0.05,
            "t_end": t_end,
            "save_every": t_end / 20,
            "rtol": RTOL,
            "atol": RTOL * 1e-2,
            "interaction": "exact" if n <= EXACT_UP_TO else "expansion",
            "tolerance": TOLERANCE,
        },
    }


def _subsample(n: int, size: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, size)).astype(int))


def measured_self_weight(x: np.ndarray, beta: float, *, rows: int = ROWS) -> float:
    """The mean of ``e^{β} / Σ_j e^{β s_ij}`` over ``rows`` evenly spaced rows ``i`` (``s_ii = 1``)."""
    logits = beta * (x[_subsample(x.shape[0], rows)] @ x.T - 1.0)  # <= 0 up to round-off
    return float(np.mean(1.0 / np.sum(np.exp(logits), axis=1)))


def run_long_context(n: int, d: int, gamma: float, *, seed: int = 0, t_end: float = T_END) -> LongContextRun:
    """Build the run of :func:`study_config` with attnflow's ``build`` and solve it
    (``solve_streaming``), measuring each snapshot as it comes."""
    config = config_from_dict(study_config(n, d, gamma, seed=seed, t_end=t_end))
    sim = build(config)
    x0 = np.asarray(sim.x0)
    beta = model_beta(config)
    series: dict[str, list] = {"ts": [], "mean_cosine": []}
    last: list[np.ndarray] = []

    def measure(ts, xs) -> None:
        for t, x in zip(np.asarray(ts), np.asarray(xs), strict=True):
            series["ts"].append(float(t))
            series["mean_cosine"].append(float(mean_cosine(x)))
            last[:] = [x]

    wall, cpu = time.perf_counter(), time.process_time()
    statistics = solve_streaming(
        sim.field,
        sim.x0,
        on_snapshots=measure,
        integrator=sim.integrator,
        dt=sim.dt,
        t_end=t_end,
        save_every=sim.save_every,
        workers=1,
    )
    (x,) = last
    sample = _subsample(n, SAMPLE)
    return LongContextRun(
        d=d,
        n=n,
        gamma=gamma,
        beta=float(sim.kernel.profile.beta),
        seed=seed,
        t_end=t_end,
        interaction=sim.interaction,
        **{key: np.asarray(value) for key, value in series.items()},
        overlap=float(np.mean(np.sum(x * x0, axis=1))),
        clusters=int(n_clusters(x[sample], theta_c=THETA_C)),
        sample=int(sample.size),
        self_weight=measured_self_weight(x0, beta),
        final_self_weight=measured_self_weight(x, beta),
        status=str(np.asarray(statistics.statuses).reshape(-1)[0]),
        steps=int(statistics.steps),
        wall_s=time.perf_counter() - wall,
        cpu_s=time.process_time() - cpu,
    )


def summary_rows(runs: Sequence[LongContextRun]) -> list[dict]:
    """One row per run, sorted by (d, n, γ), with the predictions beside the measurements."""
    rows = []
    for run in sorted(runs, key=lambda r: (-r.d, r.n, r.gamma)):
        rows.append(
            {
                "d": run.d,
                "n": run.n,
                "gamma": run.gamma,
                "beta": run.beta,
                "t_end": run.t_end,
                "critical_gamma": critical_gamma(run.n, run.d),
                "horizon_gamma": (
                    horizon_gamma(run.n, run.d, run.t_end) if run.d >= MODE_ONE_FROM_D else None
                ),
                "self_weight": run.self_weight,
                "predicted_self_weight": predicted_self_weight(run.n, run.d, run.beta),
                "final_self_weight": run.final_self_weight,
                "mean_cosine": float(run.mean_cosine[-1]),
                "collapse": crossing_time(run.ts, run.mean_cosine),
                "overlap": run.overlap,
                "clusters": run.clusters,
                "sample": run.sample,
                "interaction": run.interaction,
                "status": run.status,
                "steps": run.steps,
                "cpu_s": run.cpu_s,
            }
        )
    return rows


def _table(rows: Sequence[dict]) -> str:
    lines = [
        "| d | n | γ | β | γ* | self-weight at t = 0 (predicted) | self-weight at T | mean cosine "
        "| collapse | overlap q | clusters / sample | CPU (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [
            str(row["d"]),
            f"{row['n']:,}",
            f"{row['gamma']:g}",
            f"{row['beta']:.1f}",
            f"{row['critical_gamma']:.3g}",
            f"{row['self_weight']:.2e} ({row['predicted_self_weight']:.2e})",
            f"{row['final_self_weight']:.2e}",
            f"{row['mean_cosine']:.3f}",
            "—" if row["collapse"] is None else f"{row['collapse']:.1f}",
            f"{row['overlap']:.3f}",
            f"{row['clusters']} / {row['sample']}",
            f"{row['cpu_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def midpoint_gamma(rows: Sequence[dict], *, level: float = 0.5) -> float | None:
    """The ``γ`` at which the final mean cosine of ``rows`` (one family, one ``n``) first falls
    through ``level``, interpolated linearly between the two grid points around it; ``None`` when it
    does not cross."""
    line = sorted(rows, key=lambda row: row["gamma"])
    for a, b in zip(line, line[1:], strict=False):
        if a["mean_cosine"] >= level > b["mean_cosine"]:
            fraction = (a["mean_cosine"] - level) / (a["mean_cosine"] - b["mean_cosine"])
            return a["gamma"] + fraction * (b["gamma"] - a["gamma"])
    return None


def _pivots(rows: Sequence[dict]) -> str:
    """Per family one row per n, one column per γ: the final mean cosine where the family collapses
    (d = 32, with the measured midpoint beside γ* and γ_T), else the final self-weight."""
    lines = []
    for d in sorted({row["d"] for row in rows}, reverse=True):
        mine = [row for row in rows if row["d"] == d]
        gammas = sorted({row["gamma"] for row in mine})
        high = d >= MODE_ONE_FROM_D
        quantity = "final mean cosine" if high else "final self-weight"
        extra = " | γ_T | measured γ at mean cosine 0.5" if high else ""
        lines += [
            f"d = {d}, {quantity} at t = {mine[0]['t_end']:g}:",
            "",
            "| n | γ*" + extra + " | " + " | ".join(f"γ = {g:g}" for g in gammas) + " |",
            "|---:|---:|" + ("---:|---:|" if high else "") + "---:|" * len(gammas),
        ]
        for n in sorted({row["n"] for row in mine}):
            line = {row["gamma"]: row for row in mine if row["n"] == n}
            first = next(iter(line.values()))
            cells = [f"{n:,}", f"{first['critical_gamma']:.3g}"]
            if high:
                middle = midpoint_gamma(list(line.values()))
                cells += [f"{first['horizon_gamma']:.2f}", "—" if middle is None else f"{middle:.2f}"]
            key, form = ("mean_cosine", ".3f") if high else ("final_self_weight", ".2e")
            cells += [format(line[g][key], form) if g in line else "" for g in gammas]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


MARKERS = {32: "o", 3: "^", 2: "s"}


def _plot(rows: Sequence[dict], path: Path) -> None:
    """Three panels: γ*(n, d) against n, the runs' (n, γ) as markers; the final mean cosine against
    γ at d = 32, γ* dotted and γ_T dashed; the final self-weight against γ in low d, γ* (d = 3)
    dotted. Matplotlib only here, at the edge of the study."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnflow.viz.plotting import save_figure

    fig = Figure(figsize=(16, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, middle, right = fig.subplots(1, 3)
    grid = np.unique(np.geomspace(16, 1e6, 60).astype(int))
    colours = {}
    for d in (2, 3, 8, 32, 128):
        (drawn,) = left.plot(grid, [critical_gamma(int(n), d) for n in grid], label=f"γ*, d = {d}")
        colours[d] = drawn.get_color()
    for d in sorted({row["d"] for row in rows}):
        mine = [row for row in rows if row["d"] == d]
        points = ([r["n"] for r in mine], [r["gamma"] for r in mine])
        left.scatter(*points, marker=MARKERS.get(d, "x"), s=14, color=colours.get(d), zorder=3)
    left.axhline(1.0, color="0.5", ls=":", lw=1)
    left.set(xscale="log", yscale="log", ylim=(0.3, 1e3), xlabel="n", ylabel="γ")
    left.set_title("γ*: n^γ = (n − 1) M_d(γ log n); markers: the runs", fontsize=10)
    left.legend(fontsize=7)
    t_end = rows[0]["t_end"] if rows else T_END
    for d, ax in ((32, middle), (None, right)):
        families = (
            [d] if d else sorted({row["d"] for row in rows if row["d"] < MODE_ONE_FROM_D}, reverse=True)
        )
        for family in families:
            for n in sorted({row["n"] for row in rows if row["d"] == family}):
                line = sorted((r for r in rows if (r["d"], r["n"]) == (family, n)), key=lambda r: r["gamma"])
                key = "mean_cosine" if d else "final_self_weight"
                points = ([r["gamma"] for r in line], [r[key] for r in line])
                style = "-" + MARKERS.get(family, "x")
                (drawn,) = ax.plot(*points, style, ms=4, label=f"d = {family}, n = {n:,}")
                if d:
                    ax.axvline(line[0]["critical_gamma"], color=drawn.get_color(), ls=":", lw=1)
                    ax.axvline(line[0]["horizon_gamma"], color=drawn.get_color(), ls="--", lw=1)
                elif family == 3:
                    ax.axvline(line[0]["critical_gamma"], color=drawn.get_color(), ls=":", lw=1)
    middle.set(xlabel="γ", ylabel=f"mean cosine at t = {t_end:g}", ylim=(-0.05, 1.05))
    middle.set_title("d = 32: collapsed (1) or frozen (0); dotted γ*, dashed γ_T", fontsize=10)
    right.set(xscale="log", yscale="log", xlabel="γ", ylabel=f"self-weight e^β / Σ e^(β s) at t = {t_end:g}")
    right.set_title("low d: no transition at a fixed γ (dotted: γ*, d = 3)", fontsize=10)
    for ax in (middle, right):
        if ax.get_legend_handles_labels()[0]:  # a family not run draws nothing
            ax.legend(fontsize=7)
    save_figure(fig, path)


def _run_or_load(folder: Path, n: int, d: int, gamma: float, *, t_end: float) -> LongContextRun:
    path = folder / f"d{d}_n{n}_gamma{gamma:g}.npz"
    if path.exists():
        run = read_record(LongContextRun, path)
        if run.t_end == t_end:
            return run
    run = run_long_context(n, d, gamma, t_end=t_end)
    write_record(path, run)
    return run


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnflow.workflows.long_context", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder (finished runs are kept)")
    parser.add_argument("--quick", action="store_true", help="small sizes (about a CPU-minute)")
    parser.add_argument("--t-end", type=float, default=T_END)
    args = parser.parse_args(argv)
    folder = args.out / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    clock = StudyClock()
    runs = []
    for d, (sizes, gammas) in (QUICK if args.quick else FAMILIES).items():
        for n in sizes:
            for gamma in gammas:
                run = _run_or_load(folder, n, d, gamma, t_end=args.t_end)
                runs.append(run)
                print(
                    f"d = {d}, n = {n:,}, γ = {gamma:g} (β = {run.beta:.2f}): {run.status}, "
                    f"mean cosine {run.mean_cosine[-1]:.3f}, overlap {run.overlap:.3f}, "
                    f"self-weight {run.final_self_weight:.2e}, {run.cpu_s:.1f} CPU-s",
                    flush=True,
                )
    rows = summary_rows(runs)
    study = {
        "quick": args.quick,
        "t_end": args.t_end,
        "normalization": "sa",
        "runs_cpu_s": float(sum(run.cpu_s for run in runs)),
        **clock.record(),
    }
    write_json(args.out / "results.json", {"study": study, "rows": rows})
    write_text(args.out / "table.md", _pivots(rows) + "\nEvery run:\n\n" + _table(rows))
    _plot(rows, args.out / "long_context.png")
    print(_pivots(rows), end="")
    print(f"CPU {study['cpu_s']:.0f} s, wall {study['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
