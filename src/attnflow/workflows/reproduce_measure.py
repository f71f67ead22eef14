"""Measuring a reproduce job from its stored snapshots (never a second simulation).

Energies of all snapshots and seeds by one compiled program per kernel structure and size (a
fixed number of states per call: jobs of other lengths and seed counts reuse it), gauge frames
and mean cosines in NumPy, then the diagnostics of :mod:`attnflow.analysis.metrics` per seed at
the report times and at the end (:func:`measure`); every value is one of
:data:`attnflow.io.outcomes.METRICS`, of :data:`LAYER_METRICS` or of
:data:`attnflow.workflows.reproduce_rates.THEORY_METRICS` (the closed forms of the flow: rates
near the end state, the equiangular reduction, the causal two-token motion).

A layer of attention heads (:class:`attnflow.numerics.heads_field.HeadsField`) is measured with
its own energy (``field.energy``: the sum over the heads; the simulation's kernel is the identity's),
no theoretical maximum (``energy_gap`` is null), its gauge frame ``u_i = G(ξ_i) x_i`` taken from the
first head's gauge where it acts in dimension ``d``, and the values of :data:`LAYER_METRICS` (also
measured for a causal field or one with held sources): whether the field is a gradient flow, the
distances to the first token's initial point, the alignment with the first head's logit axis.

Also the states a realisation's figure shows
(:func:`trajectory_states`, :func:`householder_frame`, :func:`orbit_frame`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.plateaus import detect_plateaus
from attnflow.analysis.summary import COLLAPSE_THRESHOLD, ENERGY_TOL
from attnflow.core.kernel import Kernel
from attnflow.io.outcomes import MEAN_COSINE_TOL, FigureData, time_label
from attnflow.numerics.layer_norms import LayerNormField
from attnflow.numerics.summation import energy
from attnflow.workflows.build import Simulation
from attnflow.workflows.experiments import Experiment
from attnflow.workflows.reproduce_rates import theory_values

__all__ = [
    "CONJUGATE_METRICS",
    "LAYER_METRICS",
    "householder_frame",
    "is_layer",
    "layer_values",
    "json_value",
    "measure",
    "orbit_frame",
    "series_values",
    "snapshot_values",
    "trajectory_states",
]

THETA_C = 0.1  # cluster threshold (rad), the diagnostics' default
SERIES_POINTS = 50  # snapshots per seed of the costly per-snapshot series (cluster counts)


ENERGY_CHUNK = 64  # states per compiled energy call (the last call is padded)

# The values measured for a layer of heads, a causal field or a field with held sources (besides
# those of attnflow.io.outcomes.METRICS), with their meaning.
LAYER_METRICS = {
    "gradient_flow": "the field is the gradient flow of its energy (usa, no mask, heads of case (a) or (b))",
    "first_token_distance": "max_i |x_i(t) - x_0(0)|: the distance of the farthest token to the first "
    "token's initial point (a held source, or the first token of a causal mask)",
    "first_token_displacement": "|x_0(t) - x_0(0)|: how far the first token moved",
    "qk_axis_alignment": "min_i |<x_i, e>|, e the top eigenvector of sym(W_Q^T W_K) of the first head "
    "(1: every token at +-e)",
}

# Measured where the experiment is ``conjugate`` (each seed solved again without its gauge).
CONJUGATE_METRICS = {
    "conjugate_gap": "max over the saved times and tokens of |u_i(t) - y_i(t)|, u the gauge frame and y the "
    "same kernel's flow without the gauge (Q = I) from u(0): 0 up to the solver's error by conjugacy",
}


@partial(jax.jit, static_argnames="block_size")
def _energy_chunk(kernel, xs, block_size=None):
    """``E`` of each state of ``xs (ENERGY_CHUNK, n, d)``."""
    return jax.vmap(lambda x: energy(kernel, x, block_size=block_size))(xs)


@partial(jax.jit, static_argnums=0)
def _field_energy_chunk(field, xs):
    """``field.energy`` of each state of ``xs (ENERGY_CHUNK, n, d)`` (a field of heads: its own
    program, the field is compared by identity)."""
    return jax.vmap(field.energy)(xs)


def _energies(kernel, xs: np.ndarray, block_size=None, *, field=None) -> np.ndarray:
    """``E`` of every snapshot and seed, ``xs (T, B, n, d) -> (T, B)``, ``ENERGY_CHUNK`` states a
    call: one compilation per kernel structure and size, whatever ``T`` and ``B``. With ``field``
    (a layer of heads), its own ``field.energy`` instead of the kernel's."""
    states = xs.reshape(-1, *xs.shape[2:])
    count = len(states)
    padded = np.concatenate([states, np.repeat(states[-1:], -count % ENERGY_CHUNK, axis=0)])

    def chunk(part):
        if field is not None:
            return _field_energy_chunk(field, part)
        return _energy_chunk(kernel, part, block_size=block_size)

    chunks = [chunk(jnp.asarray(padded[i : i + ENERGY_CHUNK])) for i in range(0, len(padded), ENERGY_CHUNK)]
    return np.concatenate([np.asarray(chunk) for chunk in chunks])[:count].reshape(xs.shape[:2])


