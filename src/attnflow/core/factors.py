"""Factors ``w(ξ, ζ)``: symmetric label-only weights multiplying the kernel.

The kernel is ``h((x,ξ),(y,ζ)) = w(ξ,ζ) φ(⟨Q(ξ)x, Q(ζ)y⟩)``; a factor is the ``w`` part, a frozen
pytree over the ``n`` frozen labels. Each factor carries its own operations, so a new factor is
one class here:

- ``rows(idx) -> (b, n)``: the rows ``w[idx, :]`` computed on the fly from the labels (so the
  blocked evaluation never holds an ``n × n`` matrix for the analytic factors);
- ``tile(idx_i, idx_j, dtype) -> (b_i, b_j)``: the block ``w[idx_i][:, idx_j]`` (or a
  broadcastable ``(1, 1)`` block of ones), what the tiled sums evaluate;
- ``dense() -> (n, n)``: the whole matrix ``W``;
- ``mean() -> float``: ``(1/n²) Σ_ij w_ij``, in closed form where one exists (energy bounds);
- ``eigenpairs() -> (values (n,), vectors (n, r))``: the eigenvalues of ``W`` in descending
  order and the first ``r`` orthonormal eigenvectors (``r = n``, or the rank of a low-rank ``W``);
- ``tabulated()``: the same factor with ``W`` evaluated once as a :class:`MatrixFactor` (the
  factors that are cheaper as a table return themselves).

``nonnegative`` is a static flag (the ``sa`` normalisation and the Dirac criterion need ``w ≥ 0``).

- ``NoFactor``: ``w = 1`` (returns a broadcastable ``(1, 1)`` block of ones).
- ``DistanceBias``: ALiBi-type ``w = exp(−m |ξ − ζ|)``, non-negative.
- ``ToeplitzCos``: ``w = cos(ω (ξ − ζ))``, sign-changing, of rank 2.
- ``MatrixFactor``: any symmetric ``n × n`` array (checked on construction by ``check_symmetric``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.host import to_device
from attnflow.core.pytree import pytree_dataclass


class _FactorOperations:
    """The operations every factor has, written from its ``rows`` (each factor class defines
    ``rows``, and overrides the operations it can do better)."""

    n: int
    nonnegative: bool

    def dense(self) -> jax.Array:
        return self.rows(jnp.arange(self.n))

    def matrix(self) -> jax.Array:
        """The same as :meth:`dense` (kept for the callers that still use this name)."""
        return self.dense()

    def tile(self, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
        """``w[idx_i][:, idx_j]`` in ``dtype``; here through whole rows, ``O(len(idx_i) · n)``."""
        return self.rows(idx_i)[:, idx_j].astype(dtype)

    def mean(self) -> float:
        """``(1/n²) Σ_ij w_ij`` from the dense matrix."""
        return float(jnp.mean(self.dense()))

    def eigenpairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues of ``W`` (descending, float64) and all ``n`` orthonormal eigenvectors."""
        values, vectors = np.linalg.eigh(np.asarray(self.dense(), dtype=np.float64))
        return values[::-1], vectors[:, ::-1]

    def tabulated(self) -> MatrixFactor:
        """The same ``w`` evaluated once, as a matrix (an analytic factor recomputes an ``exp`` or
        a ``cos`` per entry at every evaluation; a table is read instead)."""
        return MatrixFactor(w=self.dense(), nonnegative=self.nonnegative)


