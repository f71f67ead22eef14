"""Long contexts: Llama-3's RoPE against the context length.

One attention head in Llama-3's head dimension ``d = d_h = 128`` (``[attention]`` with one head and
identity maps, the paper's normalisation ``usa``, no mask, ``β = 1``), positions ``ξ_i = i``, and
the RoPE of ``gauge.preset = "llama3.1"``: base ``θ = 500 000``, pairs ``(k, k + 64)``, with its
llama3 scaling (``gauge.scaling = "preset"``: ``s = 8``, ``L = 8192``) or without it
(``gauge.scaling = "none"``: the frequencies of Llama-3, ``θ^{−2k/128}``). Each of the two is run
with the values read as a transformer reads them (``attention.values = "plain"``: RoPE on the
logits only) and as the paper does (``"rotated"``), at ``n`` = :data:`SIZES` tokens.

The initial tokens are iid uniform on ``S^{127}``, drawn from the seed (``init.kind = "uniform"``):
with plain values they are the content ``x0``, the same for both scalings; with rotated values they
are the gauge frame ``u0 = Q(ξ) x0``, the same for both scalings, and ``x0 = Q(ξ)ᵀ u0``. Either way
``x0`` is an iid uniform sample, and the two scalings start from the same state of the frame
their dynamics lives in, so their difference is the scaling's, not the sample's. (With rotated
values the gauge frame ``u_i = Q(ξ_i) x_i`` follows the ungauged flow, whatever the frequencies:
both scalings give the same ``u(t)``, up to round-off.)

Measured on every snapshot: the mean cosine of the content ``x`` and of the gauge frame ``u``,
and the orbit residual ``max_i |x_i − Q(ξ_i)ᵀ u*|`` (``u*`` the normalised mean of ``u``; 0 exactly
on the orbit of one point). Reported per run: the final law's spread ``1 − |m|`` (``m`` the mean
token, :func:`~attnflow.analysis.metrics.marginal_spread`; 0 on a Dirac), the final orbit residual,
and the collapse time of ``x`` and of ``u`` (the first snapshot with mean cosine at least
:data:`THRESHOLD`, :func:`~attnflow.analysis.metrics.collapse_time`, refined between the two
snapshots that bracket it by :func:`crossing_time`).

On the orbit ``x_i = Q(ξ_i)ᵀ u*`` the spread has a closed form: pair ``k`` of ``u*`` (weight
``r_k²``) turns at ``ω_k`` and its mean shrinks by ``|S_k(n)|``, ``S_k(n) = (1/n) Σ_{j<n} e^{i ω_k j}``,
so ``|m|² = Σ_k r_k² |S_k(n)|²`` (:func:`orbit_spread`). The ungauged flow is invariant under
rotations and ``u0`` is uniform, so ``u*`` is uniform: ``E r_k² = 1/64`` and the typical spread is
``1 − (mean_k |S_k(n)|²)^{1/2}`` (:func:`typical_orbit_spread`), a curve in ``n`` for each scaling.

``python -m attnflow.workflows.context_study --out DIR`` writes one ``.npz`` per run under
``DIR/runs`` (kept: a rerun with the same ``t_end`` and ``dt`` skips it), ``results.json`` (every
run and the rows of the tables), ``table.md`` (two tables, plain and rotated values, one row per n,
each cell the two scalings) and ``context_study.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from attnflow.analysis.metrics import collapse_time, marginal_spread, mean_cosine
from attnflow.core import rope_presets
from attnflow.io.atomic import read_record, write_json, write_record, write_text
from attnflow.io.config import config_from_dict
from attnflow.io.provenance import StudyClock
from attnflow.numerics.solve import solve_streaming
from attnflow.viz.context_study import plot_context_study
from attnflow.workflows.build import build

__all__ = [
    "D",
    "DT",
    "PRESET",
    "SCALINGS",
    "SEEDS",
    "SIZES",
    "T_END",
    "THRESHOLD",
    "VALUES",
    "ContextRun",
    "crossing_time",
    "frequencies",
    "orbit_residual",
    "orbit_spread",
    "run_context",
    "study_config",
    "summary_rows",
    "typical_curves",
    "typical_orbit_spread",
]

PRESET = "llama3.1"
D = 128  # Llama-3's head dimension
VALUES = ("plain", "rotated")  # attention.values
SCALINGS = ("none", "preset")  # gauge.scaling: Llama-3's frequencies, then with the llama3 rule
SIZES = (256, 512, 1024, 2048, 4096)
SEEDS = (0, 1)
T_END = 10.0  # every run of the study has collapsed by t = 7 (docs/transformer-layer.md)
DT = 0.2  # RK4; snapshots every step
THRESHOLD = 0.999  # mean cosine of a collapsed frame


@dataclasses.dataclass(frozen=True)
class ContextRun:
    """One run: its setting, the series on every snapshot, the final values, and its cost."""

    values: str
    scaling: str
    n: int
    seed: int
    t_end: float
    dt: float
    ts: np.ndarray  # (T,)
    mean_cosine: np.ndarray  # (T,) of the content x
    gauge_mean_cosine: np.ndarray  # (T,) of the gauge frame u = Q x
    orbit_residual: np.ndarray  # (T,)
    spread: float  # 1 − |m| of the final x
    u_star: np.ndarray  # (d,) the final normalised mean of u
    status: str
    steps: int
    wall_s: float
    cpu_s: float

    @property
    def label(self) -> str:
        return f"{self.values}, {'llama3 scaling' if self.scaling == 'preset' else 'no scaling'}"


def study_config(
    n: int, *, values: str, scaling: str, seed: int, t_end: float = T_END, dt: float = DT
) -> dict:
    """The config of one run, as plain data (module docstring)."""
    return {
        "model": {"n": n, "d": D, "beta": 1.0, "normalization": "usa"},
        "aux": {"kind": "positions", "spacing": "index"},
        "gauge": {"kind": "rope", "preset": PRESET, "scaling": scaling},
        "attention": {"heads": 1, "head_dim": D, "values": values, "weights": "identity"},
        "init": {"kind": "uniform", "seed": seed},
        "solver": {"method": "rk4", "dt": dt, "t_end": t_end, "save_every": dt, "dtype": "float64"},
    }


def frequencies(scaling: str) -> np.ndarray:
    """The RoPE frequencies of :data:`PRESET` under ``gauge.scaling`` (as ``build`` makes them)."""
    preset = rope_presets.get_preset(PRESET)
    if scaling == "preset":
        return rope_presets.scaled_frequencies(preset)
    return rope_presets.base_frequencies(preset)


def orbit_residual(x: np.ndarray, gauge) -> float:
    """``max_i |x_i − Q(ξ_i)ᵀ u*|``, ``u*`` the normalised mean of ``u = Q x``: the formula of
    :func:`attnflow.analysis.metrics.orbit_residual`, through the gauge's own ``apply`` (its
    ``n × d × d`` matrices would be 512 MiB at n = 4096)."""
    return float(np.max(np.linalg.norm(x - _orbit(x, gauge)[1], axis=1)))


def _orbit(x: np.ndarray, gauge) -> tuple[np.ndarray, np.ndarray]:
    """``(u*, Q(ξ)ᵀ u*)``: the orbit's base point and its points."""
    u_mean = np.mean(np.asarray(gauge.apply(jnp.asarray(x))), axis=0)
    u_star = u_mean / np.linalg.norm(u_mean)
    return u_star, np.asarray(gauge.apply_transpose(jnp.broadcast_to(jnp.asarray(u_star), x.shape)))


