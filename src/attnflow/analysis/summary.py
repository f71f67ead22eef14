"""The metrics of a stored trajectory: what a run folder's ``metrics.json`` holds (no ``run`` block).

:func:`summarize` reads the snapshots ``xs (T, n, d)`` at times ``ts`` of one run with its
kernel and never simulates: the diagnostics of :func:`attnflow.analysis.metrics.snapshot_summary`
for the final snapshot, the energy and its closed-form maximum (:func:`attnflow.analysis.theory.energy_max`),
whether the energy is non-decreasing, the collapse times, and the per-snapshot ``series``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.theory import energy_max
from attnflow.core.gauges import Gauge
from attnflow.core.kernel import Kernel
from attnflow.numerics.summation import energy

__all__ = ["COLLAPSE_THRESHOLD", "ENERGY_TOL", "PAIRWISE_LIMIT", "energy_series", "gauge_frames", "summarize"]

COLLAPSE_THRESHOLD = 0.999  # mean cosine at which a state counts as collapsed (the collapse time)
ENERGY_TOL = 1e-10  # relative decrease allowed between snapshots (round-off of the energy sum)
PAIRWISE_LIMIT = 8192  # above this n the O(n²) cluster diagnostics are skipped (null)


def gauge_frames(gauge: Gauge, xs) -> np.ndarray:
    """``u = Q(ξ)x`` for every snapshot of ``xs (T, n, d)``."""
    return np.asarray(jax.vmap(gauge.apply)(jnp.asarray(xs)))


def energy_series(kernel: Kernel, xs, *, block_size: int | None = None) -> np.ndarray:
    """``E`` of every snapshot of ``xs (T, n, d)`` (one compiled evaluation, called per snapshot)."""
    fn = jax.jit(lambda x: energy(kernel, x, block_size=block_size))
    return np.array([float(fn(jnp.asarray(x))) for x in xs])


def summarize(
    kernel: Kernel,
    ts,
    xs,
    *,
    groups: np.ndarray | None = None,
    block_size: int | None = None,
    theta_c: float = 0.1,
) -> dict:
    """Every diagnostic of the final snapshot of ``xs (T, n, d)`` and the ``series`` block.

    ``groups``: prompt ids (the conditional spread); ``block_size``: the energy's evaluation (the
    run's; the value is the same to round-off); ``theta_c``: the cluster angle.
    """
    ts, xs = np.asarray(ts), np.asarray(xs)
    us = gauge_frames(kernel.gauge, xs)
    n = xs.shape[1]
    q = None if kernel.gauge.is_identity else np.asarray(kernel.gauge.matrices())
    pairwise = n <= PAIRWISE_LIMIT
    final = metrics.snapshot_summary(xs[-1], q=q, groups=groups, theta_c=theta_c, pairwise=pairwise)
    energies = energy_series(kernel, xs, block_size=block_size)
    e_max = energy_max(kernel)
    mean_cos = np.asarray(metrics.series(xs, metrics.mean_cosine))
    gauge_mean_cos = np.asarray(metrics.series(us, metrics.mean_cosine))
    final.update(
        energy=float(energies[-1]),
        energy_max=e_max,
        energy_gap=_relative_gap(e_max, float(energies[-1])),
        energy_monotone=metrics.is_monotone(energies, tol=ENERGY_TOL * max(1.0, abs(float(energies[-1])))),
        collapse_time=metrics.collapse_time(ts, mean_cos, threshold=COLLAPSE_THRESHOLD),
        gauge_collapse_time=metrics.collapse_time(ts, gauge_mean_cos, threshold=COLLAPSE_THRESHOLD),
    )
    n_eff = [None] * len(ts) if not pairwise else [metrics.n_eff(x, theta_c=theta_c) for x in xs]
    final["series"] = {
        "t": ts.tolist(),
        "energy": energies.tolist(),
        "mean_cosine": mean_cos.tolist(),
        "gauge_mean_cosine": gauge_mean_cos.tolist(),
        "n_eff": n_eff,
    }
    return final


def _relative_gap(e_max: float | None, e: float) -> float | None:
    """``(E_max - E) / E_max``; None where undefined (no closed form, ``E_max = 0``, a non-finite value)."""
    if e_max is None or e_max == 0 or not np.isfinite(e_max) or not np.isfinite(e):
        return None
    return (e_max - e) / e_max
