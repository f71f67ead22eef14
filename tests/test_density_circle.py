"""The density solver on S^1 × labels (numerics.density_circle, stepped by the particles' methods
through numerics.density_solve): its field against the particles' field at quadrature nodes (exact),
growth rates about the uniform law against closed forms, mass, energy, Bruno–Pasqualotto–Agazzi's
three clusters, measured orders in time and space, the shared loop's step against RK4 written out,
the resolution status, and the validation messages."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import density_circle as dc
from attnflow.numerics import integrators
from attnflow.numerics.density_solve import integrate
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4_TABLEAU, Tableau
from attnflow.numerics.status import Status


def _smooth_density(grid: int, count: int, seed: int = 0, *, modes: int = 3, amplitude: float = 0.15):
    """Positive densities of mass 1 per label with a few random Fourier modes."""
    rng = np.random.default_rng(seed)
    theta = dc.grid_angles(grid)
    g = np.zeros((count, grid))
    for k in range(1, modes + 1):
        a, b = rng.uniform(-1.0, 1.0, (2, count, 1))
        g += (a * np.cos(k * theta) + b * np.sin(k * theta)) / k
    return jnp.asarray((1.0 + amplitude * g) / (2.0 * np.pi))


RK4 = integrators.RK4(retraction="none")  # the particles' methods, with the identity retraction
DOPRI5 = integrators.Adaptive(retraction="none")


@functools.partial(jax.jit, static_argnames=("dt", "steps", "snapshots", "method", "check"))
def _integrate(field, f0, *, dt, steps, snapshots=1, method=RK4, check=False):
    """One compiled program per shape and option set, the field an argument (reused across tests)."""
    status = (lambda x: dc.status_code(field, x)) if check else None
    return integrate(
        field,
        dc.CircleDensity(f0),
        integrator=method,
        dt=dt,
        steps_per_snapshot=steps,
        snapshots=snapshots,
        status=status,
    )


@functools.partial(jax.jit, static_argnames=("method",))
def _final(field, f0, dt, steps, method=RK4):
    """``steps`` steps of ``dt`` (both traced: one compiled program per method and shape)."""
    body = lambda _, s: method.step(field, s, dt)  # noqa: E731
    return jax.lax.fori_loop(0, steps, body, dc.CircleDensity(f0)).f


def _run(field, f0, *, dt, steps, method=RK4):
    return np.asarray(_final(field, f0, jnp.asarray(dt), jnp.asarray(steps), method=method))


# --- the field against the particles' field ------------------------------------------------------


def _particle_velocity(field, f, particle_gauge, profile, normalization):
    """The particles' angular velocity at the grid nodes of every label, each node weighted by its
    quadrature mass ``m = ρ_l (2π/M) f``: with the factor ``w_ij = n m_i m_j W`` the usa field is
    ``m_i`` times the density's velocity; the sa field is it (the softmax cancels ``m_i``)."""
    count, grid = f.shape
    n = count * grid
    label = np.repeat(np.arange(count), grid)
    theta = np.tile(dc.grid_angles(grid), count)
    mass = np.asarray(field.labels.weights)[label] * (2.0 * np.pi / grid) * np.asarray(f).reshape(-1)
    w = np.asarray(field.w)[label][:, label] * mass[:, None] * mass[None, :]
    w = w * n if normalization == "usa" else w
    kernel = Kernel(particle_gauge(label), factors.make_matrix_factor(w, n=n), profile)
    x = jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], axis=1))
    v = np.asarray(make_vector_field(kernel, normalization=normalization)(x))
    angular = -np.sin(theta) * v[:, 0] + np.cos(theta) * v[:, 1]
    return (angular / mass if normalization == "usa" else angular).reshape(count, grid)