def _label_tile(factor, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
    """The tile of a factor that is a formula of the labels ``ξ``: its rows on the labels
    ``(ξ_idx_i, ξ_idx_j)``, restricted to the second group. XLA pushes the slice through the
    elementwise formula, so only ``b_i × b_j`` entries are computed."""
    b = idx_i.shape[0]
    local = dataclasses.replace(factor, xi=jnp.concatenate([factor.xi[idx_i], factor.xi[idx_j]]))
    return local.rows(jnp.arange(b))[:, b:].astype(dtype)


@pytree_dataclass(data_fields=[], meta_fields=["n"])
@dataclasses.dataclass(frozen=True)
class NoFactor(_FactorOperations):
    """``w = 1``."""

    n: int
    nonnegative = True

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.ones((1, 1))

    def dense(self) -> jax.Array:
        return jnp.ones((self.n, self.n))

    def tile(self, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
        return jnp.ones((1, 1), dtype)

    def mean(self) -> float:
        return 1.0

    def tabulated(self) -> NoFactor:
        return self  # ones broadcast: cheaper than any table


@pytree_dataclass(data_fields=["xi", "slope"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class DistanceBias(_FactorOperations):
    """ALiBi-type ``w = exp(−m |ξ − ζ|)``, ``m ≥ 0``."""

    xi: jax.Array  # (n,)
    slope: jax.Array  # scalar m >= 0
    nonnegative = True

    @property
    def n(self) -> int:
        return self.xi.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.exp(-self.slope * jnp.abs(self.xi[idx, None] - self.xi[None, :]))

    def tile(self, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
        return _label_tile(self, idx_i, idx_j, dtype)

    def mean(self) -> float:
        """With sorted labels, ``S_j = Σ_{i<j} e^{−m(ξ_j−ξ_i)}`` obeys
        ``S_j = e^{−m(ξ_j−ξ_{j−1})}(S_{j−1} + 1)``, so ``Σ w = n + 2 Σ_j S_j``: O(n log n), no
        overflow (a ``lax.scan``)."""
        decay = jnp.exp(-self.slope * jnp.diff(jnp.sort(self.xi)))

        def step(s, a):
            s = a * (s + 1.0)
            return s, s

        _, partial_sums = jax.lax.scan(step, jnp.zeros((), decay.dtype), decay)
        n = self.n
        return float((n + 2.0 * jnp.sum(partial_sums)) / n**2)


@pytree_dataclass(data_fields=["xi", "omega"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class ToeplitzCos(_FactorOperations):
    """``w = cos(ω (ξ − ζ))``: ``W = F Fᵀ`` with ``F = [cos ωξ, sin ωξ]`` (rank 2)."""

    xi: jax.Array  # (n,)
    omega: jax.Array  # scalar
    nonnegative = False

    @property
    def n(self) -> int:
        return self.xi.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return jnp.cos(self.omega * (self.xi[idx, None] - self.xi[None, :]))

    def tile(self, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
        return _label_tile(self, idx_i, idx_j, dtype)

    def mean(self) -> float:
        """``|(1/n) Σ_j e^{iωξ_j}|²`` (``W = Re(z z^*)``, ``z_j = e^{iωξ_j}``), O(n)."""
        z = jnp.exp(1j * self.omega * self.xi)
        return float(jnp.abs(jnp.mean(z)) ** 2)

    def eigenpairs(self) -> tuple[np.ndarray, np.ndarray]:
        """From the rank-2 form, O(n): the eigenpairs of ``FᵀF`` give the two non-zero ones (the
        other ``n − 2`` eigenvalues are 0); returns those two eigenvectors."""
        f = np.stack([np.cos(self.omega * self.xi), np.sin(self.omega * self.xi)], axis=1).astype(np.float64)
        small, rot = np.linalg.eigh(f.T @ f)
        values = np.concatenate([small[::-1], np.zeros(f.shape[0] - 2)])
        vectors = (f @ rot[:, ::-1]) / np.sqrt(np.maximum(small[::-1], np.finfo(float).tiny))
        return values, vectors


@pytree_dataclass(data_fields=["w"], meta_fields=["nonnegative"])
@dataclasses.dataclass(frozen=True)
class MatrixFactor(_FactorOperations):
    """Any symmetric ``n × n`` matrix ``w`` (build it with :func:`make_matrix_factor`)."""

    w: jax.Array  # (n, n) symmetric
    nonnegative: bool

    @property
    def n(self) -> int:
        return self.w.shape[0]

    def rows(self, idx: jax.Array) -> jax.Array:
        return self.w[idx]

    def dense(self) -> jax.Array:
        return self.w

    def tile(self, idx_i: jax.Array, idx_j: jax.Array, dtype) -> jax.Array:
        return self.w[idx_i[:, None], idx_j[None, :]].astype(dtype)

    def tabulated(self) -> MatrixFactor:
        return self


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
    return MatrixFactor(w=to_device(w, dtype), nonnegative=bool(np.all(w >= 0)))


def check_tokens(gauge, factor, *, where: str) -> None:
    """A factor over the gauge's tokens: their counts ``n`` equal where both say one (a kernel's or a
    head's; one line here instead of a broadcasting error deep inside JAX)."""
    tokens = getattr(gauge, "n", None), getattr(factor, "n", None)
    if all(isinstance(count, int) for count in tokens) and tokens[0] != tokens[1]:
        raise ValueError(
            f"{where}: `factor` must be over the gauge's n = {tokens[0]} tokens; got one over {tokens[1]}."
        )


def check_softmax_factor(factor, normalization: str, *, where: str, head: int | None = None) -> None:
    """The softmax (``normalization`` "sa") normalises rows of weights: the factor must be
    non-negative. The one place this rule is checked (fields, the expansion, densities)."""
    if normalization == "sa" and not factor.nonnegative:
        which = "" if head is None else f" in head {head}"
        raise ValueError(
            f"{where}: `normalization` 'sa' requires a non-negative factor (softmax weights); "
            f"got the sign-changing factor {type(factor).__name__}{which}."
        )
