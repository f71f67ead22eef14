"""The mean-field density on ``S^1 × labels``: ``∂_t f + ∂_θ(f ∂_θ U) = 0``.

The law of the tokens is ``μ_t(dθ, dξ) = f(t, θ, ξ) dθ ρ(dξ)``: one density in the angle per label,
each of mass 1. Labels never move, so ``ρ`` is a quadrature (nodes ``ξ_l``, weights ``ρ_l``,
:class:`LabelQuadrature`) and the state is ``f (L, M)``: the values of each label's density on the
uniform grid ``θ_j = 2π j / M`` (:class:`CircleDensity`). The potential is

    U(θ, ξ) = Σ_ζ ρ_ζ w(ξ, ζ) ∫ φ(cos(ψ_ξ(θ) − ψ_ζ(θ'))) f(θ', ζ) dθ',    ψ_ξ(θ) = s_ξ θ + α_ξ,

the angle ``ψ`` in the gauge frame: on the circle every gauge ``Q(ξ) ∈ O(2)`` is a rotation by
``α_ξ`` (``s_ξ = 1``; RoPE: ``α_ξ = ω ξ``) or a reflection (``s_ξ = −1``; Haar-random prompt gauges
draw both), :class:`CircleGauge`. The particles' field (``attnflow.numerics.dynamics``,
``usa``) is ``dθ_i/dt = ∂_θ U`` at ``(θ_i, ξ_i)`` for the empirical law: ``∂_θ φ(⟨Q(ξ)x, Q(ζ)y⟩) =
φ'(·) ⟨Q(ξ) e_θ, Q(ζ) y⟩``, the tangential part of the particle sum. The softmax ("sa") divides by
``Z(θ, ξ) = Σ_ζ ρ_ζ w ∫ φ'(cos(ψ − ψ')) f dθ'``: velocity ``∂_θ U / Z`` (``c`` cancels). The energy
``E = ½ Σ_ξ ρ_ξ ∫ U f dθ`` is the particles' ``(1/2n²) Σ_ij h_ij`` for the empirical law.

Scheme: **pseudo-spectral** (Fourier collocation on the grid), chosen over finite volumes because

- the potential is a convolution in ``θ`` per label pair: one FFT per label, a product by the
  kernel's Fourier coefficients (exact: ``e^{β(cos s − 1)} = Σ_k e^{−β} I_k(β) e^{iks}``, scipy's
  ``ive``; ``cos s`` for the linear profile) and a ``(L, L)`` product over the labels, which the
  gauge turns into phases ``e^{∓ikα}`` (and a complex conjugation for a reflection);
- the semi-discrete linearisation about the uniform law is exact mode by mode, so growth rates
  match ``σ_k`` to the time step's error only (a second-order finite volume misses ``σ_6`` by
  ``~(6h)²``), and smooth solutions converge faster than any power of ``1/M``;
- mass is the ``k = 0`` coefficient, and the divergence of the flux has none: each label's mass is
  conserved to round-off;
- with the derivative ``D̃ = √σ D`` (``D`` spectral, Nyquist mode dropped; ``σ_k = exp(−36
  (k/K)^p)``, ``K = M/2``, the exponential filter of order ``p = filter_order`` split between the
  velocity and the divergence), velocity ``V = D̃ U`` and ``∂_t f = −D̃(f V)``: ``D̃`` is
  skew-symmetric and the kernel operator symmetric, so the semi-discrete energy obeys
  ``dE/dt = Σ_ξ ρ_ξ (2π/M) Σ_j f V² ≥ 0`` whenever ``f ≥ 0`` on the grid (usa): the energy is
  non-decreasing up to the time step's error. The filter scales mode ``k`` by ``e^{−18 (k/K)^p}``:
  by ``1 − 3e−10`` at ``K/2`` and by ``1`` to round-off below ``K/3`` (``p = 36``).

The price is Gibbs: a slice that concentrates below a few grid cells (it does: conditional slices
become Diracs, the energy's maximisers being graph laws) rings and goes negative. :func:`resolution`
measures it (the share of the spectrum's energy in the top third of the modes; the negative mass),
and :func:`status_code` turns it into a status (``Status.under_resolved`` of
:mod:`attnflow.numerics.status`): a run then stops at its last resolved snapshot instead of
returning a plausible-looking wrong law.

The field is a pure map ``state → d state / dt`` on a pytree (:class:`CircleDensityField`), so the
time methods are the particles' own (``attnflow.numerics.integrators`` with ``retraction="none"``,
the identity) and the loop theirs too (``attnflow.numerics.density_solve.integrate``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from attnflow.core.factors import Factor, NoFactor, check_softmax_factor
from attnflow.core.gauges import check_orthogonal
from attnflow.core.host import to_device
from attnflow.core.kernel import Profile
from attnflow.core.pytree import pytree_dataclass
from attnflow.numerics.status import Status

__all__ = [
    "CircleDensity",
    "CircleDensityField",
    "CircleGauge",
    "LabelQuadrature",
    "circle_gauge",
    "circle_gauge_from_matrices",
    "grid_angles",
    "identity_circle_gauge",
    "make_circle_density",
    "make_circle_field",
    "position_labels",
    "prompt_labels",
    "resolution",
    "rope_circle_gauge",
    "safe_dt",
    "stable_dt",
    "status_code",
    "uniform_density",
]

NORMALIZATIONS = ("usa", "sa")
FILTER_STRENGTH = 36.0  # σ at the Nyquist mode is e^{-36} ≈ 2e-16: the top mode is removed to round-off
MIN_GRID = 8
MODE_CUT = 1e-20  # kernel coefficients below this share of its mean are dropped (below round-off)
KERNEL_TAIL = 1e-12  # the kernel's coefficients past grid/3 (touched by the filter) relative to its mean
TAIL_TOL = 1e-8  # default share of spectral energy in the top third above which a run is under-resolved
NEGATIVE_TOL = 1e-8  # default: negative mass (per label, of mass 1) above which a run is under-resolved


# ---------------------------------------------------------------------------------------------
# Labels and gauges


@pytree_dataclass(data_fields=["nodes", "weights"], meta_fields=[])
@dataclasses.dataclass(frozen=True, eq=False)
class LabelQuadrature:
    """The label law ``ρ ≈ Σ_l weights_l δ_{nodes_l}`` (weights positive, summing to 1)."""

    nodes: jax.Array  # (L,)
    weights: jax.Array  # (L,)

    @property
    def size(self) -> int:
        return self.nodes.shape[0]


def _check_labels(nodes, weights) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.asarray(nodes, dtype=np.float64).reshape(-1)
    weights = np.asarray(weights, dtype=np.float64).reshape(-1)
    if nodes.size == 0 or nodes.shape != weights.shape:
        raise ValueError(
            f"density labels: `nodes` and `weights` must be non-empty of one length; got {nodes.size} and "
            f"{weights.size}."
        )
    if not (np.all(np.isfinite(nodes)) and np.all(np.isfinite(weights))):
        raise ValueError("density labels: `nodes` and `weights` must be finite; got non-finite entries.")
    if np.any(weights <= 0) or abs(weights.sum() - 1.0) > 1e-12:
        raise ValueError(
            f"density labels: `weights` must be positive and sum to 1; got min {weights.min()!r}, "
            f"sum {weights.sum()!r}."
        )
    return nodes, weights


def make_labels(nodes, weights, *, dtype=jnp.float64) -> LabelQuadrature:
    """Given label nodes and weights (a label file, a quadrature of one's own)."""
    nodes, weights = _check_labels(nodes, weights)
    return LabelQuadrature(nodes=to_device(nodes, dtype), weights=to_device(weights, dtype))


def position_labels(count: int, *, rule: str = "midpoint", dtype=jnp.float64) -> LabelQuadrature:
    """Positions uniform on ``[0, 1)``: ``count`` nodes of the midpoint rule ``(l + ½)/count``
    (spectral for labels entering periodically: RoPE, the Toeplitz cosine with ``ω ∈ 2πZ``), or of
    Gauss–Legendre on ``[0, 1]`` (``rule = "gauss"``: for a distance bias ``|ξ − ζ|``, whose kink
    limits either rule to low order)."""
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
        raise ValueError(f"density labels: `count` must be an integer >= 1; got {count!r}.")
    if rule == "midpoint":
        nodes, weights = (np.arange(count) + 0.5) / count, np.full(count, 1.0 / count)
    elif rule == "gauss":
        x, w = np.polynomial.legendre.leggauss(count)
        nodes, weights = 0.5 * (x + 1.0), 0.5 * w
    else:
        raise ValueError(f"density labels: `rule` must be 'midpoint' or 'gauss'; got {rule!r}.")
    return make_labels(nodes, weights, dtype=dtype)


def prompt_labels(weights, *, dtype=jnp.float64) -> LabelQuadrature:
    """Prompt ids ``0..K−1`` with masses ``weights`` (the label law is already discrete)."""
    weights = np.asarray(weights, dtype=np.float64).reshape(-1)
    return make_labels(np.arange(weights.size, dtype=np.float64), weights, dtype=dtype)


@pytree_dataclass(data_fields=["angle", "orientation"], meta_fields=[])
@dataclasses.dataclass(frozen=True, eq=False)
class CircleGauge:
    """``Q(ξ_l) ∈ O(2)`` per label node: the gauge-frame angle is ``ψ = orientation_l · θ + angle_l``
    (orientation 1: a rotation by ``angle``; −1: the reflection ``θ ↦ angle − θ``)."""

    angle: jax.Array  # (L,)
    orientation: jax.Array  # (L,) of ±1


def identity_circle_gauge(count: int, *, dtype=jnp.float64) -> CircleGauge:
    return CircleGauge(angle=to_device(np.zeros(count), dtype), orientation=to_device(np.ones(count), dtype))


def rope_circle_gauge(labels: LabelQuadrature, omega: float, *, dtype=jnp.float64) -> CircleGauge:
    """RoPE in d = 2: ``α(ξ) = ω ξ`` (``attnflow.core.gauges.make_rope`` with one frequency ``ω``)."""
    angle = float(omega) * np.asarray(labels.nodes, dtype=np.float64)
    return CircleGauge(angle=to_device(angle, dtype), orientation=to_device(np.ones(angle.size), dtype))


def circle_gauge(gauge, *, dtype=jnp.float64) -> CircleGauge:
    """The :class:`CircleGauge` of a core gauge built on the ``L`` label nodes in ``d = 2``
    (``attnflow.core.gauges``: ``IdentityGauge(n=L, d=2)``; ``make_rope(nodes, 2, [ω])``, whose one
    pair turns by ``ω ξ``; a ``DenseGauge`` of ``(L, 2, 2)`` matrices, as ``make_prompt_gauge``
    makes): the same gauge, so a configuration builds it with the particles' own builders."""
    if gauge.d != 2:
        raise ValueError(f"density gauge: the circle needs a gauge in d = 2; got d = {gauge.d}.")
    if gauge.is_identity:
        return identity_circle_gauge(gauge.n, dtype=dtype)
    if hasattr(gauge, "angles"):  # RoPE: at most one pair in d = 2
        angle = np.asarray(gauge.angles, dtype=np.float64).reshape(gauge.n, -1).sum(axis=1)
        return CircleGauge(angle=to_device(angle, dtype), orientation=to_device(np.ones(gauge.n), dtype))
    return circle_gauge_from_matrices(np.asarray(gauge.matrices()), dtype=dtype)


def circle_gauge_from_matrices(q, *, dtype=jnp.float64) -> CircleGauge:
    """Per-label orthogonal ``q (L, 2, 2)`` (prompt gauges: ``haar_orthogonal(seed, K, 2)``): a rotation
    ``[[cos a, −sin a], [sin a, cos a]]`` or a reflection ``[[cos a, sin a], [sin a, −cos a]]``; both
    have ``a = atan2(q[1, 0], q[0, 0])``, told apart by the determinant."""
    q = check_orthogonal(q, name="density gauge")
    if q.shape[1] != 2:
        raise ValueError(f"density gauge: matrices must be 2 × 2 on the circle; got shape {q.shape}.")
    angle = np.arctan2(q[:, 1, 0], q[:, 0, 0])
    orientation = np.sign(np.linalg.det(q))
    return CircleGauge(angle=to_device(angle, dtype), orientation=to_device(orientation, dtype))


# ---------------------------------------------------------------------------------------------
# The state and the field


@pytree_dataclass(data_fields=["f"], meta_fields=[])
@dataclasses.dataclass(frozen=True, eq=False)
class CircleDensity:
    """``f (L, M)``: label ``l``'s density (w.r.t. ``dθ``, mass 1) at ``θ_j = 2π j / M``."""

    f: jax.Array


def grid_angles(grid: int) -> np.ndarray:
    """``θ_j = 2π j / grid``, ``j = 0..grid−1``."""
    return 2.0 * np.pi * np.arange(grid) / grid


def make_circle_density(values, *, grid: int, labels: int, dtype=jnp.float64) -> CircleDensity:
    """An initial state from grid values: ``(labels, grid)`` (one row per label node) or ``(grid,)`` /
    ``(1, grid)`` (the same law for every label); finite and non-negative, each row rescaled to mass 1
    (``∫ f dθ`` by the trapezoid rule, exact for the interpolant)."""
    where = "density"
    f = np.asarray(values, dtype=np.float64)
    if f.ndim == 1:
        f = f[None, :]
    if f.ndim != 2 or f.shape[1] != grid or f.shape[0] not in (1, labels):
        raise ValueError(
            f"{where}: the initial density must have shape ({labels}, {grid}) (one row per label node) or "
            f"({grid},); got {np.shape(values)}."
        )
    if not np.all(np.isfinite(f)):
        raise ValueError(f"{where}: the initial density must be finite; got non-finite values.")
    if f.min() < 0.0:
        row, column = np.unravel_index(int(np.argmin(f)), f.shape)
        raise ValueError(
            f"{where}: the initial density must be non-negative; got {f.min():.3g} at label row {row}, angle "
            f"index {column}."
        )
    mass = 2.0 * np.pi * f.mean(axis=1, keepdims=True)
    if np.any(mass <= 0.0):
        raise ValueError(
            f"{where}: each label's initial density must have positive mass; got a row of zeros."
        )
    f = np.broadcast_to(f / mass, (labels, grid))
    return CircleDensity(f=to_device(f, dtype))


def uniform_density(grid: int, labels: int, *, dtype=jnp.float64) -> CircleDensity:
    return CircleDensity(f=jnp.full((labels, grid), 1.0 / (2.0 * np.pi), dtype))


def kernel_grid(beta: float) -> int:
    """The smallest grid whose modes past ``grid/3`` hold less than ``KERNEL_TAIL`` of the kernel
    ``e^{β(cos s − 1)}`` (relative to its mean): the filter then never touches the kernel."""
    top = 0
    while scipy.special.ive(top, beta) >= KERNEL_TAIL * scipy.special.ive(0, beta):
        top += 1
    return max(MIN_GRID, 3 * top)


def kept_modes(profile: Profile, grid: int) -> int:
    """The kernel's modes the field keeps: up to the first below ``MODE_CUT`` of its mean (then
    round-off), rounded up to a multiple of 8 (β moving a little does not change the program),
    at most ``grid // 2 + 1``. The label product then costs ``O(L² P)``, not ``O(L² M)``."""
    top = grid // 2 + 1
    if profile.kind == "exp":
        beta = float(profile.beta)
        needed = 1
        while needed < top and scipy.special.ive(needed, beta) >= MODE_CUT * scipy.special.ive(0, beta):
            needed += 1
    else:
        needed = 2  # cos s and the constant: modes 0 and 1
    return min(top, -(-needed // 8) * 8)


def _kernel_coefficients(profile: Profile, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """Fourier coefficients ``a_k`` (``Σ_k a_k e^{iks}``, ``k = 0..modes−1``) of ``φ(cos s)/scale``
    and ``φ'(cos s)/scale``, ``scale = φ'(1)`` (bounded by 1/β and 1: no overflow)."""
    k = np.arange(modes)
    beta = float(profile.beta)
    if profile.kind == "exp":
        dphi = scipy.special.ive(k, beta)  # e^{-β} I_k(β)
        return dphi / beta, dphi
    phi = np.where(k == 1, 0.5, 0.0)  # cos s = (e^{is} + e^{-is}) / 2
    return phi, np.where(k == 0, 1.0, 0.0)


@pytree_dataclass(
    data_fields=["labels", "gauge", "w", "phi_hat", "dphi_hat", "scale"],
    meta_fields=["grid", "normalization", "filter_order"],
)
@dataclasses.dataclass(frozen=True, eq=False)
class CircleDensityField:
    """``state ↦ ∂_t state`` of the continuity equation (build it with :func:`make_circle_field`).

    Pure and jit-friendly: every number is an array (a new ``β`` is a new field of the same shapes,
    not a recompilation); ``grid``, ``normalization`` and ``filter_order`` are static."""

    labels: LabelQuadrature
    gauge: CircleGauge
    w: jax.Array  # (L, L): the factor on the label nodes
    phi_hat: jax.Array  # (P,): coefficients of φ(cos s)/scale, k = 0..P−1 (P = kept_modes)
    dphi_hat: jax.Array  # (P,): coefficients of φ'(cos s)/scale
    scale: jax.Array  # φ'(1)
    grid: int
    normalization: str
    filter_order: int

    # -- spectral pieces ----------------------------------------------------------------------
    def _modes(self) -> jax.Array:
        return jnp.arange(self.grid // 2 + 1)

    def _forward(self, values: jax.Array) -> jax.Array:
        """Coefficients ``c_k`` of the trigonometric interpolant, ``k = 0..M/2`` (``rfft / M``)."""
        return jnp.fft.rfft(values, axis=-1) / self.grid

    def _inverse(self, coefficients: jax.Array) -> jax.Array:
        return jnp.fft.irfft(coefficients, n=self.grid, axis=-1) * self.grid

    def derivative_multiplier(self) -> jax.Array:
        """``i k √σ_k``, the Nyquist mode dropped (an odd derivative has no real Nyquist part)."""
        k = self._modes()
        eta = k / (self.grid // 2)
        half_filter = jnp.exp(-0.5 * FILTER_STRENGTH * eta**self.filter_order)
        multiplier = 1j * k * half_filter
        return jnp.where((k == self.grid // 2) & (self.grid % 2 == 0), 0.0, multiplier)

    def _conjugate_where_reflected(self, z: jax.Array) -> jax.Array:
        return jnp.where(self.gauge.orientation[:, None] > 0, z, jnp.conj(z))

    def _convolve(self, coefficients: jax.Array, kernel_hat: jax.Array) -> jax.Array:
        """Coefficients (in θ, per label ξ) of ``Σ_ζ ρ_ζ w(ξ,ζ) ∫ k(ψ_ξ(θ) − ψ_ζ(θ')) f(θ', ζ) dθ'``.

        Only the kernel's ``P = len(kernel_hat)`` first modes are non-zero (past them its coefficients
        are below round-off, :func:`kept_modes`): the gauge phases and the ``(L, L)`` label product act
        on those, as one real product on the stacked real and imaginary parts."""
        kept = kernel_hat.shape[0]
        phase = jnp.exp(1j * jnp.arange(kept)[None, :] * self.gauge.angle[:, None])  # e^{ikα_l}
        frame = jnp.conj(phase) * self._conjugate_where_reflected(coefficients[:, :kept])  # ψ frame
        mix = (self.w * self.labels.weights[None, :]).astype(frame.real.dtype)
        parts = mix @ jnp.concatenate([frame.real, frame.imag], axis=1)
        mixed = (2.0 * np.pi * kernel_hat[None, :]) * (parts[:, :kept] + 1j * parts[:, kept:])
        back = self._conjugate_where_reflected(phase * mixed)
        return jnp.pad(back, ((0, 0), (0, self.grid // 2 + 1 - kept)))

    # -- the quantities -------------------------------------------------------------------------
    def potential(self, state: CircleDensity) -> jax.Array:
        """``U (L, M)`` on the grid (usa scale: ``φ`` itself)."""
        return self.scale * self._inverse(self._convolve(self._forward(state.f), self.phi_hat))

    def velocity(self, state: CircleDensity) -> jax.Array:
        """``V (L, M)`` on the grid: ``D̃U`` (usa) or ``D̃U / Z`` (sa)."""
        coefficients = self._forward(state.f)
        dU = self._inverse(self.derivative_multiplier() * self._convolve(coefficients, self.phi_hat))
        if self.normalization == "usa":
            return self.scale * dU
        return dU / self._inverse(self._convolve(coefficients, self.dphi_hat))

    def __call__(self, state: CircleDensity) -> CircleDensity:
        """``∂_t f = −D̃(f V)``."""
        flux = state.f * self.velocity(state)
        return CircleDensity(f=-self._inverse(self.derivative_multiplier() * self._forward(flux)))

    def mass(self, state: CircleDensity) -> jax.Array:
        """Each label's mass ``∫ f dθ`` (L,) (the trapezoid rule: exact for the interpolant)."""
        return 2.0 * np.pi * jnp.mean(state.f, axis=-1)

    def energy(self, state: CircleDensity) -> jax.Array:
        """``E = ½ Σ_ξ ρ_ξ ∫ U f dθ`` (the particles' ``(1/2n²) Σ_ij h_ij`` for their law)."""
        per_label = 2.0 * np.pi * jnp.mean(self.potential(state) * state.f, axis=-1)
        return 0.5 * jnp.sum(self.labels.weights * per_label)

    def marginal(self, state: CircleDensity) -> jax.Array:
        """The content law's density ``Σ_ξ ρ_ξ f(·, ξ)`` (M,)."""
        return self.labels.weights @ state.f


def make_circle_field(
    profile: Profile,
    *,
    grid: int,
    labels: LabelQuadrature,
    gauge: CircleGauge | None = None,
    factor: Factor | None = None,
    normalization: str = "usa",
    filter_order: int = 36,
) -> CircleDensityField:
    """The density field on ``S^1 × labels`` for ``profile`` (``attnflow.core.kernel.make_profile``:
    exp or linear, plain or rescaled time scale), on a uniform grid of ``grid`` angles.

    ``gauge``: :class:`CircleGauge` on the label nodes (default: none). ``factor``: a core factor on
    the ``L`` label nodes (``NoFactor(n=L)``, ``DistanceBias(xi=nodes, slope)``,
    ``ToeplitzCos(xi=nodes, omega)``, a ``MatrixFactor``); its dense ``(L, L)`` matrix is used.
    ``normalization``: "usa" or "sa" (softmax: ``w ≥ 0``). The grid must hold the kernel: the
    coefficients of ``e^{β(cos s − 1)}`` past ``M/3`` must be below ``KERNEL_TAIL`` of the first
    (:func:`kernel_grid`; else the filter cuts the kernel itself)."""
    where = "density"
    if isinstance(grid, bool) or not isinstance(grid, int | np.integer) or grid < MIN_GRID:
        raise ValueError(f"{where}: `grid` must be an integer >= {MIN_GRID}; got {grid!r}.")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{where}: `normalization` must be one of {NORMALIZATIONS}; got {normalization!r}.")
    if isinstance(filter_order, bool) or not isinstance(filter_order, int) or filter_order < 2:
        raise ValueError(f"{where}: `filter_order` must be an integer >= 2; got {filter_order!r}.")
    count = labels.size
    gauge = identity_circle_gauge(count) if gauge is None else gauge
    if gauge.angle.shape != (count,) or gauge.orientation.shape != (count,):
        raise ValueError(
            f"{where}: `gauge` must hold one angle per label node ({count}); got {gauge.angle.shape}."
        )
    factor = NoFactor(n=count) if factor is None else factor
    if factor.n != count:
        raise ValueError(
            f"{where}: `factor` must be built on the {count} label nodes; got a factor over {factor.n} "
            "labels."
        )
    check_softmax_factor(factor, normalization, where=where)
    phi_hat, dphi_hat = _kernel_coefficients(profile, kept_modes(profile, grid))
    if profile.kind == "exp":
        needed = kernel_grid(float(profile.beta))
        if grid < needed:
            raise ValueError(
                f"{where}: `grid` must resolve the kernel at beta = {float(profile.beta):g} (its Fourier "
                f"coefficients past grid/3 below {KERNEL_TAIL:g} of the first); got {grid}: use grid >= "
                f"{needed}."
            )
    w = jnp.broadcast_to(factor.dense(), (count, count)).astype(jnp.float64)
    dtype = labels.weights.dtype
    return CircleDensityField(
        labels=labels,
        gauge=gauge,
        w=w.astype(dtype),
        phi_hat=to_device(phi_hat, dtype),
        dphi_hat=to_device(dphi_hat, dtype),
        scale=to_device(float(profile.scale), dtype),
        grid=int(grid),
        normalization=normalization,
        filter_order=int(filter_order),
    )


# ---------------------------------------------------------------------------------------------
# Resolution, status, step size


def resolution(field: CircleDensityField, state: CircleDensity) -> tuple[jax.Array, jax.Array]:
    """``(tail, negative)``: the largest over labels of the share of spectral energy
    ``Σ |c_k|²`` held by the modes ``k > M/3`` (the mean included in the total), and the largest
    negative mass ``∫ max(−f, 0) dθ`` (of a label mass 1). A resolved smooth law has both at
    round-off; a slice concentrating below a few cells rings (Gibbs) and raises both."""
    c = field._forward(state.f)
    k = field._modes()
    weight = jnp.where((k == 0) | ((k == field.grid // 2) & (field.grid % 2 == 0)), 1.0, 2.0)
    power = weight * jnp.abs(c) ** 2
    tail = jnp.sum(jnp.where(k > field.grid // 3, power, 0.0), axis=-1) / jnp.sum(power, axis=-1)
    negative = 2.0 * np.pi * jnp.mean(jnp.maximum(-state.f, 0.0), axis=-1)
    return jnp.max(tail), jnp.max(negative)


def status_code(
    field: CircleDensityField,
    state: CircleDensity,
    *,
    tail_tol: float = TAIL_TOL,
    negative_tol: float = NEGATIVE_TOL,
) -> jax.Array:
    """The :class:`attnflow.numerics.status.Status` code of ``state`` (an int array, compiled)."""
    tail, negative = resolution(field, state)
    finite = jnp.all(jnp.isfinite(state.f))
    resolved = (tail <= tail_tol) & (negative <= negative_tol)
    return jnp.where(
        ~finite,
        Status.nonfinite.code,
        jnp.where(resolved, Status.ok.code, Status.under_resolved.code),
    )


def stable_dt(field: CircleDensityField, state: CircleDensity, *, courant: float = 1.0) -> jax.Array:
    """A step for explicit RK4 on ``state``: ``courant · 2 / (max|V| · M/2 + max|∂_θ V|)``.

    The advection's spectral eigenvalues are ``i k V`` up to ``k = M/2`` and the compression adds
    ``∂_θ V``; RK4 is stable on the imaginary axis up to ``2√2``, so ``courant = 1`` leaves a
    margin (the velocity changes along a run: take it from the most concentrated state expected)."""
    v = field.velocity(state)
    dv = field._inverse(field.derivative_multiplier() * field._forward(v))
    rate = jnp.max(jnp.abs(v)) * (field.grid // 2) + jnp.max(jnp.abs(dv))
    return courant * 2.0 / rate


def safe_dt(field: CircleDensityField, *, courant: float = 1.0) -> float:
    """A step for explicit RK4 that is stable for every law (a host float, from the field's numbers):
    :func:`stable_dt` with the law-independent bounds ``|V| ≤ scale · max|k'| · max_ξ Σ_ζ ρ_ζ |w|`` and
    ``|∂_θ V| ≤ scale · max|k''| · (the same)`` (``k(s) = φ(cos s)/scale``: a slice of mass 1 moves
    no faster than a Dirac's pull), or ``|V| ≤ 1``, ``|∂_θ V| ≤ 1 + β`` for sa (a softmax average of
    ``sin``). Only the resolution limits it further: a law concentrating below the grid is stopped
    by its status first."""
    s = np.linspace(0.0, np.pi, 4097)
    a = np.asarray(field.phi_hat, dtype=np.float64)
    k = np.arange(1, a.size)[:, None]
    first = np.max(np.abs(np.sum(2.0 * a[1:, None] * k * np.sin(k * s), axis=0)))
    second = np.max(np.abs(np.sum(2.0 * a[1:, None] * k**2 * np.cos(k * s), axis=0)))
    if field.normalization == "usa":
        reach = float(np.max(np.abs(np.asarray(field.w)) @ np.asarray(field.labels.weights)))
        v, dv = float(field.scale) * first * reach, float(field.scale) * second * reach
    else:
        beta = float(field.dphi_hat[0]) / a[0] if a[0] > 0 else 0.0  # exp: dphi_hat = β phi_hat
        v, dv = 1.0, 1.0 + beta
    return courant * 2.0 / (v * (field.grid // 2) + dv)
