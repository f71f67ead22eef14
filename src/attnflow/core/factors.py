"""Factors ``w(ξ, ζ)``: symmetric label-only weights multiplying the kernel (SPEC §1.1).

A factor is a frozen pytree with ``rows(idx) -> (b, n)``, the rows ``w[idx, :]`` computed on the
fly from the labels (so the blocked evaluation never holds an ``n × n`` matrix for the analytic
factors), and ``matrix() -> (n, n)``. ``nonnegative`` is a static flag (the ``sa`` normalisation
and the Dirac criterion D1 need ``w ≥ 0``).

- ``NoFactor``: ``w = 1`` (returns a broadcastable ``(1, 1)`` block of ones).
- ``DistanceBias``: ALiBi-type ``w = exp(−m |ξ − ζ|)``, non-negative.
- ``ToeplitzCos``: ``w = cos(ω (ξ − ζ))``, sign-changing.
- ``MatrixFactor``: any symmetric ``n × n`` array (checked on construction by ``check_symmetric``).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


@partial(jax.tree_util.register_dataclass, data_fields=[], meta_fields=["n"])
@dataclasses.dataclass(frozen=True)
class NoFactor:
    n: int
    nonnegative = True

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.ones((1, 1))

    def matrix(self) -> jax.Array:
        return jnp.ones((self.n, self.n))


@partial(jax.tree_util.register_dataclass, data_fields=["xi", "slope"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class DistanceBias:
    xi: jax.Array  # (n,)
    slope: jax.Array  # scalar m >= 0
    nonnegative = True

    @property
    def n(self) -> int:
        return self.xi.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.exp(-self.slope * jnp.abs(self.xi[idx, None] - self.xi[None, :]))

    def matrix(self) -> jax.Array:
        return self.rows(jnp.arange(self.n))


@partial(jax.tree_util.register_dataclass, data_fields=["xi", "omega"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class ToeplitzCos:
    xi: jax.Array  # (n,)
    omega: jax.Array  # scalar
    nonnegative = False

    @property
    def n(self) -> int:
        return self.xi.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.cos(self.omega * (self.xi[idx, None] - self.xi[None, :]))

    def matrix(self) -> jax.Array:
        return self.rows(jnp.arange(self.n))


@partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=["nonnegative"])
@dataclasses.dataclass(frozen=True)
class MatrixFactor:
    w: jax.Array  # (n, n) symmetric
    nonnegative: bool

    @property
    def n(self) -> int:
        return self.w.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return self.w[idx]

    def matrix(self) -> jax.Array:
        return self.w


Factor = NoFactor | DistanceBias | ToeplitzCos | MatrixFactor


def check_symmetric(w, *, n: int, name: str = "factor", tol: float = 1e-12) -> np.ndarray:
    """Return ``w`` as a float64 ``(n, n)`` array after checking shape, finiteness and symmetry."""
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n, n):
        raise ValueError(f"{name}: factor matrix must have shape (n, n) = ({n}, {n}); got {w.shape}.")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name}: factor matrix must be finite; got non-finite entries.")
    asym = float(np.abs(w - w.T).max())
    if asym > tol * max(1.0, float(np.abs(w).max())):
        raise ValueError(f"{name}: factor matrix must be symmetric (|W − Wᵀ| <= {tol:g}); got {asym:.3g}.")
    return w


def make_matrix_factor(w, *, n: int, dtype=jnp.float64) -> MatrixFactor:
    w = check_symmetric(w, n=n)
    return MatrixFactor(w=jnp.asarray(w, dtype=dtype), nonnegative=bool(np.all(w >= 0)))
