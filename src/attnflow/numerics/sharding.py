"""Tokens sharded across devices: the attention sums of one field split by rows over a mesh.

``TokenMesh`` places the tokens on a one-axis ``jax.sharding.Mesh`` (the devices of this process,
or of every process after ``jax.distributed.initialize``): device ``p`` of ``P`` owns the rows
``[p L, (p + 1) L)``, ``L = ⌈n / P⌉`` (the last shard padded with copies of the last token, whose
rows are dropped). ``ShardedField(field, placement)`` is ``field`` (an ``AttentionField`` or a
``HeadsField``) evaluated that way: ``x (n, d) -> v (n, d)`` like the field itself, so ``solve``
and ``integrate`` take it unchanged.

The exact sum ``g_i = Σ_j a_ij y_j`` (``jax.shard_map`` over the token axis):

1. each device applies the gauge to its own rows (a gauge's arrays are per token: each device
   reads the rows of its tokens) and forms its queries, keys and values;
2. the keys and values are all-gathered (``O(n d)`` per device);
3. each device sums its rows against every key in tiles of ``block_size`` rows × ``block_size``
   keys (``lax.map`` over its row blocks, ``lax.scan`` over the key blocks; under a causal mask
   the key blocks after a row block are skipped), so the memory per device is
   ``O(n d + block_size²)`` next to its ``O(n²/P)`` work (one tile of ``L × n`` when the field's
   ``block_size`` is None);
4. the read-out (the gauge's transpose), the projection and the held sources are applied to the
   local rows, and the velocities are all-gathered. The state enters whole and leaves whole (each
   device slices its rows), so it stays replicated (``O(n d)``): XLA never shards the solver's
   state or snapshots, and every process can read them.

What the local rows need: the rows of the gauge, the queries' causal mask by global token index
(``p L + local index``), the factor's entries ``w_ij`` for the local ``i`` against every ``j``
(the factor's ``tile``): the label factors (``DistanceBias``, ``ToeplitzCos``) by the labels of
the local rows and of every key, a ``MatrixFactor`` by its local rows. Every array enters the
``shard_map`` whole, as the field holds it, and each device slices its rows: the arrays the
caller gives are never asked for split by rows, so XLA never shards the solver's state (gauge
arrays given split by rows through ``in_specs`` came out wrong under ``jit`` at n = 3 on 4
devices: a partitioning fault outside this module, avoided here). The bound on the
logits of "usa" (``logit_bound``) is the global one (``pmax`` of the local query norms), so a
shard's exponentials are those of the one-device sum. Every pair ``(i, j)`` is evaluated once, by
the owner of row ``i``: twice the exponentials of the one-device symmetric tiles (which evaluate a
tile pair once for both of its rows), the price of rows that stay local.

The expansion (``interaction = "expansion"``; the paper's field and layers of heads, whose
queries and keys are rescaled by ``|W_Q|₂``, ``|W_K|₂`` as in ``expansion.expansion_qkv_sum``):
without a mask and without the distance bias, the moments ``M = Σ_j F(k_j)ᵀ [a_j y_j]`` of the
local tokens are added over the devices (``psum``) and each device evaluates its own rows against
them (``O(n R d / P)`` work per device and one ``R × T d'`` reduction). The causal and
distance-bias prefix sums (``expansion._prefix_sum``: token order, or label order before and after
each token) are cut into ``P`` contiguous pieces of whole ``PREFIX_CHUNK`` chunks, so that the
pairs summed exactly (inside a chunk) are those of one device; each device runs its piece from
the carry of the pieces before it: their moments, all-gathered and folded in order by a
``lax.scan`` over the pieces (the decay of the distance bias applied between the pieces' last
labels).

The results agree with one device to round-off (the sums are regrouped: tiles of rows against
keys instead of symmetric tiles, a running row maximum for "sa"): ``tests/test_sharding.py``
checks the field within 1e-13 and an RK4 trajectory within 1e-12 on 4 host devices,
``tests/test_sharding_processes.py`` the same on two processes (``jax.distributed``, CPU
collectives by gloo).

``ShardedField`` is a pytree: the wrapped field's arrays are its children, the placement and the
field's options its static data, so ``jax.jit`` over it compiles once per structure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from attnflow.core import factors
from attnflow.core.heads import head_norms
from attnflow.core.kernel import Kernel, Profile
from attnflow.core.pytree import pytree_dataclass
from attnflow.core.sphere import project
from attnflow.numerics import expansion
from attnflow.numerics.dynamics import AttentionField
from attnflow.numerics.heads_field import HeadsField

AXIS = "tokens"
ROW_SHARDED_FACTORS = (factors.MatrixFactor,)  # factors whose arrays are n × n: sharded by rows
_SCALARS = (bool, int, float, complex, str, type(None))


@pytree_dataclass(data_fields=[], meta_fields=["mesh", "axis"])
@dataclasses.dataclass(frozen=True)
class TokenMesh:
    """The placement of the tokens: contiguous row shards on the one axis ``axis`` of ``mesh``."""

    mesh: Mesh
    axis: str = AXIS

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mesh):
            raise TypeError(f"sharding: `mesh` must be a jax.sharding.Mesh; got {type(self.mesh).__name__}.")
        if tuple(self.mesh.axis_names) != (self.axis,):
            raise ValueError(
                f"sharding: `mesh` must have the one axis {self.axis!r}; "
                f"got axes {tuple(self.mesh.axis_names)!r}. Build it with make_token_mesh()."
            )

    @property
    def shards(self) -> int:
        """``P``, the number of devices the tokens are split over."""
        return int(self.mesh.devices.size)

    def rows_per_shard(self, n: int) -> int:
        """``L = ⌈n / P⌉`` rows per device (the last shard padded)."""
        return -(-n // self.shards)


def make_token_mesh(devices=None, *, axis: str = AXIS) -> TokenMesh:
    """The tokens over ``devices`` (default: every device JAX sees, those of every process after
    ``jax.distributed.initialize``), in the order given."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("sharding: `devices` must be a non-empty list of devices; got [].")
    return TokenMesh(Mesh(np.array(devices), (axis,)), axis)