def _pair_means(omega: np.ndarray, n: int) -> np.ndarray:
    """``|S_k(n)|²``, ``S_k(n) = (1/n) Σ_{j<n} e^{i ω_k j}`` (positions ``0 … n−1``)."""
    angles = np.outer(np.arange(n, dtype=np.float64), omega)
    return np.mean(np.cos(angles), axis=0) ** 2 + np.mean(np.sin(angles), axis=0) ** 2


def orbit_spread(u_star: np.ndarray, omega: np.ndarray, n: int) -> float:
    """``1 − |(1/n) Σ_i Q(ξ_i)ᵀ u*|`` for ``ξ_i = i`` and the "half" pair layout, in closed form:
    ``|m|² = Σ_k r_k² |S_k(n)|²`` with ``r_k² = u*_k² + u*_{k+m}²`` (coordinates past ``2m`` do not turn)."""
    m = omega.size
    weights = u_star[:m] ** 2 + u_star[m : 2 * m] ** 2
    rest = float(np.sum(u_star[2 * m :] ** 2))
    return 1.0 - float(np.sqrt(np.sum(weights * _pair_means(omega, n)) + rest))


def typical_orbit_spread(omega: np.ndarray, n: int, d: int = D) -> float:
    """``1 − (E|m|²)^{1/2}`` for ``u*`` uniform on ``S^{d−1}`` (``E r_k² = 2/d``)."""
    return 1.0 - float(np.sqrt(2.0 / d * np.sum(_pair_means(omega, n)) + (d - 2 * omega.size) / d))


def typical_curves(sizes: Sequence[int], points: int = 24) -> dict[str, list[tuple[int, float]]]:
    """:func:`typical_orbit_spread` at ``points`` sizes from the smallest of ``sizes`` to the
    largest, for each scaling (the dotted curves of the figure)."""
    grid = np.unique(np.geomspace(min(sizes), max(sizes), points).astype(int))
    return {
        scaling: [(int(n), typical_orbit_spread(frequencies(scaling), int(n))) for n in grid]
        for scaling in SCALINGS
    }