SETTINGS = {
    # name: (profile kind, time scale, normalization, gauge, factor)
    "rope_toeplitz_usa": ("exp", "plain", "usa", "rope", "toeplitz"),
    "prompt_none_usa": ("exp", "rescaled", "usa", "prompt", "none"),
    "rope_bias_sa": ("exp", "plain", "sa", "rope", "bias"),
    "prompt_bias_sa_linear": ("linear", "plain", "sa", "prompt", "bias"),
    "none_toeplitz_linear": ("linear", "rescaled", "usa", "none", "toeplitz"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_velocity_is_the_particle_field_at_the_quadrature_nodes(name):
    kind, time_scale, normalization, gauge_kind, factor_kind = SETTINGS[name]
    grid, count, omega = 48, 4, 2.0 * np.pi
    labels = dc.position_labels(count)
    nodes = np.asarray(labels.nodes)
    profile = make_profile(kind, beta=2.0, time_scale=time_scale)
    q = gauges.haar_orthogonal(3, count, 2)  # seed 3 draws three reflections and one rotation
    assert sorted(np.round(np.linalg.det(q))) == [-1.0, -1.0, -1.0, 1.0]
    gauge, particle_gauge = {
        "none": (None, lambda label: gauges.IdentityGauge(n=label.size, d=2)),
        "rope": (
            dc.rope_circle_gauge(labels, omega),
            lambda label: gauges.make_rope(nodes[label], 2, [omega]),
        ),
        "prompt": (dc.circle_gauge_from_matrices(q), lambda label: gauges.make_prompt_gauge(label, q)),
    }[gauge_kind]
    factor = {
        "none": None,
        "toeplitz": factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(omega)),
        "bias": factors.DistanceBias(xi=labels.nodes, slope=jnp.asarray(1.5)),
    }[factor_kind]
    field = dc.make_circle_field(
        profile, grid=grid, labels=labels, gauge=gauge, factor=factor, normalization=normalization
    )
    f = _smooth_density(grid, count)
    v = np.asarray(field.velocity(dc.CircleDensity(f)))
    v_particles = _particle_velocity(field, f, particle_gauge, profile, normalization)
    # the same sums, regrouped (FFT and label product vs the particles' pair sum): round-off, and the
    # kernel's modes past grid/2 (I_24(2)/I_0(2) ~ 1e-25) that the grid drops
    assert np.max(np.abs(v - v_particles)) <= 1e-13 * np.max(np.abs(v))


@pytest.mark.slow
def test_energy_is_the_particle_energy_at_the_quadrature_nodes():
    grid, count = 48, 3
    labels = dc.position_labels(count)
    profile = make_profile("exp", beta=1.5)
    factor = factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(2.0 * np.pi))
    gauge = dc.rope_circle_gauge(labels, 2.0 * np.pi)
    field = dc.make_circle_field(profile, grid=grid, labels=labels, gauge=gauge, factor=factor)
    f = _smooth_density(grid, count, seed=1)
    label = np.repeat(np.arange(count), grid)
    theta = np.tile(dc.grid_angles(grid), count)
    mass = np.asarray(labels.weights)[label] * (2.0 * np.pi / grid) * np.asarray(f).reshape(-1)
    n = count * grid
    w = n * np.asarray(field.w)[label][:, label] * mass[:, None] * mass[None, :]
    kernel = Kernel(
        gauges.make_rope(np.asarray(labels.nodes)[label], 2, [2.0 * np.pi]),
        factors.make_matrix_factor(w, n=n),
        profile,
    )
    x = jnp.asarray(np.stack([np.cos(theta), np.sin(theta)], axis=1))
    particle_energy = float(make_vector_field(kernel).energy(x))  # (1/2n²) Σ n m_i m_j W φ = E / n
    density_energy = float(field.energy(dc.CircleDensity(f)))
    assert density_energy == pytest.approx(n * particle_energy, rel=1e-13)  # round-off of two sums


# --- growth rates about the uniform law ------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("dt", "steps"))
def _batched_final(field, f0, *, dt, steps):
    """Independent runs from each ``f0[b]`` (vmap: a batch of runs, not a coupled system)."""
    return jax.vmap(lambda f: _integrate(field, f, dt=dt, steps=steps)[1].f[-1])(f0)


