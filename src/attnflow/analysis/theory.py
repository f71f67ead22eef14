"""Closed-form theory: energy bounds, maximiser sets, the spectral dichotomy, certificates.

Energy bounds
    ``energy_max(kernel)``: the maximum of ``E`` over configurations with the kernel's labels where
    the theory gives it in closed form, else ``None``. The gauge never changes the maximum: ``E``
    depends on ``x`` only through the gauge frame ``u_i = Q(ξ_i)x_i``, and ``x ↦ u`` is a bijection
    of ``(S^{d−1})^n``. So, for any gauge:

    - ``w = 1``: ``φ(1)/2`` (``c e^β/(2β)`` for exp, ``c/2`` for linear), attained exactly on the
      orbits ``{Q(ξ_i)ᵀ v}`` (:func:`orbit_configuration`);
    - ``w ≥ 0`` (D1): ``φ(1)·mean(W)/2`` (:func:`dirac_energy`), attained at a Dirac in the gauge
      frame, since ``φ`` is non-decreasing and ``⟨u_i,u_j⟩ ≤ 1``;
    - linear profile, sign-changing ``W`` (D2): ``c λ_max(W)/(2n)`` (:func:`spectral_bound`), from
      ``tr(WG) ≤ λ_max tr(G) = λ_max n`` for the Gram matrix ``G`` of ``u``; attained when the top
      eigenspace (dimension ``k ≤ d``) carries an equal-norm tight frame: its projector has constant
      diagonal ``k/n`` (full-period Toeplitz cosine: the uniform great circle, :func:`great_circle`);
    - otherwise ``None`` (e.g. D3: exponential profile with a sign-changing factor;
      :func:`circle_energy`, :func:`antipodal_energy`, :func:`d3_crossing`). In D3 the crossing β* of
      the circle and antipodal-pair energies is *not* a change of maximiser: neither candidate is a
      local maximum there (the circle stops being one at β_c ≈ 1.545 for n = 64), and the highest
      state found for β in [1.75, 4] is one arc of a great circle, a strict local maximum
      modulo rotations; no global maximiser is proven.

Maximiser sets
    :func:`orbit_configuration` (``Q(ξ_i)ᵀ v`` for any gauge), :func:`latitude_circle` (the RoPE
    prediction in d = 3) and :func:`prompt_clusters` (the K-cluster prediction of a prompt gauge).

Spectral criterion (the dichotomy D1 / D2)
    :func:`spectral_criterion`: the leading eigenpairs of ``W``; a positive vector in the leading
    eigenspace (Perron–Frobenius for ``W ≥ 0``) predicts a Dirac, a sign-changing leading eigenspace
    predicts a spread state.

Certificates
    :func:`certify` checks a claimed maximiser instead of trusting it: energy, energy gap, the norm
    of the Riemannian gradient ``P_x ∇E`` and the spectrum of the Riemannian Hessian on
    ``⊕_i T_{x_i}S^{d−1}`` (autodiff, dense: small ``n``). A local maximiser has gradient 0 and
    Hessian ``≤ 0``, with zero modes from the global symmetry (rotations of the gauge frame), so its
    top eigenvalue is ``≈ 0``, not ``< 0`` (:meth:`Certificate.is_local_maximiser`); a global one is
    claimed only against a closed-form bound (:meth:`Certificate.is_global_maximiser`). The
    matrix-free version for large ``n`` is ``attnflow.analysis.landscape``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.gauges import Gauge
from attnflow.core.kernel import Kernel
from attnflow.core.sphere import project
from attnflow.numerics.summation import energy

EIG_RTOL = 1e-9  # eigenvalues within this relative distance of λ_max form the leading eigenspace
FRAME_TOL = 1e-9  # tolerance on the projector diagonal for the equal-norm tight frame test (D2)
D3_BRACKET = (1.0, 5.0)  # I_1(β) − (4/π²) sinh β changes sign once in here (+ at 1, − at 5)


# --------------------------------------------------------------------------- energy bounds


def _phi_one(kernel: Kernel) -> float:
    return float(kernel.profile.phi(jnp.asarray(1.0)))


def dirac_energy(kernel: Kernel) -> float:
    """Energy of a Dirac in the gauge frame (``u_i = v`` for all i): ``φ(1)·mean(W)/2``.

    This is the D1 bound for a non-negative factor; for ``w = 1`` it is ``c e^β/(2β)`` (exp) or
    ``c/2`` (linear), the energy of every orbit configuration.
    """
    return _phi_one(kernel) * kernel.factor.mean() / 2.0


def spectral_bound(w, *, c: float = 1.0) -> float:
    """``c λ_max(W)/(2n)``: an upper bound of ``E`` for the linear profile and any symmetric ``W``.

    ``E = (c/(2n²)) tr(WG)`` with ``G`` a Gram matrix of unit vectors (PSD, ``tr G = n``), and
    ``tr(WG) ≤ λ_max(W) tr(G)``.
    """
    w = np.asarray(w.dense() if hasattr(w, "dense") else w, dtype=np.float64)
    return float(c) * float(np.linalg.eigvalsh(w)[-1]) / (2.0 * w.shape[0])


def leading_eigenspace(w, *, rtol: float = EIG_RTOL) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of ``W`` (descending) and an orthonormal basis ``(n, k)`` of the eigenspace of
    those within ``rtol·|λ_max|`` of ``λ_max``.

    ``w`` is an array or a factor (whose ``eigenpairs`` may use its structure: a ``ToeplitzCos``
    factor is handled in O(n) through its rank-2 form).
    """
    if hasattr(w, "eigenpairs"):
        values, vectors = w.eigenpairs()
    else:
        values, vectors = np.linalg.eigh(np.asarray(w, dtype=np.float64))
        values, vectors = values[::-1], vectors[:, ::-1]
    scale = max(abs(values[0]), np.finfo(float).tiny)
    k = int(np.sum(values[: vectors.shape[1]] >= values[0] - rtol * scale))
    return values, vectors[:, :k]