def crossing_time(ts: np.ndarray, values: np.ndarray, *, threshold: float = THRESHOLD) -> float | None:
    """When ``values`` (a mean cosine) reaches ``threshold``: :func:`collapse_time`'s snapshot
    ``t_k``, refined by interpolating ``log(1 − value)`` linearly from ``t_{k−1}`` (near a collapse
    ``1 − value`` falls exponentially); ``None`` if it never does."""
    hit = collapse_time(ts, values, threshold=threshold)
    if hit is None:
        return None
    k = int(np.flatnonzero(np.asarray(ts) == hit)[0])
    if k == 0:
        return hit
    before, after = 1.0 - float(values[k - 1]), max(1.0 - float(values[k]), 1e-300)
    if not before > 1.0 - threshold:  # a NaN before: nothing to interpolate
        return hit
    fraction = np.log(before / (1.0 - threshold)) / np.log(before / after)
    return float(ts[k - 1] + fraction * (ts[k] - ts[k - 1]))


def run_context(
    n: int, *, values: str, scaling: str, seed: int = 0, t_end: float = T_END, dt: float = DT
) -> ContextRun:
    """Build the run of :func:`study_config` with attnflow's ``build`` and solve it with its RK4
    (``solve_streaming``), measuring each snapshot as it comes."""
    sim = build(
        config_from_dict(study_config(n, values=values, scaling=scaling, seed=seed, t_end=t_end, dt=dt))
    )
    (head,) = sim.field.heads
    gauge = head.gauge
    x0 = sim.x0 if values == "plain" else gauge.apply_transpose(sim.x0)  # rotated: u0 is the sample
    series: dict[str, list] = {"ts": [], "mean_cosine": [], "gauge_mean_cosine": [], "orbit_residual": []}
    last: list[np.ndarray] = []

    def measure(ts, xs) -> None:
        for t, x in zip(np.asarray(ts), np.asarray(xs), strict=True):
            series["ts"].append(float(t))
            series["mean_cosine"].append(float(mean_cosine(x)))
            series["gauge_mean_cosine"].append(float(mean_cosine(np.asarray(gauge.apply(jnp.asarray(x))))))
            series["orbit_residual"].append(orbit_residual(x, gauge))
            last[:] = [x]

    wall, cpu = time.perf_counter(), time.process_time()
    statistics = solve_streaming(
        sim.field,
        x0,
        on_snapshots=measure,
        integrator=sim.integrator,
        dt=dt,
        t_end=t_end,
        save_every=dt,
        workers=1,
    )
    (x,) = last
    return ContextRun(
        values=values,
        scaling=scaling,
        n=n,
        seed=seed,
        t_end=t_end,
        dt=dt,
        **{key: np.asarray(value) for key, value in series.items()},
        spread=float(marginal_spread(x)),
        u_star=_orbit(x, gauge)[0],
        status=str(np.asarray(statistics.statuses).reshape(-1)[0]),
        steps=int(statistics.steps),
        wall_s=time.perf_counter() - wall,
        cpu_s=time.process_time() - cpu,
    )


def summary_rows(runs: Sequence[ContextRun]) -> list[dict]:
    """One row per (values, scaling, n): the means over the seeds of the final spread, the final
    orbit residual, the collapse times of ``x`` and ``u`` (``None`` when a seed did not collapse by
    ``t_end``), with the closed-form orbit spread of each run's ``u*`` and its typical value."""
    rows = []
    for values in VALUES:
        for scaling in SCALINGS:
            omega = frequencies(scaling)
            for n in sorted({run.n for run in runs}):
                mine = [r for r in runs if (r.values, r.scaling, r.n) == (values, scaling, n)]
                if not mine:
                    continue
                content = [crossing_time(r.ts, r.mean_cosine) for r in mine]
                frame = [crossing_time(r.ts, r.gauge_mean_cosine) for r in mine]
                rows.append(
                    {
                        "values": values,
                        "scaling": scaling,
                        "n": n,
                        "seeds": [r.seed for r in mine],
                        "spread": float(np.mean([r.spread for r in mine])),
                        "orbit_residual": float(np.mean([r.orbit_residual[-1] for r in mine])),
                        "collapse_x": _mean_or_none(content),
                        "collapse_u": _mean_or_none(frame),
                        "orbit_spread": float(np.mean([orbit_spread(r.u_star, omega, n) for r in mine])),
                        "typical_orbit_spread": typical_orbit_spread(omega, n),
                        "status": ",".join(sorted({r.status for r in mine})),
                        "cpu_s": float(sum(r.cpu_s for r in mine)),
                    }
                )
    return rows


