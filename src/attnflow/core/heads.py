"""Attention heads: the query, key, value and output maps of one head, with its gauge and factor.

Head ``h`` of a layer on tokens ``x_i ∈ S^{d−1}`` has maps ``W_Q, W_K, W_V (d_h, d)`` and
``W_O (d, d_h)``, a gauge ``G(ξ) ∈ O(d_h)`` (any gauge of :mod:`attnflow.core.gauges`, built in the
head dimension) and a factor ``w(ξ, ζ)`` (:mod:`attnflow.core.factors`)::

    q_i = G(ξ_i) W_Q x_i,   k_j = G(ξ_j) W_K x_j,   s_ij = ⟨q_i, k_j⟩
    values "plain"  : out_i = W_O Σ_j a_ij W_V x_j                 (a RoPE layer)
    values "rotated": out_i = W_O G(ξ_i)ᵀ Σ_j a_ij G(ξ_j) W_V x_j   (the paper's convention)

with the attention weights ``a_ij`` of the profile and the normalisation
(:func:`attnflow.numerics.summation.qkv_sum`). A ``Head`` is a frozen pytree (the maps, gauge and
factor are its children; ``values`` is static), so a list of heads enters jitted code as it is.

Constructors: :func:`make_head` from arrays (checked), :func:`identity_maps`,
:func:`gaussian_maps`, :func:`orthogonal_maps`, :func:`shared_maps` (``W_Q = W_K = W_V = W``,
``W_O = Wᵀ``) and :func:`random_qk_maps` (random ``W_Q``, ``W_K``; ``W_V = W_O = I``) for seeded
random heads; :func:`alibi_slopes` for the per-head distance bias.

:func:`is_gradient_head` tells whether a head keeps the layer a gradient flow of the energy
``E = Σ_h (1/(2n²)) Σ_ij w_ij φ(s_ij)``: (a) ``W_Q = W_K = W_V = W`` and ``W_O = Wᵀ`` with rotated
values, or (b) the identity gauge, ``A = W_QᵀW_K`` symmetric and ``W_O W_V = A``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.factors import check_tokens
from attnflow.core.host import to_device
from attnflow.core.pytree import pytree_dataclass

VALUES = ("plain", "rotated")
MAP_NAMES = ("query", "key", "value", "output")
GRADIENT_ATOL = 1e-12  # relative entrywise tolerance of the gradient-flow conditions (round-off of W)


@pytree_dataclass(data_fields=["query", "key", "value", "output", "gauge", "factor"], meta_fields=["values"])
@dataclasses.dataclass(frozen=True)
class Head:
    """One attention head: ``query, key, value (d_h, d)``, ``output (d, d_h)``, a gauge of dimension
    ``d_h`` over the ``n`` tokens, a factor, and how values are read (``values``)."""

    query: jax.Array
    key: jax.Array
    value: jax.Array
    output: jax.Array
    gauge: object
    factor: object
    values: str = "rotated"

    def __post_init__(self):
        if self.values not in VALUES:
            raise ValueError(f"head: `values` must be one of {VALUES}; got {self.values!r}.")
        d_h, d = self.query.shape
        for name in ("key", "value"):
            if getattr(self, name).shape != (d_h, d):
                raise ValueError(
                    f"head: `{name}` must have the shape of `query` (d_h, d) = {(d_h, d)}; "
                    f"got {getattr(self, name).shape}."
                )
        if self.output.shape != (d, d_h):
            raise ValueError(
                f"head: `output` must have shape (d, d_h) = {(d, d_h)}; got {self.output.shape}."
            )
        if self.gauge.d != d_h:
            raise ValueError(
                f"head: the gauge must act on the head dimension d_h = {d_h}; got d = {self.gauge.d}."
            )
        check_tokens(self.gauge, self.factor, where="head")

    @property
    def n(self) -> int | None:
        """The number of tokens, the gauge's (None for a gauge of any n)."""
        n = getattr(self.gauge, "n", None)
        return n if isinstance(n, int) else None

    @property
    def head_dim(self) -> int:
        return self.query.shape[0]

    @property
    def d(self) -> int:
        return self.query.shape[1]

    def queries(self, x: jax.Array) -> jax.Array:
        """``q_i = G(ξ_i) W_Q x_i``, ``(n, d_h)``."""
        return self.gauge.apply(x @ self.query.T.astype(x.dtype))

    def keys(self, x: jax.Array) -> jax.Array:
        """``k_j = G(ξ_j) W_K x_j``, ``(n, d_h)``."""
        return self.gauge.apply(x @ self.key.T.astype(x.dtype))

    def value_vectors(self, x: jax.Array) -> jax.Array:
        """What is summed: ``W_V x_j`` (plain) or ``G(ξ_j) W_V x_j`` (rotated), ``(n, d_h)``."""
        v = x @ self.value.T.astype(x.dtype)
        return self.gauge.apply(v) if self.values == "rotated" else v

    def read_out(self, summed: jax.Array) -> jax.Array:
        """``W_O Σ_j a_ij v_j`` (plain) or ``W_O G(ξ_i)ᵀ Σ_j a_ij v_j`` (rotated), ``(n, d)``."""
        if self.values == "rotated":
            summed = self.gauge.apply_transpose(summed)
        return summed @ self.output.T.astype(summed.dtype)


