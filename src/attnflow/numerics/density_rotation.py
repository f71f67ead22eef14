"""Rotations and reflections of a law on ``S^2`` in spherical harmonics: from the gauge frame back.

The sphere's density solver (``attnflow.numerics.density_sphere``) evolves each label's slice in its
gauge frame, ``g_ξ(u) = f_ξ(Q(ξ)ᵀ u)`` for an orthogonal ``Q(ξ)`` (the particles' conjugacy: the
kernel sees ``⟨Q(ξ)x, Q(ζ)y⟩`` only), so the content-frame law is ``f_ξ(x) = g_ξ(Q(ξ) x)``. This
module turns the coefficients of ``g`` into those of ``g ∘ Q``, exactly on every degree (a rotation
keeps the degree), with the Wigner matrices of ``Q``:

- a rotation ``Q`` with ``Qᵀ = exp(θ [n]_×)`` (axis ``n``, angle ``θ``) acts on functions as
  ``g ∘ Q = exp(−iθ n·L) g`` (``L = −i x × ∇``: to first order ``g(x − θ n × x) = g − θ n·(x × ∇g)``);
  on degree ``l`` ``L`` is the ``(2l+1) × (2l+1)`` matrices ``J_z = diag(m)``,
  ``(J_+)_{m, m−1} = sqrt((l − m + 1)(l + m))``, ``J_x = (J_+ + J_−)/2``, ``J_y = (J_+ − J_−)/2i``:
  the ladder of ``density_sphere`` (Condon–Shortley harmonics), so the phases agree by construction;
- a reflection (``det Q = −1``) is ``Q = −R`` with ``R`` a rotation, and ``g(−y)`` multiplies degree
  ``l`` by ``(−1)^l``.

RoPE about the third axis, ``Q = R_z(α)``, is the diagonal case: ``a_lm ↦ e^{imα} a_lm``. The
matrices are made once per run on the host (``O(L lmax³)`` numbers, by Euler angles
from one eigendecomposition per degree); applying them is one product per label and degree.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
from scipy.spatial.transform import Rotation

from attnflow.core.gauges import check_orthogonal

__all__ = ["rotate_coefficients", "wigner_blocks"]


def _jy(degree: int) -> np.ndarray:
    """``J_y = (J_+ − J_−)/2i`` on degree ``degree``, rows and columns ordered ``m = −l … l``."""
    m = np.arange(-degree, degree + 1, dtype=np.float64)
    raise_ = np.diag(np.sqrt((degree - m[1:] + 1.0) * (degree + m[1:])), k=-1)  # (J_+)_{m, m−1}
    return -0.5j * (raise_ - raise_.T)


def wigner_blocks(q, lmax: int) -> np.ndarray:
    """``D (L, lmax+1 [l], lmax+1 [m ≥ 0], 2 lmax + 1 [m' + lmax])`` complex: the coefficients of
    ``g_ξ ∘ Q(ξ)`` are ``Σ_{m'} D[ξ, l, m, m'] a_{l m'}(ξ)`` (``m'`` from ``−l`` to ``l``; zero columns
    past ``|m'| > l``) for per-label orthogonal ``q (L, 3, 3)``.

    ``Q ↦ (g ↦ g ∘ Q)`` is a representation of ``M = Qᵀ``, so the Euler angles ``M = R_z(α) R_y(β)
    R_z(γ)`` give ``e^{−iαJ_z} d(β) e^{−iγJ_z}``, with ``d(β) = exp(−iβJ_y) = V e^{−iβΛ} V^H`` from one
    eigendecomposition ``J_y = V Λ V^H`` per degree (its eigenvalues are ``−l … l``): a product per
    label and degree instead of a matrix exponential."""
    q = check_orthogonal(np.asarray(q, dtype=np.float64), name="density gauge")
    if q.shape[1:] != (3, 3):
        raise ValueError(f"density gauge: matrices must be 3 × 3 on the sphere; got shape {q.shape}.")
    sign = np.sign(np.linalg.det(q))
    turns = np.transpose(sign[:, None, None] * q, (0, 2, 1))  # M = Rᵀ for Q = ±R
    with warnings.catch_warnings():  # β = 0 or π (RoPE about the third axis): any split of α + γ is exact
        warnings.filterwarnings("ignore", message="Gimbal lock", category=UserWarning)
        alpha, beta, gamma = Rotation.from_matrix(turns).as_euler("ZYZ").T
    size = lmax + 1
    blocks = np.zeros((q.shape[0], size, size, 2 * lmax + 1), dtype=np.complex128)
    for degree in range(size):
        eigenvalues, v = np.linalg.eigh(_jy(degree))
        m = np.arange(-degree, degree + 1)
        turn_beta = v[degree:] * np.exp(-1j * np.outer(beta, eigenvalues))[:, None, :]  # (L, m ≥ 0, j)
        d = turn_beta @ v.conj().T  # rows m ≥ 0 of d(β)
        d *= np.exp(-1j * np.outer(alpha, m[degree:]))[:, :, None]
        d *= np.exp(-1j * np.outer(gamma, m))[:, None, :]
        parity = (sign**degree)[:, None, None]
        blocks[:, degree, : degree + 1, lmax - degree : lmax + degree + 1] = parity * d
    return blocks


def rotate_coefficients(a, blocks) -> jnp.ndarray:
    """The coefficients ``(L, l, m ≥ 0)`` of ``g ∘ Q`` from those of ``g``, ``a (L, lmax+1, lmax+1)``
    (a real function: ``a_{l,−m} = (−1)^m conj(a_lm)``), with ``blocks`` from :func:`wigner_blocks`."""
    a = jnp.asarray(a)
    m = jnp.arange(1, a.shape[-1])
    negative = jnp.flip(((-1.0) ** m) * jnp.conj(a[..., 1:]), axis=-1)  # orders −lmax … −1
    full = jnp.concatenate([negative, a], axis=-1)  # (L, l, 2 lmax + 1): m' = −lmax … lmax
    return jnp.einsum("xlmk,xlk->xlm", jnp.asarray(blocks), full)
