"""The shape class beside n_clusters in a run's metrics (the summary of its final snapshot)."""

import jax.numpy as jnp
import numpy as np

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
