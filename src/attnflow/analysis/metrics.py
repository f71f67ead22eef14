"""Diagnostics of a snapshot, as pure functions; time series by mapping over snapshots.

Conventions (the same names everywhere in attnflow):

- ``x (n, d)``: content positions, unit rows (points of ``S^{d-1}``);
- ``q (n, d, d)``: the gauge matrices ``Q(ξ_i)``; the gauge frame is ``u_i = Q(ξ_i) x_i``;
- ``groups (n,)``: integer labels to group tokens by (prompt ids, ...);
- ``ts (T,)`` saved times, ``xs (T, n, d)`` saved snapshots.

Two kinds of functions live here:

- **JAX maps** (jit-friendly, vmap-able over snapshots, return 0-d ``jax.Array``):
  :func:`mean_cosine`, :func:`resultant_deficit`, :func:`marginal_spread`, :func:`min_cosine`,
  :func:`orbit_base_point`, :func:`orbit_residual`, :func:`conditional_spread` (with
  ``num_groups`` given), :func:`azimuth_uniformity`, :func:`planarity`,
  :func:`max_pointwise_distance`. Given a NumPy array (``np.ndarray``), :func:`mean_cosine`,
  :func:`resultant_deficit`, :func:`marginal_spread`, :func:`orbit_base_point`,
  :func:`orbit_residual`, :func:`azimuth_uniformity` and :func:`planarity` compute the same
  formulas in NumPy and return NumPy values: an eager call on one snapshot compiles nothing.
- **NumPy/SciPy edges** (not jittable, they run on concrete arrays and return plain Python
  values): :func:`cluster_labels`, :func:`n_clusters`, :func:`n_eff` (connected components of a
  threshold graph), :func:`collapse_time`, :func:`is_monotone`, :func:`max_decrease`,
  :func:`circular_ks`, :func:`wasserstein_sphere` (an assignment problem),
  :func:`snapshot_summary` (a JSON-ready dict).

Energies (``energy``, ``energy_max``, ``energy_gap``) belong to the kernel module, not here;
:func:`is_monotone` and :func:`max_decrease` are what turn an energy series into
``energy_monotone``.

Every function assumes unit rows where the mathematics does (it does not renormalise), and
validates shapes, raising ``ValueError`` on bad input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "azimuth_uniformity",
    "circular_ks",
    "cluster_counts",
    "cluster_labels",
    "collapse_time",
    "conditional_spread",
    "is_monotone",
    "marginal_spread",
    "max_decrease",
    "max_pointwise_distance",
    "mean_cosine",
    "min_cosine",
    "n_clusters",
    "n_eff",
    "orbit_base_point",
    "orbit_residual",
    "planarity",
    "resultant_deficit",
    "series",
    "snapshot_summary",
    "wasserstein_sphere",
]

_HIGHEST = jax.lax.Precision.HIGHEST
# Largest number of Gram entries a NumPy edge materialises at once (rows per block = this // n).
_MAX_BLOCK_ENTRIES = 1 << 22


# --------------------------------------------------------------------------- validation helpers


def _points(x: Any, where: str, name: str = "x") -> jax.Array:
    """``x`` as a floating (n, d) JAX array with n >= 1 (shapes are static, so this traces)."""
    x = jnp.asarray(x)
    x = x.astype(jnp.result_type(x.dtype, float))
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            f"{where}: `{name}` must be an (n, d) array of unit rows with n, d >= 1; "
            f"got shape {tuple(x.shape)!r}."
        )
    return x


def _points_xp(x: Any, where: str, name: str = "x") -> tuple[Any, Any]:
    """``(x, xp)``: a NumPy array stays NumPy (``xp = np``: computed there, nothing compiled), anything
    else (a JAX array, a tracer, a list) becomes a JAX array (``xp = jnp``)."""
    if isinstance(x, np.ndarray):
        return _points_np(x, where, name), np
    return _points(x, where, name), jnp


def _points_np(x: Any, where: str, name: str = "x") -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            f"{where}: `{name}` must be an (n, d) array of unit rows with n, d >= 1; "
            f"got shape {tuple(x.shape)!r}."
        )
    return x


def _check_theta_c(theta_c: float, where: str) -> float:
    theta_c = float(theta_c)
    if not 0.0 <= theta_c <= np.pi:
        raise ValueError(f"{where}: `theta_c` must be an angle in [0, pi] radians; got {theta_c!r}.")
    return theta_c


def _gauge_frame(x: jax.Array, q: Any, where: str, xp: Any = jnp) -> jax.Array:
    """``u_i = Q(ξ_i) x_i``."""
    q = xp.asarray(q, dtype=x.dtype)
    n, d = x.shape
    if q.shape != (n, d, d):
        raise ValueError(
            f"{where}: `q` must have shape (n, d, d) = {(n, d, d)!r} to match `x`; got {tuple(q.shape)!r}."
        )
    return xp.einsum("nij,nj->ni", q, x, **_precision(xp))


# --------------------------------------------------------------------------- collapse of the law


def mean_cosine(x: Any) -> jax.Array:
    """Mean pairwise cosine over distinct pairs, ``(n|m|² − 1)/(n − 1)`` with ``m`` the mean.

    Exact for unit rows: ``Σ_{i≠j} ⟨x_i,x_j⟩ = n²|m|² − n``. Equals 1 exactly on a Dirac; a single
    token (``n = 1``) is a Dirac and gives 1.
    """
    return _mean_cosine(*_points_xp(x, "mean_cosine"))


def _mean_cosine(x, xp):
    n = x.shape[0]
    if n == 1:
        return xp.ones((), dtype=x.dtype)
    m = xp.mean(x, axis=0)
    return (n * xp.sum(m * m) - 1.0) / (n - 1)


def _resultant_deficit(x, xp):
    return 1.0 - xp.linalg.norm(xp.mean(x, axis=0))


def resultant_deficit(x: Any) -> jax.Array:
    """``1 − |m|``, ``m = (1/n) Σ_i x_i``: 0 on a Dirac, 1 when the mean vanishes."""
    return _resultant_deficit(*_points_xp(x, "resultant_deficit"))


def marginal_spread(x: Any) -> jax.Array:
    """``1 − |m|`` of the content marginal (kept as its own key beside
    :func:`conditional_spread`; the value equals :func:`resultant_deficit`)."""
    return _resultant_deficit(*_points_xp(x, "marginal_spread"))


def min_cosine(x: Any, *, block_size: int = 2048) -> jax.Array:
    """``min_{i,j} ⟨x_i, x_j⟩`` (the diagonal included, so at most 1).

    For ``n > block_size`` the Gram matrix is evaluated in row blocks (``lax.map``), memory
    ``O(block_size · n)``; the last block is padded with copies of row 0, which leaves the
    minimum unchanged.
    """
    x = _points(x, "min_cosine")
    if int(block_size) < 1:
        raise ValueError(f"min_cosine: `block_size` must be a positive int; got {block_size!r}.")
    n, d = x.shape
    if n <= block_size:
        return jnp.min(jnp.matmul(x, x.T, precision=_HIGHEST))
    n_blocks = -(-n // block_size)
    pad = n_blocks * block_size - n
    xp = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad, d))], axis=0)
    blocks = xp.reshape(n_blocks, block_size, d)
    mins = jax.lax.map(lambda b: jnp.min(jnp.matmul(b, x.T, precision=_HIGHEST)), blocks)
    return jnp.min(mins)


# --------------------------------------------------------------------------- clusters (NumPy edge)


def cluster_labels(x: Any, *, theta_c: float = 0.1, block_size: int | None = None) -> np.ndarray:
    """Connected components of the graph ``{(i, j) : ⟨x_i, x_j⟩ ≥ cos θ_c}`` as labels ``(n,)``.

    Labels are ``0..C−1`` in order of first appearance (token 0 is in cluster 0). Components are
    single-linkage clusters: a chain of points each within ``θ_c`` of the next is one cluster, so
    the count is meant for discrete (clustered) states.

    NumPy edge, not jittable. Time ``O(n² d)``; memory ``O(block_size · n)``: the Gram matrix
    is formed ``block_size`` rows at a time (default: ``2²² // n`` rows) and the edges of each block
    merge the current classes (:func:`_components`).
    """
    x = _points_np(x, "cluster_labels")
    theta_c = _check_theta_c(theta_c, "cluster_labels")
    n = x.shape[0]
    if block_size is None:
        block_size = max(1, _MAX_BLOCK_ENTRIES // n)
    elif int(block_size) < 1:
        raise ValueError(f"cluster_labels: `block_size` must be a positive int or None; got {block_size!r}.")
    block_size = int(block_size)
    cos_c = np.cos(theta_c)
    labels = np.arange(n)
    for start in range(0, n, block_size):
        rows, cols = np.nonzero(x[start : start + block_size] @ x.T >= cos_c)
        a, b = labels[rows + start], labels[cols]
        differ = a != b
        if not np.any(differ):
            continue
        labels = _components(n, a[differ], b[differ])[labels]  # the classes this block's edges join
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.reshape(-1)]


def _components(size: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The connected components of the graph on ``0..size-1`` with the edges ``(a[k], b[k])``:
    each vertex's label is the smallest vertex of its component.

    Hook and compress, in NumPy: every edge whose ends have different roots hooks the larger root
    under the smaller (``np.minimum.at``), then pointer jumping takes every vertex to its root; the
    edges joining different roots are kept for the next round. A root only ever decreases, and
    each round hooks at least one root, so it ends; the rounds grow like ``log size`` on paths
    and trees (about 11 on a shuffled path of 10⁵ vertices).
    """
    parent = np.arange(size)
    while a.size:
        root_a, root_b = parent[a], parent[b]
        low = np.minimum(root_a, root_b)
        np.minimum.at(parent, root_a, low)
        np.minimum.at(parent, root_b, low)
        while not np.array_equal(up := parent[parent], parent):
            parent = up
        joined = parent[a] != parent[b]
        a, b = a[joined], b[joined]
    return parent


def n_clusters(x: Any, *, theta_c: float = 0.1) -> int:
    """Number of connected components of ``{G_ij ≥ cos θ_c}`` (:func:`cluster_labels`); 1 on a Dirac."""
    return int(cluster_labels(x, theta_c=theta_c).max()) + 1


def cluster_counts(xs: Any, *, theta_c: float = 0.1) -> np.ndarray:
    """:func:`n_clusters` of every state of ``xs (T, n, d)`` at once: ``(T,)`` integers.

    The graphs of all snapshots form one block-diagonal graph whose components are counted by one
    :func:`_components` call (snapshots in chunks of about ``2²²`` Gram entries), instead of
    one call per snapshot."""
    xs = np.asarray(xs, dtype=float)
    if xs.ndim != 3 or xs.shape[0] < 1:
        raise ValueError(f"cluster_counts: `xs` must be a (T, n, d) array of states; got shape {xs.shape!r}.")
    theta_c = _check_theta_c(theta_c, "cluster_counts")
    steps, n, _ = xs.shape
    cos_c, chunk = np.cos(theta_c), max(1, _MAX_BLOCK_ENTRIES // (n * n))
    counts = np.empty(steps, dtype=np.int64)
    for start in range(0, steps, chunk):
        block = xs[start : start + chunk]
        k, rows, cols = np.nonzero(np.triu(block @ np.swapaxes(block, 1, 2) >= cos_c, 1))
        component = _components(block.shape[0] * n, k * n + rows, k * n + cols)
        per_state = np.sort(component.reshape(-1, n), axis=1)
        counts[start : start + block.shape[0]] = 1 + np.count_nonzero(np.diff(per_state, axis=1), axis=1)
    return counts


def n_eff(x: Any, *, theta_c: float = 0.1) -> float:
    """Participation number ``1 / Σ_c (n_c/n)²`` over the components of :func:`cluster_labels`.

    1 on a Dirac; ``K`` for ``K`` clusters of equal mass; ``1/Σ p_k²`` for masses ``p_k``.
    """
    labels = cluster_labels(x, theta_c=theta_c)
    p = np.bincount(labels) / labels.size
    return float(1.0 / np.sum(p * p))


# --------------------------------------------------------------------------- gauge frame, orbits


def orbit_base_point(x: Any, q: Any) -> jax.Array:
    """``u* = normalise((1/n) Σ_i Q(ξ_i) x_i)``, the base point of the orbit the state is near.

    Undefined (NaN) when the gauge-frame mean vanishes.
    """
    x, xp = _points_xp(x, "orbit_base_point")
    return _orbit_base_point(_gauge_frame(x, q, "orbit_base_point", xp), xp)


def _orbit_base_point(u, xp):
    """The normalised mean of the gauge frame ``u``."""
    m = xp.mean(u, axis=0)
    return m / xp.linalg.norm(m)


def _orbit_residual(x, q, u, xp):
    u_star = _orbit_base_point(u, xp)
    target = xp.einsum("nji,j->ni", q, u_star, **_precision(xp))
    return xp.max(xp.linalg.norm(x - target, axis=1))


def _precision(xp) -> dict:
    return {"precision": _HIGHEST} if xp is jnp else {}


def orbit_residual(x: Any, q: Any) -> jax.Array:
    """``max_i |x_i − Q(ξ_i)ᵀ u*|`` with ``u*`` = :func:`orbit_base_point`.

    0 exactly on a maximiser ``Γ[ξ ↦ Q(ξ)ᵀ v]``. With ``q`` the identity this is the
    distance to the Dirac at the normalised mean.
    """
    x, xp = _points_xp(x, "orbit_residual")
    return _orbit_residual(x, xp.asarray(q, dtype=x.dtype), _gauge_frame(x, q, "orbit_residual", xp), xp)


def conditional_spread(x: Any, groups: Any, *, num_groups: int | None = None) -> jax.Array:
    """``Σ_k (n_k/n)(1 − |m_k|)`` over the groups of equal label, ``m_k`` the group mean.

    0 iff every group is a Dirac ("conditional Diracisation").

    ``groups`` are integers. With ``num_groups=None`` any integer labels are accepted and mapped
    to ``0..K−1`` with ``np.unique`` (needs concrete labels, so not under ``jit``). With
    ``num_groups=K`` the labels must already be in ``0..K−1`` (labels outside are dropped by
    ``jax.ops.segment_sum``; empty groups contribute 0) and the function is jittable.
    """
    x = _points(x, "conditional_spread")
    n = x.shape[0]
    if jnp.shape(groups) != (n,):
        raise ValueError(
            f"conditional_spread: `groups` must be a 1-d array of n = {n} integer labels; "
            f"got shape {tuple(jnp.shape(groups))!r}."
        )
    if num_groups is None:
        ids, num_groups = _group_ids(groups)
        ids = jnp.asarray(ids)
    else:
        if int(num_groups) < 1:
            raise ValueError(
                f"conditional_spread: `num_groups` must be a positive int or None; got {num_groups!r}."
            )
        ids, num_groups = jnp.asarray(groups), int(num_groups)
    return _conditional_spread(x, ids, num_groups, jnp)


def _group_ids(groups: Any) -> tuple[np.ndarray, int]:
    """Concrete integer labels mapped to ``0..K−1``, and ``K``."""
    labels = np.asarray(groups)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"conditional_spread: `groups` must hold integer labels; got dtype {labels.dtype}.")
    _, ids = np.unique(labels, return_inverse=True)
    return ids.reshape(-1), int(ids.max()) + 1


def _conditional_spread(x, ids, num_groups: int, xp):
    n = x.shape[0]
    if xp is jnp:
        sums = jax.ops.segment_sum(x, ids, num_segments=num_groups)
        counts = jax.ops.segment_sum(jnp.ones(n, dtype=x.dtype), ids, num_segments=num_groups)
    else:
        sums = np.zeros((num_groups, x.shape[1]), x.dtype)
        np.add.at(sums, ids, x)
        counts = np.bincount(ids, minlength=num_groups).astype(x.dtype)
    # (n_k/n)(1 − |S_k|/n_k) = (n_k − |S_k|)/n, which is 0 for an empty group.
    return xp.sum(counts - xp.linalg.norm(sums, axis=1)) / n


# --------------------------------------------------------------------------- shape of the law


def _azimuth_frame(axis: Any) -> tuple[np.ndarray, np.ndarray]:
    """A right-handed orthonormal frame ``(e1, e2, a)`` with ``a = axis/|axis|``, deterministic:
    ``e1`` is the standard basis vector least aligned with ``a`` (first on ties), made orthogonal
    to ``a``; ``e2 = a × e1``. For ``axis = (0, 0, 1)`` this is ``e1 = x̂, e2 = ŷ``."""
    a = np.asarray(axis, dtype=np.float64)
    norm = np.linalg.norm(a) if a.shape == (3,) else 0.0
    if not (np.isfinite(norm) and norm > 0):
        raise ValueError(f"azimuth_uniformity: `axis` must be a non-zero finite 3-vector; got {axis!r}.")
    a = a / norm
    e1 = np.eye(3)[np.argmin(np.abs(a))]
    e1 = e1 - np.dot(e1, a) * a
    e1 = e1 / np.linalg.norm(e1)
    return e1, np.cross(a, e1)


def azimuth_uniformity(x: Any, *, axis: Any = (0.0, 0.0, 1.0)) -> jax.Array:
    """``|(1/n) Σ_i e^{iφ_i}|``, ``φ_i`` the azimuth of ``x_i`` about ``axis`` (d = 3 only).

    0 for points equally spaced in azimuth (a uniform latitude or great circle about ``axis``),
    1 when all azimuths agree. The azimuth is measured in the frame of :func:`_azimuth_frame`
    (the value does not depend on the choice of ``e1``). A point on the axis has no azimuth; it
    is given ``φ = 0`` (the ``atan2(0, 0)`` convention). ``axis`` is a static parameter (NumPy).
    """
    x, xp = _points_xp(x, "azimuth_uniformity")
    if x.shape[1] != 3:
        raise ValueError(
            f"azimuth_uniformity: `x` must be points of S^2 (d = 3) for an azimuth about an axis; "
            f"got d = {x.shape[1]}."
        )
    return _azimuth_uniformity(x, axis, xp)


def _azimuth_uniformity(x, axis, xp):
    e1, e2 = _azimuth_frame(axis)
    c = xp.matmul(x, xp.asarray(e1, dtype=x.dtype), **_precision(xp))
    s = xp.matmul(x, xp.asarray(e2, dtype=x.dtype), **_precision(xp))
    r = xp.hypot(c, s)
    on_axis = r == 0
    r_safe = xp.where(on_axis, 1.0, r)
    cos_phi = xp.where(on_axis, 1.0, c / r_safe)
    sin_phi = xp.where(on_axis, 0.0, s / r_safe)
    return xp.hypot(xp.mean(cos_phi), xp.mean(sin_phi))


def planarity(x: Any) -> jax.Array:
    """``max_i |⟨x_i, n̂⟩|``, ``n̂`` the right singular vector of ``X`` for its least singular value.

    ``n̂`` is the eigenvector of the ``d × d`` matrix ``XᵀX`` for its smallest eigenvalue (no
    ``n × n`` factor is formed; ``n < d`` gives a null direction and planarity 0). In d = 3, 0 iff
    the points lie on one great circle. In general d it measures the distance to the best
    hyperplane through the origin (codimension 1), so 0 means "in a hyperplane", not "on a great
    circle". For a latitude circle at height ``v3`` with ``v3² < (1 − v3²)/2`` it equals ``|v3|``.
    """
    return _planarity(*_points_xp(x, "planarity"))


def _planarity(x, xp):
    _, vecs = xp.linalg.eigh(xp.matmul(x.T, x, **_precision(xp)))
    return xp.max(xp.abs(xp.matmul(x, vecs[:, 0], **_precision(xp))))


# --------------------------------------------------------------------------- time series (NumPy edge)


def _series_np(values: Any, where: str, name: str = "values") -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"{where}: `{name}` must be a 1-d series; got shape {values.shape!r}.")
    return values


