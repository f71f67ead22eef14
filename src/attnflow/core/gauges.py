"""Gauges ``Q: A → O(d)``: the orthogonal matrix ``Q(ξ_i)`` each token carries.

A gauge is a frozen pytree holding, for the ``n`` frozen labels, what is needed to apply
``Q(ξ_i)`` and ``Q(ξ_i)ᵀ`` row by row:

- ``IdentityGauge``: ``Q = I`` (plain USA).
- ``RoPE``: RoFormer block rotations ``blockdiag(r(θ_1 ξ), …, r(θ_m ξ))`` on the coordinate pairs
  ``(0,1), (2,3), …``; coordinates past the ``m`` pairs stay fixed. Stored as angles ``(n, m)``, so
  it costs ``O(n d)`` memory whatever ``d``.
- ``DenseGauge``: any per-token orthogonal matrices ``q (n, d, d)`` (generalized RoPE, prompt
  gauges, gauges read from a file, realisation gauges).

``apply(x)`` returns the gauge frame ``u_i = Q(ξ_i) x_i``; ``apply_transpose(u)`` returns
``Q(ξ_i)ᵀ u_i``; ``matrices()`` returns ``q (n, d, d)``; ``is_identity`` (static) says whether
``Q = I`` for every token (then the gauge frame is the content itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.constraints import FREQUENCIES
from attnflow.core.host import to_device
from attnflow.core.pytree import pytree_dataclass

AXES = {"x": (1, 2), "y": (2, 0), "z": (0, 1)}  # generator L_a rotates the plane (i, j) of axis a


@pytree_dataclass(data_fields=[], meta_fields=["n", "d"])
@dataclasses.dataclass(frozen=True)
class IdentityGauge:
    """``Q(ξ) = I`` for every label."""

    n: int
    d: int
    is_identity = True

    def apply(self, x: jax.Array) -> jax.Array:
        return x

    def apply_transpose(self, u: jax.Array) -> jax.Array:
        return u

    def matrices(self) -> jax.Array:
        return _identity_matrices(self.n, self.d)


LAYOUTS = ("interleaved", "half")


@pytree_dataclass(data_fields=["angles"], meta_fields=["d", "layout"])
@dataclasses.dataclass(frozen=True)
class RoPE:
    """Block rotations by ``angles[i, k] = θ_k ξ_i`` on ``m`` coordinate pairs: ``(2k, 2k+1)``
    (``layout="interleaved"``: RoFormer, GPT-J) or ``(k, k+m)`` (``"half"``: the "rotate half" of
    GPT-NeoX, Llama, Qwen2, Mistral, Gemma). The two layouts are conjugate by a permutation of the
    coordinates; with maps ``W_Q, W_K`` of a published model the layout of its code matters."""

    angles: jax.Array  # (n, m), m <= d // 2
    d: int
    layout: str = "interleaved"
    is_identity = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"rope: `layout` must be one of {LAYOUTS}; got {self.layout!r}.")

    @property
    def n(self) -> int:
        return self.angles.shape[0]

    def _rotate(self, x: jax.Array, sign: float) -> jax.Array:
        m = self.angles.shape[1]  # the rotation in the state's dtype (a float32 state: cos rounded)
        cos, sin = jnp.cos(self.angles).astype(x.dtype), (sign * jnp.sin(self.angles)).astype(x.dtype)
        if self.layout == "half":
            a, b = x[:, :m], x[:, m : 2 * m]
            return jnp.concatenate([cos * a - sin * b, sin * a + cos * b, x[:, 2 * m :]], axis=1)
        pairs = x[:, : 2 * m].reshape(x.shape[0], m, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = jnp.stack([cos * a - sin * b, sin * a + cos * b], axis=-1)
        return jnp.concatenate([rotated.reshape(x.shape[0], 2 * m), x[:, 2 * m :]], axis=1)

    def apply(self, x: jax.Array) -> jax.Array:
        return self._rotate(x, 1.0)

    def apply_transpose(self, u: jax.Array) -> jax.Array:
        return self._rotate(u, -1.0)

    def matrices(self) -> jax.Array:
        return _rope_matrices(self)


# ``matrices()`` as one compiled program each (called eagerly for the metrics and the store, they
# would otherwise compile every operation on its own, in every process; inside a trace they are
# inlined). The entries are cos, sin, 0 and 1 exactly, as computed operation by operation.
@partial(jax.jit, static_argnums=(0, 1))
def _identity_matrices(n: int, d: int) -> jax.Array:
    return jnp.broadcast_to(jnp.eye(d), (n, d, d))


@jax.jit
def _rope_matrices(gauge: RoPE) -> jax.Array:
    eye = jnp.broadcast_to(jnp.eye(gauge.d, dtype=gauge.angles.dtype), (gauge.n, gauge.d, gauge.d))
    return jax.vmap(gauge.apply, in_axes=2, out_axes=2)(eye)


@pytree_dataclass(data_fields=["q"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class DenseGauge:
    """Arbitrary per-token orthogonal matrices ``q[i] = Q(ξ_i)``."""

    q: jax.Array  # (n, d, d)
    is_identity = False

    @property
    def n(self) -> int:
        return self.q.shape[0]

    @property
    def d(self) -> int:
        return self.q.shape[1]

    def apply(self, x: jax.Array) -> jax.Array:  # in the state's dtype, as RoPE
        return jnp.einsum("nij,nj->ni", self.q.astype(x.dtype), x)

    def apply_transpose(self, u: jax.Array) -> jax.Array:
        return jnp.einsum("nji,nj->ni", self.q.astype(u.dtype), u)

    def matrices(self) -> jax.Array:
        return self.q


Gauge = IdentityGauge | RoPE | DenseGauge


def check_orthogonal(q: np.ndarray, *, name: str = "gauge", tol: float = 1e-8) -> np.ndarray:
    """Return ``q (n, d, d)`` as float64 after checking every ``q[i]`` is orthogonal to ``tol``."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 3 or q.shape[1] != q.shape[2]:
        raise ValueError(f"{name}: gauge matrices must have shape (n, d, d); got {q.shape}.")
    if not np.all(np.isfinite(q)):
        raise ValueError(f"{name}: gauge matrices must be finite; got non-finite entries.")
    defect = np.abs(np.einsum("nki,nkj->nij", q, q) - np.eye(q.shape[1])).max(axis=(1, 2))
    worst = int(np.argmax(defect))
    if defect[worst] > tol:
        raise ValueError(
            f"{name}: gauge matrices must be orthogonal (|QᵀQ − I| <= {tol:g}); "
            f"got {defect[worst]:.3g} for token {worst}."
        )
    return q


