"""The USA-AV vector field (SPEC §1.2): ``dx_i/dt = P_{x_i}(Q(ξ_i)ᵀ g_i)``, ``dξ_i/dt = 0``.

``make_vector_field(kernel, ...)`` returns a closure ``x (n, d) -> v (n, d)``; the frozen labels
live inside the kernel, so integrators never see them. Options:

- ``normalization``: "usa" (``1/n``) or "sa" (softmax rows).
- ``causal``: token ``i`` sees ``j ≤ i`` only (not a gradient flow).
- ``value``: "gradient" (value ``Q(ξ_i)ᵀQ(ξ_j)``: the gradient flow of the energy) or
  "logits_only" (the rotation only inside the logits, value ``x_j``; not a gradient flow).

``noise_increment`` is the stochastic part ``sqrt(2 noise dt) P_x dW`` of the Stratonovich SDE on
the sphere (the solver renormalises after adding it).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from attnflow.core.kernel import Kernel
from attnflow.core.sphere import project
from attnflow.numerics.summation import attention_sum

VALUES = ("gradient", "logits_only")
VectorField = Callable[[jax.Array], jax.Array]


def make_vector_field(
    kernel: Kernel,
    *,
    normalization: str = "usa",
    causal: bool = False,
    value: str = "gradient",
    block_size: int | None = None,
) -> VectorField:
    """The vector field of the USA-AV dynamics for ``kernel`` (a pure closure over it)."""
    if value not in VALUES:
        raise ValueError(f"dynamics: `value` must be one of {VALUES}; got {value!r}.")
    if normalization == "sa" and not kernel.factor.nonnegative:
        raise ValueError(
            "dynamics: `normalization` 'sa' requires a non-negative factor (softmax weights); "
            f"got the sign-changing factor {type(kernel.factor).__name__}."
        )
    gauge = kernel.gauge
    options = dict(normalization=normalization, causal=causal, block_size=block_size)

    def field(x: jax.Array) -> jax.Array:
        u = gauge.apply(x)
        if value == "gradient":
            g = gauge.apply_transpose(attention_sum(kernel, u, u, **options))
        else:
            g = attention_sum(kernel, u, x, **options)
        return project(x, g)

    return field


def noise_increment(key: jax.Array, x: jax.Array, *, noise: float, dt: float) -> jax.Array:
    """``sqrt(2 · noise · dt) · P_x(ζ)`` with ``ζ`` standard Gaussian (``noise = 1/κ``)."""
    dw = jax.random.normal(key, x.shape, dtype=x.dtype)
    return jnp.sqrt(2.0 * noise * dt) * project(x, dw)
