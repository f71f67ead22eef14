"""Target laws of the realisation constructions (experiments E7 and E8), NumPy/SciPy at the edge.

- Angle laws on ``[0, 2π)`` with a ``cdf`` (``cdf(0) = 0``, ``cdf(2π) = 1``) and its inverse ``ppf``:
  :class:`VonMisesMixture` (exact Fourier-series CDF), :class:`EmpiricalAngleLaw` (samples,
  interpolated CDF), :class:`QuantileLaw` (a bare quantile function); :func:`as_angle_law` turns
  any of those inputs into a law. :class:`EmpiricalAngleLaw` returns its CDF as an
  :class:`AngleCDF` carrying ``ks_tolerance``, the resolution at which
  :func:`attnflow.analysis.metrics.circular_ks` reads the angles: :data:`ATOM_TOLERANCE` for a law
  with atoms (tied samples), 0 for a continuous one.
- :func:`spherical_mixture_samples`: the three-blob von Mises–Fisher target on ``S^2`` of experiment E8.

Randomness comes from an explicit seed, NumPy ``Generator`` or JAX key (:func:`make_rng`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import scipy.special

TWO_PI = 2.0 * np.pi
CDF_BLOCK_ENTRIES = 1 << 20  # angles × Fourier terms evaluated at once in VonMisesMixture.cdf
PPF_NEWTON_STEPS = 8  # quadratic convergence from a 2π/2048 bracket: round-off after 3-4 steps
PPF_TOL = 1e-13  # |cdf(θ) − u| at which Newton stops (the CDF series rounds at ~1e-14 for κ ~ 1e3)
# Resolution of an atom's position in the KS distance (EmpiricalAngleLaw.ks_tolerance): 32 ulps of
# 2π, 2.8e-14 rad. Realised orbit angles are the target quantiles to <= 5 ulps of 2π (measured for
# n = 16 to 1024, both modes, tau = 40): the round-off of the converged state and of arctan2.
ATOM_TOLERANCE = 32 * float(np.spacing(TWO_PI))


def make_rng(key_or_seed) -> np.random.Generator:
    """A NumPy generator from an int seed, a Generator, or a JAX key."""
    if isinstance(key_or_seed, np.random.Generator):
        return key_or_seed
    if isinstance(key_or_seed, int | np.integer):
        return np.random.default_rng(int(key_or_seed))
    data = np.asarray(jax.random.key_data(key_or_seed)).ravel()
    return np.random.default_rng([int(v) for v in data])


def _bisect_monotone(fn: Callable[[np.ndarray], np.ndarray], target, lo, hi, iterations: int):
    """Vectorised bisection for the generalised inverse of a non-decreasing ``fn``: returns the
    midpoint of ``[lo, hi]`` after halving it ``iterations`` times, keeping ``fn(lo) ≤ target``."""
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = fn(mid) <= target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class VonMisesMixture:
    """``Σ_k w_k vM(κ_k, μ_k)`` as a law on ``[0, 2π)`` (``cdf(0) = 0``, ``cdf(2π) = 1``).

    The CDF is the exact Fourier series ``F(θ) = θ/2π + (1/π) Σ_{m≥1} (A_m/m)(sin m(θ−μ) + sin mμ)``
    per component, ``A_m = I_m(κ)/I_0(κ)`` (``scipy.special.ive``), truncated where the terms are
    below 1e-17: accurate to round-off. ``ppf`` brackets on a 2048-cell grid and refines by
    safeguarded Newton steps: monotone, and ``|cdf(ppf(u)) − u|`` at round-off.
    """

    weights: tuple[float, ...]
    kappas: tuple[float, ...]
    mus: tuple[float, ...]

    def __post_init__(self):
        w, k, m = (
            np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (self.weights, self.kappas, self.mus)
        )
        if not (w.ndim == k.ndim == m.ndim == 1 and w.size == k.size == m.size >= 1):
            raise ValueError(
                "VonMisesMixture: `weights`, `kappas`, `mus` must be 1-d of one length >= 1; "
                f"got lengths {w.size}, {k.size}, {m.size}."
            )
        if not (np.all(np.isfinite(w)) and np.all(w >= 0) and abs(w.sum() - 1.0) <= 1e-12):
            raise ValueError(f"VonMisesMixture: `weights` must be >= 0 and sum to 1; got {tuple(w)}.")
        if not (np.all(np.isfinite(k)) and np.all(k >= 0)):
            raise ValueError(f"VonMisesMixture: `kappas` must be finite and >= 0; got {tuple(k)}.")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"VonMisesMixture: `mus` must be finite; got {tuple(m)}.")
        for name, a in (("weights", w), ("kappas", k), ("mus", m)):
            object.__setattr__(self, name, tuple(float(v) for v in a))

    def pdf(self, theta) -> np.ndarray:
        """Density with respect to ``dθ``: ``Σ_k w_k e^{κ_k(cos(θ−μ_k) − 1)} / (2π I_0e(κ_k))``."""
        theta = np.asarray(theta, dtype=np.float64)
        out = np.zeros_like(theta)
        for w, k, m in zip(self.weights, self.kappas, self.mus, strict=True):
            out += w * np.exp(k * (np.cos(theta - m) - 1.0)) / (TWO_PI * scipy.special.i0e(k))
        return out

    def cdf(self, theta) -> np.ndarray:
        """``F(θ) = ν([0, θ])`` for ``θ ∈ [0, 2π]`` (clipped outside)."""
        theta = np.clip(np.asarray(theta, dtype=np.float64), 0.0, TWO_PI)
        flat = theta.reshape(-1)
        out = flat / TWO_PI
        for w, k, m in zip(self.weights, self.kappas, self.mus, strict=True):
            orders = np.arange(1, int(20 + 10 * np.sqrt(k)) + 1, dtype=np.float64) if k > 0 else np.ones(0)
            coef = scipy.special.ive(orders, k) / scipy.special.ive(0, k) / orders  # A_m / m
            keep = coef > 1e-18 * coef[0] if coef.size else coef > 0
            orders, coef = orders[keep], coef[keep]
            if orders.size == 0:
                continue
            offset = np.sin(orders * m) @ coef
            rows = max(1, CDF_BLOCK_ENTRIES // orders.size)  # bound the (rows, M) block in memory
            for start in range(0, flat.size, rows):
                block = np.sin(np.multiply.outer(flat[start : start + rows] - m, orders)) @ coef
                out[start : start + rows] += w * (block + offset) / np.pi
        return np.clip(out, 0.0, 1.0).reshape(theta.shape)

    def ppf(self, u) -> np.ndarray:
        """Inverse CDF on ``[0, 1]`` → ``[0, 2π]``: grid bracket, then safeguarded Newton steps
        (bisection whenever a step leaves the bracket), then a running maximum over sorted ``u``
        so that the result is monotone exactly, not only to round-off."""
        u = np.asarray(u, dtype=np.float64)
        flat = np.clip(u.reshape(-1), 0.0, 1.0)
        grid = np.linspace(0.0, TWO_PI, 2049)
        values = self.cdf(grid)
        values[0], values[-1] = 0.0, 1.0
        j = np.clip(np.searchsorted(values, flat, side="right") - 1, 0, grid.size - 2)
        lo, hi = grid[j], grid[j + 1]
        rise = values[j + 1] - values[j]
        theta = lo + (hi - lo) * np.where(rise > 0, (flat - values[j]) / np.where(rise > 0, rise, 1.0), 0.5)
        for _ in range(PPF_NEWTON_STEPS):
            excess = self.cdf(theta) - flat
            if np.max(np.abs(excess), initial=0.0) <= PPF_TOL:
                break
            lo, hi = np.where(excess <= 0, theta, lo), np.where(excess > 0, theta, hi)
            density = self.pdf(theta)
            step = theta - excess / np.where(density > 0, density, 1.0)
            inside = (density > 0) & (step >= lo) & (step <= hi)
            theta = np.where(inside, step, 0.5 * (lo + hi))
        order = np.argsort(flat, kind="stable")
        theta[order] = np.maximum.accumulate(theta[order])
        return theta.reshape(u.shape)

    def sample(self, key_or_seed, n: int) -> np.ndarray:
        """``n`` iid angles in ``[0, 2π)`` (NumPy's von Mises sampler, seeded)."""
        rng = make_rng(key_or_seed)
        component = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights))
        theta = rng.vonmises(np.asarray(self.mus)[component], np.asarray(self.kappas)[component])
        return np.mod(theta, TWO_PI)


