"""Particles against the density on S^1 × labels (analysis.density_distance): the distances' closed
forms, and the particle law converging to the density like n^{-1/2} on a labelled setting (RoPE with
the Toeplitz cosine factor), the slope measured."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from attnflow.analysis import density_distance as dd
from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import density_circle as dc
from attnflow.numerics.density_solve import integrate
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4


def _von_mises(grid, kappa, centre):
    theta = dc.grid_angles(grid)
    return np.exp(kappa * (np.cos(theta - centre) - 1.0)) / (2.0 * np.pi * scipy.special.i0e(kappa))


def test_cdf_of_the_interpolant_is_exact():
    grid = 32
    f = _von_mises(grid, 2.0, 1.0)
    theta, cdf = dd.density_cdf(f, fine=1024)
    # the exact CDF of a von Mises law, F(θ) − F(0) = ∫_0^θ f (quadrature of the analytic density)
    fine = np.linspace(0.0, theta[300], 20001)
    exact = np.trapezoid(np.exp(2.0 * (np.cos(fine - 1.0) - 1.0)), fine) / (
        2.0 * np.pi * scipy.special.i0e(2.0)
    )
    assert cdf[0, 300] == pytest.approx(exact, abs=1e-9)  # trapezoid error on 20001 points ~1e-10
    assert cdf[0, 0] == 0.0 and np.all(np.diff(cdf[0]) > 0)


def test_circle_w1_closed_forms():
    grid = 64
    uniform = np.full(grid, 1.0 / (2.0 * np.pi))
    # a Dirac against the uniform law: the mean arc length to a point, π/2
    assert dd.circle_w1(np.zeros(10), uniform) == pytest.approx(np.pi / 2.0, abs=1e-4)  # fine-grid O(2π/FINE)
    # two Diracs at 0 and π (half each) against the uniform law: π/4
    assert dd.circle_w1(np.array([0.0, np.pi]), uniform) == pytest.approx(np.pi / 4.0, abs=1e-4)
    # many stratified samples of a law: close to it (the quantile-cell samples are at distance <~ 1/n)
    f = _von_mises(grid, 3.0, 2.0)
    samples = dd.sample_density(f, 4000, np.random.default_rng(0), stratified=True)[0]
    assert dd.circle_w1(samples, f) <= 2e-3


def test_weighted_w1_1d_and_sliced_against_the_quadrature():
    assert dd.weighted_w1_1d([0.0], [1.0], [1.0, 3.0], [1.0, 1.0]) == pytest.approx(2.0)
    assert dd.weighted_w1_1d([0.0, 1.0], [3.0, 1.0], [0.0, 1.0], [1.0, 1.0]) == pytest.approx(0.25)
    grid, count = 64, 4
    labels = dc.position_labels(count)
    f = np.stack([_von_mises(grid, 2.0, c) for c in (0.0, 1.5, 3.0, 4.5)])
    rng = np.random.default_rng(1)
    per_label = 2000
    theta = np.concatenate(dd.sample_density(f, per_label, rng, stratified=True))
    index = np.repeat(np.arange(count), per_label)
    near = dd.sliced_w1_density(theta, index, f, labels.nodes, labels.weights)
    shifted = dd.sliced_w1_density(theta + 0.5, index, f, labels.nodes, labels.weights)
    assert near <= 3e-3  # the stratified samples' own W1 ~1/n and the refined grid's 2π/(4·64)/8
    assert shifted >= 30 * near  # a rotation by 0.5 is seen


def test_validation_messages():
    with pytest.raises(ValueError, match="every label needs particles"):
        dd.labelled_circle_w1(np.zeros(3), np.zeros(3, int), np.ones((2, 16)), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="`f` must be a finite"):
        dd.circle_w1(np.zeros(3), np.full(16, np.nan))
    with pytest.raises(ValueError, match="`f` must be non-negative"):
        dd.sample_density(np.cos(dc.grid_angles(16)), 4, np.random.default_rng(0))


# --- the particle law converges to the density ---------------------------------------------------

GRID, LABELS, OMEGA, BETA, T_END, DT = 128, 4, 2.0 * np.pi, 1.0, 0.5, 0.05


def _setting():
    labels = dc.position_labels(LABELS)
    profile = make_profile("exp", beta=BETA)
    factor = factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(OMEGA))
    field = dc.make_circle_field(
        profile, grid=GRID, labels=labels, gauge=dc.rope_circle_gauge(labels, OMEGA), factor=factor
    )
    # a label-dependent initial law: a von Mises bump whose centre turns with the label
    f0 = np.stack([_von_mises(GRID, 1.0, 2.0 * np.pi * s) for s in np.asarray(labels.nodes)])
    return labels, profile, field, f0


@functools.lru_cache(maxsize=1)
def _density_at_t_end():
    labels, _, field, f0 = _setting()
    _, states, codes = jax.jit(
        lambda s: integrate(
            field,
            s,
            integrator=RK4(retraction="none"),
            dt=DT / 5,
            steps_per_snapshot=round(5 * T_END / DT),
            snapshots=1,
            status=lambda x: dc.status_code(field, x),
        )
    )(dc.CircleDensity(jnp.asarray(f0)))
    assert int(codes[-1]) == dc.DensityStatus.ok.code
    return np.asarray(states.f[-1])


@functools.partial(jax.jit, static_argnames=("steps",))
def _particles_rk4(kernel, xs, *, steps):
    """RK4 then renormalise, ``steps`` steps of ``DT``, for a batch of initial states ``xs (S, n, 2)``."""
    field = jax.vmap(make_vector_field(kernel))

    def step(x, _):
        k1 = field(x)
        k2 = field(x + 0.5 * DT * k1)
        k3 = field(x + 0.5 * DT * k2)
        k4 = field(x + DT * k3)
        y = x + DT / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        return y / jnp.linalg.norm(y, axis=-1, keepdims=True), None

    return jax.lax.scan(step, xs, None, length=steps)[0]


def _particle_distances(n, seeds, batch):
    """``labelled_circle_w1`` of ``seeds`` particle runs of ``n`` tokens (``batch`` runs at a time)."""
    labels, profile, _, f0 = _setting()
    per_label = n // LABELS
    index = np.repeat(np.arange(LABELS), per_label)
    xi = np.asarray(labels.nodes)[index]
    kernel = Kernel(
        gauges.make_rope(xi, 2, [OMEGA]),
        factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(OMEGA)),
        profile,
    )
    theta0 = np.stack(
        [
            np.concatenate(dd.sample_density(f0, per_label, np.random.default_rng(seed)))
            for seed in range(seeds)
        ]
    )
    xs = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
    ends = np.concatenate(
        [
            np.asarray(_particles_rk4(kernel, jnp.asarray(xs[i : i + batch]), steps=round(T_END / DT)))
            for i in range(0, seeds, batch)
        ]
    )
    f_end = _density_at_t_end()
    theta = np.arctan2(ends[..., 1], ends[..., 0])
    return [dd.labelled_circle_w1(t, index, f_end, labels.weights) for t in theta]


def _slope(sizes, seeds, batch):
    distances = [np.mean(_particle_distances(n, seeds, batch)) for n in sizes]
    return np.polyfit(np.log(sizes), np.log(distances), 1)[0], distances


def test_particles_approach_the_density_like_n_to_the_minus_half():
    """RoPE (``α = 2πξ``) with the Toeplitz cosine on 4 label nodes, β = 1, t = 0.5: the particle law
    (iid initial angles from each label's slice) against the density, W1 per label averaged over the
    labels, mean of 8 seeds per n. RK4 at dt = 0.05 errs ~1e-6, the grid not at all: the distance is
    the sampling noise carried by the flow, ``~ n^{-1/2}``."""
    slope, distances = _slope([48, 192, 768], seeds=8, batch=8)  # dense particle sums: quick to compile
    assert distances[-1] < distances[0] / 2.5  # a 16-fold n: 4-fold for n^{-1/2}
    assert -0.65 <= slope <= -0.35  # n^{-1/2} within the scatter of 8 seeds (the slow test: ±0.1)


@pytest.mark.slow
def test_particles_approach_the_density_like_n_to_the_minus_half_to_4096():
    slope, distances = _slope([256, 1024, 4096], seeds=8, batch=1)
    print("n^slope", slope, distances)
    assert -0.6 <= slope <= -0.4  # 8 seeds per n over a 16-fold range of n, from 64 tokens per label