# ----------------------------------------------------------------------------- the local rows


def _padded_rows(a: jax.Array, rows: int) -> jax.Array:
    """``a`` with its first axis padded to ``rows`` by copies of its last row (finite, unit tokens)."""
    pad = rows - a.shape[0]
    if pad == 0:
        return a
    return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), mode="edge")


def _row_sharded(factor) -> bool:
    return isinstance(factor, ROW_SHARDED_FACTORS)


def _factor_tile(factor, local_idx: jax.Array, global_idx: jax.Array, cols: jax.Array, n: int, dtype):
    """``w[i, j]`` for the local rows ``i`` and the keys ``cols``: a row-sharded factor by the rows'
    local index, a label factor by their global one (padding rows clamped to the last token; they
    are dropped). The factor's own ``tile`` (``attnflow.core.factors``)."""
    if _row_sharded(factor):
        return factor.tile(local_idx, cols, dtype)
    return factor.tile(jnp.minimum(global_idx, n - 1), cols, dtype)


def _local_sum(factor, profile, q, k, values, *, offset, n: int, causal, sa: bool, shift: str, bound, block):
    """``Σ_j a_ij values_j`` for the local queries ``q (L, m)`` (global rows ``offset + i``) against
    all keys ``k (n, m)``: the unnormalised weights ``w_ij e^{β(s_ij − shift_i)}`` times
    ``[values, 1]`` (the ones give the softmax denominators), ``(L, dv [+ 1])``.

    Tiles of ``block`` rows × ``block`` keys (``lax.map`` over the row blocks, ``lax.scan`` over the
    key blocks, the key blocks past a causal row block skipped), so the memory per device is
    ``O(n m + block²)``; ``block`` None: one tile of every local row and every key. ``shift``:
    "unit" (``s − 1``, unit queries and keys: ``attention_sum``), "bound" (``s − bound``, "usa" of
    ``qkv_sum``) or "row" (each row's largest seen logit, "sa" of ``qkv_sum``: kept as a running
    maximum over the key blocks, the sums rescaled when it grows)."""
    rows_here, dtype = q.shape[0], q.dtype
    exp = profile.kind == "exp"
    beta = profile.beta.astype(dtype)
    y = values.astype(dtype)
    if sa:
        y = jnp.concatenate([y, jnp.ones((n, 1), dtype)], axis=1)
    b = rows_here if block is None else min(int(block), rows_here)
    c = n if block is None else min(int(block), n)
    tiles = -(-n // c)
    key_tiles = jnp.pad(k, ((0, tiles * c - n), (0, 0))).reshape(tiles, c, k.shape[1])
    value_tiles = jnp.pad(y, ((0, tiles * c - n), (0, 0))).reshape(tiles, c, y.shape[1])

    def add_tile(idx, carry, t):
        top, acc = carry
        global_idx = offset + idx
        cols = t * c + jnp.arange(c)
        s = q[idx] @ key_tiles[t].T
        seen = cols[None, :] < n  # the padding keys are never seen
        if causal is not False:
            below = (
                cols[None, :] < global_idx[:, None]
                if causal == "strict"
                else cols[None, :] <= global_idx[:, None]
            )
            seen = seen & below
        if not exp:
            e = jnp.ones_like(s)
        elif shift == "unit":
            e = profile.dphi_unit(s).astype(dtype)
        elif shift == "bound":
            e = jnp.exp(beta * (s - bound))
        else:
            grown = jnp.maximum(top, jnp.max(jnp.where(seen, s, -jnp.inf), axis=1, keepdims=True))
            safe = jnp.where(jnp.isfinite(grown), grown, 0.0)
            acc = acc * jnp.where(jnp.isfinite(top), jnp.exp(beta * (top - safe)), 0.0)
            e, top = jnp.exp(beta * (s - safe)), grown
        w = _factor_tile(factor, idx, global_idx, jnp.minimum(cols, n - 1), n, dtype)
        return top, acc + jnp.where(seen, w * e, 0.0) @ value_tiles[t]

    def row_block(idx):
        init = (jnp.full((b, 1), -jnp.inf, dtype), jnp.zeros((b, y.shape[1]), dtype))
        last = offset + jnp.max(idx)  # the block's last row: later key blocks are unseen when causal

        def step(carry, t):
            if causal is False:
                return add_tile(idx, carry, t), None
            return jax.lax.cond(
                t * c <= last, lambda carry: add_tile(idx, carry, t), lambda carry: carry, carry
            ), None

        return jax.lax.scan(step, init, jnp.arange(tiles))[0][1]

    count = -(-rows_here // b)
    idx = jnp.minimum(jnp.arange(count * b), rows_here - 1).reshape(count, b)
    out = row_block(idx[0]) if count == 1 else jax.lax.map(row_block, idx).reshape(count * b, -1)
    return out[:rows_here]


def _normalised(summed, dv: int, *, sa: bool, scale, n: int, guard: bool):
    """The sums divided by their softmax denominators ("sa"; a row that sees nothing is zero when
    ``guard``) or scaled by ``scale / n`` ("usa")."""
    if not sa:
        return summed[:, :dv] * (scale / n).astype(summed.dtype)
    denominator = summed[:, dv : dv + 1]
    if not guard:
        return summed[:, :dv] / denominator
    safe = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, summed[:, :dv] / safe, 0.0)


def _gathered(a: jax.Array, axis: str, n: int) -> jax.Array:
    """The rows of every device, in token order, without the padding: ``(n, ...)``."""
    return jax.lax.all_gather(a, axis, tiled=True)[:n]


def _held(v: jax.Array, offset, sources: int) -> jax.Array:
    """``v`` with the rows of the first ``sources`` tokens (by global index) set to zero."""
    if sources == 0:
        return v
    global_idx = offset + jnp.arange(v.shape[0])
    return jnp.where((global_idx < sources)[:, None], 0.0, v)


# ----------------------------------------------------------------------------- the two fields


def _attention_rows(field: AttentionField, axis: str, n: int, x, gauge, factor, profile):
    """One device's rows of ``AttentionField.__call__`` (exact): ``x (L, d)`` and ``gauge`` are its
    rows; returns the velocities of every token (all-gathered)."""
    offset = jax.lax.axis_index(axis) * x.shape[0]
    u_here = gauge.apply(x)
    u = _gathered(u_here, axis, n)
    values = u if field.value == "gradient" else _gathered(x, axis, n)
    sa = field.normalization == "sa"
    if field.causal == "strict":  # the one-device field sums it by qkv_sum: bounded by the logits
        shift = "row" if sa else "bound"
        bound = _logit_bound(u_here, u, axis) if shift == "bound" else jnp.zeros((), x.dtype)
    else:
        shift, bound = "unit", jnp.zeros((), x.dtype)
    summed = _local_sum(
        factor, profile, u_here, u, values, offset=offset, n=n, causal=field.causal, sa=sa, shift=shift,
        bound=bound, block=field.block_size,
    )  # fmt: skip
    if shift == "bound" and profile.kind == "exp":
        scale = profile.c * jnp.exp(profile.beta * bound)
    else:
        scale = profile.scale
    g = _normalised(summed, values.shape[1], sa=sa, scale=scale, n=n, guard=field.causal == "strict")
    if field.value == "gradient":
        g = gauge.apply_transpose(g)
    return _gathered(_held(project(x, g), offset, field.sources), axis, n)


def _logit_bound(q_here, k, axis):
    """``max_i |q_i| · max_j |k_j|`` over every device's queries (``summation.logit_bound``)."""
    top = jax.lax.pmax(jnp.max(jnp.sum(q_here * q_here, axis=1)), axis)
    return jnp.sqrt(top * jnp.max(jnp.sum(k * k, axis=1)))


def _heads_rows(field: HeadsField, axis: str, n: int, x, heads, profile):
    """One device's rows of ``HeadsField.__call__`` (exact); ``heads`` hold their gauges' rows."""
    offset = jax.lax.axis_index(axis) * x.shape[0]
    sa = field.normalization == "sa"
    exp = profile.kind == "exp"
    total = jnp.zeros_like(x)
    for head in heads:
        q = head.queries(x)
        k = _gathered(head.keys(x), axis, n)
        v = _gathered(head.value_vectors(x), axis, n)
        bound = _logit_bound(q, k, axis) if exp and not sa else jnp.zeros((), x.dtype)
        summed = _local_sum(
            head.factor, profile, q, k, v, offset=offset, n=n, causal=field.causal, sa=sa,
            shift="row" if sa else "bound", bound=bound, block=field.block_size,
        )  # fmt: skip
        scale = profile.c * jnp.exp(profile.beta * bound) if exp else profile.c
        total = total + head.read_out(_normalised(summed, v.shape[1], sa=sa, scale=scale, n=n, guard=True))
    return _gathered(_held(project(x, total), offset, field.sources), axis, n)


def _expansion_plan(field: AttentionField, dtype):
    """The expansion's degree and feature weights, from the field's concrete β, and the direction
    of the labels of a causal distance bias (both needed before tracing)."""
    kernel, d = field.kernel, field.kernel.gauge.d
    degree = expansion._check(kernel, d, field.normalization, field.tolerance)
    direction = 1.0
    if field.causal is not False and isinstance(kernel.factor, factors.DistanceBias):
        direction = expansion._monotone_direction(kernel.factor.xi)
    return expansion._Plan(expansion._beta(kernel), degree, d, dtype), direction


def _prefix_sum_from(plan, profile, q, k, y, a, zeta, slope, carry, *, strict: bool, same: bool):
    """``expansion._prefix_sum`` started from ``carry = (moments, zeta_ref)`` (the moments of every
    earlier token, decayed to the label ``zeta_ref``) instead of zero: the rows of one shard."""
    c = expansion.PREFIX_CHUNK
    chunked = expansion._chunked
    chunks = (chunked(q, c), chunked(k, c), chunked(y, c), chunked(a, c), chunked(zeta, c, edge=True))
    local = jnp.arange(c)
    below = local[None, :] < local[:, None] if strict else local[None, :] <= local[:, None]

    def step(carry, chunk):
        moments, zeta_ref = carry
        qc, kc, yc, ac, zc = chunk
        key_features = plan.features(kc)
        query_features = key_features if same else plan.features(qc)
        into = ac * jnp.exp(-slope * (zc - zeta_ref))[:, None]
        across = expansion._gather(into, query_features @ (moments * plan.weights[:, None]))
        gap = jnp.maximum(zc[:, None] - zc[None, :], 0.0)
        w = jnp.where(below, (ac @ ac.T) * jnp.exp(-slope * gap), 0.0)
        inside = (w * profile.dphi_unit((kc if same else qc) @ kc.T).astype(k.dtype)) @ yc
        zeta_last = zc[-1]
        out_of = ac * jnp.exp(-slope * (zeta_last - zc))[:, None]
        moments = jnp.exp(-slope * (zeta_last - zeta_ref)) * moments + key_features.T @ expansion._spread(
            out_of, yc
        )
        return (moments, zeta_last), across + inside

    _, out = jax.lax.scan(step, carry, chunks)
    return out.reshape(-1, y.shape[1])[: k.shape[0]]


def _chunk(plan, rows: int) -> int:
    """Tokens per chunk of the moments: ``chunk · R`` about ``expansion.CHUNK_ENTRIES`` (as one device)."""
    return int(min(rows, max(64, expansion.CHUNK_ENTRIES // plan.rank)))


def _moments(plan, k_chunks, y_chunks, a_chunks) -> jax.Array:
    """``Σ_j F(k_j)ᵀ [a_j1 y_j, …, a_jT y_j]`` over chunks ``(m, chunk, ·)`` (``lax.scan``): memory
    ``O(chunk · R)``, not ``O(rows · R)``."""

    def accumulate(moments, c):
        kc, yc, ac = c
        return moments + plan.features(kc).T @ expansion._spread(ac, yc), None

    init = jnp.zeros((plan.rank, a_chunks.shape[2] * y_chunks.shape[2]), k_chunks.dtype)
    return jax.lax.scan(accumulate, init, (k_chunks, y_chunks, a_chunks))[0]


def _sharded_prefix(
    plan, profile, q, k, y, a, zeta, slope, *, strict: bool, same: bool, axis: str, shards: int
):
    """``expansion._prefix_sum`` of every token (``q``, ``k``, ``y``, ``a``, ``zeta`` in processing
    order, on every device; ``same``: ``q`` is ``k``) with the order cut into ``shards`` contiguous
    pieces of whole ``PREFIX_CHUNK`` chunks, so that the pairs summed exactly are those of one
    device. Each device sums its piece from the carry of the pieces before it: their moments
    (``all_gather``, ``R × T d'`` each) folded in order (a ``lax.scan`` over the pieces). Returns
    the sums of every token."""
    n = k.shape[0]
    chunk = expansion.PREFIX_CHUNK
    rows = -(-n // (shards * chunk)) * chunk
    total = rows * shards
    zeros = lambda t: jnp.pad(t, [(0, total - n)] + [(0, 0)] * (t.ndim - 1))  # noqa: E731
    q, k, zeta = _padded_rows(q, total), _padded_rows(k, total), _padded_rows(zeta, total)
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
    out = _prefix_sum_from(plan, profile, qp, kp, yp, ap, zp, slope, carry, strict=strict, same=same)
    return jax.lax.all_gather(out, axis, tiled=True)[:n]


def _expansion_sum(plan, factor, profile, q, k, y, *, causal, direction: float, axis: str, n: int):
    """``Σ_j w_ij p_L(⟨q_i, k_j⟩) y_j`` (``j <= i`` or ``j < i`` when causal) for this device's rows,
    unnormalised: ``expansion._kernel_sum`` sharded (``q``, ``k``, ``y``: the device's rows; ``q is
    k`` for the paper's kernel). No mask and no distance bias: the moments of the local tokens are
    added over the devices (``psum``), then each device evaluates its rows against them. Otherwise
    the prefix sums of ``_sharded_prefix``, in token order (causal) or in label order (the
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
        chunk = _chunk(plan, here)
        chunked = lambda t: expansion._chunked(t, chunk)  # noqa: E731
        moments = jax.lax.psum(_moments(plan, chunked(k), chunked(y), chunked(a * real)), axis)
        weighted = moments * plan.weights[:, None]
        evaluate = lambda c: expansion._gather(c[1], plan.features(c[0]) @ weighted)  # noqa: E731
        summed = jax.lax.map(evaluate, (chunked(q), chunked(a)))
        return summed.reshape(-1, y.shape[1])[:here]
    shards = jax.lax.axis_size(axis)

    def prefix(q, k, y, zeta, slope, strict):
        options = dict(strict=strict, same=same, axis=axis, shards=shards)
        return _sharded_prefix(plan, profile, q, k, y, labels, zeta, slope, **options)

    k_all, y_all = _gathered(k, axis, n), _gathered(y, axis, n)
    q_all = k_all if same else _gathered(q, axis, n)
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


def _with_ones(y: jax.Array, sa: bool) -> jax.Array:
    """``y`` with a column of ones for "sa" (the softmax denominators come out of the same sum)."""
    return jnp.concatenate([y, jnp.ones((y.shape[0], 1), y.dtype)], axis=1) if sa else y


def _expansion_rows(field: AttentionField, prepared, axis: str, n: int, x, gauge, factor, profile):
    """One device's rows of the paper's field by the expansion (``expansion.expansion_sum``)."""
    plan, direction = prepared
    offset = jax.lax.axis_index(axis) * x.shape[0]
    u = gauge.apply(x)
    sa = field.normalization == "sa"
    y = _with_ones(u if field.value == "gradient" else x, sa)
    options = dict(causal=field.causal, direction=direction, axis=axis, n=n)
    summed = _expansion_sum(plan, factor, profile, u, u, y, **options)
    g = _normalised(summed, x.shape[1], sa=sa, scale=profile.scale, n=n, guard=field.causal == "strict")
    if field.value == "gradient":
        g = gauge.apply_transpose(g)
    return _gathered(_held(project(x, g), offset, field.sources), axis, n)


def _scaled(head, profile):
    """``expansion._scaled`` with the numbers made by NumPy: ``(|W_Q|₂, |W_K|₂, profile of β' = β
    |W_Q|₂ |W_K|₂)``, concrete even while a program is traced (``expansion._scaled`` makes β' with
    ``jnp.asarray``, a traced value inside ``jit``, which its own degree check then refuses)."""
    nq, nk = head_norms(head)
    beta = np.asarray(float(profile.beta) * nq * nk, np.asarray(profile.beta).dtype)
    return nq, nk, Profile(kind=profile.kind, beta=beta, c=np.asarray(profile.c))


def _heads_plans(field: HeadsField, dtype) -> tuple:
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


def _heads_expansion_rows(field: HeadsField, plans, axis: str, n: int, x, heads):
    """One device's rows of a layer of heads by the expansion (``expansion.expansion_qkv_sum``)."""
    offset = jax.lax.axis_index(axis) * x.shape[0]
    sa = field.normalization == "sa"
    total = jnp.zeros_like(x)
    for head, (nq, nk, scaled, plan, direction) in zip(heads, plans, strict=True):
        q = head.queries(x) / jnp.asarray(nq, x.dtype)
        k = head.keys(x) / jnp.asarray(nk, x.dtype)
        v = head.value_vectors(x)
        options = dict(causal=field.causal, direction=direction, axis=axis, n=n)
        summed = _expansion_sum(plan, head.factor, scaled, q, k, _with_ones(v, sa), **options)
        g = _normalised(summed, v.shape[1], sa=sa, scale=scaled.scale, n=n, guard=True)
        total = total + head.read_out(g)
    return _gathered(_held(project(x, total), offset, field.sources), axis, n)


# ----------------------------------------------------------------------------- the sharded field


def _split_field(field) -> tuple[tuple, tuple]:
    """The wrapped field as ``(static, children)``: its class and scalar options, and for every other
    attribute its tree definition (static) and leaves (children). The expansion chooses its degree
    from β when it is traced, so its field is static whole (compared by identity)."""
    if field.interaction != "exact":
        return ("whole", field), ()
    options, trees, children = [], [], []
    for item in dataclasses.fields(field):
        value = getattr(field, item.name)
        if isinstance(value, _SCALARS):
            options.append((item.name, value))
            continue
        leaves, treedef = jax.tree_util.tree_flatten(value)
        trees.append((item.name, treedef))
        children.append(tuple(leaves))
    return ("parts", type(field), tuple(options), tuple(trees)), tuple(children)


def _join_field(static: tuple, children: tuple):
    """``_split_field``'s inverse; the field is rebuilt without ``__init__`` (it was validated when
    made), as ``attnflow.core.pytree`` rebuilds its nodes."""
    if static[0] == "whole":
        return static[1]
    _, cls, options, trees = static
    field = object.__new__(cls)
    for name, value in options:
        object.__setattr__(field, name, value)
    for (name, treedef), leaves in zip(trees, children, strict=True):
        object.__setattr__(field, name, jax.tree_util.tree_unflatten(treedef, leaves))
    return field


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedField:
    """``field`` (``AttentionField`` or ``HeadsField``) with its tokens sharded over ``placement``:
    ``sharded(x) -> v``, equal to ``field(x)`` to round-off (see the module docstring)."""

    field: Any
    placement: TokenMesh

    def __post_init__(self) -> None:
        if not isinstance(self.field, AttentionField | HeadsField):
            raise TypeError(
                "sharding: `field` must be an AttentionField or a HeadsField; "
                f"got {type(self.field).__name__}."
            )
        if not isinstance(self.placement, TokenMesh):
            raise TypeError(
                "sharding: `placement` must be a TokenMesh (make_token_mesh()); "
                f"got {type(self.placement).__name__}."
            )

    @property
    def numbers_traceable(self) -> bool:
        """False: a program cache that splits a dataclass field attribute by attribute keeps a
        sharded field whole (by identity); ``jax.jit`` over it uses its own pytree registration
        (the wrapped field's arrays as children), which caches by structure."""
        return False

    @property
    def interaction(self) -> str:
        return self.field.interaction

    @property
    def gradient_flow(self) -> bool:
        return self.field.gradient_flow

    def energy(self, x: jax.Array) -> jax.Array:
        """The wrapped field's energy (evaluated on one device)."""
        return self.field.energy(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        n = x.shape[0]
        placement = self.placement
        local = placement.rows_per_shard(n)
        rows = local * placement.shards
        pad = lambda tree: jax.tree.map(lambda a: _padded_rows(a, rows), tree)  # noqa: E731
        field = self.field
        if isinstance(field, HeadsField):
            heads = tuple(
                _replaced(h, gauge=pad(h.gauge), factor=_padded_factor(h.factor, pad)) for h in field.heads
            )

            plans = _heads_plans(field, x.dtype) if field.interaction == "expansion" else None

            def body(x, heads, profile, mine):
                own = lambda h: _replaced(h, gauge=mine(h.gauge), factor=_factor_rows(h.factor, mine))  # noqa: E731
                heads = tuple(own(h) for h in heads)
                if plans is not None:
                    return _heads_expansion_rows(field, plans, placement.axis, n, x, heads)
                return _heads_rows(field, placement.axis, n, x, heads, profile)

            operands = (heads, field.profile)
        else:
            kernel = field.kernel
            if field.interaction == "expansion":
                prepared = _expansion_plan(field, x.dtype)
                rows_fn = lambda *args: _expansion_rows(field, prepared, *args)  # noqa: E731
            else:
                rows_fn = lambda *args: _attention_rows(field, *args)  # noqa: E731

            def body(x, gauge, factor, profile, mine):
                return rows_fn(placement.axis, n, x, mine(gauge), _factor_rows(factor, mine), profile)

            operands = (pad(kernel.gauge), _padded_factor(kernel.factor, pad), kernel.profile)

        def rows_of(x, *operands):
            start = jax.lax.axis_index(placement.axis) * local
            mine = lambda tree: jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, local), tree)  # noqa: E731
            return body(mine(x), *operands, mine)

        # Everything enters whole and leaves whole; each device slices its own rows (of the state,
        # of the gauge, of a matrix factor). Nothing asks XLA for an array split by rows, so it never
        # shards the solver's state or snapshots across the devices (every process can read them);
        # gauge arrays given split by rows (in_specs) came out wrong under jit at n = 3 on 4 devices.
        whole = PartitionSpec()
        sharded = jax.shard_map(
            rows_of, mesh=placement.mesh, in_specs=whole, out_specs=whole, check_vma=False
        )
        return sharded(_padded_rows(x, rows), *operands)


def _padded_factor(factor, pad):
    """A row-sharded factor padded to whole shards (its rows are sliced per device), else itself."""
    return pad(factor) if _row_sharded(factor) else factor


def _factor_rows(factor, mine):
    """The device's rows of a row-sharded factor (``mine``), else the whole factor."""
    return mine(factor) if _row_sharded(factor) else factor


def _replaced(obj, **changes):
    """A copy of the frozen dataclass ``obj`` with ``changes``, made without ``__init__`` (inside a
    trace: validated when it was made)."""
    copy = object.__new__(type(obj))
    for item in dataclasses.fields(obj):
        object.__setattr__(copy, item.name, changes.get(item.name, getattr(obj, item.name)))
    return copy


def _flatten(sharded: ShardedField):
    static, children = _split_field(sharded.field)
    return children, (sharded.placement, static)


def _unflatten(aux, children) -> ShardedField:
    placement, static = aux
    sharded = object.__new__(ShardedField)
    object.__setattr__(sharded, "field", _join_field(static, children))
    object.__setattr__(sharded, "placement", placement)
    return sharded


jax.tree_util.register_pytree_node(ShardedField, _flatten, _unflatten)


def shard_tokens(field, placement: TokenMesh | None = None) -> ShardedField:
    """``field`` with its tokens sharded over ``placement`` (default: every device, ``make_token_mesh()``)."""
    return ShardedField(field, make_token_mesh() if placement is None else placement)
