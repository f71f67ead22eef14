"""Distances between empirical laws of labelled tokens: sliced 1-Wasserstein.

A labelled state is embedded as points ``(cos 2πs, sin 2πs, x) ∈ R^{d+2}``, ``s`` the label
rescaled to ``[0, 1)`` (``label_phase``), so that two states of different sizes can be compared as
laws of (label, token). The sliced distance averages the exact 1-D distance of the projections on
fixed directions; it costs ``O(n log n)`` per direction, so laws of 10^6 tokens compare in seconds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["label_phase", "labelled_points", "sliced_w1", "w1_1d"]


def label_phase(xi: np.ndarray) -> np.ndarray:
    """Labels rescaled to ``[0, 1)`` by their own grid: ``(xi - min) / (max - min + step)``, where
    ``step`` is the smallest gap between distinct labels (``i/n`` for positions ``0..n-1``,
    ``k/K`` for ``K`` prompt ids). One distinct label maps to 0."""
    xi = np.asarray(xi, dtype=np.float64)
    values = np.unique(xi)
    if values.size == 1:
        return np.zeros_like(xi)
    step = float(np.min(np.diff(values)))
    return (xi - values[0]) / (values[-1] - values[0] + step)


def labelled_points(xi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``(n, d + 2)`` points ``(cos 2πs, sin 2πs, x)``, ``s = label_phase(xi)``."""
    angle = 2.0 * np.pi * label_phase(xi)
    return np.column_stack([np.cos(angle), np.sin(angle), np.asarray(x, dtype=np.float64)])


def w1_1d(a: np.ndarray, b: np.ndarray) -> float:
    """Exact 1-Wasserstein distance between the empirical laws of samples ``a`` and ``b`` (sizes may
    differ): the integral over ``q ∈ (0, 1)`` of the distance between their quantile functions,
    which are constant between the breakpoints ``i/len(a)`` and ``j/len(b)``."""
    a, b = np.sort(np.ravel(a)), np.sort(np.ravel(b))
    if a.size == 0 or b.size == 0:
        raise ValueError(f"w1_1d: samples must be non-empty; got sizes {a.size} and {b.size}.")
    q = np.union1d(np.arange(1, a.size + 1) / a.size, np.arange(1, b.size + 1) / b.size)
    widths = np.diff(q, prepend=0.0)
    middle = q - 0.5 * widths
    ia = np.minimum((middle * a.size).astype(np.int64), a.size - 1)
    ib = np.minimum((middle * b.size).astype(np.int64), b.size - 1)
    return float(np.sum(widths * np.abs(a[ia] - b[ib])))


def sliced_w1(p: np.ndarray, q: np.ndarray, *, directions: int = 64, seed: int = 0) -> float:
    """Sliced 1-Wasserstein distance between point clouds ``p (m, k)`` and ``q (l, k)``: the mean of
    ``w1_1d`` of their projections on ``directions`` uniform random unit vectors of ``R^k`` (the same
    vectors for every call with the same ``seed`` and ``k``)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.ndim != 2 or q.ndim != 2 or p.shape[1] != q.shape[1]:
        raise ValueError(f"sliced_w1: point clouds must be (m, k) and (l, k); got {p.shape} and {q.shape}.")
    theta = np.random.default_rng(seed).standard_normal((directions, p.shape[1]))
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    return float(np.mean([w1_1d(p @ v, q @ v) for v in theta]))
