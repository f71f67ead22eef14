"""The kernel family ``h((x,ξ),(y,ζ)) = w(ξ,ζ) · φ(⟨Q(ξ)x, Q(ζ)y⟩)``.

- ``Profile``: ``φ(t) = (c/β) e^{βt}`` ("exp") or ``φ(t) = c t`` ("linear"); ``c = 1`` ("plain") or
  ``c = e^{−β}`` ("rescaled"). Logits are never exponentiated unbounded: on the sphere ``t ≤ 1``, so
  ``φ'(t) = scale · e^{β(t−1)}`` with the constant ``scale = c e^β`` factored out.
- ``Kernel``: a gauge, a factor and a profile (how the sums over it are evaluated is
  ``attnflow.numerics.summation``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attnflow.core.factors import Factor, check_tokens
from attnflow.core.gauges import Gauge
from attnflow.core.host import to_device
from attnflow.core.pytree import pytree_dataclass

PROFILES = ("exp", "linear")
TIME_SCALES = ("plain", "rescaled")


@pytree_dataclass(data_fields=["beta", "c"], meta_fields=["kind"])
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
    """Profile from the config vocabulary: ``time_scale`` "plain" (c = 1) or "rescaled" (c = e^{−β}).
    Its numbers are made on the host (:func:`attnflow.core.host.to_device`); ``e^{−β}`` is
    JAX's (a "rescaled" run's constant is the one it always was). A traced ``beta`` (under
    ``jax.grad``, ``jit`` or ``vmap``) stays traced: the profile is then made with JAX operations."""
    if time_scale not in TIME_SCALES:
        raise ValueError(f"profile: `time_scale` must be one of {TIME_SCALES}; got {time_scale!r}.")
    if isinstance(beta, jax.core.Tracer):
        beta = jnp.asarray(beta, dtype)
        c = jnp.ones((), dtype) if time_scale == "plain" else jnp.exp(-beta)
        return Profile(kind=kind, beta=beta, c=c)
    c = 1.0 if time_scale == "plain" else float(jnp.exp(-beta))
    return Profile(kind=kind, beta=to_device(beta, dtype), c=to_device(c, dtype))


@pytree_dataclass(data_fields=["gauge", "factor", "profile"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Kernel:
    gauge: Gauge
    factor: Factor
    profile: Profile

    def __post_init__(self) -> None:
        check_tokens(self.gauge, self.factor, where="kernel")

    @property
    def n(self) -> int:
        return self.gauge.n