def energy_max(kernel: Kernel) -> float | None:
    """Maximal energy for the kernel's labels where the theory gives it in closed form (see the
    module doc), else ``None``."""
    factor = kernel.factor
    if factor.nonnegative:  # w = 1 included
        return dirac_energy(kernel)
    if kernel.profile.kind != "linear":
        return None
    values, basis = leading_eigenspace(factor)
    n, k = basis.shape
    # Attained iff unit u_i with Gram G = (n/k) P exist, P = basis basisᵀ the projector: rank k <= d
    # and constant diagonal k/n (then u_i = sqrt(n/k) basis_i in R^k ⊂ R^d and tr(WG) = λ_max n).
    frame_defect = float(np.max(np.abs(np.sum(basis**2, axis=1) - k / n)))
    if values[0] <= 0 or k > kernel.gauge.d or frame_defect > FRAME_TOL:
        return None
    return float(kernel.profile.c) * float(values[0]) / (2.0 * n)


# --------------------------------------------------------------------------- rates of the flow


def collapse_rates(u, w, *, beta: float, c: float = 1.0) -> tuple[float, float]:
    """``(slowest, fastest)`` decay rates of ``1 − mean cosine`` near a collapsed state (the
    linearisation there), ``u (n, d)`` the gauge frame of that state, ``w (n, n)`` the factor:
    ``2 λ_2(L_A)`` and ``2 λ_max(L_A)``, ``L_A = diag(A1) − A`` the graph Laplacian of the weights
    ``A_ij = (c/n) w_ij e^{β⟨u_i, u_j⟩}`` (``λ_2`` its smallest non-zero eigenvalue).

    Near ``x_i = x* + ε_i`` (a Dirac of the collapsing quantity) the field is
    ``dε_i/dt = Σ_j A_ij (ε_j − ε_i) + O(|ε|²)``: the logits' derivative multiplies ``x*`` and is
    projected away. The gradient flow collapses in the gauge frame (``u_i = u*``: ``A = (c e^β/n) W``;
    ``w = 1``: both rates ``2 c e^β``, the equiangular reduction's at ``ρ = 1``); logits-only values
    collapse the content (``x_i = x*``, ``u_i = Q(ξ_i) x*``: the gauge sets the weights). ``1 − mean
    cosine`` is quadratic in ``ε``: it decays at twice the rates, between the two."""
    u = np.asarray(u, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n = u.shape[0]
    a = float(c) / n * w * np.exp(beta * (u @ u.T - 1.0)) * np.exp(beta)
    a = 0.5 * (a + a.T)
    laplacian = np.diag(a.sum(axis=1)) - a
    eigenvalues = np.linalg.eigvalsh(laplacian)
    return 2.0 * float(eigenvalues[1]), 2.0 * float(eigenvalues[-1])


def circle_normal_rate(xi, omega: float, *, beta: float, c: float = 1.0) -> float:
    """The rate at which the uniform great circle ``x_i = (cos ωξ_i, sin ωξ_i, 0)`` of the factor
    ``w = cos ω(ξ − ζ)`` (exp profile, no gauge) draws back displacements out of its plane: ``−`` the
    largest eigenvalue of the linearisation ``dδ_i/dt = Σ_j a_ij δ_j − (Σ_j a_ij w_ij) δ_i``,
    ``a_ij = (c/n) w_ij e^{β w_ij}`` (``⟨x_i, x_j⟩ = w_ij`` on the circle), on the complement of the
    tilts ``δ = cos ωξ, sin ωξ`` (rotations of the plane, rate 0). Continuum, full period: the modes
    ``cos kωξ`` have rates ``c[(I_0 + I_2)/2 − (I_{k−1} + I_{k+1})/2](β)``; the slowest is ``k = 0``,
    ``c[(I_0(β) + I_2(β))/2 − I_1(β)]`` (0.136 c at β = 1), and it changes sign near β = 1.55 (the
    circle stops being stable). Negative: the circle is unstable out of its plane."""
    xi = np.asarray(xi, dtype=np.float64).reshape(-1)
    n = xi.size
    w = np.cos(omega * (xi[:, None] - xi[None, :]))
    a = float(c) / n * w * np.exp(beta * w)
    m = a - np.diag(np.sum(a * w, axis=1))
    tilts = np.stack([np.cos(omega * xi), np.sin(omega * xi)], axis=1)
    basis = np.linalg.qr(np.concatenate([tilts, np.eye(n)], axis=1))[0][:, 2:n]
    return -float(np.linalg.eigvalsh(basis.T @ (0.5 * (m + m.T)) @ basis)[-1])


def first_token_rate(n: int, *, strict: bool = False) -> float:
    """The rate at which a causal softmax layer with values ``I`` draws its tokens onto the first
    token's point near that Dirac (Karagodin–Polyanskiy–Rigollet): there every logit is equal, the
    weights are ``1/(i + 1)`` over ``j <= i``, and ``dε_i/dt = (1/(i + 1)) Σ_{j<=i} ε_j − ε_i``, a
    triangular map with eigenvalues ``−i/(i + 1)``: the slowest, token 1's, is ``1/2`` (``n >= 2``),
    whatever β and the maps. ``strict`` (``j < i``): every eigenvalue is ``−1`` (a Jordan chain: no
    single exponential rate before ``t ≈ n``), returned as 1."""
    if n < 2:
        raise ValueError(f"first_token_rate: `n` must be >= 2; got {n!r}.")
    return 1.0 if strict else 0.5


def source_rate(n: int, sources: int, *, beta: float, c: float = 1.0) -> float:
    """The rate at which the movers of the usa field (identity maps, ``w = 1``, no gauge) reach
    ``sources`` held tokens at one point near that Dirac: ``dε_i/dt = (c e^β/n)(Σ_{movers} ε_j − n ε_i)``
    (a held ``ε`` is 0); the movers' common displacement decays at ``c e^β sources/n``, the rest at
    ``c e^β``."""
    if not 0 < sources < n:
        raise ValueError(f"source_rate: `sources` must be in [1, n) = [1, {n}); got {sources!r}.")
    return float(c) * float(np.exp(beta)) * sources / n


def axis_rates(signs, weight, *, beta: float, c: float = 1.0) -> tuple[float, float]:
    """The rate at which the tokens of the gradient layer ``W_Q = W_K = W_V = W``, ``W_O = Wᵀ`` (one
    head, no gauge, usa, no mask) close in on ``±e`` near that state, ``e`` the top eigenvector of
    ``M = WᵀW`` (eigenvalue ``λ``), ``signs`` the side ``s_i = ±1`` of each token. There the field is
    ``P_{x_i}(Σ_j a_ij M x_j)``, ``a_ij = (c/n) e^{β s_i s_j λ}``, and on ``e^⊥`` (``M``'s other
    eigenvalues ``μ_k``) ``dε/dt = (μ_k a − λ diag(s_i Σ_j a_ij s_j)) ε``, each ``k`` on its own:
    ``(slowest, fastest)`` rates, ``−`` the largest and the smallest eigenvalue of these symmetric
    matrices. ``1 − min_i |⟨x_i, e⟩|`` is quadratic in ``ε``: it decays at twice a rate between."""
    s = np.asarray(signs, dtype=np.float64).reshape(-1)
    w = np.asarray(weight, dtype=np.float64)
    values, vectors = np.linalg.eigh(w.T @ w)
    lam = float(values[-1])
    n = s.size
    a = float(c) / n * np.exp(beta * lam * np.outer(s, s))
    drift = lam * np.diag(s * (a @ s))
    spectra = [np.linalg.eigvalsh(mu * a - drift) for mu in values[:-1]]
    return -float(max(e[-1] for e in spectra)), -float(min(e[0] for e in spectra))


def second_token_angle(ts, x0, x1, *, query, key, beta: float, strict: bool = False) -> np.ndarray:
    """The angle ``θ(t)`` between the first token (which never moves) and the second one under a
    causal softmax layer with values ``I`` (the second token sees the first and itself: its velocity
    ``a_10 P_{x_1} x_0`` keeps it on the great circle through ``x_0`` and ``x_1(0)``), solved to 1e-12:

        dθ/dt = −sin θ · e^{s_10}/(e^{s_10} + e^{s_11}),   s_1j = β ⟨W_Q x_1, W_K x_j⟩,

    ``x_1 = cos θ x_0 + sin θ e``; ``strict`` (``j < i``): it sees the first token only, ``dθ/dt =
    −sin θ``. ``query``, ``key``: ``W_Q, W_K (d_h, d)``."""
    import scipy.integrate

    x0, x1 = np.asarray(x0, dtype=np.float64), np.asarray(x1, dtype=np.float64)
    wq, wk = np.asarray(query, dtype=np.float64), np.asarray(key, dtype=np.float64)
    e = x1 - np.dot(x0, x1) * x0
    e /= np.linalg.norm(e)
    theta0 = float(np.arctan2(np.dot(x1, e), np.dot(x1, x0)))

    def rate(_, theta):
        if strict:
            return -np.sin(theta)
        y = np.cos(theta[0]) * x0 + np.sin(theta[0]) * e
        q = wq @ y
        s10, s11 = beta * q @ (wk @ x0), beta * q @ (wk @ y)
        return -np.sin(theta) / (1.0 + np.exp(s11 - s10))

    ts = np.asarray(ts, dtype=np.float64)
    solution = scipy.integrate.solve_ivp(rate, (0.0, float(ts.max(initial=0.0))), [theta0], t_eval=ts,
                                         method="DOP853", rtol=1e-12, atol=1e-14)  # fmt: skip
    return solution.y[0]


def equiangular_rho(
    ts, *, rho0: float, n: int, beta: float, c: float = 1.0, normalization: str = "usa"
) -> np.ndarray:
    """``ρ(t)`` of the equiangular reduction (all pairwise cosines equal, ``Q = I``, ``w = 1``, exp
    profile), solved to ``1e-13``: "usa" ``dρ/dt = (2c/n) e^{βρ}(1 − ρ)((n − 1)ρ + 1)``; "sa"
    ``dρ/dt = 2 e^{βρ}(1 − ρ)((n − 1)ρ + 1)/(e^β + (n − 1) e^{βρ})`` (the softmax has no ``c``).
    Linearised at ``ρ = 1``: rates ``2 c e^β`` and ``2``."""
    import scipy.integrate

    if normalization not in ("usa", "sa"):
        raise ValueError(f"equiangular_rho: `normalization` must be 'usa' or 'sa'; got {normalization!r}.")

    def rate(_, rho):
        grow = 2.0 * np.exp(beta * rho) * (1.0 - rho) * ((n - 1) * rho + 1.0)
        if normalization == "usa":
            return c * grow / n
        return grow / (np.exp(beta) + (n - 1) * np.exp(beta * rho))

    ts = np.asarray(ts, dtype=np.float64)
    solution = scipy.integrate.solve_ivp(rate, (0.0, float(ts.max(initial=0.0))), [rho0], t_eval=ts,
                                         method="DOP853", rtol=1e-13, atol=1e-15)  # fmt: skip
    return solution.y[0]


def equiangular_energy(rho, *, n: int, beta: float, c: float = 1.0):
    """The energy ``E = (1/(2n²)) Σ_ij φ(⟨x_i, x_j⟩)``, ``φ(s) = (c/β) e^{βs}``, of ``n`` tokens whose
    pairwise cosines all equal ``rho``: ``(c/(2βn)) (e^β + (n − 1) e^{βρ})`` (``Q = I``, ``w = 1``; for
    the softmax too, whose flow is not this energy's gradient flow)."""
    rho = np.asarray(rho, dtype=np.float64)
    return c / (2.0 * beta * n) * (np.exp(beta) + (n - 1) * np.exp(beta * rho))


LAYER_NORMS = ("post", "pre", "peri", "ngpt")


def _check_layer_norm(where: str, normalization: str, layer_norm: str, alpha: float) -> None:
    if normalization not in ("usa", "sa"):
        raise ValueError(f"{where}: `normalization` must be 'usa' or 'sa'; got {normalization!r}.")
    if layer_norm not in LAYER_NORMS:
        raise ValueError(f"{where}: `layer_norm` must be one of {LAYER_NORMS}; got {layer_norm!r}.")
    if not alpha > 0:
        raise ValueError(f"{where}: `alpha` must be positive; got {alpha!r}.")


def equiangular_layer_norm_rates(
    deficit: float,
    r: float,
    *,
    n: int,
    beta: float,
    c: float = 1.0,
    normalization: str = "usa",
    layer_norm: str = "post",
    alpha: float = 1.0,
) -> tuple[float, float]:
    """``(dρ/dt, dr/dt)`` of equiangular tokens with cosine ``ρ = 1 − deficit`` and radius ``r``
    under a layer norm (:mod:`attnflow.numerics.layer_norms`), ``Q = I``, ``w = 1``, exp profile.

    With ``s = 1 + (n − 1)ρ`` and ``S = Σ_j x_j``, the attention output is
    ``A_i = k (e^β x_i + e^{βρ} Σ_{j≠i} x_j)``, ``k = c/n`` (usa) or ``1/(e^β + (n − 1)e^{βρ})`` (sa):

    - radial part ``⟨x_i, A_i⟩ = k g``, ``g = e^β + (n − 1)ρ e^{βρ}``;
    - tangent part ``P_{x_i} A_i = k e^{βρ}(S − s x_i)``: ``⟨P_{x_i} A_i, x_j⟩ = k e^{βρ} s(1 − ρ)``
      for ``j ≠ i`` and ``|P_{x_i} A_i|² = k² e^{2βρ} s(n − 1)(1 − ρ)``;
    - ``|A_i| = k h``, ``h = (g² + e^{2βρ} s(n − 1)(1 − ρ))^{1/2}``.

    Each norm moves ``x_i`` along ``P_{x_i} A_i`` at a speed factor ``σ``, so ``dρ/dt`` is ``σ`` times
    post-LN's ``2 k e^{βρ} s(1 − ρ)`` (:func:`equiangular_rho`):

    - ``post``: ``σ = 1``, ``dr/dt = 0``;
    - ``pre`` (``dz/dt = A``): ``σ = 1/r``, ``dr/dt = k g``;
    - ``peri`` (``dz/dt = A/|A|``): ``σ = 1/(r k h)``, ``dr/dt = g/h``;
    - ``ngpt`` (``dx/dt = α P_x(A/|A|)``): ``σ = α/(k h)``, ``dr/dt = 0``.

    ``k`` cancels from peri and nGPT: they see neither ``c`` nor the softmax, but they see β."""
    _check_layer_norm("equiangular_layer_norm_rates", normalization, layer_norm, alpha)
    rho = 1.0 - deficit
    b = np.exp(beta * rho)
    s = 1.0 + (n - 1) * rho
    k = c / n if normalization == "usa" else 1.0 / (np.exp(beta) + (n - 1) * b)
    g = np.exp(beta) + (n - 1) * rho * b
    h = np.sqrt(g * g + b * b * s * (n - 1) * max(deficit, 0.0))
    closing = 2.0 * k * b * s * deficit  # post-LN's drho/dt
    if layer_norm == "post":
        return closing, 0.0
    if layer_norm == "pre":
        return closing / r, k * g
    if layer_norm == "peri":
        return closing / (r * k * h), g / h
    return alpha * closing / (k * h), 0.0


class EquiangularFlow(NamedTuple):
    """The equiangular reduction's solution at the times asked for (each ``(T,)``)."""

    rho: np.ndarray  # the common cosine ρ(t)
    deficit: np.ndarray  # 1 − ρ(t), solved for itself (accurate where ρ rounds to 1)
    radius: np.ndarray  # r(t) (1 for post and nGPT)


def equiangular_layer_norm(
    ts,
    *,
    rho0: float,
    n: int,
    beta: float,
    c: float = 1.0,
    normalization: str = "usa",
    layer_norm: str = "post",
    alpha: float = 1.0,
) -> EquiangularFlow:
    """``ρ(t)``, ``1 − ρ(t)`` and ``r(t)`` of the equiangular reduction under a layer norm, every
    radius 1 at ``t = 0`` (:func:`equiangular_layer_norm_rates`, solved for ``(1 − ρ, r)`` to a
    relative ``1e-13``).

    Tokens with every pairwise cosine equal (and every radius equal) stay so: the field is
    equivariant under permutations and orthogonal maps, and an orthogonal map permutes equiangular
    tokens. With a gauge and the gradient value the same holds in the gauge frame ``u_i = Q_i x_i``
    (``|A_i|`` and ``⟨x_i, A_i⟩`` are those of the gauge-free field at ``u``), so ``x_i`` tends to the
    orbit point ``Q_iᵀ u*`` at the speed of this ODE (:func:`equiangular_orbit_residual`), under
    every norm.

    Near ``ρ = 1`` (``h → g → n e^β``): post collapses at ``2 c e^β`` (usa), nGPT at ``2α``; pre's
    radius grows like ``c e^β t`` and peri's like ``t``, so for both ``1 − ρ`` decays like ``t^{−2}``."""
    import scipy.integrate

    _check_layer_norm("equiangular_layer_norm", normalization, layer_norm, alpha)
    options = dict(n=n, beta=beta, c=c, normalization=normalization, layer_norm=layer_norm, alpha=alpha)

    def rate(_, state):
        closing, growing = equiangular_layer_norm_rates(state[0], state[1], **options)
        return [-closing, growing]

    ts = np.asarray(ts, dtype=np.float64)
    solution = scipy.integrate.solve_ivp(
        rate,
        (0.0, float(ts.max(initial=0.0))),
        [1.0 - rho0, 1.0],
        t_eval=ts,
        method="DOP853",
        rtol=1e-13,
        atol=1e-300,  # relative accuracy down to any deficit
    )
    deficit = solution.y[0]
    return EquiangularFlow(rho=1.0 - deficit, deficit=deficit, radius=solution.y[1])


def equiangular_orbit_residual(deficit, n: int):
    """``|u_i − u*|`` of ``n`` equiangular unit vectors with cosine ``ρ = 1 − deficit`` (``u*`` their
    normalised mean): ``⟨u_i, u*⟩ = (s/n)^{1/2}``, ``s = 1 + (n − 1)ρ``, so the distance is
    ``(2 − 2(s/n)^{1/2})^{1/2}``, computed without cancellation from the deficit. For a gauge frame
    ``u_i = Q_i x_i`` it is the distance of ``x_i`` to its orbit point ``Q_iᵀ u*``."""
    spread = (n - 1) / n * np.asarray(deficit, dtype=np.float64)  # 1 - s/n
    return np.sqrt(2.0 * spread / (1.0 + np.sqrt(np.maximum(1.0 - spread, 0.0))))


# --------------------------------------------------------------------------- maximiser sets


def orbit_configuration(gauge: Gauge, v) -> jax.Array:
    """The maximiser ``x_i = Q(ξ_i)ᵀ v`` of a gauge kernel with ``w = 1`` (``v`` is normalised)."""
    v = jnp.asarray(v, dtype=jnp.float64)
    if v.shape != (gauge.d,) or not bool(jnp.linalg.norm(v) > 0):
        raise ValueError(
            f"orbit_configuration: `v` must be a non-zero vector of length d = {gauge.d}; got {v}."
        )
    v = v / jnp.linalg.norm(v)
    return gauge.apply_transpose(jnp.broadcast_to(v, (gauge.n, gauge.d)))


@dataclasses.dataclass(frozen=True)
class LatitudeCircle:
    """The predicted maximiser for standard RoPE in d = 3, ``ξ_i = i``, ``full_period``.

    The orbit ``R(ξ_i)ᵀ v`` is ``n`` equally spaced points on the circle at height ``v_3``.
    """

    height: float  # v_3
    radius: float  # sqrt(1 − v_3²)
    mean: np.ndarray  # (0, 0, v_3)
    mean_cosine: float  # (n v_3² − 1)/(n − 1)
    resultant_deficit: float  # 1 − |v_3|
    azimuth_uniformity: float  # 0 (equally spaced azimuths)


def latitude_circle(v, n: int) -> LatitudeCircle:
    """Predicted diagnostics of the RoPE maximiser through ``v`` (d = 3, full period, ``n`` tokens)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape != (3,) or not np.linalg.norm(v) > 0:
        raise ValueError(f"latitude_circle: `v` must be a non-zero 3-vector; got {v!r}.")
    if n < 2:
        raise ValueError(f"latitude_circle: `n` must be >= 2; got {n!r}.")
    h = float(v[2] / np.linalg.norm(v))
    return LatitudeCircle(
        height=h,
        radius=float(np.sqrt(1.0 - h * h)),
        mean=np.array([0.0, 0.0, h]),
        mean_cosine=(n * h * h - 1.0) / (n - 1.0),
        resultant_deficit=1.0 - abs(h),
        azimuth_uniformity=0.0,
    )


@dataclasses.dataclass(frozen=True)
class ClusterPrediction:
    """The predicted maximiser for a prompt gauge: clusters ``Q_kᵀ v`` with masses ``ρ(k)``."""

    centres: np.ndarray  # (K, d)
    masses: np.ndarray  # (K,)
    n_eff: float  # 1 / Σ_k ρ(k)² (distinct centres)
    marginal_spread: float  # 1 − |Σ_k ρ(k) Q_kᵀ v|


def prompt_clusters(q_prompts, v, masses=None) -> ClusterPrediction:
    """Predicted clusters of the prompt gauge ``q_prompts (K, d, d)`` on the orbit through ``v``.

    ``masses`` defaults to equal masses ``1/K``. ``n_eff`` assumes the ``K`` centres are distinct
    (true for Haar-random ``Q_k`` with probability 1).
    """
    q_prompts = np.asarray(q_prompts, dtype=np.float64)
    kk, d = q_prompts.shape[0], q_prompts.shape[-1]
    v = np.asarray(v, dtype=np.float64)
    if v.shape != (d,) or not np.linalg.norm(v) > 0:
        raise ValueError(f"prompt_clusters: `v` must be a non-zero vector of length d = {d}; got {v!r}.")
    p = np.full(kk, 1.0 / kk) if masses is None else np.asarray(masses, dtype=np.float64)
    if p.shape != (kk,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0, rtol=0, atol=1e-12):
        raise ValueError(
            f"prompt_clusters: `masses` must be {kk} non-negative numbers summing to 1; got {p!r}."
        )
    centres = np.einsum("kji,j->ki", q_prompts, v / np.linalg.norm(v))
    return ClusterPrediction(
        centres=centres,
        masses=p,
        n_eff=float(1.0 / np.sum(p * p)),
        marginal_spread=float(1.0 - np.linalg.norm(p @ centres)),
    )


# --------------------------------------------------------------------------- D2 and D3


def great_circle(xi, omega: float, d: int = 3) -> np.ndarray:
    """The uniform great circle ``x_i = (cos ωξ_i, sin ωξ_i, 0, …)`` in ``R^d`` (D2 maximiser)."""
    xi = np.asarray(xi, dtype=np.float64).reshape(-1)
    if d < 2:
        raise ValueError(f"great_circle: `d` must be >= 2; got {d!r}.")
    x = np.zeros((xi.size, d))
    x[:, 0], x[:, 1] = np.cos(omega * xi), np.sin(omega * xi)
    return x


def antipodal_pair(xi, omega: float, d: int = 3) -> np.ndarray:
    """``x_i = sign(cos ωξ_i) e_1``: the two antipodal Diracs of :func:`antipodal_energy` (a
    stationary state of every kernel: all points on one line)."""
    x = great_circle(xi, omega, d)
    return np.where(x[:, :1] >= 0, 1.0, -1.0) * np.eye(d)[0]


def great_circle_arc(xi, omega: float, fraction: float, d: int = 3) -> np.ndarray:
    """``x_i = (cos fωξ_i, sin fωξ_i, 0, …)``: the great circle compressed onto an arc of ``f·2π``
    in label order (``0 < f <= 1``). Not stationary; with ``w = cos ω(ξ−ζ)`` and the exp profile,
    Newton from ``f`` in ``[0.5, 0.7]`` converges to the single arc of D3 (module doc of
    ``attnflow.analysis.landscape``)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"great_circle_arc: `fraction` must be in (0, 1]; got {fraction!r}.")
    return great_circle(xi, fraction * omega, d)


