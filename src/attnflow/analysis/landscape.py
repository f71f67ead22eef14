"""Stationary states of the energy on ``(S^{d−1})^n``: Riemannian Newton and the Morse index, matrix-free.

The energy ``E(x) = (1/(2n²)) Σ_ij h(z_i, z_j)`` is maximised by the dynamics (its gradient flow is
the USA dynamics with the value ``Q(ξ_i)ᵀQ(ξ_j)``: ``v = n·P_x∇E``). Its stationary states are the
zeros of the Riemannian gradient ``P_x∇E``; their stability is read from the Riemannian Hessian.
Everything here uses the energy and two operators only, never an ``(nd)²`` matrix:

- the Riemannian gradient ``G(x) = P_x∇E(x)`` (:func:`riemannian_gradient`), evaluated like the
  vector field (dense, or in tiles of ``block_size`` for large ``n``);
- the Riemannian Hessian applied to a tangent vector (:func:`hessian_vector`): for the embedded
  product of spheres ``Hess E[η] = P_x(DG(x)[η])`` for tangent ``η`` (``DG`` by ``jax.jvp``); this
  equals ``P_x∇²E η − ⟨x_i, ∇_iE⟩ η_i``, the matrix of ``attnflow.analysis.theory.riemannian_hessian``.

The symmetry group. ``E`` depends on ``x`` only through the gauge frame ``u_i = Q(ξ_i)x_i`` and is
invariant under ``u ↦ Ru`` for every rotation ``R``. The tangent vectors ``Q(ξ_i)ᵀ A u_i`` (``A``
skew, :func:`symmetry_modes`) are zero modes of the Hessian at every stationary state (3 for a
state spanning ``R³``, 2 for a Dirac). Both the Newton step and the spectrum are taken on the
tangent space with these modes removed: the Newton equation ``Hess E[η] = −G`` is then solvable
(MINRES, matrix-free), and "strict local maximum modulo rotations" means every remaining eigenvalue
is negative.

- :func:`newton`: Riemannian Newton–Krylov to a stationary state of any index (the residual
  ``|G|`` decreases at every accepted step: a backtracking line search on ``|G|``, each particle's
  step capped at ``MAX_STEP`` radians), until ``|G|`` (Frobenius) is at most ``gradient_tol``.
- :func:`hessian_spectrum`: the top eigenvalues of the Hessian on the complement of the symmetry
  modes by Lanczos (ARPACK's implicitly restarted Lanczos on Hessian-vector products), and the
  Morse index: the number of eigenvalues above ``INDEX_RTOL·scale`` (ascent directions; 0 for a
  strict local maximum modulo rotations). More eigenvalues are asked for until one at or below the
  threshold is found, so the index is exact, not capped.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse.linalg

from attnflow.core.kernel import Kernel
from attnflow.core.sphere import normalize, project
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.summation import attention_sum, energy

GRADIENT_TOL = 1e-13  # Newton's target for |P_x ∇E| (Frobenius over all particles)
INDEX_RTOL = 1e-8  # an eigenvalue counts as an ascent direction above INDEX_RTOL · scale
SYMMETRY_RTOL = 1e-8  # symmetry modes with a singular value below this (relative) are dependent
MAX_STEP = 0.5  # radians: the largest Newton step of one particle (a trust region far from a state)
MAX_NEWTON = 60
LINE_SEARCH_HALVINGS = 12
TOP_EIGENVALUES = 8  # eigenvalues asked of Lanczos first (doubled until one is below the threshold)


@partial(jax.jit, static_argnames="block_size")
def riemannian_gradient(kernel: Kernel, x: jax.Array, *, block_size: int | None = None) -> jax.Array:
    """``P_{x_i}∇_{x_i}E`` for every particle ``(n, d)``: the gradient-flow field divided by ``n``."""
    return make_vector_field(kernel, block_size=block_size)(x) / kernel.n


@partial(jax.jit, static_argnames="block_size")
def hessian_vector(
    kernel: Kernel, x: jax.Array, eta: jax.Array, *, block_size: int | None = None
) -> jax.Array:
    """The Riemannian Hessian of ``E`` at ``x`` applied to ``P_x η``: ``P_x DG(x)[P_x η]``, ``(n, d)``."""
    eta = project(x, eta)
    _, dg = jax.jvp(lambda y: riemannian_gradient(kernel, y, block_size=block_size), (x,), (eta,))
    return project(x, dg)


def symmetry_modes(kernel: Kernel, x) -> np.ndarray:
    """An orthonormal basis ``(k, n·d)`` of the tangent directions ``Q(ξ_i)ᵀ A u_i`` (``A`` skew)
    along which ``E`` is constant: the orbit of ``x`` under the rotations of the gauge frame."""
    x = jnp.asarray(x, dtype=jnp.float64)
    gauge, d = kernel.gauge, x.shape[1]
    u = gauge.apply(x)
    modes = []
    for a in range(d):
        for b in range(a + 1, d):
            generator = np.zeros((d, d))
            generator[a, b], generator[b, a] = 1.0, -1.0
            modes.append(np.asarray(gauge.apply_transpose(u @ jnp.asarray(generator.T))).reshape(-1))
    _, s, vt = np.linalg.svd(np.stack(modes), full_matrices=False)
    return vt[s > SYMMETRY_RTOL * s[0]]


def _reduced_projector(x: np.ndarray, modes: np.ndarray):
    """``v ↦`` the tangent part of ``v`` with the symmetry modes removed (flat vectors)."""

    def apply(v: np.ndarray) -> np.ndarray:
        v = v.reshape(x.shape)
        v = (v - np.sum(x * v, axis=1, keepdims=True) * x).reshape(-1)
        return v - modes.T @ (modes @ v)

    return apply


def reduced_hessian(kernel: Kernel, x, *, block_size: int | None = None, shift: float = 1.0):
    """The Hessian at ``x`` as a ``scipy`` ``LinearOperator`` on ``R^{n·d}``: ``Π H Π`` on the
    reduced tangent space (``Π``: tangent, symmetry modes removed), ``−shift`` on its complement
    (the normal directions and the symmetry modes, moved out of the way of the top eigenvalues).
    Returns the operator, the projector and the number of symmetry modes."""
    x64 = jnp.asarray(x, dtype=jnp.float64)
    xn = np.asarray(x64)
    modes = symmetry_modes(kernel, x64)
    proj = _reduced_projector(xn, modes)
    shape = xn.shape

    def matvec(v):
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        pv = proj(v)
        hv = np.asarray(hessian_vector(kernel, x64, jnp.asarray(pv.reshape(shape)), block_size=block_size))
        return proj(hv.reshape(-1)) - shift * (v - pv)

    size = xn.size
    operator = scipy.sparse.linalg.LinearOperator((size, size), matvec=matvec, dtype=np.float64)
    return operator, proj, modes.shape[0]


@dataclasses.dataclass(frozen=True)
class NewtonResult:
    """Where Newton stopped: the state, its energy, ``|P_x∇E|``, the iterations and whether
    ``gradient_norm <= gradient_tol``."""

    x: np.ndarray
    energy: float
    gradient_norm: float
    iterations: int
    converged: bool


def _norm(kernel, x, block_size):
    return float(jnp.linalg.norm(riemannian_gradient(kernel, x, block_size=block_size)))


def newton(
    kernel: Kernel,
    x0,
    *,
    gradient_tol: float = GRADIENT_TOL,
    max_iter: int = MAX_NEWTON,
    block_size: int | None = None,
) -> NewtonResult:
    """Riemannian Newton–Krylov from ``x0`` (rows normalised) to a stationary state of ``E``.

    Each step solves ``Hess E[η] = −P_x∇E`` on the tangent space with the symmetry modes removed
    (MINRES to a relative residual ``min(1e-2, |G|)``, floored at 1e-13), caps each particle's step at
    ``MAX_STEP`` and retracts (``x_i ← (x_i + α η_i)/|x_i + α η_i|``) with the largest
    ``α = 2^{−k}`` that decreases ``|G|``. Stops at ``|G| <= gradient_tol``, after ``max_iter``
    steps, or when no step decreases ``|G|`` (the round-off floor).
    """
    x = normalize(jnp.asarray(x0, dtype=jnp.float64))
    if x.ndim != 2 or x.shape != (kernel.n, kernel.gauge.d) or not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError(
            f"newton: `x0` must be a finite (n, d) = ({kernel.n}, {kernel.gauge.d}) array; "
            f"got shape {tuple(x.shape)}."
        )
    g = riemannian_gradient(kernel, x, block_size=block_size)
    gn = float(jnp.linalg.norm(g))
    iterations = 0
    while gn > gradient_tol and iterations < max_iter:
        operator, proj, _ = reduced_hessian(kernel, x, block_size=block_size)
        rhs = -proj(np.asarray(g).reshape(-1))
        rtol = max(1e-13, min(1e-2, gn))
        eta, _ = scipy.sparse.linalg.minres(operator, rhs, rtol=rtol, maxiter=20 * rhs.size)
        eta = eta.reshape(x.shape)
        widest = float(np.max(np.linalg.norm(eta, axis=1)))
        if widest > MAX_STEP:
            eta = eta * (MAX_STEP / widest)
        eta = jnp.asarray(eta)
        alpha, accepted = 1.0, False
        for _ in range(LINE_SEARCH_HALVINGS):
            trial = normalize(x + alpha * eta)
            g_trial = riemannian_gradient(kernel, trial, block_size=block_size)
            gn_trial = float(jnp.linalg.norm(g_trial))
            if gn_trial < (1.0 - 1e-4 * alpha) * gn:
                x, g, gn, accepted = trial, g_trial, gn_trial, True
                break
            alpha /= 2.0
        iterations += 1
        if not accepted:
            break
    return NewtonResult(
        x=np.asarray(x),
        energy=float(energy(kernel, x, block_size=block_size)),
        gradient_norm=gn,
        iterations=iterations,
        converged=gn <= gradient_tol,
    )


@dataclasses.dataclass(frozen=True)
class HessianSpectrum:
    """The top of the Hessian's spectrum on the tangent space modulo the symmetry modes.

    ``eigenvalues``: the largest ones found, descending (at least ``TOP_EIGENVALUES`` where the
    reduced space is that large, and always one at or below ``threshold`` unless every eigenvalue is
    above it); ``index``: how many exceed ``threshold = INDEX_RTOL · scale`` (``scale``: the largest
    of ``|λ|`` found and ``max_i |⟨x_i, ∇_iE⟩|``); ``symmetry_dim``: the number of zero modes removed.
    """

    eigenvalues: np.ndarray
    index: int
    threshold: float
    symmetry_dim: int

    @property
    def top(self) -> float:
        """The largest eigenvalue modulo symmetry (``< 0``: a strict local maximum)."""
        return float(self.eigenvalues[0])


@partial(jax.jit, static_argnames="block_size")
def _scale(kernel: Kernel, x: jax.Array, block_size: int | None) -> jax.Array:
    """``max_i |⟨x_i, ∇_iE⟩|``, the curvature term of the Hessian (a scale of its entries).

    ``∇_{x_i}E = Q(ξ_i)ᵀ a_i / n`` with ``a = attention_sum(u, u)`` ("usa") in the gauge frame, so
    ``⟨x_i, ∇_iE⟩ = ⟨u_i, a_i⟩ / n``.
    """
    u = kernel.gauge.apply(x)
    a = attention_sum(kernel, u, u, block_size=block_size)
    return jnp.max(jnp.abs(jnp.sum(u * a, axis=1))) / kernel.n


def hessian_spectrum(
    kernel: Kernel,
    x,
    *,
    block_size: int | None = None,
    k: int = TOP_EIGENVALUES,
) -> HessianSpectrum:
    """Top eigenvalues and Morse index of the Riemannian Hessian at ``x`` modulo symmetry (Lanczos)."""
    x = jnp.asarray(x, dtype=jnp.float64)
    n, d = x.shape
    scale = float(_scale(kernel, x, block_size))
    operator, _, n_sym = reduced_hessian(kernel, x, block_size=block_size, shift=max(scale, 1e-300))
    reduced = n * (d - 1) - n_sym
    size = n * d
    k = max(1, min(k, reduced))
    while True:
        if k >= size - 1:  # ARPACK needs k < size - 1: small problems in one dense pass of matvecs
            dense = np.column_stack([operator.matvec(e) for e in np.eye(size)])
            values = np.linalg.eigvalsh((dense + dense.T) / 2.0)[::-1][:reduced]
        else:
            values = scipy.sparse.linalg.eigsh(
                operator, k=k, which="LA", return_eigenvectors=False, tol=1e-13
            )
            values = np.sort(values)[::-1]
        threshold = INDEX_RTOL * max(scale, float(np.max(np.abs(values))))
        if values[-1] <= threshold or k >= reduced:
            break
        k = min(2 * k, reduced)
    return HessianSpectrum(
        eigenvalues=values,
        index=int(np.sum(values > threshold)),
        threshold=threshold,
        symmetry_dim=n_sym,
    )


__all__ = [
    "GRADIENT_TOL",
    "INDEX_RTOL",
    "HessianSpectrum",
    "NewtonResult",
    "hessian_spectrum",
    "hessian_vector",
    "newton",
    "reduced_hessian",
    "riemannian_gradient",
    "symmetry_modes",
]
