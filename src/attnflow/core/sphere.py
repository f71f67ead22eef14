"""Geometry of the unit sphere S^{d-1} ⊂ R^d and the initial laws on it.

Every function acts row-wise on an array of points ``x (n, d)``.

- ``normalize(x)``: radial projection onto the sphere.
- ``project(x, y)``: the tangent projection ``P_x(y) = y − ⟨x, y⟩ x``.
- ``exp_map(x, v)``: the geodesic from ``x`` with initial velocity ``v`` (tangent) at time 1,
  ``cos|v| x + sinc|v| v``, series-safe at ``v = 0``.
- ``dexp_inv(x, sigma, w)``: the inverse differential of ``exp_x`` at ``sigma``, used to integrate in
  normal coordinates (geodesic Runge–Kutta).
- ``geodesic_distance(x, y)``: ``arccos⟨x, y⟩`` with the argument clipped (and an ``arctan2`` form
  that stays accurate for nearly equal points).
- Samplers: ``sample_uniform`` (normalised Gaussians), ``sample_cap`` (a Gaussian blob of width
  ``sigma`` around a direction, normalised), ``equiangular`` (all pairwise cosines equal ``rho0``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.host import to_device


def _dot(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(x * y, axis=-1, keepdims=True)


def normalize(x: jax.Array) -> jax.Array:
    """Scale every row of ``x`` to unit length."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def project(x: jax.Array, y: jax.Array) -> jax.Array:
    """Tangent projection ``P_x(y) = y − ⟨x, y⟩ x`` (row-wise)."""
    return y - _dot(x, y) * x


def _sinc(r: jax.Array) -> jax.Array:
    """``sin(r)/r`` with the removable singularity at 0 filled in."""
    return jnp.sinc(r / jnp.pi)


def exp_map(x: jax.Array, v: jax.Array) -> jax.Array:
    """Riemannian exponential ``exp_x(v) = cos|v| x + (sin|v|/|v|) v`` for tangent ``v``."""
    r = jnp.linalg.norm(v, axis=-1, keepdims=True)
    return jnp.cos(r) * x + _sinc(r) * v


def dexp_inv(x: jax.Array, sigma: jax.Array, w: jax.Array) -> jax.Array:
    """Pull a tangent vector ``w`` at ``exp_x(sigma)`` back to ``T_x`` through ``d(exp_x)_sigma``.

    With ``r = |sigma|``, ``e = sigma/r`` and ``p = −sin r x + cos r e`` (the unit velocity of the
    geodesic at ``exp_x(sigma)``), the differential stretches the ``e`` direction by 1 and the
    directions orthogonal to ``x`` and ``e`` by ``sin r / r``; so ``w = a p + w_perp`` pulls back
    to ``a e + w_perp r / sin r``. At ``sigma = 0`` this is the identity.
    """
    r = jnp.linalg.norm(sigma, axis=-1, keepdims=True)
    e = sigma / jnp.where(r > 0, r, 1.0)
    p = -jnp.sin(r) * x + jnp.cos(r) * e
    along = _dot(w, p)
    return along * e + (w - along * p) / _sinc(r)


def geodesic_distance(x: jax.Array, y: jax.Array) -> jax.Array:
    """Great-circle distance between matching rows of ``x`` and ``y``."""
    cross = jnp.linalg.norm(x - _dot(x, y) * y, axis=-1)
    return jnp.arctan2(cross, jnp.clip(jnp.sum(x * y, axis=-1), -1.0, 1.0))


def _seeded(key) -> bool:
    """Whether ``key`` is an integer seed (NumPy's PCG64 stream) rather than a JAX key."""
    return isinstance(key, int | np.integer)


def _numpy_gaussian(seed, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Standard Gaussians from an integer seed through NumPy's PCG64, rounded to ``dtype``.

    An integer seed is the config convention (``init.seed``): ``np.random.default_rng(seed)``
    draws the same initial data as a plain NumPy implementation of the model, whatever JAX's PRNG
    settings, so results can be compared seed by seed with reference codes.
    """
    return np.random.default_rng(int(seed)).standard_normal(shape).astype(dtype)


def _numpy_normalize(x: np.ndarray) -> np.ndarray:
    """``normalize`` on the host, in the same operations (``x / sqrt(sum(x * x))`` per row)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))


def _unit_center(c: np.ndarray) -> np.ndarray:
    """``c / |c|``; a center whose squared norm leaves the dtype's range (1e-200 or 1e200 in
    float64, 1e-30 in float32) is first divided by its largest entry: a direction like any other."""
    if not (np.all(np.isfinite(c)) and np.any(c)):
        raise ValueError(f"sample_cap: `center` must be a finite nonzero vector; got {c.tolist()}.")
    with np.errstate(over="ignore", under="ignore"):
        square = np.sum(c * c)
    if not np.finfo(c.dtype).tiny <= square < np.inf:
        c = c / np.max(np.abs(c))
    return _numpy_normalize(c)


def sample_uniform(key, n: int, d: int, *, dtype=jnp.float64) -> jax.Array:
    """``n`` iid uniform points on ``S^{d−1}`` (normalised standard Gaussians).

    ``key`` is a JAX key or an integer seed (NumPy's ``default_rng(seed).standard_normal((n, d))``;
    then computed on the host, :mod:`attnflow.core.host`).
    """
    if _seeded(key):
        return to_device(_numpy_normalize(_numpy_gaussian(key, (n, d), dtype)), dtype)
    return normalize(jax.random.normal(key, (n, d), dtype=dtype))


def sample_cap(key, n: int, center: jax.Array, *, sigma: float, dtype=jnp.float64) -> jax.Array:
    """``n`` points ``normalize(c + sigma·g)``, ``g`` standard Gaussian, ``c`` the unit center.

    ``key`` is a JAX key or an integer seed, as for ``sample_uniform``.
    """
    if _seeded(key):
        c = _unit_center(np.asarray(center, dtype=dtype))
        points = c + sigma * _numpy_gaussian(key, (n, c.shape[-1]), dtype)
        return to_device(_numpy_normalize(points), dtype)
    center = normalize(jnp.asarray(center, dtype=dtype))
    return normalize(center + sigma * jax.random.normal(key, (n, center.shape[-1]), dtype=dtype))


def equiangular(n: int, d: int, rho0: float, *, dtype=jnp.float64) -> jax.Array:
    """``n`` unit vectors in ``R^d`` (``d ≥ n``) with every pairwise cosine equal to ``rho0``.

    Rows of the Cholesky factor of the Gram matrix ``(1 − rho0) I + rho0 11ᵀ``, embedded in the
    first ``n`` coordinates. Requires ``−1/(n−1) < rho0 < 1`` (positive definiteness).
    """
    if d < n:
        raise ValueError(f"equiangular: `d` must be >= n = {n}; got {d}.")
    if n == 1:
        x = np.zeros((1, d))
        x[0, 0] = 1.0
        return to_device(x, dtype)
    if not -1.0 / (n - 1) < rho0 < 1.0:
        raise ValueError(
            f"equiangular: `rho0` must lie in (-1/(n-1), 1) = ({-1.0 / (n - 1)}, 1); got {rho0!r}."
        )
    gram = (1.0 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    chol = np.linalg.cholesky(gram)
    x = np.zeros((n, d))
    x[:, :n] = chol
    return to_device(x, dtype)