def circle_energy(beta, *, c: float = 1.0):
    """``E(uniform great circle) = c I_1(β)/(2β)`` for ``w = cos 2π(ξ−ζ)``, exp profile (continuum).

    With ``x(ξ) = (cos 2πξ, sin 2πξ)``, ``⟨x,y⟩ = w``, so ``E = (c/2β) ∫ cos θ e^{β cos θ} dθ/2π``.
    """
    import scipy.special  # SciPy is imported where it is used: a run's start-up does not pay for it

    beta = np.asarray(beta, dtype=np.float64)
    return c * scipy.special.iv(1, beta) / (2.0 * beta)


def antipodal_energy(beta, *, c: float = 1.0):
    """``E(antipodal pair) = c (4/π²) sinh(β)/(2β)`` for ``w = cos 2π(ξ−ζ)``, exp profile (continuum).

    ``x(ξ) = ±e`` on the two half-periods centred at ``0`` and ``1/2``: ``E = (c/2β)·2A sinh β``
    with ``A = ∬_{same half} w = 2/π²`` (``∫_{−1/4}^{1/4} cos 2πξ dξ = 1/π``).
    """
    beta = np.asarray(beta, dtype=np.float64)
    return c * (4.0 / np.pi**2) * np.sinh(beta) / (2.0 * beta)


