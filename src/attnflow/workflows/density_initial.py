"""The initial law of a density run, from a config's ``[density]`` section (on the label nodes).

- ``init = "uniform"``: ``(1 + amplitude cos(mode (θ − φ_ξ))) / 2π`` on S^1, ``(1 + amplitude
  P_mode(⟨x, c_ξ⟩)) / 4π`` on S^2, a phase ``φ_ξ`` or a direction ``c_ξ`` per label drawn from ``seed``
  (NumPy's PCG64);
- ``init = "vmf"``: the mixture ``Σ_j w_j vMF(c_j, κ)``, the same law for every label;
- ``init = "file"``: the values on the grid, ``(L, M)`` or ``(M,)`` on S^1, ``(L, nlat, nlon)`` or
  ``(nlat, nlon)`` on S^2 (the Gauss–Legendre latitudes and the longitudes of the run's grid, as
  ``density.zarr`` stores them), finite, non-negative, of positive mass in every row; on S^2 in the
  content frame, turned to the gauge frame by the inverse Wigner matrices.

Each label's slice has mass 1 (rows rescaled by the trapezoid rule, exact for the interpolant; on S^2
the harmonic projection divided by its mass). On S^2 the solver holds gauge-frame slices
``g_ξ(u) = f_ξ(Q(ξ)ᵀ u)``: the law's directions ``c`` become ``Q(ξ) c`` (a RoPE turn ``R_z(α_ξ)``
turns them by ``α_ξ``; a prompt gauge may also reflect them).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from attnflow.io.arrays import ArrayFileError, load_array
from attnflow.io.config import Config, ConfigError
from attnflow.numerics import density_circle as dc
from attnflow.numerics import density_rotation
from attnflow.numerics import density_sphere as ds

__all__ = ["circle_initial", "load_checked", "sphere_initial"]


def _fail(key: str, constraint: str, value) -> ConfigError:
    return ConfigError.from_parts(key, constraint, value)


def load_checked(key: str, path) -> np.ndarray:
    """The array of the file named by ``key`` (``.npy``), finite everywhere, or a ``ConfigError``
    naming ``key`` (the density's label, gauge, factor and initial-density files)."""
    try:
        array = load_array(path)
    except ArrayFileError as error:
        raise _fail(key, error.constraint, error.value) from None
    if not np.all(np.isfinite(array)):
        bad = int(np.sum(~np.isfinite(array)))
        raise _fail(key, "finite everywhere", f"{path} with {bad} non-finite entries")
    return array


def _random_phases(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 2.0 * np.pi, count)


def circle_initial(config: Config, labels: dc.LabelQuadrature, grid: int) -> dc.CircleDensity:
    density, count = config.density, labels.size
    theta = dc.grid_angles(grid)
    if density.init == "uniform":
        phase = _random_phases(density.seed, count)[:, None]
        values = (1.0 + density.amplitude * np.cos(density.mode * (theta[None, :] - phase))) / (2 * np.pi)
    elif density.init == "vmf":
        values = np.zeros(grid)
        for center, weight in zip(density.centers, _mixture_weights(density), strict=True):
            angle = math.atan2(center[1], center[0])
            kappa = density.kappa
            values += (
                weight
                * np.exp(kappa * (np.cos(theta - angle) - 1.0))
                / (2 * np.pi * scipy.special.ive(0, kappa))
            )
    else:
        values = _checked_file(density.path, count, (grid,))
    return dc.make_circle_density(values, grid=grid, labels=count)


def _checked_file(path, count: int, shape: tuple[int, ...]) -> np.ndarray:
    """The initial density's grid values read from ``path``: ``(count, *shape)`` or ``shape`` (S^1:
    ``(grid,)``; S^2: ``(nlat, nlon)``), finite, non-negative, every row of positive mass."""
    values = load_checked("density.path", path)
    rows = values[None] if values.ndim == len(shape) else values
    if rows.ndim != len(shape) + 1 or rows.shape[1:] != shape or rows.shape[0] not in (1, count):
        shapes = f"{(count, *shape)} (one row per label node) or {shape}" if count > 1 else str(shape)
        grid = "the grid" if len(shape) == 1 else "the grid (Gauss-Legendre latitudes x longitudes)"
        raise _fail(
            "density.path",
            f"an array of shape {shapes}: the values on {grid}",
            f"{path} with shape {values.shape}",
        )
    if rows.min() < 0.0:
        row, *where = np.unravel_index(int(np.argmin(rows)), rows.shape)
        place = f"angle index {where[0]}" if len(shape) == 1 else f"grid point {tuple(int(i) for i in where)}"
        raise _fail(
            "density.path", "non-negative (a density)", f"{rows.min():.3g} at label row {row}, {place}"
        )
    empty = np.flatnonzero(rows.reshape(rows.shape[0], -1).sum(axis=1) <= 0.0)
    if empty.size:
        raise _fail(
            "density.path",
            "of positive mass in every row (each is rescaled to mass 1)",
            f"zero mass in row {int(empty[0])}",
        )
    return rows


def _mixture_weights(density) -> np.ndarray:
    count = len(density.centers)
    weights = (
        np.full(count, 1.0) if density.weights is None else np.asarray(density.weights, dtype=np.float64)
    )
    return weights / weights.sum()


def _random_directions(seed: int, count: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((count, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _turn(frames: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``Q_l v_l`` for vectors ``(L, 3)`` (or ``(3,)``, the same for every label) and ``frames (L, 3, 3)``."""
    return np.einsum("lij,lj->li", frames, np.broadcast_to(vectors, (frames.shape[0], 3)))


def sphere_initial(config: Config, field: ds.SphereDensityField, labels, frames) -> ds.SphereDensity:
    """The gauge-frame slices ``g_l(u) = f_l(Q_lᵀ u)`` of the initial law: its directions turned
    by ``Q_l`` (``frames (L, 3, 3)``; None: no gauge), on the grid, then projected on the harmonics
    and each slice rescaled to mass 1."""
    density, count = config.density, labels.size
    turns = np.broadcast_to(np.eye(3), (count, 3, 3)) if frames is None else np.asarray(frames)
    points = np.asarray(field.grid_points())  # (3, nlat, nlon)
    if density.init == "uniform":
        directions = _turn(turns, _random_directions(density.seed, count))
        cosines = np.einsum("lc,cab->lab", directions, points)
        wave = scipy.special.eval_legendre(density.mode, cosines)
        values = (1.0 + density.amplitude * wave) / (4 * np.pi)
    elif density.init == "file":  # content-frame values: their harmonics turned to the gauge frame
        rows = _checked_file(density.path, count, tuple(points.shape[1:]))
        values = jnp.asarray(np.broadcast_to(rows, (count, *points.shape[1:])))
        turn = (
            None
            if frames is None
            else density_rotation.wigner_blocks(np.transpose(frames, (0, 2, 1)), field.lmax)
        )
        return _sphere_projection(field, values, turn)
    else:
        values = np.zeros((count, *points.shape[1:]))
        kappa = density.kappa
        norm = kappa / (2 * np.pi * -np.expm1(-2 * kappa))
        for center, weight in zip(density.centers, _mixture_weights(density), strict=True):
            c = np.asarray(center, dtype=np.float64) / np.linalg.norm(center)
            cosines = np.einsum("lc,cab->lab", _turn(turns, c), points)
            values += weight * norm * np.exp(kappa * (cosines - 1.0))
    return _sphere_projection(field, jnp.asarray(values), None)


@jax.jit
def _sphere_projection(field: ds.SphereDensityField, values: jax.Array, turn) -> ds.SphereDensity:
    """The harmonics of grid values ``(L, nlat, nlon)`` (``turn``: Wigner matrices applied to them;
    None: none), each slice rescaled to mass 1 (one compiled program: the transform's operations one
    by one would each compile)."""
    a = field.initial(values).a
    state = ds.SphereDensity(a=a if turn is None else density_rotation.rotate_coefficients(a, turn))
    return ds.SphereDensity(a=state.a / field.mass(state)[:, None, None])
