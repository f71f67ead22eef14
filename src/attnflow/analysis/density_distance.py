"""Particles against a density on ``S^1 × labels``: 1-Wasserstein distances per label and sliced.

A density run holds ``f (L, M)``: label ``l``'s density in the angle on the grid ``θ_j = 2π j/M``
(``attnflow.numerics.density_circle``), the label law being the quadrature ``(nodes, weights)``.
A particle run holds angles ``θ_i`` and labels; each particle belongs to one label node.

- :func:`density_cdf`: the CDF of the trigonometric interpolant of ``f`` (its exact antiderivative,
  ``c_0 θ + Σ_{k≠0} c_k (e^{ikθ} − 1)/(ik)``), evaluated on a fine grid by a zero-padded FFT.
- :func:`circle_w1`: the 1-Wasserstein distance on the circle (geodesic cost) between the empirical law
  of samples and a density: ``min_m ∫_0^{2π} |F(θ) − G(θ) − m| dθ``, the minimum at a median of
  ``F − G`` (Rabin–Delon–Gousseau), integrated on the fine grid (error ``O(2π/N)``, ``N = fine``).
- :func:`labelled_circle_w1`: ``Σ_l ρ_l W1(particles of label l, f_l)`` (each label's particles
  against its slice): the laws compared label by label.
- :func:`sample_density`: samples of each label's density by inverse CDF (to start particles from
  the density's initial law).
- :func:`sliced_w1_sphere`: the same on ``S^2 × labels``: particles ``(n, 3)`` against a density's grid
  values with their quadrature weights (a refined grid keeps the cloud's own error small).
- :func:`sliced_w1_density`: the sliced 1-Wasserstein distance of ``attnflow.analysis.distances``
  between labelled particles and the density's quadrature (a weighted point cloud on a refined grid),
  both embedded as ``(cos 2πs, sin 2πs, cos θ, sin θ)``, ``s`` the label's phase.
- :func:`nearest_nodes`: the label node of each particle (its label in the density's coordinates),
  to compare a particle run with a density run (``attnflow.workflows.density_compare``).

NumPy only: these read states, they never simulate.
"""

from __future__ import annotations

import numpy as np

from attnflow.analysis.distances import label_phase

__all__ = [
    "circle_w1",
    "density_cdf",
    "labelled_circle_w1",
    "nearest_nodes",
    "sample_density",
    "sliced_w1_density",
    "sliced_w1_sphere",
    "weighted_w1_1d",
]

TWO_PI = 2.0 * np.pi
FINE = 1 << 16  # points of the fine grid of the CDF integrals (error ~2π/FINE)


def _check_density(f) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    if f.ndim == 1:
        f = f[None, :]
    if f.ndim != 2 or f.shape[1] < 2 or not np.all(np.isfinite(f)):
        raise ValueError(
            f"density_distance: `f` must be a finite (L, M) array of grid values; got shape {f.shape}."
        )
    return f


