"""Exact sums over the kernel ``h((x,ξ),(y,ζ)) = w(ξ,ζ) · φ(⟨Q(ξ)x, Q(ζ)y⟩)`` (``attnflow.core.kernel``).

- ``attention_sum``: ``g_i = Σ_j C_ij y_j`` with ``C = w ⊙ φ'(U Uᵀ)`` normalised by ``1/n`` ("usa")
  or by its row sums ("sa", the softmax), optionally causal (``j ≤ i``). Evaluated densely (one
  ``n × n`` matrix), or blocked: symmetric tiles of ``block_size × block_size`` (float64;
  ``lax.scan`` over the tile pairs, memory ``O(n d + block_size²)`` per lane) or row blocks of
  ``block_size`` rows (float32; ``lax.map``, memory ``O(n · block_size)`` per lane). The tile
  pairs or row blocks are dealt into lanes that run on every CPU core (``attnflow.numerics.lanes``).
- ``energy``: ``E = (1/(2n²)) Σ_ij h(z_i, z_j)``, dense or tiled the same way.

Design notes (the measurements behind them: ``benchmarks/RESULTS.md``, "Per step").

- Every kernel of the family is symmetric (``S = UUᵀ`` and ``w`` are), so the float64 tiled
  evaluation computes each tile pair ``I < J`` once and uses it for both ``g_I += C_IJ v_J`` and
  ``g_J += C_IJᵀ v_I``: half the exponentials of a row-by-row pass (causal sums need only the lower
  tiles anyway). Per tile: one ``(b, d) × (d, b)`` product for the logits, one fused elementwise
  pass (factor, ``exp``, causal mask), two ``(b, b) × (b, d')`` products; a 128 × 128 float64
  tile (128 KB) stays in the L2 cache. ``u`` and the values are zero-padded to whole tiles, so
  no padding mask is needed. ``Cᵀ`` is materialised before its product: XLA's CPU product
  contracting the first axis rounds differently depending on the number of cores it is given.
- XLA parallelises each operation over the cores, which does not pay for small tiles; the lanes
  give each core whole tile sequences instead (``attnflow.numerics.lanes``).
- In float32 the exponentials are cheap, the small products dominate, and row blocks (``lax.map``)
  are faster (``symmetric_tiles``).
- The value matrix is zero-padded to a multiple of ``VALUE_COLUMNS`` columns (a product with 3
  columns is slower than with 4 on XLA's CPU backend); for "sa" a column of ones is appended so that the
  softmax denominators come out of the same product instead of a separate reduction.
- The dense path writes and re-reads ``n × n`` arrays and falls behind early; the automatic choice
  is ``attnflow.workflows.build.auto_block_size``. In float64, from 256 tokens up to ``DENSE_TILES_MAX``
  the dense evaluation uses the symmetric tiles too, unrolled, where they save a quarter of the
  entries or more (``dense_tile``). Blocked and
  dense results agree to round-off (the sums are regrouped), and neither depends on the number
  of threads, cores or CPU devices XLA uses (bitwise; tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.kernel import Kernel
from attnflow.numerics import lanes

NORMALIZATIONS = ("usa", "sa")
DENSE_TILE = 128  # float64: the dense evaluation of a few tiles' worth of tokens (see dense_tile)
DENSE_TILES_MAX = 512
VALUE_COLUMNS = 4  # the value matrix is zero-padded to a multiple of this many columns


def check_normalization(normalization: str, *, where: str) -> None:
    """The one check of ``normalization`` (the sums, the fields, the expansion, random batches)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{where}: `normalization` must be one of {NORMALIZATIONS}; got {normalization!r}.")


