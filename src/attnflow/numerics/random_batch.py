"""Random-batch approximation of the interaction (an APPROXIMATION of the exact field, for very large n).

The exact field costs ``O(n² d)`` per evaluation. The random-batch method (Jin, Li & Liu,
*Random batch methods (RBM) for interacting particle systems*, J. Comput. Phys. 400, 2020) draws,
at every time step, a uniformly random partition of the tokens into batches of ``p`` (the last one
may be smaller) and lets each token interact only with the tokens of its batch during that step:
``O(n p d)`` per evaluation, memory ``O(n p)``. It is **not** the model of the paper: it is a
stochastic approximation whose error vanishes as ``p → n`` (at ``p = n`` it is the exact field, up
to summation order) and, for fixed ``p``, behaves like ``sqrt(dt / (p − 1))`` (the strong error of
RBM). ``benchmarks/RESULTS.md`` reports the measured error against the exact dynamics.

Estimator. With ``c`` the size of token ``i``'s batch ``B`` and ``f_ij = C_ij v_j`` the exact
summands (``usa``: ``g_i = (1/n) Σ_j f_ij``), the batch sum

    g_i ≈ (1/n) f_ii + (n − 1)/(n (c − 1)) Σ_{j ∈ B, j ≠ i} f_ij

is unbiased for every ``i`` (a uniformly random batch holds each other token with probability
``(c − 1)/(n − 1)``), causal masks included: the masks are the exact field's (``summation.MASKS``:
``True`` keeps ``j ≤ i``, ``"strict"`` keeps ``j < i``, so the ``f_ii`` term drops too). For ``sa``
the numerator and the softmax denominator are estimated the same way and divided (a ratio
estimator: consistent, slightly biased); a token whose batch holds none of its allowed keys (token 0
under the strict mask, always) gets zero, as its row of the exact field does.

The partition is fixed within a step (every Runge–Kutta stage of the step sees the same batches),
so a step integrates the batch-restricted system over ``dt``: ``RandomBatchField`` is a stochastic
field ``field(x, key)`` and ``solve`` runs it like any other (fixed steps; a fresh key each step).
Randomness comes only from the explicit ``key``; results are reproducible for a given key.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attnflow.core.factors import check_softmax_factor
from attnflow.core.kernel import Kernel
from attnflow.core.pytree import pytree_field
from attnflow.core.sphere import project
from attnflow.numerics.dynamics import VALUES, VectorField
from attnflow.numerics.integrators import Integrator
from attnflow.numerics.solve import SnapshotCallback, Trajectory, solve
from attnflow.numerics.summation import MASKS, check_normalization

MAX_GROUP_ENTRIES = 2**22  # batches are evaluated in groups of at most this many p × p entries


def partition(key: jax.Array, n: int, p: int) -> tuple[jax.Array, jax.Array]:
    """A uniformly random partition of ``0..n−1`` into ``ceil(n/p)`` batches of ``p``.

    Returns ``batches (m, p)`` (token indices; the empty slots of the last batch repeat token
    ``n − 1``) and ``valid (m, p)`` (``False`` on those slots).
    """
    m = -(-n // p)
    perm = jax.random.permutation(key, n)
    slots = jnp.arange(m * p)
    batches = jnp.where(slots < n, perm[jnp.minimum(slots, n - 1)], n - 1).reshape(m, p)
    return batches, (slots < n).reshape(m, p)


def _batch_mask(idx: jax.Array, causal: bool | str) -> jax.Array | None:
    """The mask of a batch (``(p, p)``, True where token ``idx[a]`` sees ``idx[b]``), by the
    definitions of ``summation.MASKS`` (in token order, not batch order), or None for no mask."""
    if causal is False:
        return None
    keys, queries = idx[None, :], idx[:, None]
    return keys < queries if causal == "strict" else keys <= queries


def make_random_batch_field(
    kernel: Kernel,
    batches: jax.Array,
    valid: jax.Array,
    *,
    normalization: str = "usa",
    causal: bool | str = False,
    value: str = "gradient",
) -> VectorField:
    """The random-batch approximation of ``make_vector_field(kernel, ...)`` for one partition."""
    if value not in VALUES:
        raise ValueError(f"random_batch: `value` must be one of {VALUES}; got {value!r}.")
    if causal not in MASKS:
        raise ValueError(f"random_batch: `causal` must be one of {MASKS}; got {causal!r}.")
    causal = MASKS[MASKS.index(causal)]  # 0 / 1 (== False / True) mean what they mean to the exact field
    check_normalization(normalization, where="random_batch")
    check_softmax_factor(kernel.factor, normalization, where="random_batch")
    gauge, profile = kernel.gauge, kernel.profile
    n = gauge.n
    m, p = batches.shape
    group = max(1, min(m, MAX_GROUP_ENTRIES // (p * p)))
    n_groups = -(-m // group)
    pad = n_groups * group - m
    grouped_batches = jnp.concatenate([batches, jnp.full((pad, p), n - 1, batches.dtype)])
    grouped_valid = jnp.concatenate([valid, jnp.zeros((pad, p), bool)])
    grouped = (grouped_batches.reshape(n_groups, group, p), grouped_valid.reshape(n_groups, group, p))
    # where each token sits in the flattened (batch, slot) order: to gather the results back
    flat = grouped_batches.reshape(-1)
    slot_of = (
        jnp.zeros(n, jnp.int32)
        .at[jnp.where(grouped_valid.reshape(-1), flat, n)]
        .set(jnp.arange(flat.shape[0], dtype=jnp.int32), mode="drop")
    )

    def one_batch(u, vals, idx, ok):
        ub = u[idx]
        w = kernel.factor.tile(idx, idx, u.dtype) * profile.dphi_unit(ub @ ub.T).astype(u.dtype)
        w = jnp.where(ok[None, :], w, 0.0)
        mask = _batch_mask(idx, causal)
        if mask is not None:
            w = jnp.where(mask, w, 0.0)
        vb = jnp.concatenate([vals[idx], jnp.ones((p, 1), u.dtype)], axis=1)
        total = w @ vb  # (p, d' + 1): numerators and row sums
        own = jnp.diagonal(w)[:, None] * vb  # the j = i term, kept exact (zero under "strict")
        count = jnp.sum(ok)
        weight = ((n - 1) / jnp.maximum(count - 1, 1)).astype(u.dtype)
        est = own + weight * (total - own)  # ≈ Σ_j (all n tokens)
        if normalization == "sa":  # a row that sees no key sums to zero, as in summation.qkv_sum
            denominator = est[:, -1:]
            safe = jnp.where(denominator > 0, denominator, 1.0)
            return jnp.where(denominator > 0, est[:, :-1] / safe, 0.0)
        return est[:, :-1] * (profile.scale / n).astype(u.dtype)

    def field(x: jax.Array) -> jax.Array:
        u = gauge.apply(x)
        vals = u if value == "gradient" else x
        sums = jax.lax.map(lambda gb: jax.vmap(lambda i, o: one_batch(u, vals, i, o))(*gb), grouped)
        g = sums.reshape(-1, vals.shape[1])[slot_of]
        if value == "gradient":
            g = gauge.apply_transpose(g)
        return project(x, g)

    return field


@pytree_field(data_fields=["kernel"])
@dataclasses.dataclass(frozen=True, eq=False)
class RandomBatchField:
    """The random-batch approximation as a stochastic field: ``field(x, key)`` draws a partition
    into batches of ``p`` from ``key`` and evaluates ``make_random_batch_field`` on it. ``solve``
    calls it with a fresh key at every step, the same for every stage of the step (fixed steps
    only). Pickles, like ``make_vector_field``'s field."""

    kernel: Kernel
    p: int
    normalization: str = "usa"
    causal: bool | str = False
    value: str = "gradient"
    stochastic = True

    def __post_init__(self) -> None:
        n = self.kernel.gauge.n
        if isinstance(self.p, bool) or int(self.p) != self.p or not 2 <= self.p <= n:
            raise ValueError(f"random_batch: `p` must be an integer in [2, n] = [2, {n}]; got {self.p!r}.")
        self.field(*partition(jax.random.key(0), n, int(self.p)))  # validate the options now

    def field(self, batches: jax.Array, valid: jax.Array) -> VectorField:
        options = dict(normalization=self.normalization, causal=self.causal, value=self.value)
        return make_random_batch_field(self.kernel, batches, valid, **options)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        return self.field(*partition(key, self.kernel.gauge.n, int(self.p)))(x)


def solve_random_batch(
    kernel: Kernel,
    x0: jax.Array,
    *,
    p: int,
    key: jax.Array,
    integrator: Integrator,
    dt: float,
    t_end: float,
    save_every: float,
    normalization: str = "usa",
    causal: bool | str = False,
    value: str = "gradient",
    noise: float = 0.0,
    on_snapshot: SnapshotCallback | None = None,
) -> Trajectory:
    """``solve`` of ``RandomBatchField(kernel, p, ...)``: a fresh partition every step; ``key``
    drives the partitions and the noise, if any. **An approximation**: see the module docstring."""
    field = RandomBatchField(kernel, p, normalization=normalization, causal=causal, value=value)
    return solve(
        field, x0, integrator=integrator, dt=dt, t_end=t_end, save_every=save_every, noise=noise, key=key,
        on_snapshot=on_snapshot,
    )  # fmt: skip