def collapse_time(ts: Any, values: Any, *, threshold: float = 0.999) -> float | None:
    """The first saved time ``t_k`` with ``values[k] ≥ threshold``, or ``None`` if there is none.

    With ``values`` the :func:`mean_cosine` series this is ``collapse_time`` (on the gauge
    frame, ``gauge_collapse_time``). NaN values never count as collapsed.
    """
    ts = _series_np(ts, "collapse_time", "ts")
    values = _series_np(values, "collapse_time")
    if ts.shape != values.shape:
        raise ValueError(
            f"collapse_time: `values` must have the length of `ts` ({ts.size}); got {values.size}."
        )
    hits = np.flatnonzero(values >= threshold)
    return float(ts[hits[0]]) if hits.size else None


def max_decrease(values: Any) -> float:
    """The largest drop between consecutive entries, ``max(0, max_k (E_k − E_{k+1}))``.

    0.0 for a non-decreasing series (or fewer than two entries); NaN if the series has a NaN.
    """
    values = _series_np(values, "max_decrease")
    if np.isnan(values).any():  # one snapshot of NaN energy included: nothing is known to rise
        return float("nan")
    if values.size < 2:
        return 0.0
    return float(np.maximum(0.0, -np.min(np.diff(values))))


def is_monotone(values: Any, *, tol: float) -> bool:
    """``min_k (E_{k+1} − E_k) ≥ −tol``: non-decreasing up to ``tol`` (``energy_monotone``).

    Equivalent to ``max_decrease(values) <= tol``; a series with a NaN is not monotone.
    """
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"is_monotone: `tol` must be a non-negative float; got {tol!r}.")
    drop = max_decrease(values)
    return bool(drop <= tol)