def d3_crossing(*, xtol: float = 1e-14) -> float:
    """The β* where :func:`circle_energy` = :func:`antipodal_energy`: ``I_1(β) = (4/π²) sinh β``
    (≈ 2.7455; independent of ``c``). Below β* the circle has the higher energy."""
    import scipy.optimize
    import scipy.special

    gap = lambda b: scipy.special.iv(1, b) - (4.0 / np.pi**2) * np.sinh(b)  # noqa: E731
    return float(scipy.optimize.brentq(gap, *D3_BRACKET, xtol=xtol))


@dataclasses.dataclass(frozen=True)
class SpectralCriterion:
    """Leading eigenpairs of ``W`` and the D1/D2 prediction."""

    eigenvalues: np.ndarray  # the top min(n, 4) eigenvalues, descending
    multiplicity: int  # dimension of the leading eigenspace
    leading_vectors: np.ndarray  # (n, multiplicity) orthonormal basis of it
    positive: bool  # the leading eigenspace holds a vector with all entries > 0
    prediction: str  # "dirac" if positive else "spread"


def spectral_criterion(w, *, rtol: float = EIG_RTOL) -> SpectralCriterion:
    """Perron–Frobenius test on the leading eigenspace of a symmetric ``W`` (array or factor).

    ``positive`` asks whether some ``v`` in the leading eigenspace has ``v_i > 0`` for all i (for a
    simple eigenvalue: the eigenvector has one strict sign; otherwise a small linear program
    ``max t  s.t. V a ≥ t, |a|_∞ ≤ 1``). ``W ≥ 0`` with ``{w > 0}`` connected always gives a
    positive Perron vector ("dirac", D1); the full-period Toeplitz cosine has the leading plane
    spanned by ``cos, sin`` and no positive vector in it ("spread", D2).
    """
    if not hasattr(w, "eigenpairs"):
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1] or not np.all(np.isfinite(w)):
            raise ValueError(f"spectral_criterion: `w` must be a finite square matrix; got shape {w.shape}.")
        asym = float(np.max(np.abs(w - w.T)))
        if asym > 1e-12 * max(1.0, float(np.max(np.abs(w)))):
            raise ValueError(
                f"spectral_criterion: `w` must be symmetric (|W − Wᵀ| <= 1e-12); got {asym:.3g}."
            )
    values, basis = leading_eigenspace(w, rtol=rtol)
    n, k = basis.shape
    if k == 1:
        v = basis[:, 0] * np.sign(basis[np.argmax(np.abs(basis[:, 0])), 0])
        positive = bool(np.all(v > 1e-12 * np.max(np.abs(v))))
    else:  # variables (a_1..a_k, t): maximise t subject to t − (V a)_i <= 0, −1 <= a <= 1
        import scipy.optimize

        cost = np.zeros(k + 1)
        cost[-1] = -1.0
        lp = scipy.optimize.linprog(
            cost,
            A_ub=np.hstack([-basis, np.ones((n, 1))]),
            b_ub=np.zeros(n),
            bounds=[(-1.0, 1.0)] * k + [(None, 1.0)],
        )
        positive = bool(lp.status == 0 and -lp.fun > 1e-9)
    return SpectralCriterion(
        eigenvalues=values[: min(n, 4)],
        multiplicity=k,
        leading_vectors=basis,
        positive=positive,
        prediction="dirac" if positive else "spread",
    )


