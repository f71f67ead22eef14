"""The noisy model's uniform state: its stability threshold in κ, predicted and measured.

On the circle ``S^1`` (d = 2, no gauge, no factor, exp profile, plain time scale ``c = 1``) with
noise ``1/κ`` (the diffusion ``sqrt(2/κ) P_x dW``), the mean-field equation linearised at the
uniform density moves the density's Fourier mode ``ρ_k = (1/n) Σ_j e^{ikθ_j}`` at the rate

    λ_k(κ) = k² I_k(β)/β − k²/κ        (the drift's rate, less the diffusion's),

so the uniform state is stable if and only if ``κ < κ_c = β / I_1(β)`` (``I_k(β)`` decreases in
``k``: the mode ``k = 1`` goes first) — :func:`predicted_threshold`.

Measured (:func:`measured_rate`): ``n`` particles on the uniform grid displaced by
``±ε sin(kφ_i)``; the two signs are run with the same noise (the same keys) for each of ``seeds``
noise seeds, and the response ``r(t)``, the mean over seeds of ``(ρ_k⁺ − ρ_k⁻)/2`` along the
initial one, cancels the noise's own O(1/√n) fluctuation of ``ρ_k`` to first order; the slope of
``log r(t)`` over ``[0, t_end]`` is the measured rate. The rates at several κ lie on a line in
``1/κ`` (``λ = a + b/κ``); its zero is the measured threshold ``κ_c = −b/a``
(:func:`threshold_study`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from attnflow.analysis.plateaus import LineFit, fit_line
from attnflow.analysis.stability import circle_growth_rate, perturbed_circle
from attnflow.io.config import config_from_dict
from attnflow.numerics.solve import solve
from attnflow.workflows.build import build

__all__ = [
    "ThresholdPoint",
    "ThresholdStudy",
    "density_mode",
    "measured_rate",
    "predicted_rate",
    "predicted_threshold",
    "threshold_rows",
    "threshold_study",
]

KAPPA_FACTORS = (0.7, 0.8, 0.9, 1.1, 1.2, 1.35)  # the κ of a sweep, in units of the predicted κ_c
EPS = 0.05  # displacement amplitude: ρ_k(0) ≈ kε/2, small enough for the linear regime
RATE_HORIZON = 1.5  # t_end = RATE_HORIZON / (I_k(β)/β): |λ| t_end <= 1 down to κ = 0.6 κ_c
STEPS_PER_TIME = 100  # dt = 1 / (STEPS_PER_TIME · I_k(β)/β): the scheme's O(dt) weak bias ~ 2%


def predicted_rate(k: int, beta: float, kappa: float) -> float:
    """``λ_k(κ) = k² I_k(β)/β − k²/κ``, the linear rate of the density mode ``k``."""
    return float(circle_growth_rate(k, beta)) - k * k / kappa


def predicted_threshold(beta: float, *, k: int = 1) -> float:
    """The κ at which the mode ``k`` turns unstable, ``β / I_k(β)`` (``k = 1``: the uniform state's)."""
    return beta / float(scipy.special.iv(k, beta))


def density_mode(xs, k: int) -> np.ndarray:
    """``ρ_k = (1/n) Σ_j e^{ikθ_j}`` of points ``xs (..., n, 2)`` on the circle: shape ``(...)``."""
    xs = np.asarray(xs, dtype=np.float64)
    return np.mean(np.exp(1j * k * np.arctan2(xs[..., 1], xs[..., 0])), axis=-1)


def measured_rate(
    beta: float, kappa: float, *, k: int = 1, n: int = 256, seeds: int = 16, eps: float = EPS
) -> tuple[float, np.ndarray, np.ndarray]:
    """The measured rate of the density mode ``k`` at ``(β, κ)`` (module doc), with the times and
    the response ``r(t)`` it was fitted on."""
    scale = float(circle_growth_rate(k, beta)) / (k * k)  # I_k(β)/β = 1/κ_c of the mode
    t_end = RATE_HORIZON / scale
    steps = int(round(RATE_HORIZON * STEPS_PER_TIME))
    config = config_from_dict({
        "model": {"n": n, "d": 2, "beta": beta, "noise": 1.0 / kappa},
        "solver": {"method": "rk4", "dt": t_end / steps, "t_end": t_end, "save_every": t_end / 10},
    })  # fmt: skip
    sim = build(config)
    key = jax.random.key(0)
    runs = []
    for sign in (1.0, -1.0):
        x0 = jnp.asarray(np.broadcast_to(perturbed_circle(n, [k], eps=sign * eps), (seeds, n, 2)))
        trajectory = solve(sim.field, x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                           save_every=sim.save_every, noise=sim.noise, key=key, workers=1)  # fmt: skip
        runs.append(density_mode(trajectory.xs, k).mean(axis=1))  # (T,) mean over seeds
    difference = (runs[0] - runs[1]) / 2.0
    response = np.real(difference * np.conj(difference[0])) / abs(difference[0])
    ts = np.asarray(trajectory.ts)
    if np.any(response <= 0):
        raise ValueError(
            f"measured_rate: the response must stay positive (above the noise); got {response.min():.3g} at "
            f"beta = {beta!r}, kappa = {kappa!r}. Use more `seeds` or a larger `n`."
        )
    return float(np.polyfit(ts, np.log(response), 1)[0]), ts, response


@dataclasses.dataclass(frozen=True)
class ThresholdPoint:
    beta: float
    k: int
    kappas: tuple[float, ...]
    rates: tuple[float, ...]  # measured
    predicted: tuple[float, ...]  # λ_k(κ)
    fit: LineFit  # rate against 1/κ
    kappa_measured: float  # −b/a of the fit
    kappa_predicted: float  # β / I_k(β)


@dataclasses.dataclass(frozen=True)
class ThresholdStudy:
    points: tuple[ThresholdPoint, ...]
    n: int
    seeds: int


def threshold_study(
    betas: Sequence[float] = (1.0, 2.0, 4.0),
    *,
    k: int = 1,
    n: int = 256,
    seeds: int = 16,
    kappa_factors: Sequence[float] = KAPPA_FACTORS,
) -> ThresholdStudy:
    """At each β, the measured rates at ``κ = f · κ_c`` (``f`` in ``kappa_factors``), the line
    ``λ = a + b/κ`` through them and its zero, against the prediction ``κ_c = β / I_k(β)``."""
    points = []
    for beta in betas:
        kappa_c = predicted_threshold(beta, k=k)
        kappas = tuple(f * kappa_c for f in kappa_factors)
        rates = tuple(measured_rate(beta, kappa, k=k, n=n, seeds=seeds)[0] for kappa in kappas)
        fit = fit_line([1.0 / kappa for kappa in kappas], rates)
        points.append(
            ThresholdPoint(
                beta=float(beta), k=k, kappas=kappas, rates=rates,
                predicted=tuple(predicted_rate(k, beta, kappa) for kappa in kappas), fit=fit,
                kappa_measured=-fit.slope / fit.intercept, kappa_predicted=kappa_c,
            )
        )  # fmt: skip
    return ThresholdStudy(tuple(points), n, seeds)


def threshold_rows(study: ThresholdStudy) -> list[dict]:
    """One row per (β, κ): the measured and predicted rates, and each β's thresholds."""
    return [
        {"beta": p.beta, "k": p.k, "kappa": kappa, "rate_measured": rate, "rate_predicted": pred,
         "kappa_c_measured": p.kappa_measured, "kappa_c_predicted": p.kappa_predicted}
        for p in study.points
        for kappa, rate, pred in zip(p.kappas, p.rates, p.predicted, strict=True)
    ]  # fmt: skip
