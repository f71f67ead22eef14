"""Layer norms in continuous time: where a layer's normalisation puts the attention output ``A_i``.

With ``A_i(x)`` the attention of a layer (:class:`~attnflow.numerics.dynamics.AttentionField` or
:class:`~attnflow.numerics.heads_field.HeadsField`, their ``attention(x)``), tokens ``z_i ∈ R^d``,
``x_i = z_i/|z_i|``, ``r_i = |z_i|``, ``r_i(0) = 1``:

- ``post`` (the paper's model): ``dx_i/dt = P_{x_i} A_i``, on the sphere.
- ``pre``:  ``dz_i/dt = A_i(x)``, so ``dx_i/dt = P_{x_i} A_i / r_i`` and ``dr_i/dt = ⟨x_i, A_i⟩``.
- ``peri``: ``dz_i/dt = A_i/|A_i|``, so ``dx_i/dt = P_{x_i} A_i / (r_i |A_i|)`` and
  ``dr_i/dt = ⟨x_i, A_i⟩/|A_i|``.
- ``ngpt``: ``dx_i/dt = α P_{x_i}(A_i/|A_i|)``, on the sphere.

``pre`` and ``peri`` evolve ``z`` in ``R^d`` (the integrator's ``retraction="none"``: ``retraction``
says which); ``post`` and ``ngpt`` evolve ``x`` on the sphere. All four move each token's direction
along the same ``P_{x_i} A_i`` and differ in its speed: pre-LN slows a token as its radius grows,
peri-LN and nGPT move at a speed independent of the size of ``A_i`` (speed regulation, as in
Karagodin, Ge, Polyanskiy and Rigollet, "Normalization in Attention Dynamics"). A token whose
attention output is exactly zero does not move under ``peri`` and ``ngpt`` (``A/|A|`` is taken as 0
there: the direction is undefined and the limit from any side is bounded). Held sources never move.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from attnflow.core.pytree import pytree_field
from attnflow.core.sphere import normalize, project
from attnflow.numerics.heads_field import hold_sources

LAYER_NORMS = ("post", "pre", "peri", "ngpt")


def _unit(a: jax.Array) -> jax.Array:
    """``a/|a|`` row by row, 0 where ``a = 0``."""
    norm = jnp.linalg.norm(a, axis=-1, keepdims=True)
    return a / jnp.where(norm > 0, norm, 1.0)


@pytree_field(data_fields=["layer"])
@dataclasses.dataclass(frozen=True, eq=False)
class LayerNormField:
    """``layer`` (a field with ``attention(x)`` and ``sources``) under the layer norm ``kind``; called
    on the state (``z`` for pre and peri, ``x`` for post and ngpt), it returns the state's velocity."""

    layer: Any
    kind: str = "post"
    alpha: float = 1.0  # nGPT's step scale

    def __post_init__(self) -> None:
        if self.kind not in LAYER_NORMS:
            raise ValueError(f"layer norm: `layer_norm` must be one of {LAYER_NORMS}; got {self.kind!r}.")
        if not (isinstance(self.alpha, int | float) and self.alpha > 0):
            raise ValueError(f"layer norm: `ngpt_alpha` must be a positive number; got {self.alpha!r}.")

    @property
    def numbers_traceable(self) -> bool:
        return getattr(self.layer, "numbers_traceable", True)

    @property
    def retraction(self) -> str:
        """The integrator's retraction for this state: ``"none"`` for ``z``, ``"sphere"`` for ``x``."""
        return "none" if self.kind in ("pre", "peri") else "sphere"

    @property
    def gradient_flow(self) -> bool:
        return self.kind == "post" and self.layer.gradient_flow

    def __call__(self, state: jax.Array) -> jax.Array:
        sources = self.layer.sources
        if self.kind == "post":
            return self.layer(state)
        x = state if self.kind == "ngpt" else normalize(state)
        a = self.layer.attention(x)
        if self.kind == "pre":
            return hold_sources(a, sources)
        if self.kind == "peri":
            return hold_sources(_unit(a), sources)
        return hold_sources(self.alpha * project(x, _unit(a)), sources)


def directions_and_radii(states: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(x, r)``: the tokens' directions and radii of states ``z (..., n, d)``."""
    r = jnp.linalg.norm(states, axis=-1)
    return states / r[..., None], r
