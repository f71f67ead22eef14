"""Layer norms (numerics.layer_norms): pre, peri and nGPT against an independent NumPy
implementation of their definitions (RK4, the same stage rule: z unretracted for pre and peri,
x renormalised for nGPT) with heads, RoPE gauges, a factor and a held source; the equiangular
reduction of each, a closed system for the common cosine rho (and radius r) solved by SciPy; a
zero attention output; the energy of the directions; and the snapshot-by-snapshot solve of pre
and peri (solve_radial) that a run uses to resume bitwise. Runs from a config:
tests/test_layer_norm_runs.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import integrators
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.layer_norms import (
    LayerNormField,
    directions_and_radii,
    join_state,
    solve_radial,
    split_state,
)
from attnflow.numerics.solve import Status, integrate, solve
from test_heads import make_case

TRAJECTORY_ATOL = 1e-8  # the acceptance bound at tau = 1, dt = 0.01 (measured: round-off, ~1e-14)


def reference_attention(x, specs, *, beta):
    """``A_i = Σ_h W_O Σ_j a_ij W_V x_j`` (plain values) or ``Σ_h W_O G_iᵀ Σ_j a_ij G_j W_V x_j``
    (rotated), ``a_ij = w_ij e^{β⟨q_i, k_j⟩}/n`` (usa, c = 1)."""
    n, total = x.shape[0], np.zeros_like(x)
    for spec in specs:
        g = spec["g"]
        q = np.einsum("nab,nb->na", g, x @ spec["query"].T)
        k = np.einsum("nab,nb->na", g, x @ spec["key"].T)
        a = spec["w"] * np.exp(beta * (q @ k.T)) / n
        v = x @ spec["value"].T
        if spec.get("values") == "rotated":
            summed = np.einsum("nba,nb->na", g, a @ np.einsum("nab,nb->na", g, v))
        else:
            summed = a @ v
        total += summed @ spec["output"].T
    return total


def reference_velocity(state, specs, *, kind, beta, alpha, sources):
    # pre, peri: the direction of z; ngpt: the stage point itself (extended off the sphere as the
    # post-LN field is, renormalised after the step)
    x = state if kind == "ngpt" else state / np.linalg.norm(state, axis=1, keepdims=True)
    a = reference_attention(x, specs, beta=beta)
    unit = a / np.linalg.norm(a, axis=1, keepdims=True)
    if kind == "pre":
        v = a
    elif kind == "peri":
        v = unit
    else:  # ngpt
        v = alpha * (unit - np.sum(unit * x, axis=1, keepdims=True) * x)
    v[:sources] = 0.0
    return v


def reference_rk4(state, specs, *, kind, dt, steps, **options):
    f = lambda s: reference_velocity(s, specs, kind=kind, **options)  # noqa: E731
    for _ in range(steps):
        k1 = f(state)
        k2 = f(state + dt / 2 * k1)
        k3 = f(state + dt / 2 * k2)
        k4 = f(state + dt * k3)
        state = state + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if kind == "ngpt":
            state = state / np.linalg.norm(state, axis=1, keepdims=True)
    return state


@pytest.mark.parametrize("kind", ["pre", "peri", "ngpt"])
def test_layer_norms_with_heads_gauges_and_a_source_equal_the_reference(kind):
    heads, specs = make_case(heads=2, d=8, head_dim=4, values="plain", factor="distance_bias", n=16, seed=3)
    layer = HeadsField(heads, make_profile("exp", beta=1.5), sources=1)
    field = LayerNormField(layer, kind, alpha=2.0)
    x0 = np.asarray(sphere.sample_uniform(4, 16, 8))
    method = integrators.RK4(retraction=field.retraction)
    traj = solve(field, jnp.asarray(x0), integrator=method, dt=0.01, t_end=1.0, save_every=1.0)
    expected = reference_rk4(x0, specs, kind=kind, dt=0.01, steps=100, beta=1.5, alpha=2.0, sources=1)
    np.testing.assert_allclose(traj.xs[-1], expected, rtol=0, atol=TRAJECTORY_ATOL)
    # the source is held: its velocity is zero, and only renormalising a unit row after a step may
    # change its last bit (1 ulp on the CI machine, nGPT: its retraction normalises every row)
    np.testing.assert_allclose(traj.xs[-1][0], x0[0], rtol=0, atol=1e-15)
    x, r = directions_and_radii(traj.xs[-1])
    if kind == "ngpt":
        np.testing.assert_allclose(np.asarray(r), 1.0, atol=1e-14)
    else:  # the radii moved off 1 (pre: by <x, A>; peri: by <x, A/|A|>)
        assert np.max(np.abs(np.asarray(r[1:]) - 1.0)) > 1e-3


def _equiangular_rates(rho, n, beta):
    """For n tokens with common cosine rho (paper's model, usa, c = 1): ``g`` (the tangential
    rate, d rho/dt = 2 g under post-LN), ``<x_i, A_i>`` and ``|A_i|``."""
    e1, er = np.exp(beta), np.exp(beta * rho)
    g = er * (1 - rho) * (1 + (n - 1) * rho) / n
    along = (e1 + (n - 1) * rho * er) / n
    norm = np.sqrt(e1**2 + 2 * e1 * er * (n - 1) * rho + er**2 * ((n - 1) + (n - 1) * (n - 2) * rho)) / n
    return g, along, norm


def _equiangular_ode(kind, n, beta, alpha):
    def rhs(_, y):
        rho, r = y
        g, along, norm = _equiangular_rates(rho, n, beta)
        speed = {"post": 1.0, "pre": 1.0 / r, "peri": 1.0 / (r * norm), "ngpt": alpha / norm}[kind]
        growth = {"post": 0.0, "pre": along, "peri": along / norm, "ngpt": 0.0}[kind]
        return [2 * g * speed, growth]

    return rhs


@pytest.mark.parametrize("kind", ["post", "pre", "peri", "ngpt"])
def test_equiangular_tokens_follow_each_norms_closed_system(kind):
    """Equiangular tokens stay equiangular with equal radii; rho(t) (and r(t)) solve the closed
    system: post d rho/dt = 2g(rho), the others the same direction at speeds 1/r, 1/(r|A|),
    alpha/|A| (see ``_equiangular_rates``)."""
    n, d, beta, alpha, rho0 = 5, 5, 1.0, 0.5, 0.1
    kernel = Kernel(gauges.IdentityGauge(n, d), factors.NoFactor(n), make_profile("exp", beta=beta))
    field = LayerNormField(make_vector_field(kernel), kind, alpha=alpha)
    x0 = sphere.equiangular(n, d, rho0)
    traj = solve(field, x0, integrator=integrators.RK4(retraction=field.retraction), dt=0.01, t_end=2.0,
                 save_every=0.5)  # fmt: skip
    exact = solve_ivp(_equiangular_ode(kind, n, beta, alpha), (0, 2.0), [rho0, 1.0], t_eval=traj.ts,
                      rtol=1e-12, atol=1e-14)  # fmt: skip
    x, r = directions_and_radii(jnp.asarray(traj.xs))
    gram = np.einsum("tid,tjd->tij", np.asarray(x), np.asarray(x))
    off = gram[:, ~np.eye(n, dtype=bool)]
    assert np.ptp(off, axis=1).max() < 1e-12 and np.ptp(np.asarray(r), axis=1).max() < 1e-12
    # RK4 at dt = 0.01: global error ~1e-10 against the ODE solution (tolerance 1e-12)
    np.testing.assert_allclose(off[:, 0], exact.y[0], atol=1e-9)
    np.testing.assert_allclose(np.asarray(r)[:, 0], exact.y[1], atol=1e-9)
    assert off[-1, 0] > rho0 + 0.01  # the tokens did move together


def test_bad_layer_norms_are_one_clear_error():
    kernel = Kernel(gauges.IdentityGauge(4, 3), factors.NoFactor(4), make_profile("exp", beta=1.0))
    unknown = r"^layer norm: `layer_norm` must be one of \('post', 'pre', 'peri', 'ngpt'\); got 'mix'\.$"
    with pytest.raises(ValueError, match=unknown):
        LayerNormField(make_vector_field(kernel), "mix")
    with pytest.raises(ValueError, match=r"^layer norm: `ngpt_alpha` must be a positive number; got 0\.0\.$"):
        LayerNormField(make_vector_field(kernel), "ngpt", alpha=0.0)
    with pytest.raises(ValueError, match=r"`retraction` must be 'sphere' for geodesic_rk4"):
        integrators.GeodesicRK4(retraction="none")


@pytest.mark.parametrize("kind", ["pre", "peri"])
def test_a_state_in_r_d_is_refused_the_sphere_s_retraction(kind):
    # RK4() would normalise z after every step: the post-LN dynamics, with status ok
    field = LayerNormField(_layer(), kind)
    x0 = sphere.sample_uniform(0, 12, 4)
    options = dict(dt=0.05, t_end=0.1, save_every=0.1)
    refused = r"^solve: `integrator\.retraction` must be the field's, 'none'; got 'sphere' "
    for method in (integrators.RK4(), integrators.Adaptive()):
        with pytest.raises(ValueError, match=refused + rf"\(pass integrator={type(method).__name__}\("):
            solve(field, x0, integrator=method, **options)
    with pytest.raises(ValueError, match=refused + r"\(geodesic_rk4 steps on the sphere only"):
        solve(field, x0, integrator=integrators.GeodesicRK4(), **options)
    with pytest.raises(ValueError, match=refused):
        integrate(field, x0, integrator=integrators.Euler(), dt=0.05, steps=2)
    on_the_sphere = LayerNormField(_layer(), "post")  # its state is x: the sphere's retraction is its own
    assert solve(on_the_sphere, x0, integrator=integrators.RK4(), **options).status == "ok"


@pytest.mark.parametrize("steps", [2.7, 0, -3, True])
def test_integrate_takes_a_whole_number_of_steps(steps):
    with pytest.raises(ValueError, match=rf"^integrate: `steps` must be an integer >= 1; got {steps!r}\.$"):
        integrate(
            _layer(), sphere.sample_uniform(0, 12, 4), integrator=integrators.RK4(), dt=0.05, steps=steps
        )


def _layer(n=12, d=4, *, causal=False, beta=1.5, sources=0):
    kernel = Kernel(gauges.IdentityGauge(n, d), factors.NoFactor(n), make_profile("exp", beta=beta))
    return make_vector_field(kernel, causal=causal, sources=sources)


@pytest.mark.parametrize("kind", ["pre", "peri", "ngpt"])
def test_a_zero_attention_output_leaves_its_token_in_place(kind):
    """A strict causal mask: token 0 sees no token, so A_0 = 0 exactly; A/|A| is taken as 0, so the
    token does not move (as under post-LN, P_x 0 = 0) and nothing turns NaN."""
    field = LayerNormField(_layer(causal="strict"), kind)
    x0 = sphere.sample_uniform(2, 12, 4)
    z0 = x0 * jnp.linspace(1.0, 2.0, 12)[:, None] if field.radial else x0
    np.testing.assert_array_equal(np.asarray(field.layer.attention(x0))[0], 0.0)
    v = np.asarray(field(z0))
    np.testing.assert_array_equal(v[0], 0.0)
    assert np.all(np.isfinite(v)) and np.all(np.linalg.norm(v[1:], axis=1) > 0)
    traj = solve(field, z0, integrator=integrators.RK4(retraction=field.retraction), dt=0.01, t_end=0.5,
                 save_every=0.5)  # fmt: skip
    if field.radial:  # z in R^d, no retraction: direction and radius kept exactly
        np.testing.assert_array_equal(traj.xs[-1][0], np.asarray(z0)[0])
    else:  # renormalised after every step (as post-LN): a rounding of the unit vector apart
        np.testing.assert_allclose(traj.xs[-1][0], np.asarray(z0)[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", ["pre", "peri", "ngpt"])
def test_the_energy_of_the_directions_ascends_under_every_norm(kind):
    """dE/dt = (1/n) sum_i s_i |P A_i|^2 >= 0 with s_i > 0 the norm's speed factor: E of the
    directions is non-decreasing though only post-LN is the gradient flow itself."""
    layer = _layer(n=16, d=3, beta=2.0)
    field = LayerNormField(layer, kind, alpha=0.5)
    assert field.energy_ascends and not field.gradient_flow
    assert not LayerNormField(_layer(causal=True), kind).energy_ascends  # no energy to climb
    method = integrators.RK4(retraction=field.retraction)
    x0 = sphere.sample_uniform(5, 16, 3)
    traj = solve(field, x0, integrator=method, dt=0.01, t_end=3.0, save_every=0.1)
    x, _ = directions_and_radii(jnp.asarray(traj.xs))
    energies = np.array([float(field.energy(state)) for state in x])
    assert np.all(np.diff(energies) >= -1e-13)  # round-off of the energy sum (values about 1)
    assert energies[-1] > energies[0] + 0.01  # it did climb


def test_split_and_join_are_what_a_store_keeps():
    z = np.random.default_rng(0).normal(size=(3, 5, 4))
    x, r = split_state(z)
    assert x.shape == (3, 5, 4) and r.shape == (3, 5)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(join_state(x, r), z, rtol=1e-15, atol=0)  # a rounding apart at most
    x32, r32 = split_state(z.astype(np.float32))
    assert x32.dtype == np.float32 and r32.dtype == np.float32


@pytest.mark.parametrize("kind", ["pre", "peri"])
def test_solve_radial_restarts_from_each_stored_snapshot_bitwise(kind):
    """Snapshot by snapshot from z = r x: continued from its snapshot 2, the solve gives bitwise the
    later snapshots of the whole one; and it agrees with one continuous solve of z to round-off."""
    field = LayerNormField(_layer(sources=1), kind)
    method = integrators.RK4(retraction="none")
    x0, r0 = split_state(np.asarray(sphere.sample_uniform(3, 12, 4)))
    whole: dict[int, tuple] = {}
    result = solve_radial(field, x0, r0, on_snapshot=lambda k, x, r: whole.update({k: (x, r)}),
                          integrator=method, dt=0.01, t_end=0.5, save_every=0.1)  # fmt: skip
    assert result.status == Status.ok and result.steps == 50 and int(result.evaluations) == 200
    assert sorted(whole) == [1, 2, 3, 4, 5] and result.snapshots == 6
    later: dict[int, tuple] = {}
    solve_radial(field, *whole[2], on_snapshot=lambda k, x, r: later.update({2 + k: (x, r)}),
                 integrator=method, dt=0.01, t_end=0.3, save_every=0.1)  # fmt: skip
    for k in (3, 4, 5):
        np.testing.assert_array_equal(later[k][0], whole[k][0])
        np.testing.assert_array_equal(later[k][1], whole[k][1])
    continuous = solve(field, jnp.asarray(join_state(x0, r0)), integrator=method, dt=0.01, t_end=0.5,
                       save_every=0.1)  # fmt: skip
    # five restarts, each a rounding of z apart: round-off only
    np.testing.assert_allclose(join_state(*whole[5]), continuous.xs[-1], rtol=0, atol=1e-13)
    assert np.all(whole[5][1][0] == r0[0]) and np.max(np.abs(whole[5][1] - 1.0)) > 1e-3  # held, moved
    with pytest.raises(ValueError, match=r"^solve_radial: `field` must be a pre- or peri-LN"):
        solve_radial(LayerNormField(_layer(), "ngpt"), x0, r0, on_snapshot=print, integrator=method,
                     dt=0.01, t_end=0.1, save_every=0.1)  # fmt: skip


def test_a_batch_of_layer_norm_runs_is_each_run():
    """A batch (B, n, d) of pre-LN states solves each state as alone (bitwise, one run per program
    call on a CPU)."""
    field = LayerNormField(_layer(), "pre")
    z0 = jnp.stack([sphere.sample_uniform(s, 12, 4) for s in (0, 1)])
    method = integrators.RK4(retraction="none")
    batch = solve(field, z0, integrator=method, dt=0.01, t_end=0.2, save_every=0.1, workers=1)
    for b in range(2):
        alone = solve(field, z0[b], integrator=method, dt=0.01, t_end=0.2, save_every=0.1)
        np.testing.assert_allclose(batch.xs[:, b], alone.xs, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    ("x0", "message"),
    [
        (
            np.ones((12, 5)),
            r"`x0` must have shape \(n, d\) with \(n, d\) = \(12, 4\), the kernel's; got \(12, 5\)\.",
        ),
        (
            np.ones((20, 4)),
            r"`x0` must have shape \(n, d\) with \(n, d\) = \(12, 4\), the kernel's; got \(20, 4\)\.",
        ),
        (
            np.ones((2, 12, 3)),
            r"`x0` must have shape \(B, n, d\) with \(n, d\) = \(12, 4\), the kernel's; got \(2, 12, 3\)\.",
        ),
        (
            np.ones((12, 4), np.int32),
            r"`x0` must hold real floats \(float64, or float32 with a float32 kernel\); got int32\.",
        ),
    ],
)
def test_tokens_that_do_not_fit_the_kernel_are_one_clear_error(x0, message):
    # a wrong d ran silently (a broadcast), a wrong n failed deep inside JAX
    for field in (_layer(), LayerNormField(_layer(), "post")):
        with pytest.raises(ValueError, match="^solve: " + message + "$"):
            solve(field, x0, integrator=integrators.RK4(), dt=0.05, t_end=0.1, save_every=0.1)