def _measured_rates(field, g0, *, dt, t_end, k):
    """``log(c_k(T)/c_k(0))/T`` of label-wise mode ``k`` from initial perturbations ``g0 (B, L, M)``
    of the uniform law (one run per batch entry)."""
    grid = field.grid
    f0 = 1.0 / (2.0 * np.pi) + g0
    steps = int(round(t_end / dt))
    f_end = np.asarray(_batched_final(field, f0, dt=dt, steps=steps))
    c0 = np.fft.rfft(np.asarray(f0), axis=-1) / grid
    c1 = np.fft.rfft(f_end, axis=-1) / grid
    if k == 0:  # every mode: (B, L, M//2 + 1)
        with np.errstate(divide="ignore"):  # modes absent from the start
            return np.log(np.abs(c1) / np.maximum(np.abs(c0), 1e-300)) / t_end
    return np.log(np.abs(c1[..., k]) / np.abs(c0[..., k])) / t_end


@pytest.mark.parametrize("beta,t_end,dt", [(1.0, 5.0, 0.01), (5.0, 0.2, 5e-4)])
def test_growth_rates_about_uniform_are_k2_Ik_over_beta(beta, t_end, dt):
    """``σ_k = c k² I_k(β)/β`` (w = 1, no gauge, c = 1, usa), k = 1..6, one single-mode run each:
    ``f = 1/2π + ε cos kθ`` feeds modes 0 and 2k at order ε² only, so mode k is linear to ε²."""
    grid, eps = 64, 1e-6
    field = dc.make_circle_field(make_profile("exp", beta=beta), grid=grid, labels=dc.position_labels(1))
    theta = dc.grid_angles(grid)
    ks = np.arange(1, 7)
    g0 = jnp.asarray(eps * np.cos(ks[:, None] * theta[None, :])[:, None, :])
    measured = _measured_rates(field, g0, dt=dt, t_end=t_end, k=0)  # placeholder k, read per run below
    rates = np.array([measured[i, 0, k] for i, k in enumerate(ks)])
    exact = ks**2 * scipy.special.iv(ks, beta) / beta
    # RK4's rate error (σ dt)^4/120 <= 1e-9, nonlinearity ε² e^{σT}, round-off 1e-16/ε over σ_6 T ~ 4e-3
    np.testing.assert_allclose(rates, exact, rtol=1e-6)
    if beta == 5.0:
        assert int(np.argmax(rates)) + 1 == 3  # the fastest mode at β = 5 is k = 3 (three clusters)


@pytest.mark.parametrize(
    "time_scale,normalization,kind",
    [
        ("rescaled", "usa", "exp"),
        ("plain", "sa", "exp"),
        ("rescaled", "usa", "linear"),
        ("plain", "sa", "linear"),
    ],
)
def test_growth_rates_general_profile(time_scale, normalization, kind):
    """General (w = 1): ``σ_k = k² â_k / (2π)`` with ``â_k = ∫ φ(cos s) e^{-iks} ds`` (usa), divided by
    ``â'_0 = ∫ φ'(cos s) ds / 2π`` for sa. Exp: ``â_k = 2π c I_k(β)/β``; sa: ``k² I_k(β)/(β I_0(β))``.
    Linear: only k = 1 moves, ``σ_1 = c/2`` (usa), ``1/2`` (sa)."""
    beta, grid, eps = 2.0, 64, 1e-6
    profile = make_profile(kind, beta=beta, time_scale=time_scale)
    field = dc.make_circle_field(
        profile, grid=grid, labels=dc.position_labels(1), normalization=normalization
    )
    theta = dc.grid_angles(grid)
    c = float(profile.c)
    for k in (1, 2, 3):
        rate = _measured_rates(
            field, jnp.asarray(eps * np.cos(k * theta))[None, None], dt=0.01, t_end=2.0, k=k
        )[0, 0]
        if kind == "exp":
            exact = k**2 * scipy.special.iv(k, beta) / beta
            exact = exact / scipy.special.iv(0, beta) if normalization == "sa" else c * exact
        else:
            exact = (0.5 if normalization == "sa" else 0.5 * c) if k == 1 else 0.0
        assert rate == pytest.approx(exact, rel=1e-6, abs=1e-10)  # RK4 error ~1e-10, linearity ε²