def rope_frequencies(
    d: int, *, kind: str | Sequence[float] = "full_period", n: int | None = None, base: float = 10000.0
) -> np.ndarray:
    """RoPE frequencies ``θ_k``: ``"roformer"`` (``base^{−2(k−1)/d}``, one per pair),
    ``"full_period"`` (a single pair with ``θ_1 = 2π/n``), or an explicit list."""
    if isinstance(kind, str):
        if kind == "roformer":
            return base ** (-2.0 * np.arange(d // 2) / d)
        if kind == "full_period":
            if n is None:
                raise ValueError("rope: `n` is required for full_period frequencies.")
            return np.array([2.0 * np.pi / n])
        raise ValueError(f"rope: `frequencies` must be 'roformer', 'full_period' or a list; got {kind!r}.")
    return _fitting_frequencies(kind, d)


def _fitting_frequencies(frequencies, d: int) -> np.ndarray:
    """``frequencies`` as a float64 vector, refused when there are more than the ``d // 2`` pairs
    (:data:`attnflow.core.constraints.FREQUENCIES`)."""
    frequencies = np.asarray(frequencies, dtype=np.float64).reshape(-1)
    FREQUENCIES.check(frequencies, where="rope", shown=frequencies.tolist(), d=d)
    return frequencies


def make_rope(xi, d: int, frequencies: np.ndarray, *, dtype=jnp.float64, layout: str = "interleaved") -> RoPE:
    """RoPE gauge for scalar positions ``xi (n,)`` (``layout``: see :class:`RoPE`)."""
    xi = np.asarray(xi, dtype=np.float64).reshape(-1)
    frequencies = _fitting_frequencies(frequencies, d)
    return RoPE(angles=to_device(rope_angles(xi, frequencies, dtype), dtype), d=d, layout=layout)


def rope_angles(xi, frequencies, dtype) -> np.ndarray:
    """The angles ``θ_k ξ_i`` ``(n, m)``, formed in float64 on the host. Below float64 they are
    first reduced to ``[−π, π)`` in float64, so that the rounding to ``dtype`` costs at most half
    an ulp of π (6e-8 in float32) whatever the position: rounding a raw angle of 4000 rad to float32
    would cost up to 2.4e-4. Float64 angles are kept as they are (the paper's model, bitwise)."""
    angles = np.outer(np.asarray(xi, dtype=np.float64), np.asarray(frequencies, dtype=np.float64))
    if jnp.dtype(dtype) == jnp.float64:
        return angles
    return np.remainder(angles + np.pi, 2.0 * np.pi) - np.pi


def axis_generator(axis: str) -> np.ndarray:
    """The skew-symmetric generator ``L_axis`` of rotations about a coordinate axis of R^3."""
    i, j = AXES[axis]
    g = np.zeros((3, 3))
    g[j, i], g[i, j] = 1.0, -1.0
    return g


def make_generalized_rope(
    xi, generators: Sequence[np.ndarray], rates: Sequence[float], *, omega: float, dtype=jnp.float64
) -> DenseGauge:
    """``Q(ξ) = Π_k exp(rates_k · omega · ξ · G_k)`` for skew-symmetric ``G_k`` (any d).

    Commuting generators keep the relative property ``Q(ξ)ᵀQ(ζ) = Q(ζ − ξ)``; non-commuting ones
    (default in d = 3: ``L_z`` then ``3 L_x``) give a wavy orbit.
    """
    xi = np.asarray(xi, dtype=np.float64).reshape(-1)
    paths = [skew_exponential(np.asarray(g, dtype=np.float64)) for g in generators]
    d = np.asarray(generators[0]).shape[0]
    q = np.empty((xi.size, d, d))
    for i, position in enumerate(xi):
        m = np.eye(d)
        for path, rate in zip(paths, rates, strict=True):
            m = m @ path(rate * omega * position)
        q[i] = m
    return DenseGauge(q=to_device(q, dtype))


def skew_exponential(g: np.ndarray):
    """``θ ↦ exp(θ G)`` for skew-symmetric ``G``, orthogonal to round-off for any ``θ``.

    The real Schur form ``G = Z T Zᵀ`` of a skew matrix is block diagonal with ``2 × 2`` blocks
    ``[[0, −w], [w, 0]]`` (and zeros); ``exp(θ G) = Z blockdiag(r(θ w), …, 1) Zᵀ`` with exact
    rotations ``r``, unlike ``expm`` whose error grows with ``|θ|``.
    """
    import scipy.linalg  # heavy: only for generalized RoPE, not on import

    t, z = scipy.linalg.schur(g, output="real")
    d = g.shape[0]
    blocks, i = [], 0
    while i < d:
        if i + 1 < d and abs(t[i + 1, i]) > 1e-14 * max(1.0, np.abs(t).max()):
            blocks.append((i, 0.5 * (t[i + 1, i] - t[i, i + 1])))
            i += 2
        else:
            i += 1

    def exponential(theta: float) -> np.ndarray:
        e = np.eye(d)
        for i, w in blocks:
            c, s = np.cos(theta * w), np.sin(theta * w)
            e[i : i + 2, i : i + 2] = [[c, -s], [s, c]]
        return z @ e @ z.T

    return exponential


def haar_orthogonal(key, k: int, d: int) -> np.ndarray:
    """``k`` Haar-distributed orthogonal ``d × d`` matrices.

    ``key`` is a JAX key (QR of a Gaussian, signs fixed) or an integer seed, the config convention:
    ``scipy.stats.ortho_group`` with that seed, the draw of the NumPy/SciPy reference codes (the
    outcomes of the paper's experiment E3 were measured with it).
    """
    if isinstance(key, int | np.integer):
        import scipy.stats  # heavy (most of `import attnflow`'s time): only where it is drawn from

        return scipy.stats.ortho_group.rvs(d, size=k, random_state=int(key)).reshape(k, d, d)
    g = np.asarray(jax.random.normal(key, (k, d, d), dtype=jnp.float64))
    qs, rs = np.linalg.qr(g)
    return qs * np.sign(np.diagonal(rs, axis1=1, axis2=2))[:, None, :]


def make_prompt_gauge(ids, q_prompts: np.ndarray, *, dtype=jnp.float64) -> DenseGauge:
    """Prompt gauge: token ``i`` carries ``Q_{ids[i]}`` from ``q_prompts (K, d, d)``."""
    q_prompts = check_orthogonal(q_prompts, name="prompt gauge")
    return DenseGauge(q=to_device(q_prompts[np.asarray(ids, dtype=int)], dtype))
