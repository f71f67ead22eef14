"""The shape class beside n_clusters in a run's metrics (the summary of its final snapshot)."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.analysis.shapes import classify_shape, shape_features
from attnflow.analysis.summary import DESCRIPTIONS, summarize
from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile

N = 64


def _kernel(gauge) -> Kernel:
    return Kernel(gauge=gauge, factor=factors.NoFactor(N), profile=make_profile("exp", beta=1.0))


def test_a_latitude_circle_is_one_cluster_and_a_small_circle_and_its_gauge_frame_a_dirac():
    # RoPE about e_3 by angle 2*pi*i/n: Q_i^T p for one point p puts x on a latitude circle,
    # while the gauge frame u_i = Q_i x_i = p is collapsed.
    rope = gauges.make_rope(np.arange(N), 3, gauges.rope_frequencies(3, n=N))
    p = np.array([0.6, 0.0, 0.8])
    x = np.asarray(rope.apply_transpose(jnp.tile(p, (N, 1))))
    summary = summarize(_kernel(rope), [0.0], x[None])
    assert summary["n_clusters"] == 1  # neighbours 2*pi*0.6/64 < theta_c apart: one chain
    assert summary["mean_cosine"] < 0.7  # yet far from collapsed (0.64 = x_3^2 on this circle)
    assert summary["shape"] == "small_circle"
    assert summary["gauge_shape"] == "dirac"
    assert "a circle" in DESCRIPTIONS["n_clusters"]


def test_shape_is_null_off_the_two_sphere_and_gauge_shape_needs_a_gauge():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    summary = summarize(_kernel(gauges.IdentityGauge(N, 4)), [0.0], x[None])
    assert summary["shape"] is None
    assert "gauge_shape" not in summary
    x3 = x[:, :3] / np.linalg.norm(x[:, :3], axis=1, keepdims=True)
    assert summarize(_kernel(gauges.IdentityGauge(N, 3)), [0.0], x3[None])["shape"] == "clusters"


def test_two_tokens_have_a_shape():
    # two points always lie on a great circle through them: the third principal axis exists for n = 2
    x = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert shape_features(x)["planarity"] < 1e-12
    assert classify_shape(x) in ("clusters", "great_circle", "arc", "antipodal_arcs")
    assert classify_shape(np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])) == "dirac"


def test_off_the_two_sphere_the_summary_says_why_shape_is_undefined_and_what_theta_c_means():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    summary = summarize(_kernel(gauges.IdentityGauge(N, 64)), [0.0], x[None])
    assert summary["shape"] is None
    assert "S^2 only" in summary["methods"]["shape"] and "d = 64" in summary["methods"]["shape"]
    assert "S^2 only" in DESCRIPTIONS["shape"]
    clusters = summary["methods"]["n_clusters"]
    assert "theta_c = 0.1 rad" in clusters
    assert re.search(r"nearest neighbours about 1\.\d+ rad apart", clusters)
    assert summary["n_clusters"] == N  # a spread state in d = 64: every token its own cluster
    x3 = x[:, :3] / np.linalg.norm(x[:, :3], axis=1, keepdims=True)
    on_s2 = summarize(_kernel(gauges.IdentityGauge(N, 3)), [0.0], x3[None])["methods"]
    assert (
        "shape" not in on_s2 and on_s2["n_clusters"] == "chains of tokens at angles below theta_c = 0.1 rad"
    )


def test_the_uniform_neighbour_angle_matches_sampled_tokens():
    from attnflow.analysis.summary import uniform_neighbour_angle

    rng = np.random.default_rng(0)
    for n, d in ((256, 3), (128, 16)):
        medians = []
        for _ in range(20):
            x = rng.normal(size=(n, d))
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            cos = x @ x.T
            np.fill_diagonal(cos, -1.0)
            medians.append(np.median(np.arccos(np.clip(cos.max(axis=1), -1, 1))))
        # the median nearest-neighbour angle of a token; the tokens' angles are dependent, so the
        # sampled median of 20 draws agrees within 10 %
        assert abs(np.mean(medians) / uniform_neighbour_angle(n, d) - 1.0) < 0.1, (n, d)
    assert uniform_neighbour_angle(2, 3) == pytest.approx(np.pi / 2, rel=1e-3)