def series(
    xs: Any,
    fn: Callable[[Any], Any],
    *,
    batch_size: int | None = None,
    traceable: bool = True,
) -> jax.Array:
    """``[fn(xs[k]) for k in range(T)]`` as an array with leading axis ``T``.

    ``traceable=True`` (for the JAX maps of this module, or any ``functools.partial`` of them):
    ``jax.vmap(fn)(xs)``, or ``jax.lax.map`` in batches of ``batch_size`` snapshots to bound
    memory (``min_cosine`` holds an ``n × n`` block per snapshot). ``traceable=False`` (for the
    NumPy edges such as :func:`n_clusters`): a Python loop over concrete snapshots.
    """
    xs = jnp.asarray(xs)
    if xs.ndim != 3:
        raise ValueError(
            f"series: `xs` must be a (T, n, d) stack of snapshots; got shape {tuple(xs.shape)!r}."
        )
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(f"series: `batch_size` must be a positive int or None; got {batch_size!r}.")
    if not traceable:
        return jnp.asarray(np.stack([np.asarray(fn(xk)) for xk in np.asarray(xs)]))
    if batch_size is None:
        return jax.vmap(fn)(xs)
    return jax.lax.map(fn, xs, batch_size=int(batch_size))


# --------------------------------------------------------------------------- distances to a target


