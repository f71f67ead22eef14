"""The USA-AV vector field: ``dx_i/dt = P_{x_i}(Q(ξ_i)ᵀ g_i)``, ``dξ_i/dt = 0``.

``make_vector_field(kernel, ...)`` returns a pure callable ``x (n, d) -> v (n, d)`` (an
``AttentionField``, which pickles); the frozen labels live inside the kernel, so integrators never
see them. Options:

- ``normalization``: "usa" (``1/n``) or "sa" (softmax rows).
- ``causal``: token ``i`` sees ``j ≤ i`` only (not a gradient flow).
- ``value``: "gradient" (value ``Q(ξ_i)ᵀQ(ξ_j)``: the gradient flow of the energy) or
  "logits_only" (the rotation only inside the logits, value ``x_j``; not a gradient flow).

``noise_increment`` is the stochastic part ``sqrt(2 noise dt) P_x dW`` of the Stratonovich SDE on
the sphere (the solver renormalises after adding it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attnflow.core.kernel import Kernel
from attnflow.core.sphere import project
from attnflow.numerics.summation import attention_sum

VALUES = ("gradient", "logits_only")
VectorField = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionField:
    """The vector field of the USA-AV dynamics for ``kernel``: ``field(x) -> v``, pure.

    A frozen object rather than a closure so that it pickles (the kernel is a pytree of arrays):
    a batch of runs can be shipped to worker processes (``attnflow.numerics.batch``)."""

    kernel: Kernel
    normalization: str = "usa"
    causal: bool = False
    value: str = "gradient"
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.value not in VALUES:
            raise ValueError(f"dynamics: `value` must be one of {VALUES}; got {self.value!r}.")
        if self.normalization == "sa" and not self.kernel.factor.nonnegative:
            raise ValueError(
                "dynamics: `normalization` 'sa' requires a non-negative factor (softmax weights); "
                f"got the sign-changing factor {type(self.kernel.factor).__name__}."
            )

    def __call__(self, x: jax.Array) -> jax.Array:
        gauge = self.kernel.gauge
        options = dict(normalization=self.normalization, causal=self.causal, block_size=self.block_size)
        u = gauge.apply(x)
        if self.value == "gradient":
            g = gauge.apply_transpose(attention_sum(self.kernel, u, u, **options))
        else:
            g = attention_sum(self.kernel, u, x, **options)
        return project(x, g)


def make_vector_field(
    kernel: Kernel,
    *,
    normalization: str = "usa",
    causal: bool = False,
    value: str = "gradient",
    block_size: int | None = None,
) -> AttentionField:
    """The vector field of the USA-AV dynamics for ``kernel`` (``AttentionField``)."""
    return AttentionField(
        kernel, normalization=normalization, causal=causal, value=value, block_size=block_size
    )


def noise_increment(key: jax.Array, x: jax.Array, *, noise: float, dt: float) -> jax.Array:
    """``sqrt(2 · noise · dt) · P_x(ζ)`` with ``ζ`` standard Gaussian (``noise = 1/κ``)."""
    dw = jax.random.normal(key, x.shape, dtype=x.dtype)
    return jnp.sqrt(2.0 * noise * dt) * project(x, dw)