def test_growth_rate_with_labels_is_the_top_eigenvalue_of_w_rho():
    """RoPE (``α = ωξ``) and the Toeplitz cosine on midpoint labels: the linearised operator of mode k
    is ``k² (c I_k(β)/β) D_k W diag(ρ) D_k^*`` (``D_k = diag e^{ikα}``); ``W diag(ρ)`` has eigenvalues
    ½, ½, 0, …, with eigenvectors ``e^{±iωξ}``. The perturbation ``ε cos(kθ + kα_ξ + ωξ)`` grows at
    ``σ = k² I_k(β)/(2β)``; the same with ``ωξ`` replaced by ``2ωξ`` (eigenvalue 0) does not grow."""
    beta, grid, count, omega, eps = 2.0, 64, 8, 2.0 * np.pi, 1e-6
    labels = dc.position_labels(count)
    xi = np.asarray(labels.nodes)[:, None]
    field = dc.make_circle_field(
        make_profile("exp", beta=beta),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, omega),
        factor=factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(omega)),
    )
    theta = dc.grid_angles(grid)[None, :]
    for k in (1, 2, 3):
        g_top = eps * np.cos(k * theta + k * omega * xi + omega * xi)
        g_null = eps * np.cos(k * theta + k * omega * xi + 2.0 * omega * xi)
        rates = _measured_rates(field, jnp.asarray(np.stack([g_top, g_null])), dt=0.01, t_end=2.0, k=k)
        np.testing.assert_allclose(rates[0], k**2 * scipy.special.iv(k, beta) / (2.0 * beta), rtol=1e-6)
        np.testing.assert_allclose(rates[1], 0.0, atol=1e-8)  # a null mode: round-off and ε² only


# --- conservation and the energy ------------------------------------------------------------------


@pytest.mark.slow
def test_mass_per_label_and_energy_along_a_nonlinear_run():
    grid, count = 128, 6
    labels = dc.position_labels(count)
    field = dc.make_circle_field(
        make_profile("exp", beta=3.0),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, 2.0 * np.pi),
        factor=factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(2.0 * np.pi)),
    )
    f0 = _smooth_density(grid, count, seed=4, amplitude=0.3)
    _, states, codes = _integrate(field, f0, dt=5e-3, steps=10, snapshots=20, check=True)
    assert np.all(np.asarray(codes) == Status.ok.code)
    mass = np.asarray(jax.vmap(lambda f: field.mass(dc.CircleDensity(f)))(states.f))
    assert np.max(np.abs(mass - 1.0)) <= 1e-12  # the divergence has no k = 0 mode: round-off only
    energy = np.asarray(jax.vmap(lambda f: field.energy(dc.CircleDensity(f)))(states.f))
    assert energy[-1] > energy[0] * 1.05  # the run does move the law
    # semi-discrete dE/dt = Σ ρ ∫ f V² >= 0 exactly (f > 0 here); RK4 adds ~(dt·rate)^5 per step
    assert np.min(np.diff(energy)) >= -1e-12 * energy[-1]


def test_bruno_pasqualotto_agazzi_three_clusters():
    """Uniform plus noise of size 0.01, β = 5, c = 1, no labels: the fastest mode is k = 3
    (``σ_3 = 9 I_3(5)/5 ≈ 18.6`` against 14.0 and 16.3 for k = 2, 4), and the law becomes 3-periodic:
    three clusters, evenly spaced, before the grid stops resolving them (status then under-resolved).
    The noise is band-limited (modes 1..40, RMS 0.01; grid white noise is not a resolved function)."""
    grid = 512
    field = dc.make_circle_field(make_profile("exp", beta=5.0), grid=grid, labels=dc.position_labels(1))
    rng = np.random.default_rng(0)
    theta = dc.grid_angles(grid)
    coefficients = rng.standard_normal(40) + 1j * rng.standard_normal(40)
    noise = np.real(np.exp(1j * np.outer(theta, np.arange(1, 41))) @ coefficients)
    f0 = (1.0 + 0.01 * noise / noise.std()) / (2.0 * np.pi)
    ts, states, codes = _integrate(field, jnp.asarray(f0)[None], dt=1e-4, steps=100, snapshots=40, check=True)
    codes = np.asarray(codes)
    assert codes[-1] == Status.under_resolved.code  # it concentrates below the grid by t = 0.4
    last = int(np.flatnonzero(codes == 0)[-1])
    f = np.asarray(states.f[last, 0]) * 2.0 * np.pi  # in units of the uniform law
    assert f.max() > 2.5  # well past the linear regime at the last resolved snapshot
    above = f > 1.3
    starts = np.flatnonzero(above & ~np.roll(above, 1))  # clusters: arcs where f > 1.3 × uniform
    assert starts.size == 3
    arc = np.cumsum(above & ~np.roll(above, 1))
    arc = np.where(arc == 0, 3, arc)  # an arc through θ = 0 is the last one
    centres = np.sort(
        [np.angle(np.sum((f * np.exp(1j * theta))[above & (arc == a)])) % (2.0 * np.pi) for a in (1, 2, 3)]
    )
    gaps = np.diff(np.concatenate([centres, [centres[0] + 2.0 * np.pi]]))
    np.testing.assert_allclose(gaps, 2.0 * np.pi / 3.0, atol=0.35)  # the noise shifts clusters by ~0.1
    spectrum = np.abs(np.fft.rfft(f))
    assert int(np.argmax(spectrum[1:8])) + 1 == 3 and spectrum[3] > 0.25 * spectrum[0]