def circular_ks(
    angles: Any, target_cdf: Callable[[np.ndarray], Any], *, tolerance: float | None = None
) -> float:
    """Kolmogorov–Smirnov distance ``sup_θ |F_n(θ) − F(θ)|`` on ``[0, 2π)`` with the origin at 0.

    ``angles`` (radians, any real values) are reduced mod 2π; ``F_n`` is their empirical CDF and
    ``F = target_cdf`` the target CDF on ``[0, 2π)`` (a vectorised callable, non-decreasing and
    right-continuous, ``F(0) >= 0`` the mass at 0, ``F(2π) = 1``). The origin is fixed at 0, not minimised
    over, so pass angles already relative to the base point.

    ``tolerance = 0`` (a continuous ``F``): the supremum is attained on either side of a jump of
    ``F_n``, so it is evaluated exactly there: ``D = max_k max(k/n − F(θ_(k)), F(θ_(k)) − (k−1)/n)``.
    For the midpoint angles ``2π(i + ½)/n`` against the uniform law, ``D = 1/(2n)``.

    ``tolerance = δ > 0`` (an ``F`` with atoms): the KS distance is not continuous in the angles at
    an atom (an angle an ulp below it counts against the whole jump), so the angles are read to
    the resolution ``δ``: reduced to ``[−δ, 2π − δ)`` (an angle within ``δ`` below 2π is one at 0)
    and ``D_δ = max_k max(k/n − F(θ_(k) + δ), F(θ_(k) − δ) − (k−1)/n)`` (``F = 0`` below 0). If every
    angle is within ``δ' < δ`` (circularly) of angles ``α_i`` in ``[0, 2π − 2δ)``, then ``D_δ`` is at
    most the exact KS distance of the ``α`` (with the left limits of ``F`` at its jumps), e.g.
    ``1/(2n)`` for the midpoint quantiles of the law, ties included; and ``D_δ <= D``, by at most
    the rise of ``F`` over ``δ`` where ``F`` is continuous (angles ``0.1`` off still measure so).

    ``tolerance=None`` takes ``target_cdf.ks_tolerance`` when the callable has one (the CDF of a
    law with atoms, :class:`attnflow.analysis.laws.AngleCDF`), else 0. NumPy edge.
    """
    raw = _series_np(angles, "circular_ks", "angles")
    n = raw.size
    if n == 0:
        raise ValueError("circular_ks: `angles` must hold at least one angle; got an empty array.")
    delta = float(getattr(target_cdf, "ks_tolerance", 0.0) if tolerance is None else tolerance)
    if not 0.0 <= delta < np.pi:
        raise ValueError(f"circular_ks: `tolerance` must be in [0, π) radians; got {delta!r}.")

    def cdf(theta: np.ndarray) -> np.ndarray:
        f = np.asarray(target_cdf(theta), dtype=np.float64)
        if f.shape != theta.shape:
            raise ValueError(
                f"circular_ks: `target_cdf` must map an (n,) array of angles to (n,) values; "
                f"got shape {f.shape!r} for n = {n}."
            )
        return f

    k = np.arange(1, n + 1)
    if delta == 0.0:
        theta = np.sort(np.mod(raw, 2.0 * np.pi))
        f = cdf(theta)
        return float(np.max(np.maximum(k / n - f, f - (k - 1) / n)))
    reduced = np.mod(raw + delta, 2.0 * np.pi)
    reduced[reduced >= 2.0 * np.pi] = 0.0  # np.mod(−tiny, 2π) rounds to 2π
    theta = np.sort(reduced - delta)
    above = cdf(theta + delta)
    below_at = theta - delta
    below = np.where(below_at < 0.0, 0.0, cdf(np.maximum(below_at, 0.0)))
    return float(np.max(np.maximum(k / n - above, below - (k - 1) / n)))


