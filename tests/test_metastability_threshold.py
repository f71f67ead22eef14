"""The noisy model's uniform state (workflows.noise_threshold): the threshold in κ measured by
simulation against κ_c = β / I_1(β), the zero of the linear rate k² I_k(β)/β − k²/κ."""

import numpy as np
import pytest
import scipy.special

from attnflow.analysis.stability import perturbed_circle
from attnflow.workflows.noise_threshold import (
    density_mode,
    predicted_rate,
    predicted_threshold,
    threshold_rows,
    threshold_study,
)


def test_predicted_rate_and_threshold():
    beta = 2.0
    kappa_c = predicted_threshold(beta)
    assert kappa_c == pytest.approx(beta / scipy.special.iv(1, beta), rel=1e-15)
    assert predicted_rate(1, beta, kappa_c) == pytest.approx(0.0, abs=1e-14)
    # the mode k = 1 turns unstable first: the others are still stable at kappa_c
    assert all(predicted_rate(k, beta, kappa_c) < 0 for k in (2, 3, 4))
    assert predicted_threshold(beta, k=2) > kappa_c


def test_density_mode_of_a_displaced_grid():
    """θ_j = φ_j + ε sin φ_j: ρ_1 = −J_1(ε) (Jacobi–Anger; the alias J_{n−1}(ε) ~ ε^63 is below round-off)."""
    x = perturbed_circle(64, [1], eps=0.05)
    assert density_mode(x, 1) == pytest.approx(-scipy.special.jv(1, 0.05), abs=1e-15)
    assert density_mode(np.stack([x, x]), 1).shape == (2,)


@pytest.mark.slow
def test_measured_threshold_matches_the_linear_rates():
    """β = 1, n = 64, 64 noise seeds, κ = (0.8, 0.9, 1.1, 1.25) κ_c: the zero of the fitted line
    λ = a + b/κ within 8% of κ_c = β/I_1(β) (rates to ~±0.02 at n × seeds = 4096: ~4% on κ_c, and
    the noise scheme's O(dt) weak bias, ~2% here)."""
    study = threshold_study((1.0,), n=64, seeds=64, kappa_factors=(0.8, 0.9, 1.1, 1.25))
    (point,) = study.points
    assert point.kappa_predicted == pytest.approx(1.0 / scipy.special.iv(1, 1.0))
    assert abs(point.kappa_measured / point.kappa_predicted - 1.0) <= 0.08
    # below the threshold the mode decays, above it grows
    assert point.rates[0] < 0 < point.rates[-1]
    assert point.fit.r2 >= 0.9  # the rates lie on a line in 1/κ
    assert point.fit.slope == pytest.approx(-1.0, abs=0.3)  # b = −k²: the diffusion's rate
    rows = threshold_rows(study)
    assert [r["kappa"] for r in rows] == pytest.approx(point.kappas)