def _host(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    scale = max(1.0, float(np.max(np.abs(a))), float(np.max(np.abs(b))))
    return bool(np.max(np.abs(a - b)) <= GRADIENT_ATOL * scale)


def is_gradient_head(head: Head) -> bool:
    """Whether ``head`` satisfies condition (a) or (b) of the module docstring (to round-off)."""
    wq, wk, wv, wo = (_host(getattr(head, name)) for name in MAP_NAMES)
    shared = _close(wq, wk) and _close(wq, wv) and _close(wo, wq.T)
    if shared and head.values == "rotated":
        return True
    a = wq.T @ wk
    return bool(getattr(head.gauge, "is_identity", False)) and _close(a, a.T) and _close(wo @ wv, a)


def make_head(
    query, key, value, output, *, gauge, factor, values: str = "rotated", dtype=jnp.float64
) -> Head:
    """A head from arrays (NumPy or JAX): shapes checked, every entry finite."""
    arrays = {}
    for name, array in zip(MAP_NAMES, (query, key, value, output), strict=True):
        array = _host(array)
        if array.ndim != 2:
            raise ValueError(f"head: `{name}` must be a matrix; got shape {array.shape}.")
        if not np.all(np.isfinite(array)):
            raise ValueError(
                f"head: `{name}` must be finite; got {int(np.sum(~np.isfinite(array)))} non-finite entries."
            )
        arrays[name] = to_device(array, dtype)
    return Head(**arrays, gauge=gauge, factor=factor, values=values)


def identity_maps(heads: int, head_dim: int, d: int) -> dict[str, np.ndarray]:
    """``W_Q = W_K = W_V = I`` and ``W_O = I`` (truncated or zero-padded to ``(d_h, d)``), per head."""
    eye = np.eye(head_dim, d)
    return {
        "query": np.tile(eye, (heads, 1, 1)),
        "key": np.tile(eye, (heads, 1, 1)),
        "value": np.tile(eye, (heads, 1, 1)),
        "output": np.tile(eye.T, (heads, 1, 1)),
    }


def gaussian_maps(
    seed: int, heads: int, head_dim: int, d: int, *, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """Independent Gaussian maps, entries ``N(0, scale²/d)`` (``W_O``: ``N(0, scale²/d_h)``), so that
    ``|W x| ≈ scale`` for a unit ``x``; from NumPy's generator seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    out = {name: rng.normal(0.0, scale / np.sqrt(d), (heads, head_dim, d)) for name in MAP_NAMES[:3]}
    out["output"] = rng.normal(0.0, scale / np.sqrt(head_dim), (heads, d, head_dim))
    return out


def _orthonormal_rows(rng, rows: int, columns: int) -> np.ndarray:
    """A ``rows × columns`` matrix with orthonormal rows (or columns, whichever is fewer): Haar."""
    big, small = max(rows, columns), min(rows, columns)
    g = rng.normal(size=(big, small))
    q, r = np.linalg.qr(g)
    q = q * np.sign(np.diagonal(r))[None, :]
    return q.T if rows <= columns else q


def orthogonal_maps(
    seed: int, heads: int, head_dim: int, d: int, *, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """Independent Haar maps with orthonormal rows or columns, times ``scale`` (``W_O`` too)."""
    rng = np.random.default_rng(seed)
    draw = lambda r, c: np.stack([scale * _orthonormal_rows(rng, r, c) for _ in range(heads)])  # noqa: E731
    out = {name: draw(head_dim, d) for name in MAP_NAMES[:3]}
    out["output"] = draw(d, head_dim)
    return out


def shared_maps(seed: int, heads: int, head_dim: int, d: int, *, scale: float = 1.0) -> dict[str, np.ndarray]:
    """``W_Q = W_K = W_V = W`` Gaussian (entries ``N(0, scale²/d)``) and ``W_O = Wᵀ``: a gradient flow
    with rotated values (condition (a))."""
    w = np.random.default_rng(seed).normal(0.0, scale / np.sqrt(d), (heads, head_dim, d))
    return {"query": w, "key": w.copy(), "value": w.copy(), "output": np.swapaxes(w, 1, 2).copy()}


def random_qk_maps(
    seed: int, heads: int, head_dim: int, d: int, *, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """Gaussian ``W_Q`` and ``W_K`` (entries ``N(0, scale²/d)``, as :func:`gaussian_maps`) with the
    identity ``W_V`` and ``W_O`` (as :func:`identity_maps`): random logits, values ``I``, the setting
    of the causal collapse of Karagodin, Polyanskiy and Rigollet (arXiv:2411.04990)."""
    rng = np.random.default_rng(seed)
    out = identity_maps(heads, head_dim, d)
    out["query"], out["key"] = (rng.normal(0.0, scale / np.sqrt(d), (heads, head_dim, d)) for _ in range(2))
    return out


MAKERS = {
    "identity": None,
    "gaussian": gaussian_maps,
    "orthogonal": orthogonal_maps,
    "shared": shared_maps,
    "random_qk": random_qk_maps,
}


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's slopes ``m_h = 2^{−8h/H}``, ``h = 1..H``."""
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)


def head_norms(head: Head) -> tuple[float, float]:
    """The spectral norms ``(|W_Q|₂, |W_K|₂)``: every logit of unit tokens is at most their product."""
    return float(np.linalg.norm(_host(head.query), 2)), float(np.linalg.norm(_host(head.key), 2))
