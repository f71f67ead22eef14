"""The mean-field density on ``S^2 × labels``, in spherical harmonics: ``∂_t f + div(f ∇U) = 0``.

The law is ``μ_t(dx, dξ) = f(t, x, ξ) dx ρ(dξ)`` (``dx`` the area on ``S^2``, each slice of mass 1);
the labels are a quadrature (``attnflow.numerics.density_circle.LabelQuadrature``). The state is the
harmonic coefficients ``a (L, lmax+1, lmax+1)`` of each slice (``a[l, m]``, ``m ≥ 0``, zero for
``m > l``; the real law has ``a_{l,−m} = (−1)^m conj(a_{lm})``), :class:`SphereDensity`.

**Gauge frame.** A gauge ``Q(ξ)`` enters only as ``⟨Q(ξ)x, Q(ζ)y⟩``: the law of ``u = Q(ξ)x``
obeys the same equation with ``Q = I`` (the conjugacy of the particles, which holds for any factor
with the gradient value). The solver therefore evolves the gauge-frame slices ``g_ξ = Q(ξ)_# f_ξ``:
RoPE, prompt and any other gauge is a rotation of the initial law and of the output, never inside
the field. The potential is then a zonal convolution per label pair,

    U(x, ξ) = Σ_ζ ρ_ζ w(ξ, ζ) ∫ φ(⟨x, y⟩) g(y, ζ) dy,   U_lm = scale · λ_l Σ_ζ ρ_ζ w(ξ,ζ) a_lm(ζ),

with the Funk–Hecke eigenvalues ``λ_l = 2π ∫_{−1}^{1} k(t) P_l(t) dt`` of ``k = φ/scale``
(exp: ``4π sqrt(π/2β) e^{−β} I_{l+½}(β) / β``; linear: ``4π/3`` at ``l = 1``).

**Derivatives without derivatives.** With the angular momentum ``L = −i x × ∇`` (``L_z Y_lm = m Y_lm``,
``L_± Y_lm = sqrt((l ∓ m)(l ± m + 1)) Y_{l,m±1}``, Condon–Shortley harmonics): the tangential gradient
is ``∇U = −x × (iLU)`` (three syntheses of ``iL_c U``), and the divergence of a tangent field ``F`` is
``div F = i Σ_c L_c (x × F)_c`` (three analyses). Both are exact on the harmonics.

**Transform.** Gauss–Legendre in ``cos θ`` and a uniform grid in ``φ``, with the orthonormal
associated Legendre functions tabulated once (``O(lmax³)`` numbers); analysis and synthesis are an FFT
in ``φ`` and, per ``m``, two products over the paired nodes ``±μ`` (even and odd ``l + m``). The
potential holds only the kernel's ``K`` degrees
(:func:`kept_degrees`: 24 at β = 1, 32 at β = 5), so ``∇U`` has degree ``≤ K`` and the flux
``x × (f ∇U)`` degree ``≤ lmax + K + 1``; the grid ``nlat ≥ (2 lmax + K + 2)/2`` (even),
``nlon = 2 lmax + K + 2`` integrates its products with ``Y_lm`` (``l ≤ lmax``) exactly (no aliasing,
no filter; usa): the scheme is the Galerkin truncation, mass (``a_00``) is conserved exactly
(``L`` preserves the degree: no ``l = 0`` output) and ``dE/dt = Σ ρ ∫ f |∇U|² ≥ 0`` where
``f ≥ 0`` on the grid. Resolution: the share of spectral power in ``l > 2 lmax/3`` and the negative mass
(:func:`resolution`), as on the circle.

Linear growth about the uniform law ``1/4π`` (w = 1, usa): ``∂_t g = −(1/4π) ΔU_g`` and ``ΔY_l = −l(l+1)Y_l``,
so ``σ_l = l(l+1) scale λ_l / 4π = c l(l+1) i_l(β)/β`` (``i_l`` the modified spherical Bessel function;
sa: divided by ``i_0(β)``; linear: ``σ_1 = 2c/3``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from attnflow.core.factors import Factor, NoFactor, check_softmax_factor
from attnflow.core.host import to_device
from attnflow.core.kernel import Profile
from attnflow.core.pytree import pytree_dataclass
from attnflow.numerics.density_circle import (
    KERNEL_TAIL,
    NEGATIVE_TOL,
    NORMALIZATIONS,
    TAIL_TOL,
    LabelQuadrature,
)
from attnflow.numerics.status import Status

__all__ = [
    "SphereDensity",
    "SphereDensityField",
    "funk_hecke",
    "growth_rates",
    "make_sphere_field",
    "pad_degrees",
    "gauge_frame_points",
    "grid_shape",
    "kept_degrees",
    "kernel_lmax",
    "resolution",
    "safe_dt",
    "status_code",
]

MIN_LMAX = 2
MODE_CUT = 1e-20  # Funk–Hecke eigenvalues below this share of the largest are dropped (round-off)


def funk_hecke(profile: Profile, lmax: int) -> np.ndarray:
    """``λ_l = 2π ∫_{−1}^{1} φ(t)/scale · P_l(t) dt``, ``l = 0..lmax`` (``scale = φ'(1)``)."""
    deg = np.arange(lmax + 1)
    if profile.kind == "exp":
        beta = float(profile.beta)
        # ∫ e^{β(t−1)} P_l(t) dt = 2 e^{−β} i_l(β), i_l(β) = sqrt(π/2β) I_{l+½}(β)
        return 2.0 * np.pi * 2.0 * np.sqrt(np.pi / (2.0 * beta)) * scipy.special.ive(deg + 0.5, beta) / beta
    return np.where(deg == 1, 4.0 * np.pi / 3.0, 0.0)


def growth_rates(profile: Profile, lmax: int, *, normalization: str = "usa") -> np.ndarray:
    """``σ_l`` about the uniform law (w = 1): ``l(l+1) scale λ_l / 4π`` (usa), and for sa divided by
    ``scale λ'_0 / 4π``, ``λ'_0 = 2π ∫ φ'(t)/scale dt`` (exp: ``c l(l+1) i_l(β)/β``, sa ``/ i_0(β)``)."""
    deg = np.arange(lmax + 1)
    rates = deg * (deg + 1) * funk_hecke(profile, lmax) / (4.0 * np.pi)
    if normalization == "usa":
        return float(profile.scale) * rates
    beta = float(profile.beta)
    mean_dphi = (1.0 - np.exp(-2.0 * beta)) / (2.0 * beta) if profile.kind == "exp" else 1.0  # ∫φ'/scale /2
    return rates / mean_dphi


@pytree_dataclass(data_fields=["a"], meta_fields=[])
@dataclasses.dataclass(frozen=True, eq=False)
class SphereDensity:
    """``a (L, lmax+1, lmax+1)`` complex: ``a[ξ, l, m]`` (``m ≥ 0``) of each gauge-frame slice."""

    a: jax.Array


@pytree_dataclass(
    data_fields=["labels", "w", "lam", "dlam", "scale", "legendre", "even", "odd", "weights", "mu", "points"],
    meta_fields=["lmax", "nlon", "normalization"],
)
@dataclasses.dataclass(frozen=True, eq=False)
class SphereDensityField:
    """``state ↦ ∂_t state`` (build it with :func:`make_sphere_field`)."""

    labels: LabelQuadrature
    w: jax.Array  # (L, L)
    lam: jax.Array  # (lmax+1,) Funk–Hecke of φ/scale
    dlam: jax.Array  # (lmax+1,) Funk–Hecke of φ'/scale (sa)
    scale: jax.Array
    legendre: jax.Array  # (lmax+1 [m], lmax+1 [l], nlat): orthonormal P̄_lm(μ_j), Y_lm = P̄_lm e^{imφ}
    even: jax.Array  # (lmax+1 [m], R, nlat/2): P̄_{m+2r, m} at the nodes μ < 0 (0 past lmax)
    odd: jax.Array  # (lmax+1 [m], R, nlat/2): P̄_{m+2r+1, m}
    weights: jax.Array  # (nlat,) Gauss–Legendre weights in μ = cos θ
    mu: jax.Array  # (nlat,) nodes
    points: jax.Array  # (3, nlat, nlon): the grid's Cartesian coordinates (made once)
    lmax: int
    nlon: int
    normalization: str

    # -- transforms -----------------------------------------------------------------------------
    def synthesis(self, a: jax.Array) -> jax.Array:
        """Grid values ``(..., nlat, nlon)`` of the real function with coefficients ``a (..., K, K)``
        (degrees and orders below ``K ≤ lmax + 1``: a potential needs only the kernel's degrees)."""
        kept = a.shape[-1]
        if kept == self.lmax + 1:
            c = self._full_synthesis(a)
        else:
            c = self._legendre_product(jnp.swapaxes(self.legendre[:kept, :kept], 1, 2), a)
        c = jnp.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, self.nlon // 2 + 1 - kept)])
        return jnp.fft.irfft(c, n=self.nlon, axis=-1) * self.nlon

    def analysis(self, values: jax.Array) -> jax.Array:
        """Coefficients ``(..., l, m)`` of grid values (exact for degree ``≤ 2 nlat − 1 − lmax`` in μ).

        The nodes come in pairs ``±μ`` and ``P̄_lm(−μ) = (−1)^{l+m} P̄_lm(μ)``: the sums and the
        differences of the paired rows meet the even and the odd degrees of each order, two products
        of a quarter of the size each (half the work of one product over every node and degree)."""
        c = jnp.fft.rfft(values, axis=-1)[..., : self.lmax + 1] * (2.0 * np.pi / self.nlon)
        c = c * self.weights[:, None]
        half = self.mu.size // 2
        north, south = c[..., :half, :], jnp.flip(c, axis=-2)[..., :half, :]
        even = self._legendre_product(self.even, north + south)  # (..., R, m): degrees m, m+2, ...
        odd = self._legendre_product(self.odd, north - south)  # degrees m+1, m+3, ...
        combined = jnp.concatenate([even, odd, jnp.zeros_like(even[..., :1, :])], axis=-2)
        index = jnp.asarray(self._parity_index())
        return jnp.take_along_axis(combined, jnp.broadcast_to(index, (*c.shape[:-2], *index.shape)), axis=-2)

    def _parity_index(self) -> np.ndarray:
        """``(lmax+1, lmax+1)``: where ``a[l, m]`` sits in ``[even (R rows), odd (R rows), zero]``."""
        size = self.lmax + 1
        rows = self.even.shape[1]
        degree, order = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        gap = degree - order
        return np.where(gap < 0, 2 * rows, np.where(gap % 2 == 0, gap // 2, rows + gap // 2))

    def _full_synthesis(self, a: jax.Array) -> jax.Array:
        """``Σ_l a_lm P̄_lm(μ_j)`` at every node ``(..., nlat, m)``, by the parity of ``l + m``."""
        size, rows = self.lmax + 1, self.even.shape[1]
        padded = jnp.concatenate([a, jnp.zeros_like(a[..., :1, :])], axis=-2)  # row lmax+1: zeros
        m = np.arange(size)[None, :]
        r = np.arange(rows)[:, None]
        lead = (*a.shape[:-2], rows, size)
        even_rows = jnp.asarray(np.minimum(m + 2 * r, size))
        odd_rows = jnp.asarray(np.minimum(m + 2 * r + 1, size))
        even = jnp.take_along_axis(padded, jnp.broadcast_to(even_rows, lead), axis=-2)
        odd = jnp.take_along_axis(padded, jnp.broadcast_to(odd_rows, lead), axis=-2)
        c_even = self._legendre_product(jnp.swapaxes(self.even, 1, 2), even)  # (..., half, m)
        c_odd = self._legendre_product(jnp.swapaxes(self.odd, 1, 2), odd)
        return jnp.concatenate([c_even + c_odd, jnp.flip(c_even - c_odd, axis=-2)], axis=-2)

    @staticmethod
    def _legendre_product(table: jax.Array, c: jax.Array) -> jax.Array:
        """``Σ_k table[m, out, k] c[..., k, m]``: one batched real matrix product over ``m``, on the
        real and imaginary parts and every leading index at once (a complex einsum would promote
        the table: four times the work, and XLA's CPU layout for it is slower still)."""
        lead = c.shape[:-2]
        size = 2 * int(np.prod(lead, dtype=int))
        stacked = jnp.stack([c.real, c.imag])  # (2, ..., k, m)
        columns = jnp.moveaxis(stacked, -1, 0).reshape(c.shape[-1], size, c.shape[-2])
        product = jnp.matmul(table, jnp.swapaxes(columns, 1, 2))  # (m, out, 2·lead)
        product = jnp.moveaxis(product.reshape(c.shape[-1], table.shape[1], 2, *lead), (0, 1, 2), (-1, -2, 0))
        return product[0] + 1j * product[1]

    def grid_points(self) -> jax.Array:
        """``x (3, nlat, nlon)``: the grid's Cartesian coordinates, components first."""
        return self.points

    # -- angular momentum -----------------------------------------------------------------------
    def _ladder(self, a: jax.Array) -> jax.Array:
        """``i L a`` as ``(3, ..., l, m)`` (components x, y, z) for the coefficients ``a`` of a real
        function (``m ≥ 0`` stored; ``a_{l,−1} = −conj(a_{l,1})``). ``x × ∇u = i L u`` is real."""
        deg = jnp.arange(a.shape[-2])[:, None].astype(a.real.dtype)
        m = jnp.arange(a.shape[-1])[None, :].astype(a.real.dtype)
        below = jnp.concatenate([-jnp.conj(a[..., 1:2]), a[..., :-1]], axis=-1)  # a_{l, m−1}
        above = jnp.concatenate([a[..., 1:], jnp.zeros_like(a[..., :1])], axis=-1)  # a_{l, m+1}
        inside = (m <= deg).astype(a.real.dtype)
        plus = jnp.sqrt(jnp.maximum((deg - m + 1.0) * (deg + m), 0.0)) * inside * below  # (L_+ a)_{lm}
        minus = jnp.sqrt(jnp.maximum((deg + m + 1.0) * (deg - m), 0.0)) * inside * above  # (L_− a)_{lm}
        lx = 0.5 * (plus + minus)
        ly = -0.5j * (plus - minus)
        return 1j * jnp.stack([lx, ly, m * a])

    @staticmethod
    def _cross(x: jax.Array, y: jax.Array) -> jax.Array:
        """``x × y`` for components-first ``(3, ...)`` arrays."""
        return jnp.stack([x[1] * y[2] - x[2] * y[1], x[2] * y[0] - x[0] * y[2], x[0] * y[1] - x[1] * y[0]])

    def gradient(self, a: jax.Array) -> jax.Array:
        """``∇_S u`` as ``(3, ..., nlat, nlon)`` on the grid, from the coefficients of ``u``:
        ``−x × (iLu)``."""
        return -self._cross(self.grid_points(), self.synthesis(self._ladder(a)))

    def divergence(self, flux: jax.Array) -> jax.Array:
        """Coefficients of ``div F`` for a tangent field ``F (3, ..., nlat, nlon)``:
        ``i Σ_c L_c (x × F)_c``."""
        h = self.analysis(self._cross(self.grid_points(), flux))  # (3, ..., l, m)
        ladders = jax.vmap(self._ladder)(h)  # (3 [h component], 3 [L component], ...)
        return ladders[0, 0] + ladders[1, 1] + ladders[2, 2]

    # -- the field ------------------------------------------------------------------------------
    def _mix(self, a: jax.Array, lam: jax.Array) -> jax.Array:
        """``λ_l Σ_ζ ρ_ζ w(ξ,ζ) a_lm(ζ)`` on the kernel's ``K = len(lam)`` degrees (``(L, K, K)``)."""
        kept = lam.shape[0]
        a = a[:, :kept, :kept]
        mix = (self.w * self.labels.weights[None, :]).astype(a.real.dtype)
        mixed = jnp.einsum("xz,zlm->xlm", mix, a.real) + 1j * jnp.einsum("xz,zlm->xlm", mix, a.imag)
        return lam[None, :, None] * mixed

    def potential(self, state: SphereDensity) -> jax.Array:
        """Coefficients of ``U`` (usa scale), on the kernel's degrees ``(L, K, K)``."""
        return self.scale * self._mix(state.a, self.lam)

    def velocity(self, state: SphereDensity) -> jax.Array:
        """``V (3, L, nlat, nlon)`` on the grid: ``∇U`` (usa) or ``∇U / Z`` (sa)."""
        grad = self.gradient(self._mix(state.a, self.lam))
        if self.normalization == "usa":
            return self.scale * grad
        return grad / self.synthesis(self._mix(state.a, self.dlam))[None]

    def __call__(self, state: SphereDensity) -> SphereDensity:
        f = self.synthesis(state.a)
        return SphereDensity(a=-self.divergence(f[None] * self.velocity(state)))

    def density(self, state: SphereDensity) -> jax.Array:
        """Grid values ``f (L, nlat, nlon)``."""
        return self.synthesis(state.a)

    def mass(self, state: SphereDensity) -> jax.Array:
        """``∫ f dx`` per label: ``sqrt(4π) a_00``."""
        return jnp.sqrt(4.0 * np.pi) * state.a[:, 0, 0].real

    def energy(self, state: SphereDensity) -> jax.Array:
        """``½ Σ_ξ ρ_ξ ∫ U f dx`` (Parseval on the real coefficients)."""
        u = self.potential(state)
        kept = u.shape[-1]
        weight = jnp.where(jnp.arange(kept) == 0, 1.0, 2.0)[None, None, :]
        per_label = jnp.sum(weight * (u * jnp.conj(state.a[:, :kept, :kept])).real, axis=(1, 2))
        return 0.5 * jnp.sum(self.labels.weights * per_label)

    def areas(self) -> jax.Array:
        """The quadrature areas of the grid points ``(nlat, nlon)`` (``w_j · 2π/nlon``; they sum to 4π)."""
        return jnp.broadcast_to(self.weights[:, None] * (2.0 * np.pi / self.nlon), (self.mu.size, self.nlon))

    def initial(self, values: jax.Array) -> SphereDensity:
        """The state of grid values ``(L, nlat, nlon)`` (its projection on degrees ``≤ lmax``)."""
        return SphereDensity(a=self.analysis(values))


def kept_degrees(lam: np.ndarray) -> int:
    """The kernel's degrees the field keeps: up to the first with ``|λ_l|`` below ``MODE_CUT`` of the
    largest (round-off), rounded up to a multiple of 8, at most ``lmax + 1``. The potential, its
    gradient and the label product then cost ``O(K³)`` rather than ``O(lmax³)``."""
    small = np.abs(lam) < MODE_CUT * np.max(np.abs(lam))
    needed = int(np.argmax(small & (np.arange(lam.size) >= 2))) if np.any(small[2:]) else lam.size
    return min(lam.size, -(-needed // 8) * 8)


def _grid_points(mu: np.ndarray, nlon: int) -> np.ndarray:
    """``(3, nlat, nlon)``: ``(sin θ cos φ, sin θ sin φ, cos θ)`` at ``cos θ = μ_j``, ``φ = 2πk/nlon``."""
    phi = 2.0 * np.pi * np.arange(nlon) / nlon
    s = np.sqrt(1.0 - mu**2)[:, None]
    return np.stack(
        [s * np.cos(phi)[None, :], s * np.sin(phi)[None, :], np.broadcast_to(mu[:, None], (mu.size, nlon))]
    )


def _parity_tables(table: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """``(even, odd)``, each ``(m, R, half)``: rows ``l = m + 2r`` and ``l = m + 2r + 1`` of ``table``
    at the first ``half`` nodes (``μ < 0``), zero past ``lmax``; ``R = lmax // 2 + 1``."""
    size = table.shape[0]
    rows = size // 2 + 1
    even, odd = np.zeros((size, rows, half)), np.zeros((size, rows, half))
    for m in range(size):
        for r in range(rows):
            if m + 2 * r < size:
                even[m, r] = table[m, m + 2 * r, :half]
            if m + 2 * r + 1 < size:
                odd[m, r] = table[m, m + 2 * r + 1, :half]
    return even, odd


def _legendre_table(lmax: int, mu: np.ndarray) -> np.ndarray:
    """``P̄_lm(μ_j)`` as ``(m, l, j)``, with ``Y_lm(θ, φ) = P̄_lm(cos θ) e^{imφ}`` (orthonormal,
    Condon–Shortley phase: scipy's ``sph_harm_y``)."""
    theta = np.arccos(mu)
    table = np.zeros((lmax + 1, lmax + 1, mu.size))
    for m in range(lmax + 1):
        for deg in range(m, lmax + 1):
            table[m, deg] = scipy.special.sph_harm_y(deg, m, theta, 0.0).real
    return table


def grid_shape(profile: Profile, lmax: int) -> tuple[int, int, int]:
    """``(kept, nlat, nlon)``: the kernel's degrees the field keeps (:func:`kept_degrees`) and the
    grid that projects the flux without aliasing. The flux ``x × (f ∇U)`` has degree
    ``lmax + kept + 1``, and against ``Y_lm`` (``l ≤ lmax``) ``2 lmax + kept + 1``: ``nlat`` Gauss
    nodes in ``μ`` (even: they pair as ``±μ``) and ``nlon = 2 lmax + kept + 2`` longitudes."""
    kept = kept_degrees(funk_hecke(profile, lmax))
    return kept, 2 * -(-(2 * lmax + kept + 2) // 4), 2 * lmax + kept + 2


def kernel_lmax(profile: Profile) -> int:
    """The smallest ``lmax`` whose degrees past ``2 lmax / 3`` (where :func:`resolution` measures
    the tail) hold Funk–Hecke eigenvalues below ``KERNEL_TAIL`` of the first: the sphere's
    counterpart of ``density_circle.kernel_grid`` (the kernel is then resolved in full)."""
    if profile.kind != "exp":
        return MIN_LMAX  # the linear profile has degree 1 only
    beta = float(profile.beta)
    first = scipy.special.ive(0.5, beta)
    top = 0
    while scipy.special.ive(top + 0.5, beta) >= KERNEL_TAIL * first:
        top += 1
    return max(MIN_LMAX, -(-3 * top // 2))


def make_sphere_field(
    profile: Profile,
    *,
    lmax: int,
    labels: LabelQuadrature,
    factor: Factor | None = None,
    normalization: str = "usa",
) -> SphereDensityField:
    """The density field on ``S^2 × labels`` in the gauge frame (rotate the initial law by each
    label's gauge; see the module docstring), harmonics up to degree ``lmax``."""
    where = "density"
    if isinstance(lmax, bool) or not isinstance(lmax, int | np.integer) or lmax < MIN_LMAX:
        raise ValueError(f"{where}: `lmax` must be an integer >= {MIN_LMAX}; got {lmax!r}.")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{where}: `normalization` must be one of {NORMALIZATIONS}; got {normalization!r}.")
    count = labels.size
    factor = NoFactor(n=count) if factor is None else factor
    if factor.n != count:
        raise ValueError(
            f"{where}: `factor` must be built on the {count} label nodes; got {factor.n} labels."
        )
    check_softmax_factor(factor, normalization, where=where)
    kept, nlat, nlon = grid_shape(profile, lmax)
    lam = funk_hecke(profile, lmax)[:kept]
    mu, gauss = np.polynomial.legendre.leggauss(nlat)
    if profile.kind == "exp":
        dlam = float(profile.beta) * lam  # φ' = β φ for the exp profile
    else:
        dlam = np.where(np.arange(kept) == 0, 4.0 * np.pi, 0.0)
    dtype = labels.weights.dtype
    w = np.broadcast_to(np.asarray(factor.dense(), dtype=np.float64), (count, count))
    table = _legendre_table(lmax, mu)
    even, odd = _parity_tables(table, nlat // 2)
    return SphereDensityField(
        labels=labels,
        w=to_device(w, dtype),
        lam=to_device(lam, dtype),
        dlam=to_device(dlam, dtype),
        scale=to_device(float(profile.scale), dtype),
        legendre=to_device(table, dtype),
        even=to_device(even, dtype),
        odd=to_device(odd, dtype),
        weights=to_device(gauss, dtype),
        mu=to_device(mu, dtype),
        points=to_device(_grid_points(mu, nlon), dtype),
        lmax=int(lmax),
        nlon=int(nlon),
        normalization=normalization,
    )


def resolution(field: SphereDensityField, state: SphereDensity) -> tuple[jax.Array, jax.Array]:
    """``(tail, negative)``: the largest share of spectral power ``Σ_m |a_lm|²`` in degrees
    ``l > 2 lmax/3`` (the mean included) and the largest negative mass ``∫ max(−f, 0) dx``."""
    m = jnp.arange(field.lmax + 1)[None, None, :]
    power = jnp.where(m == 0, 1.0, 2.0) * jnp.abs(state.a) ** 2
    per_degree = jnp.sum(power, axis=-1)
    deg = jnp.arange(field.lmax + 1)[None, :]
    tail = jnp.sum(jnp.where(3 * deg > 2 * field.lmax, per_degree, 0.0), axis=-1) / jnp.sum(
        per_degree, axis=-1
    )
    f = field.synthesis(state.a)
    negative = jnp.einsum("j,xjk->x", field.weights, jnp.maximum(-f, 0.0)) * (2.0 * np.pi / field.nlon)
    return jnp.max(tail), jnp.max(negative)


def status_code(
    field: SphereDensityField,
    state: SphereDensity,
    *,
    tail_tol: float = TAIL_TOL,
    negative_tol: float = NEGATIVE_TOL,
) -> jax.Array:
    tail, negative = resolution(field, state)
    finite = jnp.all(jnp.isfinite(state.a.real)) & jnp.all(jnp.isfinite(state.a.imag))
    resolved = (tail <= tail_tol) & (negative <= negative_tol)
    return jnp.where(
        ~finite,
        Status.nonfinite.code,
        jnp.where(resolved, Status.ok.code, Status.under_resolved.code),
    )


def safe_dt(field: SphereDensityField, *, courant: float = 1.0) -> float:
    """A step for explicit RK4 that is stable for every law (a host float): ``courant · 2 / (|V| lmax +
    |div V|)`` with the law-independent bounds ``|V| ≤ scale · max_t |k'(t)| sqrt(1 − t²) · reach`` and
    ``|div V| ≤ scale · max_t |(1 − t²) k''(t) − 2t k'(t)| · reach`` (the gradient and Laplacian of the
    zonal ``k = φ/scale``; ``reach = max_ξ Σ_ζ ρ_ζ |w|``), or ``|V| ≤ 1``, ``|div V| ≤ 2 + β`` for sa."""
    t = np.linspace(-1.0, 1.0, 4001)
    lam, dlam = np.asarray(field.lam), np.asarray(field.dlam)
    beta = float(dlam[0] / lam[0]) if lam[0] > 0 else 0.0  # exp: φ' = β φ; linear: λ_0 = 0
    dk = np.exp(beta * (t - 1.0)) if beta > 0 else np.ones_like(t)
    ddk = beta * dk
    if field.normalization == "usa":
        reach = float(np.max(np.abs(np.asarray(field.w)) @ np.asarray(field.labels.weights)))
        v = float(field.scale) * reach * np.max(dk * np.sqrt(1.0 - t**2))
        dv = float(field.scale) * reach * np.max(np.abs((1.0 - t**2) * ddk - 2.0 * t * dk))
    else:
        v, dv = 1.0, 2.0 + beta
    return courant * 2.0 / (v * field.lmax + dv)


def gauge_frame_points(field: SphereDensityField, q) -> jax.Array:
    """``Q(ξ_l)ᵀ x`` on the grid, ``(L, 3, nlat, nlon)``, for per-label gauges ``q (L, 3, 3)``: the
    gauge-frame slice is ``g_ξ(u) = f_ξ(Q(ξ)ᵀ u)``, so evaluating the content-frame law ``f_ξ`` at these
    points gives the solver's initial values (``field.initial``). RoPE with one rotating pair in
    d = 3 is a rotation about the third axis; prompt gauges are ``haar_orthogonal(seed, K, 3)``."""
    q = jnp.asarray(q)
    return jnp.einsum("lij,iab->ljab", q, field.grid_points())  # (Qᵀx)_j = Σ_i Q_ij x_i


def pad_degrees(state: SphereDensity, lmax: int) -> SphereDensity:
    """The same band-limited law with coefficients up to ``lmax`` (zeros above): to evaluate it on the
    finer grid of a field with that ``lmax`` (distances, plots)."""
    a = state.a
    extra = lmax + 1 - a.shape[-1]
    if extra < 0:
        raise ValueError(f"pad_degrees: `lmax` must be >= the state's {a.shape[-1] - 1}; got {lmax}.")
    return SphereDensity(a=jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, extra), (0, extra)]))