def _mean_or_none(times: Sequence[float | None]) -> float | None:
    return None if any(t is None for t in times) else float(np.mean(times))


def _time(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


_COLUMNS = {  # per values: (heading, row key, format) of each column after n
    "plain": (
        ("collapse of x", "collapse_x", None),
        ("spread 1 − \\|m\\|", "spread", ".1e"),
        ("orbit residual", "orbit_residual", ".3f"),
    ),
    "rotated": (
        ("collapse of u", "collapse_u", None),
        ("spread 1 − \\|m\\|", "spread", ".4f"),
        ("typical orbit spread", "typical_orbit_spread", ".4f"),
        ("orbit residual", "orbit_residual", ".1e"),
    ),
}


def _cell(rows: Sequence[dict], key: str, form: str | None) -> str:
    """The values of the scalings, in the order of ``SCALINGS``, as ``a / b``."""
    return " / ".join(_time(row[key]) if form is None else format(row[key], form) for row in rows)


def _table(rows: Sequence[dict]) -> str:
    """Two tables, plain and rotated values: one row per n, each cell "no scaling / llama3"."""
    lines = []
    for values, columns in _COLUMNS.items():
        mine = [row for row in rows if row["values"] == values]
        if not mine:
            continue
        lines += [
            f"{values.capitalize()} values (each cell: no scaling / llama3 scaling):",
            "",
            "| n | " + " | ".join(heading for heading, _, _ in columns) + " | CPU (s) |",
            "|---:|" + "---:|" * (len(columns) + 1),
        ]
        for n in sorted({row["n"] for row in mine}):
            pair = sorted(
                (row for row in mine if row["n"] == n), key=lambda row: SCALINGS.index(row["scaling"])
            )
            cells = [_cell(pair, key, form) for _, key, form in columns]
            cpu = sum(row["cpu_s"] for row in pair)
            lines.append(f"| {n:,} | " + " | ".join(cells) + f" | {cpu:.1f} |")
        lines.append("")
    return "\n".join(lines)


def _run_or_load(
    folder: Path, n: int, *, values: str, scaling: str, seed: int, t_end: float, dt: float
) -> ContextRun:
    path = folder / f"{values}_{scaling}_n{n}_seed{seed}.npz"
    if path.exists():
        run = read_record(ContextRun, path)
        if (run.t_end, run.dt) == (t_end, dt):
            return run
    run = run_context(n, values=values, scaling=scaling, seed=seed, t_end=t_end, dt=dt)
    write_record(path, run)
    return run


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnflow.workflows.context_study", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder (finished runs are kept)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--t-end", type=float, default=T_END)
    parser.add_argument("--dt", type=float, default=DT)
    args = parser.parse_args(argv)
    folder = args.out / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    clock = StudyClock()
    runs = []
    for n in sorted(args.sizes):
        for seed in args.seeds:
            for values in VALUES:
                for scaling in SCALINGS:
                    run = _run_or_load(
                        folder, n, values=values, scaling=scaling, seed=seed, t_end=args.t_end, dt=args.dt
                    )
                    runs.append(run)
                    print(
                        f"{run.label}, n = {n:,}, seed {seed}: {run.status}, spread {run.spread:.4f}, "
                        f"orbit residual {run.orbit_residual[-1]:.2e}, {run.cpu_s:.1f} CPU-s",
                        flush=True,
                    )
    rows = summary_rows(runs)
    study = {
        "preset": PRESET,
        "d": D,
        "t_end": args.t_end,
        "dt": args.dt,
        "threshold": THRESHOLD,
        "seeds": args.seeds,
        "sizes": sorted(args.sizes),
        "runs_cpu_s": float(sum(run.cpu_s for run in runs)),
        **clock.record(),
    }
    write_json(
        args.out / "results.json",
        {
            "study": study,
            "rows": rows,
            "runs": [
                {
                    "values": r.values,
                    "scaling": r.scaling,
                    "n": r.n,
                    "seed": r.seed,
                    "spread": r.spread,
                    "orbit_residual": float(r.orbit_residual[-1]),
                    "collapse_x": crossing_time(r.ts, r.mean_cosine),
                    "collapse_u": crossing_time(r.ts, r.gauge_mean_cosine),
                    "status": r.status,
                    "steps": r.steps,
                    "wall_s": r.wall_s,
                    "cpu_s": r.cpu_s,
                }
                for r in runs
            ],
        },
    )
    write_text(args.out / "table.md", _table(rows))
    plot_context_study(runs, rows, typical_curves(args.sizes), args.out / "context_study.png")
    print(_table(rows), end="")
    print(f"CPU {study['cpu_s']:.0f} s, wall {study['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
