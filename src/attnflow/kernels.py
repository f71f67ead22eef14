"""The kernel family ``h((x,ξ),(y,ζ)) = w(ξ,ζ) · φ(⟨Q(ξ)x, Q(ζ)y⟩)`` (SPEC §1.1, §1.3).

- ``Profile``: ``φ(t) = (c/β) e^{βt}`` ("exp") or ``φ(t) = c t`` ("linear"); ``c = 1`` ("plain") or
  ``c = e^{−β}`` ("rescaled"). Logits are never exponentiated unbounded: on the sphere ``t ≤ 1``, so
  ``φ'(t) = scale · e^{β(t−1)}`` with the constant ``scale = c e^β`` factored out.
- ``Kernel``: a gauge, a factor and a profile.
- ``attention_sum``: ``g_i = Σ_j C_ij y_j`` with ``C = w ⊙ φ'(U Uᵀ)`` normalised by ``1/n`` ("usa")
  or by its row sums ("sa", the softmax), optionally causal (``j ≤ i``). Evaluated densely, or in
  row blocks of ``block_size`` rows (``lax.map``) with memory ``O(n · block_size)``.
- ``energy``: ``E = (1/(2n²)) Σ_ij h(z_i, z_j)``, blocked the same way.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from attnflow.factors import Factor
from attnflow.gauges import Gauge

PROFILES = ("exp", "linear")
NORMALIZATIONS = ("usa", "sa")


@partial(jax.tree_util.register_dataclass, data_fields=["beta", "c"], meta_fields=["kind"])
@dataclasses.dataclass(frozen=True)
class Profile:
    """``φ(t) = (c/β) e^{βt}`` (kind "exp") or ``φ(t) = c t`` (kind "linear")."""

    kind: str
    beta: jax.Array
    c: jax.Array

    def __post_init__(self):
        if self.kind not in PROFILES:
            raise ValueError(f"profile: `kind` must be one of {PROFILES}; got {self.kind!r}.")

    @property
    def scale(self) -> jax.Array:
        """The constant ``φ'(1)``: ``c e^β`` (exp) or ``c`` (linear)."""
        return self.c * jnp.exp(self.beta) if self.kind == "exp" else self.c

    def dphi_unit(self, s: jax.Array) -> jax.Array:
        """``φ'(s) / φ'(1)``, bounded by 1 on the sphere."""
        return jnp.exp(self.beta * (s - 1.0)) if self.kind == "exp" else jnp.ones_like(s)

    def phi(self, s: jax.Array) -> jax.Array:
        if self.kind == "exp":
            return self.scale / self.beta * jnp.exp(self.beta * (s - 1.0))
        return self.c * s


def make_profile(kind: str = "exp", *, beta: float = 1.0, time_scale: str = "plain", dtype=jnp.float64):
    """Profile from the config vocabulary: ``time_scale`` "plain" (c = 1) or "rescaled" (c = e^{−β})."""
    scales = {"plain": 1.0, "rescaled": float(jnp.exp(-beta))}
    if time_scale not in scales:
        raise ValueError(f"profile: `time_scale` must be one of {tuple(scales)}; got {time_scale!r}.")
    return Profile(kind=kind, beta=jnp.asarray(beta, dtype), c=jnp.asarray(scales[time_scale], dtype))


@partial(jax.tree_util.register_dataclass, data_fields=["gauge", "factor", "profile"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Kernel:
    gauge: Gauge
    factor: Factor
    profile: Profile

    @property
    def n(self) -> int:
        return self.gauge.n


def _row_blocks(fn, n: int, block_size: int | None):
    """Evaluate ``fn(idx) -> (b, ...)`` over all rows, in one block or in blocks of ``block_size``.

    Rows past ``n`` (padding of the last block) are clamped to ``n − 1`` and dropped afterwards.
    """
    if block_size is None or block_size >= n:
        return fn(jnp.arange(n))
    n_blocks = -(-n // block_size)
    idx = jnp.minimum(jnp.arange(n_blocks * block_size), n - 1).reshape(n_blocks, block_size)
    out = jax.lax.map(fn, idx)
    return out.reshape(n_blocks * block_size, *out.shape[2:])[:n]


def attention_sum(
    kernel: Kernel,
    u: jax.Array,
    values: jax.Array,
    *,
    normalization: str = "usa",
    causal: bool = False,
    block_size: int | None = None,
) -> jax.Array:
    """``g_i = Σ_j C_ij values_j`` with ``C_ij = w_ij φ'(⟨u_i,u_j⟩)/n`` (usa) or the softmax (sa)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"kernel: `normalization` must be one of {NORMALIZATIONS}; got {normalization!r}.")
    n = u.shape[0]
    profile = kernel.profile

    def block(idx):
        weights = kernel.factor.rows(idx) * profile.dphi_unit(u[idx] @ u.T)
        if causal:
            weights = jnp.where(jnp.arange(n)[None, :] <= idx[:, None], weights, 0.0)
        if normalization == "sa":
            return (weights @ values) / jnp.sum(weights, axis=1, keepdims=True)
        return (weights @ values) * (profile.scale / n)

    return _row_blocks(block, n, block_size)


def energy(kernel: Kernel, x: jax.Array, *, block_size: int | None = None) -> jax.Array:
    """``E(x) = (1/(2n²)) Σ_ij w_ij φ(⟨Q_i x_i, Q_j x_j⟩)``."""
    u = kernel.gauge.apply(x)
    n = u.shape[0]

    def block(idx):
        w = jnp.broadcast_to(kernel.factor.rows(idx), (idx.shape[0], n))
        return jnp.sum(w * kernel.profile.phi(u[idx] @ u.T), axis=1)

    return jnp.sum(_row_blocks(block, n, block_size)) / (2.0 * n * n)


def logits(kernel: Kernel, x: jax.Array) -> jax.Array:
    """The dense logit matrix ``S_ij = ⟨Q_i x_i, Q_j x_j⟩`` (``n × n``: small n only)."""
    u = kernel.gauge.apply(x)
    return u @ u.T
