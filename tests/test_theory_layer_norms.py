"""The equiangular reduction under each layer norm (attnflow.analysis.theory.equiangular_layer_norm,
E15's closed form): its right-hand side is the particle field's at equiangular states, its solution
follows an independent NumPy solve of the particles (the definitions of pre-, peri-LN and nGPT written
out again here), the gauge frame of a gauged field obeys it under every norm, its asymptotic speeds
are the stated ones, and the orbit's distance has its closed form."""

import numpy as np
import pytest

from attnflow.analysis import theory
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.layer_norms import LayerNormField

NORMS = theory.LAYER_NORMS


def _field(n, d, *, beta, c_scale="plain", normalization="usa", layer_norm="post", alpha=1.0, q=None):
    gauge = gauges.IdentityGauge(n=n, d=d) if q is None else gauges.DenseGauge(q=q)
    kernel = Kernel(
        gauge=gauge, factor=factors.NoFactor(n=n), profile=make_profile(beta=beta, time_scale=c_scale)
    )
    layer = make_vector_field(kernel, normalization=normalization)
    return layer if layer_norm == "post" else LayerNormField(layer, layer_norm, alpha=alpha)


def _rates_of(field, x, r, layer_norm):
    """``(dρ/dt, dr/dt)`` of equiangular tokens read off the field's velocity at ``x (n, d)``, radius
    ``r``."""
    radial = layer_norm in ("pre", "peri")
    v = np.asarray(field(x * r if radial else x))
    radial_speed = np.sum(x * v, axis=1)
    dx = (v - radial_speed[:, None] * x) / r if radial else v
    off = ~np.eye(len(x), dtype=bool)
    drho = (dx @ x.T + x @ dx.T)[off]
    assert np.ptp(drho) < 1e-12 and (not radial or np.ptp(radial_speed) < 1e-12)  # equiangular stays so
    return float(np.mean(drho)), float(np.mean(radial_speed)) if radial else 0.0


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize("layer_norm", NORMS)
def test_the_rates_are_the_particle_field_at_equiangular_states(layer_norm, normalization):
    """The derivation: at equiangular states (several ρ, r, β), ``dρ/dt`` and ``dr/dt`` read off
    attnflow's field equal ``equiangular_layer_norm_rates`` (round-off: 1e-12 relative)."""
    n, alpha = 5, 1.7
    for rho, r, beta in [(0.1, 1.0, 1.0), (-0.2, 2.5, 0.5), (0.9, 7.0, 3.0)]:
        x = np.asarray(sphere.equiangular(n, n, rho))
        field = _field(n, n, beta=beta, normalization=normalization, layer_norm=layer_norm, alpha=alpha)
        measured = _rates_of(field, x, r, layer_norm)
        expected = theory.equiangular_layer_norm_rates(
            1.0 - rho, r, n=n, beta=beta, normalization=normalization, layer_norm=layer_norm, alpha=alpha
        )
        np.testing.assert_allclose(measured, expected, rtol=1e-12, atol=1e-14)


def _attention(x, beta, c, normalization):
    logits = beta * x @ x.T
    if normalization == "usa":
        return c / len(x) * np.exp(logits) @ x
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ x


def _particles(state, layer_norm, beta, c, normalization, alpha):
    """The definitions, written out again: post ``P_x A``; pre ``dz/dt = A``; peri ``A/|A|``;
    nGPT ``α P_x(A/|A|)``; ``x = z/|z|``."""
    x = state / np.linalg.norm(state, axis=1, keepdims=True)
    a = _attention(x, beta, c, normalization)
    tangent = lambda v: v - np.sum(x * v, axis=1, keepdims=True) * x  # noqa: E731
    unit = a / np.linalg.norm(a, axis=1, keepdims=True)
    return {"post": tangent(a), "pre": a, "peri": unit, "ngpt": alpha * tangent(unit)}[layer_norm]


@pytest.mark.parametrize("normalization", ["usa", "sa"])
@pytest.mark.parametrize("layer_norm", NORMS)
@pytest.mark.parametrize("n", [3, 5])
def test_the_ode_follows_an_independent_solve_of_the_particles(n, layer_norm, normalization):
    """RK4 (dt = 1e-3, error ~1e-13) of the particles from equiangular data; cosines and radii at
    τ = 1, 2, 4 equal the ODE's to 1e-10 (the two solvers' errors), and stay equal among the tokens."""
    beta, c, alpha, dt = 1.5, 0.7, 2.0, 1e-3
    z = np.asarray(sphere.equiangular(n, n, 0.1))
    f = lambda s: _particles(s, layer_norm, beta, c, normalization, alpha)  # noqa: E731
    times = np.array([1.0, 2.0, 4.0])
    flow = theory.equiangular_layer_norm(times, rho0=0.1, n=n, beta=beta, c=c, normalization=normalization,
                                         layer_norm=layer_norm, alpha=alpha)  # fmt: skip
    off = ~np.eye(n, dtype=bool)
    steps = 0
    for k, t in enumerate(times):
        while steps * dt < t - 1e-12:
            k1 = f(z)
            k2 = f(z + dt / 2 * k1)
            k3 = f(z + dt / 2 * k2)
            k4 = f(z + dt * k3)
            z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            if layer_norm in ("post", "ngpt"):
                z = z / np.linalg.norm(z, axis=1, keepdims=True)
            steps += 1
        r = np.linalg.norm(z, axis=1)
        x = z / r[:, None]
        cosines = (x @ x.T)[off]
        assert np.max(np.abs(cosines - flow.rho[k])) < 1e-10, (t, cosines, flow.rho[k])
        assert np.max(np.abs(r / flow.radius[k] - 1.0)) < 1e-10, (t, r, flow.radius[k])


