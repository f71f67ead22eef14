"""Does the RoPE orbit of E1 survive W_Q != W_K? A study beyond the paper (issue 22, section 4).

One head on S^2, RoPE ``G(ξ_i)`` (full_period, ξ_i = i), usa, no mask, ``W_V = W_O = I``,
``W_Q = I`` and ``W_K = I + ε B`` with one fixed Gaussian ``B`` (entries N(0, 1/d), seed 0), so that
``‖W_Qᵀ W_K − I‖₂ = ε ‖B‖₂``; and, to tell the logits' part from the values', ``W_Q = W_K = I`` with
``W_V = I + ε B`` (rotated values). For each ε and for plain and rotated values, a few seeds of uniform
initial tokens run to τ = 20 (Dormand-Prince, rtol 1e-7, as E1) and the final state is measured
against the orbit of the gauge: the orbit residual ``max_i |x_i − G(ξ_i)ᵀ u*|`` (0 on an orbit) and
the spread of the gauge frame ``1 − mean cosine of u_i = G(ξ_i) x_i`` (0 when it has collapsed).

    python scripts/orbit_maps_study.py        # about two minutes on 2 cores
    python scripts/orbit_maps_study.py --draw # only the figure, from the JSON

writes ``docs/figures/orbit_maps.png`` and ``docs/figures/orbit_maps.json`` (the numbers of the figure).
The ε = 0, rotated point is E13 (the layer form of E1); docs/experiments-attention.md reads the figure.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import attnflow  # noqa: F401  (enables float64)
from attnflow.analysis import metrics
from attnflow.core import factors, gauges, sphere
from attnflow.core.heads import make_head
from attnflow.core.kernel import make_profile
from attnflow.numerics import integrators
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.solve import solve

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"
N, D, T_END, SEEDS = 32, 3, 20.0, (0, 1, 2)
EPSILONS = (0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
# rotated or plain values with W_K = I + ε B (x: |W_Q^T W_K - I|); rotated values with W_Q = W_K = I
# and W_V = I + ε B instead (x: |W_V - I|), to tell the logits' part from the values'
SERIES = ("rotated", "plain", "rotated, W_V perturbed")


def run(epsilon: float, series: str, b: np.ndarray, gauge, x0: jax.Array) -> dict:
    """Final states of the seeds ``x0 (B, n, d)`` for one ε and one series, measured."""
    values = "plain" if series == "plain" else "rotated"
    key, value = np.eye(D) + epsilon * b, np.eye(D)
    if series == "rotated, W_V perturbed":  # W_Q = W_K = I, W_V = I + ε B: is it the values?
        key, value = value, key
    factor = factors.NoFactor(n=N)
    head = make_head(np.eye(D), key, value, np.eye(D), gauge=gauge, factor=factor, values=values)
    field = HeadsField((head,), make_profile("exp", beta=1.0))
    trajectory = solve(field, x0, integrator=integrators.make_integrator("adaptive", rtol=1e-7, atol=1e-9),
                       dt=0.01, t_end=T_END, save_every=T_END, workers=1)  # fmt: skip
    q = np.asarray(gauge.matrices())
    finals = np.asarray(trajectory.xs)[-1]
    residual = [float(metrics.orbit_residual(x, q)) for x in finals]
    spread = [1.0 - float(metrics.mean_cosine(np.einsum("nij,nj->ni", q, x))) for x in finals]
    statuses = [str(s) for s in np.ravel(trajectory.statuses)]
    return {"orbit_residual": residual, "gauge_spread": spread, "statuses": statuses}


def main() -> int:
    if sys.argv[1:] == ["--draw"]:  # redraw the figure from the numbers already written
        draw(json.loads((OUT / "orbit_maps.json").read_text())["rows"], OUT / "orbit_maps.png")
        return 0
    start = time.perf_counter()
    b = np.random.default_rng(0).normal(0.0, 1.0 / np.sqrt(D), (D, D))
    norm_b = float(np.linalg.norm(b, 2))
    gauge = gauges.make_rope(range(N), D, gauges.rope_frequencies(D, kind="full_period", n=N))
    x0 = jnp.stack([sphere.sample_uniform(seed, N, D) for seed in SEEDS])
    rows = []
    for series in SERIES:
        for epsilon in EPSILONS:
            measured = run(epsilon, series, b, gauge, x0)
            rows.append({"series": series, "epsilon": epsilon, "distance": epsilon * norm_b, **measured})
            worst = {key: max(measured[key]) for key in ("orbit_residual", "gauge_spread")}
            print(f"{series:22s} distance {epsilon * norm_b:.3g}: orbit residual "
                  f"{worst['orbit_residual']:.3g}, gauge spread {worst['gauge_spread']:.3g}")  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    record = {"n": N, "d": D, "t_end": T_END, "seeds": list(SEEDS), "norm_B": norm_b, "rows": rows,
              "wall_s": time.perf_counter() - start}  # fmt: skip
    (OUT / "orbit_maps.json").write_text(json.dumps(record, indent=1) + "\n")
    draw(rows, OUT / "orbit_maps.png")
    print(f"wrote {OUT / 'orbit_maps.png'} ({record['wall_s']:.0f} s)")
    return 0


def draw(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), constrained_layout=True)
    floor = 1e-16  # zeros drawn on the axis floor of the log scale
    labels = {"rotated": "rotated values", "plain": "plain values",
              "rotated, W_V perturbed": "rotated values, W_Q = W_K = I, x = |W_V - I|"}  # fmt: skip
    for series, colour in zip(SERIES, ("C0", "C3", "C2"), strict=True):
        mine = [r for r in rows if r["series"] == series]
        dist = np.array([max(r["distance"], 1e-4) for r in mine])
        for ax, key in zip(axes, ("orbit_residual", "gauge_spread"), strict=True):
            per_seed = np.maximum(np.array([r[key] for r in mine]), floor)
            ax.plot(dist, np.median(per_seed, axis=1), "-o", color=colour, label=f"{labels[series]} (median)")
            for column in per_seed.T:
                ax.plot(dist, column, ".", color=colour, alpha=0.35)
    titles = ("orbit residual max_i |x_i - G_i^T u*|", "gauge-frame spread 1 - mean cos(u)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("|W_Q^T W_K - I|_2 (0 drawn at 1e-4)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8, loc="center right")  # the empty middle of the spread panel
    fig.suptitle(f"RoPE orbit with W_Q != W_K or W_V != I: one head, full-period RoPE, n = {N}, d = {D}, "
                 f"tau = {T_END:g}, W_O = I, 3 seeds (dots)",
                 fontsize=10)  # fmt: skip
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
