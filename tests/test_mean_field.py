"""Sliced W1 distances (closed forms) and the mean-field convergence workflow at small n."""

import math

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

from attnflow.analysis.distances import label_phase, labelled_points, sliced_w1, w1_1d
from attnflow.workflows import mean_field


def test_w1_1d_closed_form_for_samples_of_different_sizes():
    # quantile functions 0|1 and 0|0.5|1 differ by 0.5 on (1/3, 2/3]: W1 = 1/6
    assert w1_1d(np.array([1.0, 0.0]), np.array([0.5, 1.0, 0.0])) == pytest.approx(1 / 6, rel=1e-15)


def test_w1_1d_matches_scipy_on_random_samples():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(1000), rng.exponential(size=377)
    assert w1_1d(a, b) == pytest.approx(wasserstein_distance(a, b), rel=1e-12)


def test_w1_1d_rejects_an_empty_sample():
    with pytest.raises(ValueError, match=r"w1_1d: samples must be non-empty; got sizes 0 and 2\."):
        w1_1d(np.array([]), np.array([1.0, 2.0]))


def test_sliced_w1_of_a_translation_is_the_mean_projected_shift():
    # every projection of p + v is the projection of p shifted by <theta, v>, so the sliced distance
    # is |v| E|theta_1|, E|theta_1| = Gamma(k/2) / (sqrt(pi) Gamma((k+1)/2)) for uniform directions of R^k
    k = 5
    p = np.random.default_rng(0).standard_normal((200, k))  # any cloud: each projection shifts exactly
    v = np.array([0.3, -0.1, 0.2, 0.0, 0.4])
    expected = np.linalg.norm(v) * math.gamma(k / 2) / (math.sqrt(math.pi) * math.gamma((k + 1) / 2))
    # 20000 directions: the Monte Carlo mean is within ~1 % of its expectation
    assert sliced_w1(p, p + v, directions=20000) == pytest.approx(expected, rel=0.02)
    assert sliced_w1(p, p) == 0.0


def test_sliced_w1_rejects_clouds_of_different_dimension():
    with pytest.raises(ValueError, match=r"sliced_w1: point clouds must be \(m, k\) and \(l, k\)"):
        sliced_w1(np.zeros((3, 4)), np.zeros((3, 5)))


@pytest.mark.parametrize(
    ("xi", "expected"),
    [
        (np.arange(8.0), np.arange(8) / 8),  # positions 0..n-1 -> i/n
        (np.arange(8) / 8, np.arange(8) / 8),  # unit spacing is already i/n
        (np.array([0, 1, 2, 3, 0, 1]), np.array([0, 1, 2, 3, 0, 1]) / 4),  # prompt ids k/K
        (np.zeros(4), np.zeros(4)),
    ],
)
def test_label_phase(xi, expected):
    np.testing.assert_allclose(label_phase(xi), expected, rtol=0, atol=1e-15)


def test_labelled_points_embed_the_label_on_a_circle():
    points = labelled_points(np.arange(4.0), np.eye(3)[[0, 1, 2, 0]])
    np.testing.assert_allclose(points[:, :2], [[1, 0], [0, 1], [-1, 0], [0, -1]], atol=1e-15)
    np.testing.assert_array_equal(points[:, 2:], np.eye(3)[[0, 1, 2, 0]])


def test_initial_samples_of_different_sizes_are_independent():
    from attnflow.core.gauges import IdentityGauge

    small = mean_field.initial_state(IdentityGauge(n=4, d=3), np.arange(4.0), 3, seed=0, sigma=0.6, drift=0.5)
    large = mean_field.initial_state(IdentityGauge(n=8, d=3), np.arange(8.0), 3, seed=0, sigma=0.6, drift=0.5)
    np.testing.assert_allclose(np.linalg.norm(large, axis=1), 1.0, rtol=1e-15)
    assert not np.allclose(small, large[:4])


@pytest.mark.slow
def test_the_empirical_law_converges_with_n():
    """E3 from the off-symmetry initial law, at t = 2: independent samples at n = 2048 are closer to
    each other than samples at n = 128 are to them (expected ratio sqrt(17/2) = 2.9 for distances
    that scale as n^{-1/2}; one pair fluctuates by a factor 2, so three seeds are averaged)."""
    small = [mean_field.run_setting("E3", "", 128, t_end=2.0, seed=s) for s in range(3)]
    large = [mean_field.run_setting("E3", "", 2048, t_end=2.0, seed=s) for s in range(3)]
    assert all(law.status == "ok" for law in small + large)
    cloud = [[labelled_points(law.xi, law.x) for law in laws] for laws in (small, large)]
    across = np.mean([sliced_w1(cloud[0][s], cloud[1][s]) for s in range(3)])
    within = np.mean([sliced_w1(cloud[1][s], cloud[1][(s + 1) % 3]) for s in range(3)])
    assert within < across / 1.5, (within, across)