# --- measured orders ------------------------------------------------------------------------------


def _labelled_field(grid, beta=2.0, count=3):
    labels = dc.position_labels(count)
    return dc.make_circle_field(
        make_profile("exp", beta=beta),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, 2.0 * np.pi),
        factor=factors.DistanceBias(xi=labels.nodes, slope=jnp.asarray(1.0)),
    )


@pytest.mark.parametrize("method", [RK4, DOPRI5], ids=["rk4", "dopri5"])
def test_order_in_time(method):
    grid, t_end = 64, 0.8
    field = _labelled_field(grid)
    f0 = _smooth_density(grid, 3, seed=2, amplitude=0.4)
    dts = [0.1, 0.05, 0.025]
    finals = [np.asarray(_run(field, f0, dt=dt, steps=round(t_end / dt), method=method)) for dt in dts]
    reference = np.asarray(_run(field, f0, dt=0.025 / 8, steps=round(8 * t_end / 0.025), method=method))
    errors = [np.max(np.abs(f - reference)) for f in finals]
    slope = np.polyfit(np.log(dts), np.log(errors), 1)[0]
    # the declared order, measured (diffrax's test_ode_order margin); Dormand–Prince's fifth-order
    # solution measures 5.3–5.4 here (its next error term is not yet negligible): a wider margin above
    margin = (0.3, 0.5) if method.order == 5 else (0.3, 0.3)
    assert method.order - margin[0] <= slope <= method.order + margin[1]


def _estimated_orders(method, field, state):
    """``log2`` of successive ratios of the embedded error estimate at halved steps."""
    step = jax.jit(lambda s, dt: method.step_with_error(field, s, dt, rtol=0.0, atol=1e-10)[1])
    errors = [float(step(state, dt)) for dt in (0.08, 0.04, 0.02)]
    return np.log2(np.array(errors[:-1]) / errors[1:])


def test_dopri5_error_estimate_scales_like_dt5():
    grid = 48
    field = _labelled_field(grid)
    state = dc.CircleDensity(_smooth_density(grid, 3, seed=2, amplitude=0.4))
    orders = _estimated_orders(DOPRI5, field, state)
    assert np.all(np.abs(orders - 5.0) <= 0.4)  # the embedded pair's local error: O(dt^5)

    # a mutant: one coefficient of the embedded weights moved (still consistent, sum 1): the
    # estimate is then the difference of a 5th- and a 1st-order step, O(dt^2)
    b_error = list(integrators.DOPRI5_TABLEAU.b_error)
    b_error[0], b_error[2] = b_error[0] + 0.01, b_error[2] - 0.01

    class WrongEstimate(integrators.Adaptive):
        tableau = Tableau(
            a=integrators.DOPRI5_TABLEAU.a,
            b=integrators.DOPRI5_TABLEAU.b,
            c=integrators.DOPRI5_TABLEAU.c,
            b_error=tuple(b_error),
        )

    mutant = _estimated_orders(WrongEstimate(retraction="none"), field, state)
    assert np.all(np.abs(mutant - 5.0) > 2.0), mutant


