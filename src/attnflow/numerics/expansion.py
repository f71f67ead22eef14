"""Attention sums and the energy in ``O(n R d)`` by a polynomial expansion of the kernel, with an
error chosen in advance: the same contract as ``attention_sum`` and ``energy``
(``attnflow.numerics.summation``) to within ``tolerance``.

The kernel ``e^{β(s−1)}`` is replaced by ``p_L(s) = Σ_α weight_α u^α v^α``
(``attnflow.numerics.polynomial_features``), so that

    Σ_j w_ij p_L(⟨u_i, u_j⟩) y_j = Σ_t a_it F(u_i) · [weight ⊙ Σ_j a_jt F(u_j) y_jᵀ]

for a factor with label terms ``w_ij = Σ_t a_it a_jt``: none (``a = 1``), Toeplitz cosine
(``a = (cos ωξ, sin ωξ)``, two terms). The moments ``M_t = Σ_j a_jt F(u_j) y_jᵀ`` are accumulated
over chunks of tokens, so memory is ``O(n d + chunk · R)``. The features are split
(``polynomial_features.split_features``): ``F(u) = T(u) ⊗ P(u)``, the monomials ``T`` of all
coordinates but the first (``G`` of them) times the powers ``P`` of the first (``L + 1``), the
monomials of degree above ``L`` weighted 0. A chunk's moments are then one product of ``G × c``
against ``c × (L + 1) T d'`` and their evaluation one of ``(L + 1) T d' × G`` against ``G × c``:
wide on both sides, where the ``R`` monomials (``monomial_features``) give a product of width
``T d'`` only (3 or 4 columns, far below the machine's matmul rate). The split does
``G (L + 1) / R`` (about 2.5 in d = 3) times the multiply-adds at several times the rate
(``benchmarks/RESULTS.md``, "Expansion"). Without a mask or the distance bias the chunks are
dealt into lanes that run on every CPU device (``attnflow.numerics.lanes``).

Prefix sums (``_prefix_sum``) serve the causal masks (token order) and the distance bias
``w = e^{−m|ξ_i − ξ_j|}`` (label order; the sum splits into ``j`` before ``i`` and ``j`` after ``i``,
each a linear recurrence ``S ← e^{−m Δξ} S + F(u_j) y_jᵀ`` with decays ``<= 1``). They run over
chunks of ``PREFIX_CHUNK`` tokens: pairs inside a chunk are summed exactly (a small dense block),
pairs across chunks through the carried moments. Unsorted labels are sorted by a permutation.
A causal sum with the distance bias needs labels monotone in token order.

``"sa"``: the denominators are the same sum with value 1 (a column of ones). The linear profile has
``φ' = c``: degree 0, exact.

Error (``expansion_degree``): with ``ε = tail_bound(β, L)`` the kernel error for ``|s| <= SHELL``,
that is wherever the field is evaluated with every ``|x_i| <= STAGE_RADIUS = 1.1`` (the Runge–Kutta
stages off the sphere included, ``attnflow.numerics.polynomial_features``; the bounds below hold
there, ``max_j |y_j|`` taken at the stage; a stage beyond it, never met in practice (radii up to
1.0011 measured), gives NaN, so the run stops with the status ``nonfinite`` instead of going on with
an unbounded error),
- "usa": ``|Δg_i| <= ε · φ'(1) · max_j |y_j|`` (``|w| <= 1`` for the supported factors): the
  tolerance is relative to the field's scale ``φ'(1) max|y|``;
- "sa": the relative kernel error is at most ``ε e^{β(1+SHELL)}``, and
  ``|Δg_i| <= 2 ε_rel / (1 − ε_rel) · max_j |y_j|`` (``w >= 0``);
- energy: ``|ΔE| <= ε · φ'(1) / (2β)``, relative to the energy's scale ``φ'(1)/(2β)``.
Round-off adds a few ulps of the same scales.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors
from attnflow.core.factors import check_softmax_factor
from attnflow.core.kernel import Kernel
from attnflow.numerics import lanes
from attnflow.numerics import polynomial_features as pf
from attnflow.numerics.summation import check_normalization

INTERACTIONS = ("auto", "exact", "expansion")
SUPPORTED_FACTORS = (factors.NoFactor, factors.DistanceBias, factors.ToeplitzCos)
MAX_RANK = 10_000  # features per token; past this the exact path is the way
PREFIX_CHUNK = 128  # tokens per chunk of a prefix sum (exact pairs inside a chunk)
CHUNK_ENTRIES = 2**18  # chunk · R of the moment accumulation (2 MB in float64)
EXP_COST = 20.0  # one exponential in multiply-adds, for the cost model


def expansion_degree(beta: float, tolerance: float, *, kind: str = "exp", normalization: str = "usa") -> int:
    """The smallest degree ``L`` whose closed-form tail bound meets ``tolerance`` (see the module
    docstring for what it bounds). ``kind`` "linear": 0 (the kernel is constant)."""
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"expansion: `tolerance` must be in (0, 1); got {tolerance!r}.")
    check_normalization(normalization, where="expansion")
    if kind == "linear":
        return 0
    target = tolerance
    if normalization == "sa":
        target = tolerance / (2.0 + tolerance) * math.exp(-beta * (1.0 + pf.SHELL))
    for degree in range(pf.MAX_DEGREE + 1):
        if pf.tail_bound(beta, degree) <= target:
            return degree
    raise ValueError(
        f"expansion: `tolerance` must be reachable with degree <= {pf.MAX_DEGREE} at beta = {beta:g}; "
        f"got {tolerance!r}. Use interaction 'exact'."
    )


def expansion_rank(
    d: int, beta: float, tolerance: float, *, kind: str = "exp", normalization: str = "usa"
) -> int:
    """Features per token, ``C(L + d, d)`` with ``L = expansion_degree(...)``."""
    return pf.rank(d, expansion_degree(beta, tolerance, kind=kind, normalization=normalization))


def expansion_cost(n: int, d: int, rank: int, *, terms: int = 1, prefix: bool = False, dv: int = 4) -> float:
    """Multiply-adds of one expansion sum: features, moments and contraction per token (``terms``
    label terms; two passes for the distance bias), plus the exact pairs inside the chunks of a
    prefix sum. The ``R`` useful ones: the split products do about 2.5 times as many, at a rate
    several times higher (module docstring)."""
    per_token = rank * (d + 2 * terms * dv)
    if prefix:
        per_token = 2 * per_token + PREFIX_CHUNK * (d + EXP_COST + dv)
    return n * per_token


def exact_cost(n: int, d: int, *, dv: int = 4) -> float:
    """Multiply-adds of one exact sum by symmetric tiles: ``n²/2`` pairs."""
    return 0.5 * n * n * (d + EXP_COST + 2 * dv)


def prefer_expansion(kernel: Kernel, d: int, *, normalization: str, causal: bool, tolerance: float) -> bool:
    """The choice of ``interaction = "auto"``: the expansion when it is supported and its cost model
    is below the exact one."""
    factor = kernel.factor
    if not isinstance(factor, SUPPORTED_FACTORS):
        return False
    try:
        r = _rank_for(kernel, d, normalization, tolerance)
    except ValueError:
        return False
    terms = 2 if isinstance(factor, factors.ToeplitzCos) else 1
    prefix = causal or isinstance(factor, factors.DistanceBias)
    return expansion_cost(kernel.n, d, r, terms=terms, prefix=prefix) < exact_cost(kernel.n, d)


def _beta(kernel: Kernel) -> float:
    try:
        return float(kernel.profile.beta)
    except jax.errors.ConcretizationTypeError:
        raise ValueError(
            "expansion: `beta` must be a concrete number (the degree is chosen from it before tracing); "
            "got a traced value. Close over the kernel instead of passing it through jit."
        ) from None


def _rank_for(kernel: Kernel, d: int, normalization: str, tolerance: float) -> int:
    r = expansion_rank(d, _beta(kernel), tolerance, kind=kernel.profile.kind, normalization=normalization)
    if r > MAX_RANK:
        raise ValueError(
            f"expansion: `d` must be small enough for the tolerance (rank C(L + d, d) <= {MAX_RANK}); "
            f"got d = {d}, rank {r} at beta = {_beta(kernel):g}, tolerance {tolerance:g}. "
            "Use interaction 'exact' or a larger tolerance."
        )
    return r


def check(kernel: Kernel, d: int, *, normalization: str, causal: bool, tolerance: float) -> int:
    """Every validation of the expansion path, before tracing (to call where the field is made);
    returns the rank, for the run's record."""
    _check(kernel, d, normalization, tolerance)
    if causal and isinstance(kernel.factor, factors.DistanceBias):
        _monotone_direction(kernel.factor.xi)
    return _rank_for(kernel, d, normalization, tolerance)