def _row_blocks(fn, operands, n: int, block_size: int | None):
    """Evaluate ``fn(operands, idx) -> (b, ...)`` over all rows, in one block or in blocks of
    ``block_size`` rows dealt into lanes (``attnflow.numerics.lanes``).

    Rows past ``n`` (padding of the last block) are clamped to ``n − 1`` and dropped afterwards.
    """
    if block_size is None or block_size >= n:
        return fn(operands, jnp.arange(n))
    n_blocks = -(-n // block_size)
    blocks, _ = lanes.deal(np.minimum(np.arange(n_blocks * block_size), n - 1).reshape(n_blocks, block_size))
    out = lanes.lane_map(lambda ops, lane: jax.lax.map(lambda idx: fn(ops, idx), lane), operands, blocks)
    # lane l holds blocks l, l + LANES, ...: back to block order, then drop the padding
    out = jnp.swapaxes(out, 0, 1).reshape(-1, block_size, *out.shape[3:])[:n_blocks]
    return out.reshape(n_blocks * block_size, *out.shape[2:])[:n]


def symmetric_tiles(dtype) -> bool:
    """Whether the blocked evaluation uses symmetric tiles (float64: the ``exp`` dominates) or row
    blocks (float32: the two small products per tile do; module docstring)."""
    return jnp.dtype(dtype) == jnp.float64


def dense_tile(n: int, dtype) -> int | None:
    """The tile of the dense evaluation: ``DENSE_TILE`` in float64 when ``n <= DENSE_TILES_MAX`` and
    the upper tiles (padding included) hold at most 3/4 of the ``n²`` entries, else None (one
    ``n × n`` matrix). With a tile, the symmetric tile pairs are evaluated unrolled
    (``_tiled_sum``). Below ~256 tokens, or where the padding of the last tile wastes more
    than a quarter of the entries, one matrix is cheaper."""
    if not symmetric_tiles(dtype) or n > DENSE_TILES_MAX:
        return None
    m = -(-n // DENSE_TILE)
    return DENSE_TILE if m * (m + 1) // 2 * DENSE_TILE**2 <= 0.75 * n * n else None


def _tiles(n: int, tile: int, *, lower: bool):
    """The tile layout of an ``n × n`` symmetric computation on ``m = ⌈n / tile⌉`` tiles of slots:
    ``labels (m, tile)`` (the token of each slot; padding slots clamped to ``n − 1``), ``valid
    (m, tile)``, and the tile pairs ``(I, J)`` with ``I <= J`` (or ``J <= I`` when ``lower``),
    ``(k, 2)`` in row order."""
    m = -(-n // tile)
    slots = np.arange(m * tile)
    labels = np.minimum(slots, n - 1).reshape(m, tile)
    pairs = np.stack(np.tril_indices(m) if lower else np.triu_indices(m), axis=1)
    valid = (slots < n).reshape(m, tile)
    return jnp.asarray(labels), jnp.asarray(valid), pairs


def _dealt(pairs: np.ndarray):
    """Tile pairs dealt into lanes (``lanes.deal``): ``(LANES, k, 2)`` and the mask of real pairs."""
    dealt, real = lanes.deal(pairs)
    return jnp.asarray(dealt), jnp.asarray(real)


def _tiled_rows(a: jax.Array, tile: int) -> jax.Array:
    """``a (n, k)`` zero-padded to whole tiles and reshaped to ``(m, tile, k)``."""
    n = a.shape[0]
    return jnp.pad(a, ((0, -n % tile), (0, 0))).reshape(-1, tile, a.shape[1])


def _padded_values(values: jax.Array, *, ones: bool) -> jax.Array:
    """``values (n, d')`` with an optional column of ones, zero-padded to ``VALUE_COLUMNS`` columns."""
    n, dv = values.shape
    columns = [values]
    if ones:
        columns.append(jnp.ones((n, 1), values.dtype))
    pad = -(dv + ones) % VALUE_COLUMNS
    if pad:
        columns.append(jnp.zeros((n, pad), values.dtype))
    return jnp.concatenate(columns, axis=1) if len(columns) > 1 else values


def attention_weights(kernel: Kernel, u: jax.Array, idx: jax.Array, *, causal: bool = False) -> jax.Array:
    """Rows ``idx`` of the unnormalised weights ``w_ij φ'(⟨u_i,u_j⟩)/φ'(1)`` (zero above the diagonal
    when ``causal``), shape ``(len(idx), n)``, in the dtype of ``u``."""
    n = u.shape[0]
    factor_rows = kernel.factor.rows(idx).astype(u.dtype)  # NoFactor's ones must not promote float32
    weights = factor_rows * kernel.profile.dphi_unit(u[idx] @ u.T).astype(u.dtype)
    if causal:
        weights = jnp.where(jnp.arange(n)[None, :] <= idx[:, None], weights, 0.0)
    return weights


def _tiled_sum(kernel: Kernel, u, padded, tile: int, *, causal: bool, unrolled: bool = False):
    """``Σ_j C_ij padded_j`` by symmetric tiles (module docstring): each tile pair ``I <= J`` once
    (causal: ``J <= I``), the pairs spread over lanes, one accumulator per lane; or, ``unrolled`` (the
    dense evaluation of a few tiles), evaluated in turn into one accumulator, each a static slice.

    ``u`` and the values are zero-padded to whole tiles: a padding slot has finite weights and a
    zero value, so it adds exact zeros to the real rows (no mask), and its own row is dropped.
    """
    n = u.shape[0]
    labels, _, pairs = _tiles(n, tile, lower=causal)
    operands = (kernel.factor, kernel.profile, labels, _tiled_rows(u, tile), _tiled_rows(padded, tile))

    def add_tile(ops, g, pair):  # pair: traced (a lane's scan) or Python integers (unrolled)
        factor, profile, labels, ut, vt = ops
        i, j = pair
        w = factor.tile(labels[i], labels[j], u.dtype)
        w = w * profile.dphi_unit(ut[i] @ ut[j].T).astype(u.dtype)
        if causal:  # lower tiles only: above the diagonal only inside the diagonal tiles
            local = jnp.arange(tile)
            w = jnp.where((i != j) | (local[None, :] <= local[:, None]), w, 0.0)
        g = g.at[i].add(w @ vt[j])
        unrolled_diagonal = isinstance(i, int) and i == j  # known diagonal: no transposed half
        if not causal and not unrolled_diagonal:
            # Cᵀ v with Cᵀ materialised (the barrier stops XLA from folding the transpose into the
            # product): XLA's CPU dot contracting the first axis of C rounds differently depending
            # on the number of cores it is given; the plain (b, b) × (b, d') product does not
            w_t = jax.lax.optimization_barrier(w.T)
            g = g.at[j].add(jnp.where(i != j, w_t @ vt[i], 0.0))
        return g

    if unrolled:
        g = jnp.zeros_like(operands[-1])
        for pair in pairs.tolist():
            g = add_tile(operands, g, pair)
    else:
        scan_lane = lanes.scan_dealt(add_tile, init=lambda ops: jnp.zeros_like(ops[-1]))
        g = lanes.lane_sum(scan_lane, operands, _dealt(pairs))
    return g.reshape(-1, padded.shape[1])[:n]


def attention_sum(
    kernel: Kernel,
    u: jax.Array,
    values: jax.Array,
    *,
    normalization: str = "usa",
    causal: bool = False,
    block_size: int | None = None,
) -> jax.Array:
    """``g_i = Σ_j C_ij values_j`` with ``C_ij = w_ij φ'(⟨u_i,u_j⟩)/n`` (usa) or the softmax (sa).

    ``block_size = None`` (or ``>= n``): dense, one ``n × n`` weight matrix. Otherwise, in float64,
    symmetric tiles of ``block_size × block_size`` (``lax.scan`` over the tile pairs; memory
    ``O(n d + block_size²)``, half the kernel evaluations); in float32, row blocks of
    ``block_size`` rows (``lax.map``; memory ``O(n · block_size)``) — see ``symmetric_tiles``.
    """
    check_normalization(normalization, where="kernel")
    if causal == "strict":  # the symmetric tiles hold j <= i: the general sum
        options = dict(normalization=normalization, causal=causal, block_size=block_size)
        return qkv_sum(kernel.factor, kernel.profile, u, u, values, **options)
    n, dv = values.shape
    sa = normalization == "sa"
    padded = _padded_values(values.astype(u.dtype), ones=sa)
    if block_size is None or block_size >= n:
        tile = dense_tile(n, u.dtype)
        if tile is None:
            summed = attention_weights(kernel, u, jnp.arange(n), causal=causal) @ padded
        else:
            summed = _tiled_sum(kernel, u, padded, tile, causal=causal, unrolled=True)
    elif symmetric_tiles(u.dtype):
        summed = _tiled_sum(kernel, u, padded, int(block_size), causal=causal)
    else:
        rows = lambda ops, idx: attention_weights(ops[0], ops[1], idx, causal=causal) @ ops[2]  # noqa: E731
        summed = _row_blocks(rows, (kernel, u, padded), n, int(block_size))
    if sa:
        return summed[:, :dv] / summed[:, dv : dv + 1]
    return summed[:, :dv] * (kernel.profile.scale / n).astype(u.dtype)


def energy(kernel: Kernel, x: jax.Array, *, block_size: int | None = None) -> jax.Array:
    """``E(x) = (1/(2n²)) Σ_ij w_ij φ(⟨Q_i x_i, Q_j x_j⟩)`` (dense, or by symmetric tiles)."""
    u = kernel.gauge.apply(x)
    n = u.shape[0]
    if block_size is None or block_size >= n or not symmetric_tiles(u.dtype):

        def rows(ops, idx):
            kernel, u = ops
            w = jnp.broadcast_to(kernel.factor.rows(idx).astype(u.dtype), (idx.shape[0], n))
            return jnp.sum(w * kernel.profile.phi(u[idx] @ u.T).astype(u.dtype), axis=1)

        return jnp.sum(_row_blocks(rows, (kernel, u), n, block_size)) / (2.0 * n * n)
    tile = int(block_size)
    labels, valid, pairs = _tiles(n, tile, lower=False)
    operands = (kernel.factor, kernel.profile, labels, valid, _tiled_rows(u, tile))

    def add_tile(ops, total, pair):
        factor, profile, labels, valid, ut = ops
        i, j = pair
        w = factor.tile(labels[i], labels[j], u.dtype)
        h = jnp.where(valid[i][:, None] & valid[j][None, :], w * profile.phi(ut[i] @ ut[j].T), 0.0)
        return total + jnp.where(i == j, 1.0, 2.0) * jnp.sum(h)  # tile (J, I) = tile (I, J)ᵀ

    scan_lane = lanes.scan_dealt(add_tile, init=lambda ops: jnp.zeros((), u.dtype))
    return lanes.lane_sum(scan_lane, operands, _dealt(pairs)) / (2.0 * n * n)


def logits(kernel: Kernel, x: jax.Array) -> jax.Array:
    """The dense logit matrix ``S_ij = ⟨Q_i x_i, Q_j x_j⟩`` (``n × n``: small n only)."""
    u = kernel.gauge.apply(x)
    return u @ u.T


MASKS = (False, True, "strict")  # no mask, inclusive causal (j <= i), strict causal (j < i)


def logit_bound(q: jax.Array, k: jax.Array) -> jax.Array:
    """``max_i |q_i| · max_j |k_j|``: a bound on every logit ``⟨q_i, k_j⟩`` (Cauchy–Schwarz)."""
    return jnp.sqrt(jnp.max(jnp.sum(q * q, axis=1)) * jnp.max(jnp.sum(k * k, axis=1)))


def _allowed(idx: jax.Array, n: int, causal) -> jax.Array | None:
    """The mask of rows ``idx`` (``(b, n)``, True where ``j`` is seen), or None for no mask."""
    if causal is False:
        return None
    j = jnp.arange(n)[None, :]
    return j < idx[:, None] if causal == "strict" else j <= idx[:, None]


def qkv_sum(
    factor,
    profile,
    q: jax.Array,
    k: jax.Array,
    values: jax.Array,
    *,
    normalization: str = "usa",
    causal: bool | str = False,
    block_size: int | None = None,
) -> jax.Array:
    """``g_i = Σ_j a_ij values_j`` for queries ``q (n, m)`` and keys ``k (n, m)`` that need not be
    equal or unit: ``a_ij = w_ij φ'(⟨q_i, k_j⟩) / n`` ("usa") or the row-normalised weights
    ``w_ij φ'(s_ij) / Σ_l w_il φ'(s_il)`` ("sa", ``w >= 0``); ``causal``: ``j <= i`` (True) or
    ``j < i`` ("strict", in token order). A row that sees no token (the first one of a strict
    mask) sums to zero.

    The exponentials are bounded: "usa" factors ``c e^{βM}`` out with ``M = logit_bound(q, k)``
    (every logit ``<= M``), "sa" subtracts each row's largest seen logit. Evaluated densely
    (``block_size`` None or ``>= n``) or in row blocks of ``block_size`` (``lax.map`` over lanes;
    memory ``O(n · block_size)``). The paper's kernel (``q = k`` unit vectors) has the faster
    symmetric path :func:`attention_sum`."""
    check_normalization(normalization, where="kernel")
    if causal not in MASKS:
        raise ValueError(f"kernel: `causal` must be one of {MASKS}; got {causal!r}.")
    n, dv = values.shape
    dtype = q.dtype
    sa = normalization == "sa"
    exp = profile.kind == "exp"
    bound = logit_bound(q, k) if exp and not sa else jnp.zeros((), dtype)
    padded = _padded_values(values.astype(dtype), ones=sa)

    def rows(ops, idx):
        factor, profile, q, k, padded, bound = ops
        s = q[idx] @ k.T
        seen = _allowed(idx, n, causal)
        if exp:
            if sa:  # each row's largest seen logit (a row that sees nothing keeps a finite shift)
                shift = jnp.max(s if seen is None else jnp.where(seen, s, -jnp.inf), axis=1, keepdims=True)
                shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
            else:
                shift = bound
            weights = jnp.exp(profile.beta.astype(dtype) * (s - shift))
        else:
            weights = jnp.ones_like(s)
        weights = factor.rows(idx).astype(dtype) * weights
        if seen is not None:
            weights = jnp.where(seen, weights, 0.0)
        return weights @ padded

    summed = _row_blocks(rows, (factor, profile, q, k, padded, bound), n, block_size)
    if sa:
        denominator = summed[:, dv : dv + 1]
        safe = jnp.where(denominator > 0, denominator, 1.0)
        return jnp.where(denominator > 0, summed[:, :dv] / safe, 0.0)
    scale = profile.c * jnp.exp(profile.beta * bound) if exp else profile.c
    return summed[:, :dv] * (scale / n).astype(dtype)


def qkv_energy(factor, profile, q: jax.Array, k: jax.Array, *, block_size: int | None = None) -> jax.Array:
    """``(1/(2n²)) Σ_ij w_ij φ(⟨q_i, k_j⟩)`` over all pairs (the energy of one head), with the
    exponentials bounded as in :func:`qkv_sum`."""
    n, dtype = q.shape[0], q.dtype
    exp = profile.kind == "exp"
    bound = logit_bound(q, k) if exp else jnp.zeros((), dtype)

    def rows(ops, idx):
        factor, profile, q, k, bound = ops
        s = q[idx] @ k.T
        h = jnp.exp(profile.beta.astype(dtype) * (s - bound)) if exp else s
        return jnp.sum(jnp.broadcast_to(factor.rows(idx).astype(dtype), s.shape) * h, axis=1)

    total = jnp.sum(_row_blocks(rows, (factor, profile, q, k, bound), n, block_size))
    scale = profile.c * jnp.exp(profile.beta * bound) / profile.beta if exp else profile.c
    return total * scale.astype(dtype) / (2.0 * n * n)