def _geodesic_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise angles ``2 atan2(|a_i − b_j|, |a_i + b_j|)``: accurate near 0 and near π, unlike
    ``arccos⟨a_i, b_j⟩``."""
    from scipy.spatial.distance import cdist

    return 2.0 * np.arctan2(cdist(a, b), cdist(a, -b))


def wasserstein_sphere(a: Any, b: Any) -> float:
    """Exact ``W1`` between the uniform laws on two equal-size clouds of unit vectors, with the
    geodesic (great-circle) cost: ``min_σ (1/n) Σ_i ∠(a_i, b_σ(i))`` over permutations ``σ``.

    Solved as an assignment problem (``scipy.optimize.linear_sum_assignment``, ``O(n³)`` time,
    ``O(n²)`` memory), which is exact for equal uniform weights (Birkhoff). NumPy edge.
    """
    a = _points_np(a, "wasserstein_sphere", "a")
    b = _points_np(b, "wasserstein_sphere", "b")
    if a.shape != b.shape:
        raise ValueError(
            f"wasserstein_sphere: `b` must have the shape of `a` {a.shape!r} (equal-size clouds "
            f"in the same dimension); got {b.shape!r}."
        )
    from scipy.optimize import linear_sum_assignment

    cost = _geodesic_matrix(a, b)
    rows, cols = linear_sum_assignment(cost)
    return float(np.mean(cost[rows, cols]))


def max_pointwise_distance(a: Any, b: Any) -> jax.Array:
    """``max_i |a_i − b_i|`` (Euclidean, matched by index), e.g. ``|x_i − g(ξ_i)|`` in experiment E8."""
    a = _points(a, "max_pointwise_distance", "a")
    b = _points(b, "max_pointwise_distance", "b")
    if a.shape != b.shape:
        raise ValueError(
            f"max_pointwise_distance: `b` must have the shape of `a` {tuple(a.shape)!r}; "
            f"got {tuple(b.shape)!r}."
        )
    return jnp.max(jnp.linalg.norm(a - b, axis=1))


# --------------------------------------------------------------------------- one snapshot, all keys


def _json_float(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def snapshot_summary(
    x: Any,
    *,
    q: Any = None,
    groups: Any = None,
    theta_c: float = 0.1,
    axis: Any = (0.0, 0.0, 1.0),
    pairwise: bool = True,
) -> dict[str, float | int | None]:
    """Every diagnostic computable from one snapshot, as plain Python values (JSON-ready).

    Keys: ``mean_cosine, resultant_deficit, min_cosine, n_clusters, n_eff, gauge_mean_cosine,
    gauge_resultant_deficit, orbit_residual, conditional_spread, marginal_spread,
    azimuth_uniformity, planarity``. Energies and the time-series keys (``collapse_time``, ...)
    are not snapshot quantities and are left to the caller.

    - ``q=None`` means no gauge: ``Q = I``, so the gauge frame *is* the content frame and
      ``gauge_*`` equal their content values; ``orbit_residual`` is then the distance to the Dirac
      at the normalised mean.
    - ``conditional_spread`` is ``None`` without ``groups``.
    - ``azimuth_uniformity`` is ``None`` unless d = 3.
    - Any non-finite value (e.g. ``orbit_residual`` when the gauge-frame mean vanishes) is ``None``.
    - Computed in NumPy (the same formulas as the JAX maps, :func:`mean_cosine` and the others):
      one snapshot is too little work to pay for compiling a program per shape.
    - ``pairwise=False`` skips the ``O(n²)`` keys (``min_cosine``, ``n_clusters``, ``n_eff``: ``None``).
    """
    x = _points_np(x, "snapshot_summary")
    n, d = x.shape
    q = np.broadcast_to(np.eye(d, dtype=x.dtype), (n, d, d)) if q is None else np.asarray(q, dtype=x.dtype)
    u = _gauge_frame(x, q, "snapshot_summary", np)
    if pairwise:
        labels = cluster_labels(x, theta_c=theta_c)
        p = np.bincount(labels) / n
        pairs = {
            "min_cosine": _json_float(_min_cosine_np(x)),
            "n_clusters": int(labels.max()) + 1,
            "n_eff": _json_float(1.0 / np.sum(p * p)),
        }
    else:
        pairs = {"min_cosine": None, "n_clusters": None, "n_eff": None}
    with np.errstate(invalid="ignore", divide="ignore"):  # a vanishing gauge-frame mean: None
        orbit = _orbit_residual(x, q, u, np)
    return {
        "mean_cosine": _json_float(_mean_cosine(x, np)),
        "resultant_deficit": _json_float(_resultant_deficit(x, np)),
        **pairs,
        "gauge_mean_cosine": _json_float(_mean_cosine(u, np)),
        "gauge_resultant_deficit": _json_float(_resultant_deficit(u, np)),
        "orbit_residual": _json_float(orbit),
        "conditional_spread": None if groups is None else _json_float(_spread(x, groups)),
        "marginal_spread": _json_float(_resultant_deficit(x, np)),
        "azimuth_uniformity": _json_float(_azimuth_uniformity(x, axis, np)) if d == 3 else None,
        "planarity": _json_float(_planarity(x, np)),
    }


def _spread(x: np.ndarray, groups: Any) -> float:
    return _conditional_spread(x, *_group_ids(groups), np)


def _min_cosine_np(x: np.ndarray) -> float:
    """:func:`min_cosine` in NumPy, ``_MAX_BLOCK_ENTRIES`` Gram entries at a time."""
    rows = max(1, _MAX_BLOCK_ENTRIES // x.shape[0])
    return min(float(np.min(x[i : i + rows] @ x.T)) for i in range(0, x.shape[0], rows))