def _check(kernel: Kernel, d: int, normalization: str, tolerance: float) -> int:
    factor = kernel.factor
    if not isinstance(factor, SUPPORTED_FACTORS):
        raise ValueError(
            "expansion: `factor` must be none, distance_bias or toeplitz_cos (a matrix factor has no "
            f"low-rank label structure; use interaction 'exact'); got {type(factor).__name__}."
        )
    check_softmax_factor(factor, normalization, where="expansion")
    degree = expansion_degree(_beta(kernel), tolerance, kind=kernel.profile.kind, normalization=normalization)
    _rank_for(kernel, d, normalization, tolerance)
    return degree


class _Plan:
    """The static pieces of one expansion: the degree, the rank ``R`` and the weights ``(G, L + 1)``
    of the split features, and the two wide products of a chunk of tokens (module docstring)."""

    def __init__(self, beta: float, degree: int, d: int, dtype):
        coefficients = pf.monomial_coefficients(beta, degree) if degree else np.ones(1)
        self.degree = degree
        self.rank = pf.rank(d, degree)
        self.weights = jnp.asarray(pf.split_weights(d, degree, coefficients), dtype)

    def chunk(self, n: int, width: int) -> int:
        """Tokens per chunk: its features and products about ``CHUNK_ENTRIES`` entries, at least 64."""
        rows = self.weights.shape[0] + (self.degree + 1) * (1 + 2 * width)
        return int(min(n, max(64, CHUNK_ENTRIES // rows)))

    def zeros(self, width: int, dtype) -> jax.Array:
        """No moments: ``(G, (L + 1) width)`` zeros."""
        return jnp.zeros((self.weights.shape[0], self.weights.shape[1] * width), dtype)

    def moments(self, k: jax.Array, y: jax.Array) -> jax.Array:
        """``Σ_j T(k_j) ⊗ [P(k_j) ⊗ y_j]`` of a chunk (``k (c, d)``, ``y (c, w)``), ``(G, (L + 1) w)``."""
        tail, powers = pf.split_features(k.T, self.degree)
        z = (powers.T[:, :, None] * y[:, None, :]).reshape(k.shape[0], -1)
        return tail @ z

    def weighted(self, moments: jax.Array) -> jax.Array:
        """The moments times the weights, transposed for :meth:`evaluate`: ``((L + 1) w, G)``."""
        g, a = self.weights.shape
        return (moments.reshape(g, a, -1) * self.weights[:, :, None]).reshape(g, -1).T

    def evaluate(self, q: jax.Array, weighted: jax.Array) -> jax.Array:
        """``Σ_j p_L(⟨q_i, k_j⟩) y_j`` for a chunk ``q (c, d)`` from ``weighted`` moments, ``(c, w)``:
        ``Σ_a P_a(q_i) [M̃ T(q_i)]_a``."""
        tail, powers = pf.split_features(q.T, self.degree)
        per_power = (weighted @ tail).reshape(self.degree + 1, -1, q.shape[0])
        return jnp.sum(powers[:, None, :] * per_power, axis=0).T


def _label_terms(factor, n: int, dtype) -> jax.Array:
    """``a (n, T)`` with ``w_ij = Σ_t a_it a_jt`` (times the decay of the distance bias)."""
    if isinstance(factor, factors.ToeplitzCos):
        angle = factor.omega * factor.xi
        return jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1).astype(dtype)
    return jnp.ones((n, 1), dtype)


def _chunked(a: jax.Array, chunk: int, *, edge: bool = False) -> jax.Array:
    """``a (n, ...)`` padded to whole chunks (zeros, or the last entry when ``edge``), ``(m, chunk, ...)``."""
    pad = -a.shape[0] % chunk
    widths = [(0, pad)] + [(0, 0)] * (a.ndim - 1)
    padded = jnp.pad(a, widths, mode="edge" if edge else "constant")
    return padded.reshape(-1, chunk, *a.shape[1:])


def _spread(a: jax.Array, y: jax.Array) -> jax.Array:
    """``[a_1 y, …, a_T y]``, ``(c, T d')``: the values of each label term side by side."""
    return (a[:, :, None] * y[:, None, :]).reshape(y.shape[0], -1)


def _gather(a: jax.Array, z: jax.Array) -> jax.Array:
    """``Σ_t a_t z_t`` for ``z = [z_1, …, z_T]`` of shape ``(c, T d')``."""
    return jnp.sum(a[:, :, None] * z.reshape(z.shape[0], a.shape[1], -1), axis=1)


def _global_sum(plan: _Plan, q, k, y, a) -> jax.Array:
    """``g_i = Σ_j Σ_t a_it a_jt p_L(⟨q_i,k_j⟩) y_j`` over all pairs, by the moments
    ``M = Σ_j F(k_j)ᵀ [a_j1 y_j, …, a_jT y_j]`` accumulated over chunks, then evaluated chunk by
    chunk (``q is k``: one set of chunks), the chunks dealt into lanes when there are several."""
    n, width = k.shape[0], a.shape[1] * y.shape[1]
    chunk = _lane_chunk(plan, n, width)
    if chunk >= n:  # one chunk: no lanes
        weighted = plan.weighted(plan.moments(k, _spread(a, y)))
        return _gather(a, plan.evaluate(q, weighted))
    chunks = (_chunked(k, chunk), _chunked(y, chunk), _chunked(a, chunk))
    weighted = plan.weighted(_lane_moments(plan, *chunks))
    queries = chunks[0] if q is k else _chunked(q, chunk)
    return _lane_evaluate(plan, queries, chunks[2], weighted).reshape(-1, y.shape[1])[:n]


def _lane_chunk(plan: _Plan, n: int, width: int) -> int:
    """Tokens per chunk of a global sum: at most ``plan.chunk``; with ``LANES × 64`` tokens or more,
    a whole number of chunks per lane (``attnflow.numerics.lanes``), fewer: as few chunks as the
    plan allows (the lanes without one idle)."""
    chunk = plan.chunk(n, width)
    if n < lanes.LANES * 64:
        return chunk
    per_lane = -(-n // (lanes.LANES * chunk))
    return -(-n // (lanes.LANES * per_lane))


def _lane_moments(plan: _Plan, k_chunks, y_chunks, a_chunks) -> jax.Array:
    """``Σ_j F(k_j)ᵀ [a_j1 y_j, …, a_jT y_j]`` over chunks ``(m, chunk, ·)``, the chunks dealt into
    lanes: each lane accumulates its own moments (a ``lax.scan``), added in lane order; the lanes
    run on every CPU device."""
    width = a_chunks.shape[2] * y_chunks.shape[2]
    dealt, real = (jnp.asarray(t) for t in lanes.deal(np.arange(k_chunks.shape[0])))

    def accumulate(ops, moments, i):
        kc, yc, ac = ops
        return moments + plan.moments(kc[i], _spread(ac[i], yc[i]))

    lane = lanes.scan_dealt(accumulate, init=lambda ops: plan.zeros(width, k_chunks.dtype))
    return lanes.lane_sum(lane, (k_chunks, y_chunks, a_chunks), (dealt, real))


def _lane_evaluate(plan: _Plan, q_chunks, a_chunks, weighted) -> jax.Array:
    """``Σ_t a_it [F(q_i) · weighted]_t`` for the chunks ``(m, chunk, ·)`` of queries, dealt into
    lanes (the padding items of ``lanes.deal`` skipped); ``(m', chunk, d')`` in chunk order,
    ``m' >= m`` (zero chunks last)."""
    dealt, real = (jnp.asarray(t) for t in lanes.deal(np.arange(q_chunks.shape[0])))
    shape = (q_chunks.shape[1], weighted.shape[0] // (plan.degree + 1) // a_chunks.shape[2])

    def evaluate(ops, lane):
        qc, ac, weighted = ops

        def chunk(item):
            i, real = item
            some = lambda i: _gather(ac[i], plan.evaluate(qc[i], weighted))  # noqa: E731
            return jax.lax.cond(real, some, lambda i: jnp.zeros(shape, qc.dtype), i)

        return jax.lax.map(chunk, lane)

    out = lanes.lane_map(evaluate, (q_chunks, a_chunks, weighted), (dealt, real))
    return jnp.swapaxes(out, 0, 1).reshape(-1, *out.shape[2:])  # lane l holds chunks l, l + LANES, ...


def _prefix_sum(
    plan: _Plan, profile, q, k, y, a, zeta, slope, *, strict: bool, carry=None, same: bool | None = None
) -> jax.Array:
    """``g_i = Σ_{j <= i} e^{−m(ζ_i − ζ_j)} Σ_t a_it a_jt K(q_i, k_j) y_j`` in processing order
    (``j < i`` when ``strict``), for ``ζ`` non-decreasing; ``K`` is exact inside a chunk and
    ``p_L`` across chunks (carried moments, rescaled by the decay to the chunk's last label).
    ``carry = (moments, ζ_ref)``: the moments of tokens before these ones, decayed to ``ζ_ref``
    (a shard of the sharded sum starts from the shards before it; None: none). ``same``: the
    queries are the keys (default ``q is k``, which a sharded slice no longer shows)."""
    n = k.shape[0]
    c = PREFIX_CHUNK
    same = q is k if same is None else same
    chunks = (_chunked(q, c), _chunked(k, c), _chunked(y, c), _chunked(a, c), _chunked(zeta, c, edge=True))
    local = jnp.arange(c)
    below = local[None, :] < local[:, None] if strict else local[None, :] <= local[:, None]

    def step(carry, chunk):
        moments, zeta_ref = carry
        qc, kc, yc, ac, zc = chunk
        into = ac * jnp.exp(-slope * (zc - zeta_ref))[:, None]
        across = _gather(into, plan.evaluate(qc, plan.weighted(moments)))
        gap = jnp.maximum(zc[:, None] - zc[None, :], 0.0)
        w = jnp.where(below, (ac @ ac.T) * jnp.exp(-slope * gap), 0.0)
        inside = (w * profile.dphi_unit((kc if same else qc) @ kc.T).astype(k.dtype)) @ yc
        zeta_last = zc[-1]
        out_of = ac * jnp.exp(-slope * (zeta_last - zc))[:, None]
        moments = jnp.exp(-slope * (zeta_last - zeta_ref)) * moments + plan.moments(kc, _spread(out_of, yc))
        return (moments, zeta_last), across + inside

    if carry is None:
        carry = (plan.zeros(a.shape[1] * y.shape[1], k.dtype), zeta[0])
    _, out = jax.lax.scan(step, carry, chunks)
    return out.reshape(-1, y.shape[1])[:n]


def _monotone_direction(xi) -> float:
    """+1 if the labels are non-decreasing in token order, −1 if non-increasing (a causal sum with
    the distance bias runs over both orders at once only then)."""
    try:
        steps = np.diff(np.asarray(xi))
    except jax.errors.TracerArrayConversionError:
        raise ValueError(
            "expansion: the distance-bias labels must be concrete for a causal sum; got traced labels."
        ) from None
    if np.all(steps >= 0):
        return 1.0
    if np.all(steps <= 0):
        return -1.0
    raise ValueError(
        "expansion: `causal` with the distance bias must have labels monotone in token order; "
        "got unsorted labels. Use interaction 'exact'."
    )


def _kernel_sum(plan: _Plan, factor, profile, q, k, y, *, causal) -> jax.Array:
    """``Σ_j w_ij K(q_i, k_j) y_j`` (``j <= i`` when causal, ``j < i`` when "strict"),
    unnormalised; ``q is k`` for the paper's kernel."""
    n = k.shape[0]
    a = _label_terms(factor, n, k.dtype)
    strict = causal == "strict"
    if not isinstance(factor, factors.DistanceBias):
        if causal is False:
            return _global_sum(plan, q, k, y, a)
        return _prefix_sum(plan, profile, q, k, y, a, jnp.zeros(n, k.dtype), 0.0, strict=strict)
    slope = factor.slope.astype(k.dtype)
    if causal is not False:
        zeta = _monotone_direction(factor.xi) * factor.xi.astype(k.dtype)
        return _prefix_sum(plan, profile, q, k, y, a, zeta, slope, strict=strict)
    order = jnp.argsort(factor.xi)
    zeta = factor.xi.astype(k.dtype)[order]
    ks, ys = k[order], y[order]
    qs = ks if q is k else q[order]
    before = _prefix_sum(plan, profile, qs, ks, ys, a, zeta, slope, strict=False)
    k_back = ks[::-1]
    q_back = k_back if q is k else qs[::-1]
    after = _prefix_sum(plan, profile, q_back, k_back, ys[::-1], a, -zeta[::-1], slope, strict=True)
    return jnp.zeros_like(y).at[order].set(before + after[::-1])


def _normalized_sum(kernel: Kernel, q, k, values, *, normalization, causal, tolerance, guard: bool):
    """``_kernel_sum`` of ``values`` normalised by ``φ'(1)/n`` ("usa") or by the same sum of ones
    ("sa"; with ``guard``, a row that sees nothing sums to zero); NaN where a query or key lies
    beyond ``STAGE_RADIUS`` (``_within_the_shell``)."""
    n, dv = values.shape
    degree = _check(kernel, q.shape[1], normalization, tolerance)
    plan = _Plan(_beta(kernel), degree, q.shape[1], q.dtype)
    y = values.astype(q.dtype)
    if normalization == "sa":
        with_ones = jnp.concatenate([y, jnp.ones((n, 1), q.dtype)], axis=1)
        summed = _kernel_sum(plan, kernel.factor, kernel.profile, q, k, with_ones, causal=causal)
        if guard:
            den = summed[:, dv:]
            rows = jnp.where(den > 0, summed[:, :dv] / jnp.where(den > 0, den, 1.0), 0.0)
            return _within_the_shell(rows, q, k)
        return _within_the_shell(summed[:, :dv] / summed[:, dv:], q, k)
    summed = _kernel_sum(plan, kernel.factor, kernel.profile, q, k, y, causal=causal)
    return _within_the_shell(summed * (kernel.profile.scale / n).astype(q.dtype), q, k)


def _within_the_shell(out: jax.Array, q: jax.Array, k: jax.Array) -> jax.Array:
    """``out``, or NaN everywhere if a query or a key lies beyond ``STAGE_RADIUS``: the error bound
    holds only inside it, so a Runge–Kutta stage that left it (a step far too large for the field)
    ends the run with the status ``nonfinite`` rather than with a field of unknown error. Inside,
    ``out`` is returned unchanged (a select: the same bits)."""
    radius_squared = jnp.maximum(jnp.max(jnp.sum(q * q, axis=1)), jnp.max(jnp.sum(k * k, axis=1)))
    shell = pf.SHELL * (1.0 + 64 * jnp.finfo(q.dtype).eps)  # a stage at 1.1 to round-off is inside
    return jnp.where(radius_squared <= shell, out, jnp.nan)


def expansion_sum(
    kernel: Kernel,
    u: jax.Array,
    values: jax.Array,
    *,
    normalization: str = "usa",
    causal: bool = False,
    tolerance: float = 1e-10,
) -> jax.Array:
    """``attention_sum(kernel, u, values, normalization=..., causal=...)`` to within ``tolerance``
    of its scale (``φ'(1) max|values|`` for "usa", ``max|values|`` for "sa"), in ``O(n R d)``."""
    options = dict(normalization=normalization, causal=causal, tolerance=tolerance)
    strict = causal == "strict"  # the first token sees nothing: its sum is zero
    return _normalized_sum(kernel, u, u, values, guard=strict, **options)


def expansion_energy(kernel: Kernel, x: jax.Array, *, tolerance: float = 1e-10) -> jax.Array:
    """``energy(kernel, x)`` to within ``tolerance · φ'(1)/(2β)`` (exp) or exactly (linear)."""
    u = kernel.gauge.apply(x)
    n = u.shape[0]
    if kernel.profile.kind == "linear":  # φ(s) = c s: E = (1/2n) Σ_i ⟨u_i, (c/n) Σ_j w_ij u_j⟩
        g = expansion_sum(kernel, u, u, tolerance=tolerance)
        return jnp.sum(u * g) / (2.0 * n)
    g = expansion_sum(kernel, u, jnp.ones((n, 1), u.dtype), tolerance=tolerance)
    return jnp.sum(g) / (2.0 * n * kernel.profile.beta.astype(u.dtype))


def _scaled(head, profile):
    """The head's expansion problem on unit-bounded vectors: queries and keys divided by
    ``|W_Q|₂`` and ``|W_K|₂`` (so ``|⟨q', k'⟩| <= 1`` for unit tokens) and the profile of
    ``β' = β M``, ``M = |W_Q|₂ |W_K|₂``: ``e^{β s} = e^{β' s'}``, the same kernel."""
    from attnflow.core.heads import head_norms
    from attnflow.core.kernel import Profile

    nq, nk = head_norms(head)
    beta = float(profile.beta) * nq * nk
    beta = np.asarray(beta, profile.beta.dtype)  # NumPy: concrete inside a traced program too
    scaled = Profile(kind=profile.kind, beta=beta, c=profile.c)
    return nq, nk, scaled


def check_qkv(head, profile, *, normalization: str, causal, tolerance: float) -> int:
    """Every validation of the expansion for one head (see :func:`check`); returns its rank."""
    _, _, scaled = _scaled(head, profile)
    kernel = Kernel(head.gauge, head.factor, scaled)
    return check(kernel, head.head_dim, normalization=normalization, causal=causal, tolerance=tolerance)


def expansion_qkv_sum(
    head, profile, q, k, values, *, normalization: str = "usa", causal=False, tolerance: float = 1e-10
) -> jax.Array:
    """``qkv_sum(head.factor, profile, q, k, values, ...)`` to within ``tolerance`` of its scale
    (``c e^{βM} max|values|`` for "usa", ``M = |W_Q|₂|W_K|₂`` the largest logit of unit tokens;
    ``max|values|`` for "sa"), in ``O(n R d_h)``: the expansion of :func:`expansion_sum` with two
    feature maps, for the rescaled problem of ``_scaled``."""
    nq, nk, scaled = _scaled(head, profile)
    qs, ks = q / jnp.asarray(nq, q.dtype), k / jnp.asarray(nk, k.dtype)
    options = dict(normalization=normalization, causal=causal, tolerance=tolerance)
    return _normalized_sum(Kernel(head.gauge, head.factor, scaled), qs, ks, values, guard=True, **options)
