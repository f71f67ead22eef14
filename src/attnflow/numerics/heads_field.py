"""The vector field of an attention layer with heads: ``dx_i/dt = P_{x_i}(Σ_h out_i^h)``.

Each head (:class:`attnflow.core.heads.Head`) maps the tokens to queries, keys and values; its
attention sum is :func:`attnflow.numerics.summation.qkv_sum` (exact, dense or row blocks) or, with
``interaction = "expansion"``, :func:`attnflow.numerics.expansion.expansion_qkv_sum` (within
``tolerance`` of the field's scale ``c e^{βM} max|v|``, ``M = |W_Q|₂ |W_K|₂`` the largest logit).
The heads' outputs are added and projected on the tangent space (post-LN, the paper's).

Options: ``normalization`` "usa" or "sa"; ``causal`` False, True (``j <= i``) or "strict"
(``j < i``), in token order (positions sorted); ``sources``: the first ``sources`` tokens are
attended to and never move.

``gradient_flow`` says whether the layer is the gradient flow of ``energy``: usa, no mask, and
every head satisfying :func:`attnflow.core.heads.is_gradient_head` (held sources keep it one).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attnflow.core.factors import check_softmax_factor
from attnflow.core.heads import Head, is_gradient_head
from attnflow.core.kernel import Profile
from attnflow.core.pytree import pytree_field
from attnflow.core.sphere import project
from attnflow.numerics import expansion
from attnflow.numerics.summation import MASKS, check_normalization, qkv_energy, qkv_sum


def hold_sources(v: jax.Array, sources: int) -> jax.Array:
    """``v`` with the rows of the first ``sources`` tokens set to zero (they never move)."""
    return v if sources == 0 else v.at[:sources].set(0.0)


@pytree_field(data_fields=["heads", "profile"])
@dataclasses.dataclass(frozen=True, eq=False)
class HeadsField:
    """``field(x) -> v`` for the heads ``heads`` (a tuple of :class:`Head`), pure and picklable; a
    pytree whose leaves are the heads' and the profile's arrays."""

    heads: tuple
    profile: Profile
    normalization: str = "usa"
    causal: bool | str = False
    sources: int = 0
    block_size: int | None = None
    interaction: str = "exact"
    tolerance: float = 1e-10

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(self.heads))
        if not self.heads or not all(isinstance(h, Head) for h in self.heads):
            raise ValueError(f"attention: `heads` must be a non-empty list of Head; got {self.heads!r}.")
        d = self.heads[0].d
        if any(h.d != d for h in self.heads):
            raise ValueError(f"attention: every head must act on d = {d}; got {[h.d for h in self.heads]}.")
        check_normalization(self.normalization, where="attention")
        if self.causal not in MASKS:
            raise ValueError(f"attention: `causal` must be one of {MASKS}; got {self.causal!r}.")
        for h, head in enumerate(self.heads):
            check_softmax_factor(head.factor, self.normalization, where="attention", head=h)
        counts = sorted({head.n for head in self.heads if head.n is not None})
        if len(counts) > 1:
            raise ValueError(
                f"attention: every head must be over the same n tokens; got {[h.n for h in self.heads]}."
            )
        n = counts[0] if counts else None
        if isinstance(self.sources, bool) or not isinstance(self.sources, int) or self.sources < 0:
            raise ValueError(f"attention: `sources` must be a non-negative integer; got {self.sources!r}.")
        if n is not None and self.sources >= n:
            raise ValueError(
                f"attention: `sources` must be below n = {n} (some token must move); got {self.sources}."
            )
        if self.interaction not in ("exact", "expansion"):
            raise ValueError(
                f"attention: `interaction` must be 'exact' or 'expansion'; got {self.interaction!r}."
            )
        if self.interaction == "expansion":
            _ = self.rank

    @property
    def numbers_traceable(self) -> bool:
        """Whether the heads' arrays are leaves (program arguments): a layer of other maps, gauges'
        angles or slopes then reuses the program. Not for the expansion, whose degree is chosen
        from the maps' norms when the field is made."""
        return self.interaction == "exact"

    @property
    def d(self) -> int:
        return self.heads[0].d

    @property
    def rank(self) -> int | None:
        """Features per token of the expansion (the largest over the heads), None for "exact"."""
        if self.interaction == "exact":
            return None
        options = dict(normalization=self.normalization, causal=self.causal, tolerance=self.tolerance)
        return max(expansion.check_qkv(head, self.profile, **options) for head in self.heads)

    @property
    def gradient_flow(self) -> bool:
        """Whether ``v = n P_x ∇E`` (E non-decreasing): usa, no mask, every head of case (a) or (b)."""
        return self.normalization == "usa" and self.causal is False and all(map(is_gradient_head, self.heads))

    def _sum(self, head: Head, q, k, v) -> jax.Array:
        options = dict(normalization=self.normalization, causal=self.causal)
        if self.interaction == "expansion":
            return expansion.expansion_qkv_sum(
                head, self.profile, q, k, v, tolerance=self.tolerance, **options
            )
        return qkv_sum(head.factor, self.profile, q, k, v, block_size=self.block_size, **options)

    def attention(self, x: jax.Array) -> jax.Array:
        """``A_i = Σ_h out_i^h``, before the projection, ``(n, d)``."""
        total = jnp.zeros_like(x)
        for head in self.heads:
            summed = self._sum(head, head.queries(x), head.keys(x), head.value_vectors(x))
            total = total + head.read_out(summed)
        return total

    def __call__(self, x: jax.Array) -> jax.Array:
        return hold_sources(project(x, self.attention(x)), self.sources)

    def energy(self, x: jax.Array) -> jax.Array:
        """``E = Σ_h (1/(2n²)) Σ_ij w_ij φ(⟨q_i, k_j⟩)`` (always defined; monotone only for a
        gradient flow)."""
        return sum(
            qkv_energy(head.factor, self.profile, head.queries(x), head.keys(x), block_size=self.block_size)
            for head in self.heads
        )
