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
   ``block_size`` is None), besides the field's own arrays, held whole (``n²`` for a matrix
   factor, as on one device);
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
the moments of each device's tokens added over the devices, the causal and distance-bias prefix
sums run piece by piece from the carry of the pieces before
(:mod:`attnflow.numerics.sharded_expansion`).

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
from attnflow.core.pytree import pytree_dataclass
from attnflow.core.sphere import project
from attnflow.numerics.dynamics import AttentionField
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.sharded_expansion import (
    expansion_sum,
    field_plan,
    gathered,
    heads_plans,
    padded_rows,
    with_ones,
)

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
    u = gathered(u_here, axis, n)
    values = u if field.value == "gradient" else gathered(x, axis, n)
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
    return gathered(_held(project(x, g), offset, field.sources), axis, n)


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
        k = gathered(head.keys(x), axis, n)
        v = gathered(head.value_vectors(x), axis, n)
        bound = _logit_bound(q, k, axis) if exp and not sa else jnp.zeros((), x.dtype)
        summed = _local_sum(
            head.factor, profile, q, k, v, offset=offset, n=n, causal=field.causal, sa=sa,
            shift="row" if sa else "bound", bound=bound, block=field.block_size,
        )  # fmt: skip
        scale = profile.c * jnp.exp(profile.beta * bound) if exp else profile.c
        total = total + head.read_out(_normalised(summed, v.shape[1], sa=sa, scale=scale, n=n, guard=True))
    return gathered(_held(project(x, total), offset, field.sources), axis, n)


def _expansion_rows(field: AttentionField, prepared, axis: str, n: int, x, gauge, factor, profile):
    """One device's rows of the paper's field by the expansion (``expansion.expansion_sum``)."""
    plan, direction = prepared
    offset = jax.lax.axis_index(axis) * x.shape[0]
    u = gauge.apply(x)
    sa = field.normalization == "sa"
    y = with_ones(u if field.value == "gradient" else x, sa)
    options = dict(causal=field.causal, direction=direction, axis=axis, n=n)
    summed = expansion_sum(plan, factor, profile, u, u, y, **options)
    g = _normalised(summed, x.shape[1], sa=sa, scale=profile.scale, n=n, guard=field.causal == "strict")
    if field.value == "gradient":
        g = gauge.apply_transpose(g)
    return gathered(_held(project(x, g), offset, field.sources), axis, n)


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
        summed = expansion_sum(plan, head.factor, scaled, q, k, with_ones(v, sa), **options)
        g = _normalised(summed, v.shape[1], sa=sa, scale=scaled.scale, n=n, guard=True)
        total = total + head.read_out(g)
    return gathered(_held(project(x, total), offset, field.sources), axis, n)


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

    def __reduce__(self):
        raise TypeError(
            "sharding: a ShardedField must stay in the process that made it (its mesh holds this "
            "process's devices); got a pickle. Solve a batch of it in this process: solve(..., workers=1)."
        )

    def __getattr__(self, name: str):
        """The wrapped field's attributes (``interaction``, ``rank``, ``causal``, ``heads``, its
        ``energy``, evaluated on one device, ...): a sharded field is read like the field it
        evaluates (metrics, summaries, the store)."""
        if name == "field":  # not set yet (while unpickling or unflattening): no recursion
            raise AttributeError(name)
        return getattr(self.field, name)

    def __call__(self, x: jax.Array) -> jax.Array:
        n = x.shape[0]
        placement = self.placement
        local = placement.rows_per_shard(n)
        rows = local * placement.shards
        pad = lambda tree: jax.tree.map(lambda a: padded_rows(a, rows), tree)  # noqa: E731
        field = self.field
        if isinstance(field, HeadsField):
            heads = tuple(
                _replaced(h, gauge=pad(h.gauge), factor=_padded_factor(h.factor, pad)) for h in field.heads
            )

            plans = heads_plans(field, x.dtype) if field.interaction == "expansion" else None

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
                prepared = field_plan(field, x.dtype)
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
        return sharded(padded_rows(x, rows), *operands)


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