# --------------------------------------------------------------------------- certificates


@dataclasses.dataclass(frozen=True)
class Certificate:
    """What a configuration's energy landscape looks like at that point (a check of a claimed maximiser)."""

    energy: float
    energy_max: float | None
    energy_gap: float | None  # (E_max − E)/E_max
    gradient_norm: float  # ‖P_x ∇E‖ over all particles (Frobenius)
    hessian_top: float  # largest eigenvalue of the Riemannian Hessian on ⊕ T_{x_i}S
    hessian_eigenvalues: np.ndarray  # all of them, ascending (n(d−1),)

    def is_local_maximiser(self, *, gradient_tol: float = 1e-10, hessian_tol: float = 1e-8) -> bool:
        """A second-order critical point: gradient ≤ ``gradient_tol`` and no Hessian eigenvalue above
        ``hessian_tol`` (no ascent direction to second order).

        A local statement only: at β = 2 (D3, n = 64) both the clean arc (E = 0.411211) and the arc
        with token 1 on the far side of its gap (E = 0.409138) pass. The rotation zero modes keep
        ``hessian_top`` at ``≈ 0``; a *strict* local maximum modulo rotations is read from the
        spectrum with those modes removed (``attnflow.analysis.landscape.hessian_spectrum``).
        """
        return self.gradient_norm <= gradient_tol and self.hessian_top <= hessian_tol

    def is_global_maximiser(self, *, gap_tol: float = 1e-9) -> bool:
        """Proven global maximiser: a closed-form bound ``E_max`` is known (:func:`energy_max`) and
        ``E`` is within ``gap_tol`` of it (relative gap ``(E_max − E)/E_max ≤ gap_tol``).

        ``False`` means "not proven", including every kernel without a bound (e.g. D3, where the
        best state known is found numerically, never proven).
        """
        return self.energy_gap is not None and self.energy_gap <= gap_tol


