"""The expansion's sums with the tokens split over the devices of a mesh (inside
``jax.shard_map``; used by :mod:`attnflow.numerics.sharding`).

:func:`expansion_sum` is ``expansion._kernel_sum`` for one device's rows: without a mask and
without the distance bias, the moments ``M = Σ_j F(k_j)ᵀ [a_j y_j]`` of each device's tokens
(accumulated over chunks of ``plan.chunk`` tokens, as on one device) are added over the
devices (``psum``), then each device evaluates its rows against them. The causal and distance-bias
prefix sums (:func:`sharded_prefix`) cut the processing order (token order, or label order before
and after each token) into one contiguous piece per device, of whole ``PREFIX_CHUNK`` chunks, so
that the pairs summed exactly (inside a chunk) are those of one device; each device runs its
piece (:func:`prefix_sum_from`) from the carry of the pieces before it, their moments
all-gathered and folded in order by a ``lax.scan``. :func:`field_plan` and :func:`heads_plans`
make the features' plans from concrete numbers before tracing.

:func:`padded_rows` and :func:`gathered` are the two row operations both modules use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors
from attnflow.core.heads import head_norms
from attnflow.core.kernel import Kernel, Profile
from attnflow.numerics import expansion
from attnflow.numerics.dynamics import AttentionField
from attnflow.numerics.heads_field import HeadsField


def padded_rows(a: jax.Array, rows: int) -> jax.Array:
    """``a`` with its first axis padded to ``rows`` by copies of its last row (finite, unit tokens)."""
    pad = rows - a.shape[0]
    if pad == 0:
        return a
    return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), mode="edge")


def gathered(a: jax.Array, axis: str, n: int) -> jax.Array:
    """The rows of every device, in token order, without the padding: ``(n, ...)``."""
    return jax.lax.all_gather(a, axis, tiled=True)[:n]


def field_plan(field: AttentionField, dtype):
    """The expansion's degree and feature weights, from the field's concrete β, and the direction
    of the labels of a causal distance bias (both needed before tracing)."""
    kernel, d = field.kernel, field.kernel.gauge.d
    degree = expansion._check(kernel, d, field.normalization, field.tolerance)
    direction = 1.0
    if field.causal is not False and isinstance(kernel.factor, factors.DistanceBias):
        direction = expansion._monotone_direction(kernel.factor.xi)
    return expansion._Plan(expansion._beta(kernel), degree, d, dtype), direction


def prefix_sum_from(plan, profile, q, k, y, a, zeta, slope, carry, *, strict: bool, same: bool):
    """``expansion._prefix_sum`` started from ``carry = (moments, zeta_ref)`` (the moments of every
    earlier token, decayed to the label ``zeta_ref``) instead of zero: the rows of one shard."""
    return expansion._prefix_sum(
        plan, profile, q, k, y, a, zeta, slope, strict=strict, carry=carry, same=same
    )


def _moments(plan, k_chunks, y_chunks, a_chunks) -> jax.Array:
    """``Σ_j F(k_j)ᵀ [a_j1 y_j, …, a_jT y_j]`` over chunks ``(m, chunk, ·)`` (``lax.scan``): memory
    ``O(chunk · R)``, not ``O(rows · R)``."""

    def accumulate(moments, c):
        kc, yc, ac = c
        return moments + plan.moments(kc, expansion._spread(ac, yc)), None

    init = plan.zeros(a_chunks.shape[2] * y_chunks.shape[2], k_chunks.dtype)
    return jax.lax.scan(accumulate, init, (k_chunks, y_chunks, a_chunks))[0]


def sharded_prefix(
    plan, profile, q, k, y, a, zeta, slope, *, strict: bool, same: bool, axis: str, shards: int
):
    """``expansion._prefix_sum`` of every token (``q``, ``k``, ``y``, ``a``, ``zeta`` in processing
    order, on every device; ``same``: ``q`` is ``k``) with the order cut into ``shards`` contiguous
    pieces of whole ``PREFIX_CHUNK`` chunks, so that the pairs summed exactly are those of one
    device. Each device sums its piece from the carry of the pieces before it: their moments
    (``all_gather``, ``G × (L + 1) T d'`` each) folded in order (a ``lax.scan`` over the pieces). Returns
    the sums of every token."""
    n = k.shape[0]
    chunk = expansion.PREFIX_CHUNK
    rows = -(-n // (shards * chunk)) * chunk
    total = rows * shards
    zeros = lambda t: jnp.pad(t, [(0, total - n)] + [(0, 0)] * (t.ndim - 1))  # noqa: E731
    q, k, zeta = padded_rows(q, total), padded_rows(k, total), padded_rows(zeta, total)
    y, a = zeros(y), zeros(a)  # the padding tokens add nothing
    p = jax.lax.axis_index(axis)
    qp, kp, yp, ap, zp = (jax.lax.dynamic_slice_in_dim(t, p * rows, rows) for t in (q, k, y, a, zeta))
    last = zp[-1]
    chunked = lambda t: expansion._chunked(t, chunk)  # noqa: E731  (whole chunks: rows is a multiple)
    own = _moments(plan, chunked(kp), chunked(yp), chunked(ap * jnp.exp(-slope * (last - zp))[:, None]))
    owns, lasts = jax.lax.all_gather(own, axis), jax.lax.all_gather(last, axis)

    def fold(carry, piece):
        moments, zeta_ref = carry
        own_q, last_q, q = piece
        folded = (jnp.exp(-slope * (last_q - zeta_ref)) * moments + own_q, last_q)
        return jax.tree.map(lambda new, old: jnp.where(q < p, new, old), folded, carry), None

    start = (jnp.zeros_like(own), zeta[0])
    carry, _ = jax.lax.scan(fold, start, (owns, lasts, jnp.arange(shards)))
    out = prefix_sum_from(plan, profile, qp, kp, yp, ap, zp, slope, carry, strict=strict, same=same)
    return jax.lax.all_gather(out, axis, tiled=True)[:n]


def expansion_sum(plan, factor, profile, q, k, y, *, causal, direction: float, axis: str, n: int):
    """``Σ_j w_ij p_L(⟨q_i, k_j⟩) y_j`` (``j <= i`` or ``j < i`` when causal) for this device's rows,
    unnormalised: ``expansion._kernel_sum`` sharded (``q``, ``k``, ``y``: the device's rows; ``q is
    k`` for the paper's kernel). No mask and no distance bias: the moments of the local tokens are
    added over the devices (``psum``), then each device evaluates its rows against them. Otherwise
    the prefix sums of ``sharded_prefix``, in token order (causal) or in label order (the
    distance bias: the tokens before and after each one)."""
    here, dtype, same = q.shape[0], q.dtype, q is k
    offset = jax.lax.axis_index(axis) * here
    rows = jnp.arange(here)
    global_idx = jnp.minimum(offset + rows, n - 1)
    labels = expansion._label_terms(factor, n, dtype)
    bias = isinstance(factor, factors.DistanceBias)
    if causal is False and not bias:
        a = labels[global_idx]
        real = (offset + rows < n).astype(dtype)[:, None]  # padding rows add nothing
        chunk = plan.chunk(here, labels.shape[1] * y.shape[1])
        chunked = lambda t: expansion._chunked(t, chunk)  # noqa: E731
        moments = jax.lax.psum(_moments(plan, chunked(k), chunked(y), chunked(a * real)), axis)
        weighted = plan.weighted(moments)
        evaluate = lambda c: expansion._gather(c[1], plan.evaluate(c[0], weighted))  # noqa: E731
        summed = jax.lax.map(evaluate, (chunked(q), chunked(a)))
        return summed.reshape(-1, y.shape[1])[:here]
    shards = jax.lax.axis_size(axis)

    def prefix(q, k, y, zeta, slope, strict):
        options = dict(strict=strict, same=same, axis=axis, shards=shards)
        return sharded_prefix(plan, profile, q, k, y, labels, zeta, slope, **options)

    k_all, y_all = gathered(k, axis, n), gathered(y, axis, n)
    q_all = k_all if same else gathered(q, axis, n)
    if causal is not False:
        if bias:
            zeta, slope = direction * factor.xi.astype(dtype), factor.slope.astype(dtype)
        else:
            zeta, slope = jnp.zeros(n, dtype), jnp.zeros((), dtype)
        summed_all = prefix(q_all, k_all, y_all, zeta, slope, causal == "strict")
    else:
        order = jnp.argsort(factor.xi)
        zeta, slope = factor.xi.astype(dtype)[order], factor.slope.astype(dtype)
        ks, ys = k_all[order], y_all[order]
        qs = ks if same else q_all[order]
        before = prefix(qs, ks, ys, zeta, slope, False)
        k_back = ks[::-1]
        after = prefix(k_back if same else qs[::-1], k_back, ys[::-1], -zeta[::-1], slope, True)
        summed_all = jnp.zeros_like(y_all).at[order].set(before + after[::-1])
    return summed_all[global_idx]


def with_ones(y: jax.Array, sa: bool) -> jax.Array:
    """``y`` with a column of ones for "sa" (the softmax denominators come out of the same sum)."""
    return jnp.concatenate([y, jnp.ones((y.shape[0], 1), y.dtype)], axis=1) if sa else y


def _scaled(head, profile):
    """``expansion._scaled`` with the numbers made by NumPy: ``(|W_Q|₂, |W_K|₂, profile of β' = β
    |W_Q|₂ |W_K|₂)``, concrete even while a program is traced (``expansion._scaled`` makes β' with
    ``jnp.asarray``, a traced value inside ``jit``, which its own degree check then refuses)."""
    nq, nk = head_norms(head)
    beta = np.asarray(float(profile.beta) * nq * nk, np.asarray(profile.beta).dtype)
    return nq, nk, Profile(kind=profile.kind, beta=beta, c=np.asarray(profile.c))


def heads_plans(field: HeadsField, dtype) -> tuple:
    """Per head, the expansion of ``expansion.expansion_qkv_sum``, made before tracing: the norms
    ``|W_Q|₂``, ``|W_K|₂``, the profile of ``β' = β |W_Q|₂ |W_K|₂``, the plan and the direction of
    the labels of a causal distance bias."""
    plans = []
    for head in field.heads:
        nq, nk, scaled = _scaled(head, field.profile)
        kernel = Kernel(head.gauge, head.factor, scaled)
        degree = expansion._check(kernel, head.head_dim, field.normalization, field.tolerance)
        direction = 1.0
        if field.causal is not False and isinstance(head.factor, factors.DistanceBias):
            direction = expansion._monotone_direction(head.factor.xi)
        plan = expansion._Plan(float(scaled.beta), degree, head.head_dim, dtype)
        plans.append((nq, nk, scaled, plan, direction))
    return tuple(plans)