def _rk4_written_out(field, f, dt):
    """One classical RK4 step of ``∂_t f = F(f)`` on the grid values, written out."""
    F = lambda g: field(dc.CircleDensity(g)).f  # noqa: E731
    k1 = F(f)
    k2 = F(f + 0.5 * dt * k1)
    k3 = F(f + 0.5 * dt * k2)
    k4 = F(f + dt * k3)
    return f + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def test_the_loop_steps_with_the_particles_rk4():
    """A snapshot of ``density_solve.integrate`` after 3 steps is 3 classical RK4 steps of the
    density's right-hand side (the shared method and loop: nothing of the density's own); a method
    with one wrong weight (a valid tableau: b = 1/4 each) is not."""
    grid, dt = 48, 0.02
    field = _labelled_field(grid)
    f0 = _smooth_density(grid, 3, seed=6, amplitude=0.4)
    written = f0
    for _ in range(3):
        written = _rk4_written_out(field, written, dt)
    _, states, codes = _integrate(field, f0, dt=dt, steps=3)
    assert np.asarray(codes).tolist() == [0, 0]
    change = np.max(np.abs(np.asarray(written - f0)))
    assert change > 1e-3  # the law moves
    # the same sums in another order: round-off of the ~1e-1 state, far below a step's change
    np.testing.assert_allclose(np.asarray(states.f[-1]), np.asarray(written), rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(states.f[0]), np.asarray(f0), rtol=0, atol=0)

    class WrongWeights(integrators.RK4):
        tableau = Tableau(a=RK4_TABLEAU.a, b=(0.25, 0.25, 0.25, 0.25), c=RK4_TABLEAU.c)

    _, wrong, _ = _integrate(field, f0, dt=dt, steps=3, method=WrongWeights(retraction="none"))
    # its weights are still of order 2 (measured 4e-8 off in 3 steps): far outside the round-off above
    assert np.max(np.abs(np.asarray(wrong.f[-1]) - np.asarray(written))) > 1e-10


def test_the_loop_takes_only_the_identity_retraction():
    field = _labelled_field(48)
    state = dc.CircleDensity(_smooth_density(48, 3))
    with pytest.raises(ValueError, match=r"^density: `integrator` must have retraction='none'.*got 'sphere'"):
        integrate(field, state, integrator=integrators.RK4(), dt=0.01, steps_per_snapshot=1, snapshots=1)


def test_a_fake_rk4_fails_the_order_test():
    class FakeRK4(integrators.RK4):
        tableau = Tableau(a=RK4_TABLEAU.a, b=(1.0, 0.0, 0.0, 0.0), c=RK4_TABLEAU.c)

    grid, t_end = 48, 0.8
    field = _labelled_field(grid)
    f0 = _smooth_density(grid, 3, seed=2, amplitude=0.4)
    reference = np.asarray(_run(field, f0, dt=0.0125, steps=64))
    fake = FakeRK4(retraction="none")
    errors = [
        np.max(np.abs(np.asarray(_run(field, f0, dt=dt, steps=round(t_end / dt), method=fake)) - reference))
        for dt in (0.1, 0.05)
    ]
    assert np.log2(errors[0] / errors[1]) < 1.5  # Euler's weights: order 1, far from 4