@jax.jit
def _gauge_matrices(gauge):
    """``Q(ξ_i) (n, d, d)``: one compiled program (called eagerly, a gauge's ``matrices`` compiles
    each of its operations on its own)."""
    return gauge.matrices()


def _gauge_frames(q: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``u_i = Q_i x_i`` of every snapshot and seed, ``xs (T, B, n, d)``, ``q (n, d, d)``."""
    return np.einsum("nij,tbnj->tbni", q, xs)


def _mean_cosines(xs: np.ndarray) -> np.ndarray:
    """:func:`attnflow.analysis.metrics.mean_cosine` of every snapshot and seed (unit rows:
    ``(n|m|² − 1)/(n − 1)``, ``m`` the mean), ``xs (T, B, n, d) -> (T, B)``."""
    n = xs.shape[-2]
    if n == 1:
        return np.ones(xs.shape[:2])
    m = xs.mean(axis=-2)
    return (n * np.sum(m * m, axis=-1) - 1.0) / (n - 1)


def json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    value = float(value)
    return value if np.isfinite(value) else None


def _cyclic_maxima(values: np.ndarray) -> int:
    return int(np.sum((values > np.roll(values, 1)) & (values >= np.roll(values, -1))))


def snapshot_values(x: np.ndarray, u: np.ndarray, q: np.ndarray | None, groups) -> dict[str, Any]:
    """Every snapshot quantity of :data:`METRICS` for one seed's state ``x (n, d)``."""
    n, d = x.shape
    values = metrics.snapshot_summary(x, q=q, groups=groups, theta_c=THETA_C)
    gauge_labels = metrics.cluster_labels(u, theta_c=THETA_C)
    p = np.bincount(gauge_labels) / n
    values.update(gauge_n_clusters=int(gauge_labels.max()) + 1, gauge_n_eff=float(1.0 / np.sum(p * p)))
    if d == 3:
        q_or_eye = np.broadcast_to(np.eye(d), (n, d, d)) if q is None else q
        u_star = np.asarray(metrics.orbit_base_point(x, q_or_eye))
        normal = np.linalg.eigh(x.T @ x)[1][:, 0]
        values.update(
            std_x3=float(np.std(x[:, 2])),
            u_star_3=abs(float(u_star[2])),
            circle_deficit=1.0 - abs(float(u_star[2])),
            circle_azimuth_uniformity=float(metrics.azimuth_uniformity(x, axis=normal)),
            latitude_oscillations=_cyclic_maxima(x[:, 2]),
        )
    return {key: json_value(value) for key, value in values.items()}


def series_values(ts, energies, mean_cos, gauge_mean_cos, e_max) -> dict[str, Any]:
    """The quantities of a time series up to its last entry (energies and cosines ``(T,)``); the
    plateaus of the energy staircase (:func:`attnflow.analysis.plateaus.detect_plateaus`, flatness
    per e-fold of time, so the same in ``t`` as in ``t e^β``), times in the run's own unit."""
    e_last = float(energies[-1])
    ts = np.asarray(ts, dtype=np.float64)
    plateaus = detect_plateaus(ts, energies) if np.count_nonzero(ts > 0) >= 3 else None
    return {
        "n_plateaus": None if plateaus is None else len(plateaus),
        "plateau_longest": max((p.lifetime for p in plateaus), default=0.0) if plateaus is not None else None,
        "plateau_first_entry": plateaus[0].entry if plateaus else None,
        "plateau_last_lifetime": plateaus[-1].lifetime if plateaus else None,
        "energy": e_last,
        "energy_max": e_max,
        "energy_gap": None if e_max is None else (e_max - e_last) / e_max,
        "energy_monotone": metrics.is_monotone(energies, tol=ENERGY_TOL * max(1.0, abs(e_last))),
        "energy_max_decrease": metrics.max_decrease(energies),
        "mean_cosine_monotone": metrics.is_monotone(mean_cos, tol=MEAN_COSINE_TOL),
        "mean_cosine_max_decrease": metrics.max_decrease(mean_cos),
        "collapse_time": metrics.collapse_time(ts, mean_cos, threshold=COLLAPSE_THRESHOLD),
        "gauge_collapse_time": metrics.collapse_time(ts, gauge_mean_cos, threshold=COLLAPSE_THRESHOLD),
    }


def _time_indices(ts: np.ndarray, report_times: Sequence[float]) -> dict[str, int]:
    found = {time_label(None): len(ts) - 1}
    for t in report_times:
        k = int(np.argmin(np.abs(ts - t)))
        if abs(ts[k] - t) <= 1e-9 * max(1.0, t):
            found[time_label(t)] = k
    return found


def _layer_gauge(field) -> np.ndarray | None:
    """``G(ξ_i) (n, d, d)`` of the first head of a layer, where it is a gauge in dimension ``d``."""
    gauge = field.heads[0].gauge
    if gauge.is_identity or gauge.d != field.d:
        return None
    return np.asarray(_gauge_matrices(gauge))


def _qk_axis(field) -> np.ndarray | None:
    """The top eigenvector of ``sym(W_Qᵀ W_K)`` of the first head (its largest logit's direction)."""
    if not hasattr(field, "heads"):
        return None
    head = field.heads[0]
    a = np.asarray(head.query, dtype=np.float64).T @ np.asarray(head.key, dtype=np.float64)
    return np.linalg.eigh(0.5 * (a + a.T))[1][:, -1]


def is_layer(field) -> bool:
    """Whether ``field`` gets the values of :data:`LAYER_METRICS`: heads, a mask or held sources."""
    return hasattr(field, "heads") or field.causal is not False or field.sources > 0


def layer_values(field, x: np.ndarray, x_first: np.ndarray, axis: np.ndarray | None) -> dict[str, Any]:
    """:data:`LAYER_METRICS` of one seed's state ``x (n, d)``; ``x_first`` its first token at
    ``t = 0``, ``axis`` the first head's logit axis (:func:`_qk_axis`) or None."""
    values = {
        "gradient_flow": bool(field.gradient_flow),
        "first_token_distance": float(np.max(np.linalg.norm(x - x_first, axis=1))),
        "first_token_displacement": float(np.linalg.norm(x[0] - x_first)),
        "qk_axis_alignment": None if axis is None else float(np.min(np.abs(x @ axis))),
    }
    return {key: json_value(value) for key, value in values.items()}


def measure(
    sim: Simulation,
    ts: np.ndarray,
    xs: np.ndarray,
    seeds,
    experiment: Experiment,
    *,
    e_max: float | None,
    tables: Kernel | None = None,
    radii: np.ndarray | None = None,
    conjugate: np.ndarray | None = None,
) -> tuple[list, FigureData]:
    """Per-seed values at the report times and at the end, from snapshots ``xs (T, B, n, d)``;
    ``e_max`` is the theory's maximal energy (:func:`attnflow.analysis.theory.energy_max`) or None.
    ``tables``: the same kernel as ``sim``'s with its gauge as matrices and its factor as a matrix
    (``DenseGauge``, ``MatrixFactor``), if there is one: the energies and gauge matrices are taken
    from it (programs shared by every gauge and factor); a gauge frame is measured only where
    ``sim``'s gauge is not the identity. A layer of heads (``sim.field.heads``) is measured with
    ``sim.field.energy``, no ``e_max``, and the first head's gauge as the gauge frame (where it
    acts in dimension ``d``). A layer norm (:class:`~attnflow.numerics.layer_norms.LayerNormField`) is
    measured as its layer, on the directions ``xs``, with the radii ``radii (T, B, n)`` of pre and peri
    (None otherwise) and the norm handed to the closed forms. ``conjugate (T, B, n, d)``: the flow without
    the gauge from the gauge frame's initial state (a ``conjugate`` experiment), for
    :data:`CONJUGATE_METRICS`."""
    norm = sim.field if isinstance(sim.field, LayerNormField) else None
    if norm is not None:
        sim = dataclasses.replace(sim, field=norm.layer)
    heads = hasattr(sim.field, "heads")
    if tables is not None and tables is not sim.kernel and (heads or sim.field.sources > 0):
        # the snapshots came from a field rebuilt from the tabulated kernel: the paper's field, which
        # has neither the heads nor (as rebuilt by reproduce) the held sources
        raise ValueError(
            "reproduce: a layer of heads or held sources must be solved as built, not from a tabulated "
            "kernel; got a tabulated kernel (set `solver.block_size` below `model.n` in the experiment)."
        )
    kernel = sim.kernel if tables is None else tables
    if heads:
        q = _layer_gauge(sim.field)
        gauged, e_max = q is not None, None
        energies = _energies(kernel, xs, field=sim.field)
    else:
        gauged = not sim.kernel.gauge.is_identity
        q = np.asarray(_gauge_matrices(kernel.gauge)) if gauged else None
        energies = _energies(kernel, xs, block_size=sim.block_size)
    us = _gauge_frames(q, xs) if gauged else xs
    mean_cos = _mean_cosines(xs)
    gauge_mean_cos = _mean_cosines(us) if gauged else mean_cos
    layer, axis = is_layer(sim.field), _qk_axis(sim.field)
    w = np.asarray(kernel.factor.dense(), dtype=np.float64) if not heads else None
    theory = theory_values(sim, w, ts, mean_cos, gauge_mean_cos, xs, us, experiment, axis=axis, norm=norm,
                           radii=radii, energies=None if heads else energies)  # fmt: skip
    if conjugate is not None:  # NaN (a run that stopped early) stays NaN: the row then fails
        gaps = np.max(np.linalg.norm(us - conjugate, axis=-1), axis=(0, 2))
    indices = _time_indices(ts, experiment.report_times)
    values = []
    for b, seed in enumerate(seeds):
        per_time, cache = {"seed": seed}, {}
        for label, k in indices.items():
            if k not in cache:
                window = (ts[: k + 1], energies[: k + 1, b], mean_cos[: k + 1, b], gauge_mean_cos[: k + 1, b])
                series = {key: json_value(v) for key, v in series_values(*window, e_max).items()}
                cache[k] = snapshot_values(xs[k, b], us[k, b], q, sim.groups) | series
                if layer:
                    cache[k] |= layer_values(sim.field, xs[k, b], xs[0, b, 0], axis)
                if theory is not None:
                    at_k = {key: v if np.ndim(v) == 0 else v[k] for key, v in theory[b].items()}
                    cache[k] |= {key: json_value(v) for key, v in at_k.items()}
                if conjugate is not None:
                    cache[k]["conjugate_gap"] = json_value(gaps[b])
            per_time[label] = cache[k]
        values.append(per_time)
    figure = FigureData(
        color=sim.xi if sim.xi.ndim == 1 else sim.xi[:, 0],
        states={label: (xs[k, 0], us[k, 0] if gauged else None) for label, k in indices.items()},
        series={"t": ts, "energy": energies[:, 0], "mean_cosine": mean_cos[:, 0],
                "gauge_mean_cosine": gauge_mean_cos[:, 0]},
        seed_series={"energy": energies.T},
        beta=float(sim.kernel.profile.beta),
    )  # fmt: skip
    if "gauge_n_clusters" in experiment.series_metrics:
        # A cluster count costs O(n²) in NumPy per snapshot: at most SERIES_POINTS of them per seed.
        stride = max(1, -(-(len(ts) - 1) // SERIES_POINTS))
        picked = np.unique(np.r_[np.arange(0, len(ts), stride), len(ts) - 1])
        counts = [metrics.cluster_counts(us[picked, b], theta_c=THETA_C) for b in range(len(seeds))]
        figure.series["gauge_n_clusters_t"] = ts[picked]
        figure.seed_series["gauge_n_clusters"] = np.asarray(counts)
    return values, figure


def trajectory_states(trajectory, t_end: float) -> dict[str, np.ndarray]:
    """States at τ = 0, 20 and the end from a realisation's trajectory (a Trajectory or (T, n, d))."""
    xs = np.asarray(getattr(trajectory, "xs", trajectory))
    if xs.ndim != 3:
        return {}
    ts = np.asarray(getattr(trajectory, "ts", np.linspace(0.0, t_end, len(xs))))
    return {label: xs[k] for label, k in _time_indices(ts, (0.0, 20.0)).items()}


def householder_frame(x: np.ndarray, targets: np.ndarray, v0: np.ndarray) -> np.ndarray | None:
    """``u_i = Q_i x_i`` with ``Q_i = I − 2wwᵀ/|w|²``, ``w = g_i − v_0`` (the realisation gauge), if it
    fits."""
    w = targets - v0
    norms = np.sum(w * w, axis=1, keepdims=True)
    safe = np.where(norms > 0, norms, 1.0)
    reflect = lambda y: y - 2.0 * w * np.sum(w * y, axis=1, keepdims=True) / safe  # noqa: E731
    return reflect(x) if np.allclose(reflect(targets), v0, atol=1e-9) else None


def orbit_frame(x: np.ndarray, alpha: np.ndarray, final: np.ndarray) -> np.ndarray | None:
    """``u_i = R_z(−α_i) x_i`` (the orbit construction: ``x_i = R(α_i)ᵀu*`` sits at azimuth
    ``az(u*) + α_i``), kept only if it is the gauge frame of this run: the final state collapses in it."""
    rotate = lambda y, a: np.stack(  # noqa: E731
        [np.cos(a) * y[:, 0] + np.sin(a) * y[:, 1], -np.sin(a) * y[:, 0] + np.cos(a) * y[:, 1], y[:, 2]],
        axis=1,
    )
    return rotate(x, alpha) if float(metrics.mean_cosine(rotate(final, alpha))) > COLLAPSE_THRESHOLD else None