def density_cdf(f, *, fine: int = FINE) -> tuple[np.ndarray, np.ndarray]:
    """``(theta (fine,), cdf (L, fine))``: each label's CDF from 0 at ``θ = 0``, normalised by its mass
    (the interpolant's exact antiderivative; ``cdf`` reaches 1 at ``2π``)."""
    f = _check_density(f)
    grid = f.shape[1]
    if fine < grid:
        raise ValueError(f"density_cdf: `fine` must be >= the grid ({grid}); got {fine}.")
    c = np.fft.rfft(f, axis=-1) / grid
    if grid % 2 == 0:
        c[:, -1] *= 0.5  # the Nyquist coefficient is shared between ±M/2: the real interpolant's half
    k = np.arange(c.shape[1])
    antiderivative = np.zeros((f.shape[0], fine // 2 + 1), dtype=complex)
    antiderivative[:, 1 : c.shape[1]] = c[:, 1:] / (1j * k[1:])
    periodic = np.fft.irfft(antiderivative * fine, n=fine, axis=-1)
    theta = TWO_PI * np.arange(fine) / fine
    mass = TWO_PI * c[:, :1].real
    cdf = (c[:, :1].real * theta[None, :] + periodic - periodic[:, :1]) / mass
    return theta, cdf


def _circle_w1_cdfs(theta: np.ndarray, f_cdf: np.ndarray, g_cdf: np.ndarray) -> float:
    """``min_m ∫ |F − G − m| dθ`` on the uniform fine grid: ``m`` the median of ``F − G``."""
    diff = f_cdf - g_cdf
    m = np.median(diff)
    return float(TWO_PI * np.mean(np.abs(diff - m)))


def _empirical_cdf(samples: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The samples' CDF at the midpoints of the fine cells (a step function: midpoints halve the error)."""
    samples = np.sort(np.mod(np.asarray(samples, dtype=np.float64).ravel(), TWO_PI))
    if samples.size == 0:
        raise ValueError("circle_w1: `samples` must be non-empty.")
    mid = theta + 0.5 * (theta[1] - theta[0])
    return np.searchsorted(samples, mid, side="right") / samples.size


def circle_w1(samples, f, *, fine: int = FINE) -> float:
    """W1 on the circle (arc-length cost) between the empirical law of angles ``samples`` and the
    density ``f (M,)`` on the uniform grid (any mass: it is normalised)."""
    theta, cdf = density_cdf(f, fine=fine)
    mid_cdf = 0.5 * (cdf[0] + np.append(cdf[0][1:], 1.0))  # the density's CDF at the same midpoints
    return _circle_w1_cdfs(theta, mid_cdf, _empirical_cdf(samples, theta))


def labelled_circle_w1(theta, label_index, f, weights, *, fine: int = FINE) -> float:
    """``Σ_l weights_l · circle_w1(θ[label_index == l], f[l])``: particles ``θ (n,)`` with the index of
    their label node ``label_index (n,)`` against the density ``f (L, M)`` with label weights ``(L,)``."""
    f = _check_density(f)
    theta, label_index = np.asarray(theta, dtype=np.float64).ravel(), np.asarray(label_index).ravel()
    weights = np.asarray(weights, dtype=np.float64).ravel()
    if theta.shape != label_index.shape or weights.shape != (f.shape[0],):
        raise ValueError(
            "labelled_circle_w1: `theta` and `label_index` must have one length and `weights` one entry per "
            f"label row of `f` ({f.shape[0]}); got {theta.shape}, {label_index.shape}, {weights.shape}."
        )
    missing = [label for label in range(f.shape[0]) if not np.any(label_index == label)]
    if missing:
        raise ValueError(
            f"labelled_circle_w1: every label needs particles; got none for label(s) {missing[:5]}."
        )
    grid_theta, cdf = density_cdf(f, fine=fine)
    total = 0.0
    for label in range(f.shape[0]):
        mid_cdf = 0.5 * (cdf[label] + np.append(cdf[label][1:], 1.0))
        empirical = _empirical_cdf(theta[label_index == label], grid_theta)
        total += weights[label] * _circle_w1_cdfs(grid_theta, mid_cdf, empirical)
    return float(total)


def nearest_nodes(labels, nodes) -> np.ndarray:
    """The index of the label node nearest to each particle's label (both in the same coordinates,
    e.g. positions on ``[0, 1)``): ``(n,)``. The particles of a node are then compared with its
    slice; labels between nodes are the label quadrature's own error."""
    labels, nodes = np.asarray(labels, dtype=np.float64).ravel(), np.asarray(nodes, dtype=np.float64).ravel()
    if labels.size == 0 or nodes.size == 0:
        raise ValueError(
            f"nearest_nodes: `labels` and `nodes` must be non-empty; got {labels.size}, {nodes.size}."
        )
    order = np.argsort(nodes)
    sorted_nodes = nodes[order]
    right = np.clip(np.searchsorted(sorted_nodes, labels), 1, max(sorted_nodes.size - 1, 1))
    left = right - 1
    if sorted_nodes.size == 1:
        return np.zeros(labels.size, dtype=int)
    closer_left = np.abs(labels - sorted_nodes[left]) <= np.abs(sorted_nodes[right] - labels)
    return order[np.where(closer_left, left, right)]


def sample_density(
    f, counts, rng: np.random.Generator, *, fine: int = FINE, stratified: bool = False
) -> list:
    """Angles drawn from each label's density: ``counts[l]`` samples of ``f[l]`` by the inverse of
    :func:`density_cdf` (linear between fine-grid points: error ``O((2π/fine)²)``). ``stratified``
    draws one uniform in each of the ``counts[l]`` equal quantile cells (a quasi-random sample)."""
    theta, cdf = density_cdf(f, fine=fine)
    if np.any(np.diff(cdf, axis=-1) < 0):
        raise ValueError("sample_density: `f` must be non-negative (its CDF decreases somewhere).")
    nodes = np.append(theta, TWO_PI)
    out = []
    for label, count in enumerate(np.broadcast_to(np.asarray(counts, dtype=int), (cdf.shape[0],))):
        u = rng.uniform(size=count)
        if stratified:
            u = (np.arange(count) + u) / count
        out.append(np.interp(u, np.append(cdf[label], 1.0), nodes))
    return out


def weighted_w1_1d(a, wa, b, wb) -> float:
    """Exact 1-Wasserstein distance between ``Σ wa δ_a`` and ``Σ wb δ_b`` on the line (weights
    normalised): ``∫ |F_a − F_b|`` over the merged breakpoints."""
    a, wa, b, wb = (np.asarray(v, dtype=np.float64).ravel() for v in (a, wa, b, wb))
    values = np.concatenate([a, b])
    jumps = np.concatenate([wa / wa.sum(), -wb / wb.sum()])
    order = np.argsort(values, kind="stable")
    values, jumps = values[order], jumps[order]
    return float(np.sum(np.abs(np.cumsum(jumps)[:-1]) * np.diff(values)))


def sliced_w1_density(
    theta, label_index, f, nodes, weights, *, refine: int = 4, directions: int = 64, seed: int = 0
) -> float:
    """Sliced W1 between labelled particles and the density's quadrature: the particle of angle
    ``θ_i`` and label node ``label_index[i]`` is ``(cos 2πs, sin 2πs, cos θ_i, sin θ_i)`` (``s`` the
    node's :func:`attnflow.analysis.distances.label_phase`); the density is the cloud of the grid points
    of ``f`` upsampled ``refine`` times (spectral interpolation) with weights ``ρ_l f(θ_j, ξ_l)``.
    The grid's own W1 error is ``O(2π/(refine·M))``; the directions are those of ``sliced_w1``."""
    f = _check_density(f)
    count, grid = f.shape
    fine = refine * grid
    c = np.fft.rfft(f, axis=-1)
    if grid % 2 == 0:
        c[:, -1] *= 0.5
    values = np.maximum(np.fft.irfft(c, n=fine, axis=-1) * refine, 0.0)  # Gibbs undershoots: no mass
    angles = TWO_PI * np.arange(fine) / fine
    phase = TWO_PI * label_phase(np.asarray(nodes, dtype=np.float64))
    cloud = np.column_stack(
        [
            np.repeat(np.cos(phase), fine),
            np.repeat(np.sin(phase), fine),
            np.tile(np.cos(angles), count),
            np.tile(np.sin(angles), count),
        ]
    )
    cloud_weights = (np.asarray(weights, dtype=np.float64)[:, None] * values).ravel()
    theta, label_index = np.asarray(theta, dtype=np.float64).ravel(), np.asarray(label_index).ravel()
    points = np.column_stack(
        [np.cos(phase[label_index]), np.sin(phase[label_index]), np.cos(theta), np.sin(theta)]
    )
    directions_ = np.random.default_rng(seed).standard_normal((directions, 4))
    directions_ /= np.linalg.norm(directions_, axis=1, keepdims=True)
    ones = np.ones(points.shape[0])
    return float(np.mean([weighted_w1_1d(points @ v, ones, cloud @ v, cloud_weights) for v in directions_]))


def sliced_w1_sphere(
    x, label_index, f, points, area, nodes, weights, *, directions: int = 64, seed: int = 0
) -> float:
    """Sliced W1 between labelled particles ``x (n, 3)`` (label node ``label_index[i]``) and the law
    ``Σ_l ρ_l f_l(y) dy``: ``f (L, k)`` the densities at the quadrature points ``points (k, 3)`` with
    areas ``area (k,)`` (a Gauss–Legendre × uniform grid: ``w_j 2π/nlon``). Both embedded as
    ``(cos 2πs, sin 2πs, x)``, ``s`` the node's label phase; negative values (Gibbs) carry no mass."""
    f = np.asarray(f, dtype=np.float64)
    points, area = np.asarray(points, dtype=np.float64), np.asarray(area, dtype=np.float64).ravel()
    count = f.shape[0]
    if f.ndim != 2 or points.shape != (f.shape[1], 3) or area.shape != (f.shape[1],):
        raise ValueError(
            f"sliced_w1_sphere: `f` must be (L, k) with `points` (k, 3) and `area` (k,); got {f.shape}, "
            f"{points.shape}, {area.shape}."
        )
    phase = TWO_PI * label_phase(np.asarray(nodes, dtype=np.float64))
    k = points.shape[0]
    cloud = np.column_stack(
        [np.repeat(np.cos(phase), k), np.repeat(np.sin(phase), k), np.tile(points, (count, 1))]
    )
    cloud_weights = (
        np.asarray(weights, dtype=np.float64)[:, None] * np.maximum(f, 0.0) * area[None, :]
    ).ravel()
    x, label_index = np.asarray(x, dtype=np.float64), np.asarray(label_index).ravel()
    particles = np.column_stack([np.cos(phase[label_index]), np.sin(phase[label_index]), x])
    directions_ = np.random.default_rng(seed).standard_normal((directions, 5))
    directions_ /= np.linalg.norm(directions_, axis=1, keepdims=True)
    ones = np.ones(particles.shape[0])
    return float(
        np.mean([weighted_w1_1d(particles @ v, ones, cloud @ v, cloud_weights) for v in directions_])
    )