def test_order_in_space_is_spectral():
    """Errors against a fine grid (192) fall faster than any power of 1/M: the log–log slope between
    successive grids is past 8 and steepens (measured 12 then 18: exponential convergence)."""
    t_end, dt, reference_grid, grids = 0.5, 2e-3, 192, [48, 64, 96]

    def initial(grid):  # the same analytic law on every grid: sharp von Mises bumps (κ = 20)
        theta = dc.grid_angles(grid)
        centres = np.array([0.3, 2.0, 4.0])[:, None]
        f = np.exp(20.0 * (np.cos(theta[None, :] - centres) - 1.0))
        return jnp.asarray(f / (2.0 * np.pi * scipy.special.i0e(20.0)))

    def final(grid):
        return np.asarray(
            _run(_labelled_field(grid, beta=1.0), initial(grid), dt=dt, steps=round(t_end / dt))
        )

    reference = final(reference_grid)
    errors = [np.max(np.abs(final(grid) - reference[:, :: reference_grid // grid])) for grid in grids]
    slopes = -np.diff(np.log(errors)) / np.diff(np.log(grids))
    assert slopes[0] >= 8.0  # algebraic schemes of order <= 4 give slopes <= 4
    assert slopes[1] >= slopes[0] + 3.0  # and theirs stay constant; a spectral slope grows with M


# --- resolution and status ------------------------------------------------------------------------


def test_under_resolved_run_says_so_and_stops_at_its_last_resolved_law():
    grid = 64
    field = dc.make_circle_field(make_profile("exp", beta=5.0), grid=grid, labels=dc.position_labels(1))
    f0 = _smooth_density(grid, 1, seed=0, amplitude=0.5)
    _, states, codes = _integrate(field, f0, dt=1e-3, steps=100, snapshots=20, check=True)
    codes = np.asarray(codes)
    assert codes[0] == 0 and codes[-1] == Status.under_resolved.code
    first_bad = int(np.argmax(codes != 0))
    tail, negative = (float(v) for v in dc.resolution(field, dc.CircleDensity(states.f[first_bad])))
    assert tail <= dc.TAIL_TOL and negative <= dc.NEGATIVE_TOL  # the frozen state is the last resolved one
    np.testing.assert_array_equal(np.asarray(states.f[-1]), np.asarray(states.f[first_bad - 1]))
    assert Status.from_codes(codes[-1]).item() is Status.under_resolved
    assert "raise `density.grid`" in Status.under_resolved.message


def test_resolution_of_a_dirac_like_law_is_flagged():
    grid = 64
    field = dc.make_circle_field(make_profile("exp", beta=1.0), grid=grid, labels=dc.position_labels(1))
    spike = np.zeros((1, grid))
    spike[0, 5] = grid / (2.0 * np.pi)
    tail, negative = (float(v) for v in dc.resolution(field, dc.CircleDensity(jnp.asarray(spike))))
    assert tail == pytest.approx(1.0 / 3.0, abs=0.02)  # a grid Dirac has a flat spectrum
    smooth_tail, _ = dc.resolution(field, dc.CircleDensity(_smooth_density(grid, 1)))
    assert float(smooth_tail) <= 1e-28
    assert int(dc.status_code(field, dc.CircleDensity(jnp.asarray(spike)))) == Status.under_resolved.code
    bad = jnp.asarray(spike).at[0, 0].set(jnp.nan)
    assert int(dc.status_code(field, dc.CircleDensity(bad))) == Status.nonfinite.code
    assert negative == 0.0


@pytest.mark.slow
def test_stable_dt_is_stable_and_tenfold_is_not():
    grid = 128
    field = dc.make_circle_field(make_profile("exp", beta=3.0), grid=grid, labels=dc.position_labels(1))
    f0 = _smooth_density(grid, 1, seed=5, amplitude=0.6)
    dt = float(dc.stable_dt(field, dc.CircleDensity(f0)))
    ok = _run(field, f0, dt=dt, steps=15)  # t ≈ 0.5, before the law concentrates
    bad = _run(field, f0, dt=10 * dt, steps=15)
    assert np.all(np.isfinite(np.asarray(ok))) and np.max(np.abs(np.asarray(ok))) < 10.0
    assert not np.all(np.abs(np.asarray(bad)) < 10.0)
    # the law-independent step is below the state's own for this law and for a sharp one (κ = 40)
    assert dc.safe_dt(field) <= dt
    sharp = np.exp(40.0 * (np.cos(dc.grid_angles(grid)) - 1.0))[None, :]
    sharp = jnp.asarray(sharp / (2.0 * np.pi * np.mean(sharp)))
    assert dc.safe_dt(field) <= float(dc.stable_dt(field, dc.CircleDensity(sharp)))


# --- validation -----------------------------------------------------------------------------------


def test_validation_messages():
    profile = make_profile("exp", beta=5.0)
    labels = dc.position_labels(4)
    with pytest.raises(ValueError, match=r"`grid` must resolve the kernel at beta = 5.*use grid >= 63"):
        dc.make_circle_field(profile, grid=32, labels=labels)
    with pytest.raises(ValueError, match="`grid` must be an integer >= 8"):
        dc.make_circle_field(profile, grid=4, labels=labels)
    with pytest.raises(ValueError, match="`normalization` must be one of"):
        dc.make_circle_field(profile, grid=64, labels=labels, normalization="softmax")
    with pytest.raises(ValueError, match="'sa' requires a non-negative factor"):
        dc.make_circle_field(
            profile,
            grid=64,
            labels=labels,
            normalization="sa",
            factor=factors.ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(1.0)),
        )
    with pytest.raises(ValueError, match="`factor` must be built on the 4 label nodes"):
        dc.make_circle_field(profile, grid=64, labels=labels, factor=factors.NoFactor(n=5))
    with pytest.raises(ValueError, match="one angle per label node"):
        dc.make_circle_field(profile, grid=64, labels=labels, gauge=dc.identity_circle_gauge(3))
    with pytest.raises(ValueError, match="`weights` must be positive and sum to 1"):
        dc.make_labels([0.0, 1.0], [0.5, 0.6])
    with pytest.raises(ValueError, match="`nodes` and `weights` must be non-empty of one length"):
        dc.make_labels([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="`rule` must be 'midpoint' or 'gauss'"):
        dc.position_labels(4, rule="simpson")
    with pytest.raises(ValueError, match="matrices must be orthogonal"):
        dc.circle_gauge_from_matrices(np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="`filter_order` must be an integer >= 2"):
        dc.make_circle_field(profile, grid=64, labels=labels, filter_order=1)


def test_circle_gauge_from_the_core_gauges():
    labels = dc.position_labels(5)
    nodes = np.asarray(labels.nodes)
    rope = dc.circle_gauge(gauges.make_rope(nodes, 2, [2.0 * np.pi]))
    np.testing.assert_allclose(np.asarray(rope.angle), 2.0 * np.pi * nodes, rtol=1e-15)
    q = gauges.haar_orthogonal(3, 5, 2)
    prompt = dc.circle_gauge(gauges.make_prompt_gauge(np.arange(5), q))
    direct = dc.circle_gauge_from_matrices(q)
    np.testing.assert_array_equal(np.asarray(prompt.angle), np.asarray(direct.angle))
    np.testing.assert_array_equal(np.asarray(prompt.orientation), np.round(np.linalg.det(q)))
    none = dc.circle_gauge(gauges.IdentityGauge(n=5, d=2))
    assert np.all(np.asarray(none.angle) == 0.0) and np.all(np.asarray(none.orientation) == 1.0)
    with pytest.raises(ValueError, match="needs a gauge in d = 2; got d = 3"):
        dc.circle_gauge(gauges.IdentityGauge(n=5, d=3))


def test_initial_density_checks_and_normalises():
    theta = dc.grid_angles(16)
    state = dc.make_circle_density(2.0 + np.cos(theta), grid=16, labels=3)
    assert state.f.shape == (3, 16)
    np.testing.assert_allclose(2.0 * np.pi * np.mean(np.asarray(state.f), axis=1), 1.0, rtol=1e-15)
    with pytest.raises(ValueError, match=r"must have shape \(3, 16\) .* got \(2, 16\)"):
        dc.make_circle_density(np.ones((2, 16)), grid=16, labels=3)
    with pytest.raises(ValueError, match="must be non-negative; got -1 at label row 0, angle index 8"):
        dc.make_circle_density(np.cos(theta), grid=16, labels=3)
    with pytest.raises(ValueError, match="must be finite"):
        dc.make_circle_density(np.full(16, np.nan), grid=16, labels=3)
    with pytest.raises(ValueError, match="positive mass"):
        dc.make_circle_density(np.zeros(16), grid=16, labels=3)


def test_gauss_labels_integrate_polynomials():
    labels = dc.position_labels(5, rule="gauss")
    nodes, weights = np.asarray(labels.nodes), np.asarray(labels.weights)
    assert float(np.sum(weights * nodes**9)) == pytest.approx(0.1, rel=1e-14)  # exact to degree 9
