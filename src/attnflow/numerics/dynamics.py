"""The USA-AV vector field: ``dx_i/dt = P_{x_i}(Q(ξ_i)ᵀ g_i)``, ``dξ_i/dt = 0``.

``make_vector_field(kernel, ...)`` returns a pure callable ``x (n, d) -> v (n, d)`` (an
``AttentionField``, which pickles); the frozen labels live inside the kernel, so integrators never
see them. Options:

- ``normalization``: "usa" (``1/n``) or "sa" (softmax rows).
- ``causal``: token ``i`` sees ``j ≤ i`` only (True) or ``j < i`` only ("strict"), in token
  order; not a gradient flow. ``attention_sum`` runs the strict mask on the general sum.
- ``sources``: the first ``sources`` tokens are attended to and never move (a held prefix).
- ``value``: "gradient" (value ``Q(ξ_i)ᵀQ(ξ_j)``: the gradient flow of the energy) or
  "logits_only" (the rotation only inside the logits, value ``x_j``; not a gradient flow).
- ``interaction``: how the attention sums are computed. "exact" (``attention_sum``: ``n²``
  kernel entries, dense or in tiles of ``block_size``), "expansion" (``expansion_sum``: ``O(n R d)``
  by a polynomial of the logit of rank ``R``, within ``tolerance`` of the field's scale; for the
  factors none, distance bias and Toeplitz cosine), or "auto" (the expansion where its cost model
  says it is cheaper, see ``attnflow.numerics.expansion.prefer_expansion``). "auto" is resolved
  when the field is made: the field's ``interaction`` is the path that runs, its ``rank`` the
  number of features (``None`` for "exact").

``noise_increment`` is the stochastic part ``sqrt(2 noise dt) P_x dW`` of the Stratonovich SDE on
the sphere (the solver renormalises after adding it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attnflow.core.factors import check_softmax_factor
from attnflow.core.kernel import Kernel
from attnflow.core.pytree import pytree_field
from attnflow.core.sphere import project
from attnflow.numerics import expansion
from attnflow.numerics.heads_field import hold_sources
from attnflow.numerics.summation import MASKS, attention_sum, energy

VALUES = ("gradient", "logits_only")
PATHS = ("exact", "expansion")  # what runs; "auto" chooses one of them in make_vector_field
VectorField = Callable[[jax.Array], jax.Array]


@pytree_field(data_fields=["kernel"])
@dataclasses.dataclass(frozen=True, eq=False)
class AttentionField:
    """The vector field of the USA-AV dynamics for ``kernel``: ``field(x) -> v``, pure.

    A frozen object rather than a closure so that it pickles (the kernel is a pytree of arrays):
    a batch of runs can be shipped to worker processes (``attnflow.numerics.batch``). A pytree:
    the kernel's arrays are its leaves, the options its structure (``jax.jit`` over a field keeps
    one program per structure)."""

    kernel: Kernel
    normalization: str = "usa"
    causal: bool | str = False
    value: str = "gradient"
    block_size: int | None = None
    interaction: str = "exact"
    tolerance: float = 1e-10
    sources: int = 0

    def __post_init__(self) -> None:
        if self.causal not in MASKS:
            raise ValueError(f"dynamics: `causal` must be one of {MASKS}; got {self.causal!r}.")
        n = self.kernel.n
        if isinstance(self.sources, bool) or not isinstance(self.sources, int) or not 0 <= self.sources < n:
            raise ValueError(f"dynamics: `sources` must be an integer in [0, {n}); got {self.sources!r}.")
        if self.value not in VALUES:
            raise ValueError(f"dynamics: `value` must be one of {VALUES}; got {self.value!r}.")
        check_softmax_factor(self.kernel.factor, self.normalization, where="dynamics")
        if self.interaction not in PATHS:
            raise ValueError(
                f"dynamics: `interaction` must be one of {PATHS} (make_vector_field resolves 'auto'); "
                f"got {self.interaction!r}."
            )
        if self.interaction == "expansion":
            _ = self.rank  # every validation of the expansion, once, before any tracing

    @property
    def numbers_traceable(self) -> bool:
        """Whether the kernel's numbers are leaves (program arguments): not for the expansion,
        whose degree is chosen from β when the field is made (its kernel is static, by identity)."""
        return self.interaction == "exact"

    @property
    def rank(self) -> int | None:
        """Features per token of the expansion (``None`` for the exact path)."""
        if self.interaction == "exact":
            return None
        options = dict(normalization=self.normalization, causal=self.causal, tolerance=self.tolerance)
        return expansion.check(self.kernel, self.kernel.gauge.d, **options)

    @property
    def gradient_flow(self) -> bool:
        """Whether ``v = n P_x ∇E`` (E non-decreasing): usa, no mask, the gradient value."""
        return self.normalization == "usa" and self.causal is False and self.value == "gradient"

    def energy(self, x: jax.Array) -> jax.Array:
        """``E(x) = (1/(2n²)) Σ_ij h(z_i, z_j)`` (exact; see ``summation.energy``)."""
        return energy(self.kernel, x, block_size=self.block_size)

    def _sum(self, u: jax.Array, values: jax.Array) -> jax.Array:
        options = dict(normalization=self.normalization, causal=self.causal)
        if self.interaction == "expansion":
            return expansion.expansion_sum(self.kernel, u, values, tolerance=self.tolerance, **options)
        return attention_sum(self.kernel, u, values, block_size=self.block_size, **options)

    def attention(self, x: jax.Array) -> jax.Array:
        """``A_i = Q(ξ_i)ᵀ g_i`` (gradient value) or ``g_i`` (logits only), before the projection."""
        gauge = self.kernel.gauge
        u = gauge.apply(x)
        if self.value == "gradient":
            return gauge.apply_transpose(self._sum(u, u))
        return self._sum(u, x)

    def __call__(self, x: jax.Array) -> jax.Array:
        return hold_sources(project(x, self.attention(x)), self.sources)


def make_vector_field(
    kernel: Kernel,
    *,
    normalization: str = "usa",
    causal: bool | str = False,
    value: str = "gradient",
    block_size: int | None = None,
    interaction: str = "exact",
    tolerance: float = 1e-10,
    sources: int = 0,
) -> AttentionField:
    """The vector field of the USA-AV dynamics for ``kernel`` (``AttentionField``); "auto" becomes
    "expansion" or "exact" here, by ``expansion.prefer_expansion``. A bad combination for the
    expansion (a matrix factor, ``d`` too large for the tolerance, ...) is a ``ValueError`` here."""
    if interaction not in expansion.INTERACTIONS:
        raise ValueError(
            f"dynamics: `interaction` must be one of {expansion.INTERACTIONS}; got {interaction!r}."
        )
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"dynamics: `tolerance` must be in (0, 1); got {tolerance!r}.")
    if interaction == "auto":
        cheaper = expansion.prefer_expansion(
            kernel, kernel.gauge.d, normalization=normalization, causal=causal, tolerance=tolerance
        )
        interaction = "expansion" if cheaper else "exact"
    return AttentionField(
        kernel, normalization=normalization, causal=causal, value=value, block_size=block_size,
        interaction=interaction, tolerance=tolerance, sources=sources,
    )  # fmt: skip


def noise_increment(key: jax.Array, x: jax.Array, *, noise: float, dt: float) -> jax.Array:
    """``sqrt(2 · noise · dt) · P_x(ζ)`` with ``ζ`` standard Gaussian (``noise = 1/κ``)."""
    dw = jax.random.normal(key, x.shape, dtype=x.dtype)
    return jnp.sqrt(2.0 * noise * dt).astype(x.dtype) * project(x, dw)  # dt may be a float64 tracer