def test_post_ln_is_the_equiangular_ode_of_the_paper():
    ts = np.linspace(0.0, 6.0, 13)
    for normalization in ("usa", "sa"):
        flow = theory.equiangular_layer_norm(ts, rho0=0.2, n=6, beta=2.0, c=0.5, normalization=normalization)
        rho = theory.equiangular_rho(ts, rho0=0.2, n=6, beta=2.0, c=0.5, normalization=normalization)
        np.testing.assert_allclose(flow.rho, rho, rtol=0, atol=1e-12)  # two DOP853 solves at 1e-13
        assert np.all(flow.radius == 1.0)
        np.testing.assert_array_equal(flow.rho, 1.0 - flow.deficit)


@pytest.mark.parametrize("layer_norm", NORMS)
def test_the_gauge_frame_of_a_gauged_field_obeys_the_same_reduction(layer_norm):
    """With orthogonal gauges ``Q_i`` and the gradient value, ``Q_i v_i(Qᵀu)`` is the gauge-free
    velocity at ``u`` under every norm (the norms see only ``|A_i|`` and ``⟨x_i, A_i⟩``): the gauge
    frame of equiangular ``u`` follows the same ODE. Round-off: 1e-13."""
    n, beta, r = 4, 1.0, 1.7
    rng = np.random.default_rng(3)
    q = np.linalg.qr(rng.normal(size=(n, n, n)))[0]
    u = np.asarray(sphere.equiangular(n, n, 0.3))
    x = np.einsum("nji,nj->ni", q, u)  # x_i = Q_i^T u_i
    radial = layer_norm in ("pre", "peri")
    gauged = _field(n, n, beta=beta, layer_norm=layer_norm, alpha=2.0, q=q)
    plain = _field(n, n, beta=beta, layer_norm=layer_norm, alpha=2.0)
    v_gauged = np.einsum("nij,nj->ni", q, np.asarray(gauged(x * r if radial else x)))
    v_plain = np.asarray(plain(u * r if radial else u))
    np.testing.assert_allclose(v_gauged, v_plain, rtol=0, atol=1e-13)
    assert np.max(np.abs(v_plain)) > 0.1  # the tokens move


def test_the_asymptotic_speeds():
    """Near ρ = 1: post collapses at 2 c e^β, nGPT at 2α (whatever β and c); pre and peri like t^-2
    (``t² (1 − ρ)`` levels off) as their radii grow like ``c e^β t`` and ``t``."""
    beta, c, alpha, n = 1.0, 0.5, 1.5, 4
    late = np.array([30.0, 31.0])

    def slope(layer_norm, ts):
        flow = theory.equiangular_layer_norm(
            ts, rho0=0.1, n=n, beta=beta, c=c, layer_norm=layer_norm, alpha=alpha
        )
        return -np.diff(np.log(flow.deficit))[0] / np.diff(ts)[0], flow

    assert slope("post", late)[0] == pytest.approx(2 * c * np.exp(beta), rel=1e-6)
    assert slope("ngpt", late)[0] == pytest.approx(2 * alpha, rel=1e-6)
    far = np.array([1e3, 2e3, 4e3])
    for layer_norm, speed in (("pre", c * np.exp(beta)), ("peri", 1.0)):
        flow = theory.equiangular_layer_norm(far, rho0=0.1, n=n, beta=beta, c=c, layer_norm=layer_norm)
        level = far**2 * flow.deficit
        # levels off: its change halves per doubling of t (a 1/t correction), and is below 1e-2
        assert abs(level[2] / level[1] - 1.0) < 0.6 * abs(level[1] / level[0] - 1.0) < 0.01
        assert np.diff(flow.radius)[1] / np.diff(far)[1] == pytest.approx(speed, rel=1e-3)


def test_the_orbit_distance_of_equiangular_vectors():
    """``max_i |u_i − u*|`` of equiangular unit vectors (``u*`` their normalised mean) is the closed
    form, also where ``1 − ρ`` is far below the resolution of ρ (relative 1e-6: the vectors' own
    round-off, 1e-16 on a distance of 1e-5)."""
    n = 5
    for deficit in (0.9, 0.3, 1e-4, 1e-10):
        u = np.asarray(sphere.equiangular(n, n, 1.0 - deficit))
        centre = u.sum(axis=0) / np.linalg.norm(u.sum(axis=0))
        distance = np.max(np.linalg.norm(u - centre, axis=1))
        assert distance == pytest.approx(float(theory.equiangular_orbit_residual(deficit, n)), rel=1e-6)
    assert float(theory.equiangular_orbit_residual(1e-30, n)) == pytest.approx(np.sqrt(0.8e-30), rel=1e-12)


def test_bad_arguments_are_refused_in_one_line():
    ts = np.array([1.0])
    with pytest.raises(ValueError, match=r"`layer_norm` must be one of .*got 'mid'"):
        theory.equiangular_layer_norm(ts, rho0=0.1, n=4, beta=1.0, layer_norm="mid")
    with pytest.raises(ValueError, match=r"`normalization` must be 'usa' or 'sa'; got 'xa'"):
        theory.equiangular_layer_norm(ts, rho0=0.1, n=4, beta=1.0, normalization="xa")
    with pytest.raises(ValueError, match=r"`alpha` must be positive; got 0.0"):
        theory.equiangular_layer_norm_rates(0.5, 1.0, n=4, beta=1.0, layer_norm="ngpt", alpha=0.0)
