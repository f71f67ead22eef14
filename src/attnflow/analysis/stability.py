"""Linear stability of the uniform state on the circle ``S^1``: closed form, and fits of snapshots.

On ``S^1 ⊂ R^2`` with ``Q = I``, ``w = 1`` and the exp profile, write ``x_i = (cos θ_i, sin θ_i)``.
The USA field of ``dynamics.py`` (``dx_i/dt = P_{x_i}((c/n) Σ_j e^{β⟨x_i,x_j⟩} x_j)``) reads

    dθ_i/dt = (c/n) Σ_j K(θ_j − θ_i),      K(δ) = e^{β cos δ} sin δ = −(1/β) d/dδ e^{β cos δ}.

Around the uniform state ``θ_i = φ_i = 2πi/n`` (an equilibrium) a displacement ``ε_i`` evolves by
``dε_i/dt = (c/n) Σ_j K'(φ_j − φ_i)(ε_j − ε_i)``, a circulant operator. With
``e^{β cos δ} = Σ_m I_m(β) e^{imδ}`` one has ``K'(δ) = (1/β) Σ_m m² I_m(β) e^{imδ}``, so the mode
``ε_i = sin(kφ_i)`` (or ``cos``) grows at

    λ_k(n) = (c/β) [ Σ_{l∈Z} (k + ln)² I_{k+ln}(β) − Σ_{l∈Z} (ln)² I_{ln}(β) ]     (n particles)
    λ_k    = c k² I_k(β) / β                                                     (n → ∞)

— the paper's formula for ``c = 1``, no missing constant. The dominant mode at ``β = 5`` is ``k = 3``.

:func:`perturbed_circle` is the initial data of a measurement and :func:`fit_growth_rates` fits the
exponential growth of each mode amplitude on its snapshots; the simulation itself is
:func:`attnflow.workflows.growth.measure_growth_rates` (this module never simulates).
"""

from __future__ import annotations

import numpy as np
import scipy.special


def circle_growth_rate(k, beta: float, *, c: float = 1.0, n: int | None = None):
    """Growth rate of the angular mode ``k`` of the uniform state on ``S^1``.

    ``n=None``: the mean-field rate ``c k² I_k(β)/β``. With ``n``: the exact rate of the
    ``n``-particle circulant linearisation (aliases ``k + ln`` included; it tends to the mean-field
    rate super-exponentially fast in ``n``).
    """
    k = np.asarray(k, dtype=np.float64)
    if n is None:
        return c * k**2 * scipy.special.iv(k, beta) / beta
    if n < 2:
        raise ValueError(f"circle_growth_rate: `n` must be >= 2; got {n!r}.")
    l_max = int(np.ceil((abs(beta) + 60.0) / n)) + 2  # I_m(β) < 1e-30 beyond |m| ≈ β + 60
    ls = np.arange(-l_max, l_max + 1, dtype=np.float64)
    m = k[..., None] + ls * n
    zero = (ls * n) ** 2 * scipy.special.iv(ls * n, beta)
    return c / beta * (np.sum(m**2 * scipy.special.iv(m, beta), axis=-1) - np.sum(zero))


def dominant_mode(beta: float, *, k_max: int | None = None) -> int:
    """The ``k ≥ 1`` with the largest mean-field rate ``k² I_k(β)`` (ties: the smallest ``k``)."""
    k_max = int(np.ceil(2.0 * beta)) + 10 if k_max is None else int(k_max)
    ks = np.arange(1, k_max + 1)
    return int(ks[np.argmax(circle_growth_rate(ks, beta))])


def uniform_circle(n: int, *, displacement=None) -> np.ndarray:
    """``n`` points ``(cos θ_i, sin θ_i)``, ``θ_i = 2πi/n + displacement_i`` (default 0)."""
    phi = 2.0 * np.pi * np.arange(n) / n
    theta = phi if displacement is None else phi + np.asarray(displacement, dtype=np.float64)
    return np.stack([np.cos(theta), np.sin(theta)], axis=1)


def mode_amplitudes(x, ks) -> np.ndarray:
    """``a_k = (2/n) Σ_i ε_i sin(kφ_i)`` with ``ε_i = θ_i − 2πi/n`` wrapped to ``(−π, π]``.

    ``x (n, 2)`` or a stack ``(T, n, 2)``; returns ``(len(ks),)`` or ``(T, len(ks))``.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-2]
    phi = 2.0 * np.pi * np.arange(n) / n
    eps = np.angle(np.exp(1j * (np.arctan2(x[..., 1], x[..., 0]) - phi)))
    basis = np.sin(np.outer(np.asarray(ks, dtype=np.float64), phi))  # (K, n)
    return (2.0 / n) * eps @ basis.T


def perturbed_circle(n: int, ks, *, eps: float) -> np.ndarray:
    """The uniform circle displaced by ``eps · Σ_k sin(kφ_i)``: all the modes ``ks`` at once (they
    are decoupled to first order, and the quadratic coupling is ``O(eps)`` relative)."""
    ks = np.asarray(ks, dtype=int)
    displacement = eps * np.sum(np.sin(np.outer(ks, 2.0 * np.pi * np.arange(n) / n)), axis=0)
    return uniform_circle(n, displacement=displacement)


def fit_growth_rates(ts, xs, ks) -> np.ndarray:
    """Growth rates of the modes ``ks`` fitted on snapshots ``xs (T, n, 2)`` at times ``ts``: the
    least-squares slope of ``log |a_k(t)|`` (:func:`mode_amplitudes`). Meaningful in the linear
    regime (amplitudes small all along)."""
    amplitudes = mode_amplitudes(xs, ks)  # (T, K)
    return np.array([np.polyfit(np.asarray(ts), np.log(np.abs(a)), 1)[0] for a in amplitudes.T])


__all__ = [
    "circle_growth_rate",
    "dominant_mode",
    "fit_growth_rates",
    "mode_amplitudes",
    "perturbed_circle",
    "uniform_circle",
]