@dataclasses.dataclass(frozen=True, eq=False)
class AngleCDF:
    """A CDF on ``[0, 2π]`` as a vectorised callable, with the position tolerance
    ``ks_tolerance`` (radians, ``>= 0``) at which :func:`attnflow.analysis.metrics.circular_ks`
    compares angles with it: ``0`` for a continuous law (the exact KS distance), positive for a
    law with atoms (the KS distance up to moving each angle by less than ``ks_tolerance``)."""

    function: Callable[[np.ndarray], np.ndarray]
    ks_tolerance: float = 0.0

    def __call__(self, theta) -> np.ndarray:
        return self.function(theta)


@dataclasses.dataclass(frozen=True)
class EmpiricalAngleLaw:
    """The law of angle samples, as the piecewise-linear CDF through ``(s_(k), (k−½)/m)`` (the
    sorted samples ``s_(k)`` in ``[0, 2π)``) and ``(0, 0)``, ``(2π, 1)``: continuous where the
    samples are distinct, with an atom of mass ``(r−1)/m`` at a value taken ``r`` times, and one of
    mass ``1/(2m)`` at a sample at 0.

    Its quantile function maps ``(k−½)/m`` to ``s_(k)`` and is the generalised inverse of the CDF,
    so the midpoint quantiles ``α_i = F⁻¹((i+½)/n)`` are within KS distance ``1/(2n)`` of the law
    for every ``n`` (with ``n = m`` they are the samples themselves; a step CDF would put every
    realised angle on a jump), ties included: for 16 copies of one angle the CDF jumps from
    ``1/32`` to ``31/32`` there and the 16 angles on it are at KS distance exactly ``1/32``.

    The KS distance is continuous in the angles at continuity points of the CDF (moving an angle by
    ``h`` changes it by at most the CDF's rise over ``h``) but not at an atom: an angle one ulp below
    an atom counts against the whole jump. Realised angles are the quantiles only to round-off, so
    a law with atoms at the resolution :data:`ATOM_TOLERANCE` (two samples, or a sample and 0,
    within ``2·ATOM_TOLERANCE``) hands its CDF to :func:`~attnflow.analysis.metrics.circular_ks`
    with ``ks_tolerance = ATOM_TOLERANCE``: angles within that of the quantiles measure at most the
    quantiles' distance, and the measure is otherwise the KS distance to within the CDF's rise over
    ``ATOM_TOLERANCE``. A law without atoms keeps ``ks_tolerance = 0``: the exact KS distance,
    unchanged. Samples within ``2·ATOM_TOLERANCE`` below ``2π`` are taken at 0 (as ``np.mod``
    already rounds ``−tiny`` to ``2π``), so that no target angle sits at the cut of the circle
    that ``circular_ks`` leaves the tolerance on either side of.
    """

    samples: np.ndarray  # sorted, in [0, 2π − 2·ATOM_TOLERANCE)

    def __post_init__(self):
        s = np.asarray(self.samples, dtype=np.float64).reshape(-1)
        if s.size < 1 or not np.all(np.isfinite(s)):
            raise ValueError(f"EmpiricalAngleLaw: `samples` must be >= 1 finite angles; got {s.size} values.")
        s = np.mod(s, TWO_PI)
        s[s >= TWO_PI - 2.0 * ATOM_TOLERANCE] = 0.0  # np.mod(−tiny, 2π) rounds to 2π: at 0 (class doc)
        object.__setattr__(self, "samples", np.sort(s))

    @property
    def _knots(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.samples.size
        xp = np.concatenate([[0.0], self.samples, [TWO_PI]])
        fp = np.concatenate([[0.0], (np.arange(m) + 0.5) / m, [1.0]])
        return xp, fp

    @property
    def ks_tolerance(self) -> float:
        """:data:`ATOM_TOLERANCE` if the law has an atom at that resolution (two samples, or the
        first sample and 0, within ``2·ATOM_TOLERANCE``), else ``0.0`` (a continuous law)."""
        gaps = np.diff(self.samples, prepend=0.0)
        return ATOM_TOLERANCE if bool(np.any(gaps <= 2.0 * ATOM_TOLERANCE)) else 0.0

    @property
    def cdf(self) -> AngleCDF:
        """Right-continuous piecewise-linear CDF on ``[0, 2π]`` (a jump at tied samples), as an
        :class:`AngleCDF` with this law's :attr:`ks_tolerance`."""
        return AngleCDF(self._cdf, self.ks_tolerance)

    def _cdf(self, theta) -> np.ndarray:
        xp, fp = self._knots
        theta = np.clip(np.asarray(theta, dtype=np.float64), 0.0, TWO_PI)
        j = np.clip(np.searchsorted(xp, theta, side="right"), 1, xp.size - 1)
        width = xp[j] - xp[j - 1]
        frac = np.where(width > 0, (theta - xp[j - 1]) / np.where(width > 0, width, 1.0), 1.0)
        return fp[j - 1] + np.clip(frac, 0.0, 1.0) * (fp[j] - fp[j - 1])

    def ppf(self, u) -> np.ndarray:
        xp, fp = self._knots
        return np.interp(np.asarray(u, dtype=np.float64), fp, xp)


@dataclasses.dataclass(frozen=True)
class QuantileLaw:
    """A law given only by its quantile function ``ppf``; ``cdf`` by bisection in ``u`` (1e-16)."""

    quantile: Callable[[np.ndarray], Any]

    def ppf(self, u) -> np.ndarray:
        return np.asarray(self.quantile(np.asarray(u, dtype=np.float64)), dtype=np.float64)

    def cdf(self, theta) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        zeros = np.zeros_like(theta)
        return _bisect_monotone(self.ppf, theta, zeros, zeros + 1.0, 55)


def as_angle_law(ppf_or_law):
    """A law with ``cdf``/``ppf``: laws pass through, 1-d samples become an
    :class:`EmpiricalAngleLaw`, a bare callable is taken as a quantile function."""
    if hasattr(ppf_or_law, "ppf") and hasattr(ppf_or_law, "cdf"):
        return ppf_or_law
    if callable(ppf_or_law):
        return QuantileLaw(ppf_or_law)
    samples = np.asarray(ppf_or_law, dtype=np.float64)
    if samples.ndim != 1:
        raise ValueError(
            "realize_orbit: `ppf_or_law` must be a law (cdf and ppf), a quantile function or 1-d "
            f"angle samples; got an array of shape {samples.shape}."
        )
    return EmpiricalAngleLaw(samples)


QUADRATURE_POINTS = 1 << 16  # intervals of the quadrature CDF: error ~1e-9 for densities as peaked as κ = 10


def quadrature_cdf(pdf: Callable[[np.ndarray], np.ndarray], *, points: int = QUADRATURE_POINTS):
    """A CDF on ``[0, 2π]`` computed from a density alone: cumulative Simpson sums on a uniform grid,
    normalised to end at 1, linearly interpolated. Independent of any closed-form CDF, so that a
    check of samples against a law does not reuse the pair ``cdf``/``ppf`` that made the samples."""
    if points < 2 or points % 2:
        raise ValueError(f"quadrature_cdf: `points` must be an even integer >= 2; got {points!r}.")
    grid = np.linspace(0.0, TWO_PI, points + 1)
    f = np.asarray(pdf(grid), dtype=np.float64)
    h = TWO_PI / points
    pairs = h / 3.0 * (f[:-2:2] + 4.0 * f[1:-1:2] + f[2::2])  # Simpson over each pair of intervals
    mids = h / 2.0 * (f[:-1] + f[1:])  # trapezoid on single intervals, for the odd nodes
    even = np.concatenate([[0.0], np.cumsum(pairs)])
    values = np.empty(points + 1)
    values[0::2] = even
    values[1::2] = even[:-1] + mids[0::2]
    values /= values[-1]

    def cdf(theta) -> np.ndarray:
        return np.interp(np.clip(np.asarray(theta, dtype=np.float64), 0.0, TWO_PI), grid, values)

    return cdf


def spherical_mixture_samples(seed, n: int) -> np.ndarray:
    """``n`` points of the experiment E8 target on ``S^2``: three von Mises–Fisher blobs.

    Means ``(0.6, 0, 0.8)``, ``(−0.5, 0.7, −0.1)/|·|``, ``(−0.3, −0.8, −0.5)/|·|``, concentrations
    ``30, 12, 50``, weights ``0.5, 0.3, 0.2``. Exact vMF sampling on ``S^2``: the cosine to the
    mean is ``w = 1 + log(U + (1−U)e^{−2κ})/κ``, the azimuth around the mean is uniform.
    """
    means = np.array([[0.6, 0.0, 0.8], [-0.5, 0.7, -0.1], [-0.3, -0.8, -0.5]])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    kappas, weights = np.array([30.0, 12.0, 50.0]), np.array([0.5, 0.3, 0.2])
    rng = make_rng(seed)
    component = rng.choice(3, size=n, p=weights)
    mu, kappa = means[component], kappas[component]
    u = rng.uniform(size=n)
    w = 1.0 + np.log(u + (1.0 - u) * np.exp(-2.0 * kappa)) / kappa
    psi = rng.uniform(0.0, TWO_PI, size=n)
    helper = np.where(np.abs(mu[:, :1]) < 0.9, np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 1.0, 0.0]]))
    e1 = helper - np.sum(helper * mu, axis=1, keepdims=True) * mu
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(mu, e1)
    r = np.sqrt(np.clip(1.0 - w * w, 0.0, None))[:, None]
    y = w[:, None] * mu + r * (np.cos(psi)[:, None] * e1 + np.sin(psi)[:, None] * e2)
    return y / np.linalg.norm(y, axis=1, keepdims=True)


__all__ = [
    "ATOM_TOLERANCE",
    "AngleCDF",
    "quadrature_cdf",
    "EmpiricalAngleLaw",
    "QuantileLaw",
    "VonMisesMixture",
    "as_angle_law",
    "make_rng",
    "spherical_mixture_samples",
]