def tangent_bases(x: jax.Array) -> jax.Array:
    """Orthonormal bases ``(n, d, d−1)`` of the tangent spaces ``T_{x_i}S^{d−1}`` (complete QR)."""
    q, _ = jnp.linalg.qr(x[:, :, None], mode="complete")
    return q[:, :, 1:]


def _landscape(kernel: Kernel, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``E(x)``, the Riemannian gradient ``(n, d)`` and the Riemannian Hessian ``(n(d−1), n(d−1))``.

    For the embedded product of spheres, ``Hess E[ξ, ξ] = ξᵀ ∇²E ξ − Σ_i ⟨x_i, ∇_i E⟩ |ξ_i|²`` for
    tangent ``ξ`` (the second term is the curvature of each sphere). With ``B = blockdiag(B_i)``,
    ``B_i`` an orthonormal basis of ``T_{x_i}S`` (:func:`tangent_bases`), the matrix is
    ``Bᵀ ∇²E B − diag(⟨x_i, ∇_i E⟩) ⊗ I_{d−1}``. The Euclidean Hessian is dense (``(nd)²`` entries).
    """
    n, d = x.shape
    fn = lambda flat: energy(kernel, flat.reshape(n, d))  # noqa: E731
    e, grad = jax.value_and_grad(fn)(x.reshape(-1))
    grad = grad.reshape(n, d)
    hess = jax.hessian(fn)(x.reshape(-1)).reshape(n, d, n, d)
    bases = tangent_bases(x)
    block = jnp.einsum("iak,iajb,jbl->ikjl", bases, hess, bases).reshape(n * (d - 1), n * (d - 1))
    radial = jnp.repeat(jnp.sum(x * grad, axis=1), d - 1)
    return e, project(x, grad), block - jnp.diag(radial)


_landscape_jit = jax.jit(_landscape)


@jax.jit
def riemannian_gradient(kernel: Kernel, x: jax.Array) -> jax.Array:
    """``P_{x_i} ∇_{x_i} E`` for every particle, ``(n, d)`` (``∇E`` by ``jax.grad``)."""
    return project(x, jax.grad(lambda y: energy(kernel, y))(x))


def riemannian_hessian(kernel: Kernel, x) -> jax.Array:
    """The Riemannian Hessian of ``E`` on ``(S^{d−1})^n`` at ``x`` in per-particle tangent bases
    (:func:`tangent_bases`), a symmetric ``(n(d−1), n(d−1))`` matrix. Small ``n`` only."""
    return _landscape_jit(kernel, jnp.asarray(x, dtype=jnp.float64))[2]


def certify(kernel: Kernel, x) -> Certificate:
    """Energy, gap to :func:`energy_max`, Riemannian gradient norm and Hessian spectrum at ``x``."""
    x = jnp.asarray(x, dtype=jnp.float64)
    if x.ndim != 2 or x.shape != (kernel.n, kernel.gauge.d):
        raise ValueError(
            f"certify: `x` must have shape (n, d) = ({kernel.n}, {kernel.gauge.d}); got {tuple(x.shape)}."
        )
    e, gradient, hessian = _landscape_jit(kernel, x)
    e = float(e)
    e_max = energy_max(kernel)
    hessian = np.asarray(hessian)
    eigenvalues = np.linalg.eigvalsh((hessian + hessian.T) / 2.0)
    return Certificate(
        energy=e,
        energy_max=e_max,
        energy_gap=None if e_max is None else (e_max - e) / e_max,
        gradient_norm=float(jnp.linalg.norm(gradient)),
        hessian_top=float(eigenvalues[-1]),
        hessian_eigenvalues=eigenvalues,
    )


__all__ = [
    "Certificate",
    "ClusterPrediction",
    "EquiangularFlow",
    "LatitudeCircle",
    "SpectralCriterion",
    "antipodal_energy",
    "antipodal_pair",
    "axis_rates",
    "certify",
    "circle_energy",
    "circle_normal_rate",
    "collapse_rates",
    "d3_crossing",
    "dirac_energy",
    "energy_max",
    "first_token_rate",
    "equiangular_energy",
    "equiangular_layer_norm",
    "equiangular_layer_norm_rates",
    "equiangular_orbit_residual",
    "equiangular_rho",
    "leading_eigenspace",
    "great_circle",
    "great_circle_arc",
    "latitude_circle",
    "orbit_configuration",
    "prompt_clusters",
    "riemannian_gradient",
    "second_token_angle",
    "source_rate",
    "riemannian_hessian",
    "spectral_bound",
    "spectral_criterion",
    "tangent_bases",
]
