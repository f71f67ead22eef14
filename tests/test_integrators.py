"""Integrators and the time loop (numerics.integrators, numerics.solve): norms, measured convergence
orders (and a fake RK4 that must fail them), adaptive tolerance proportionality, the equiangular closed
form of the equiangular ODE, solver statuses, noise and batching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow.core import gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.integrators import DOPRI5_TABLEAU, RK4_TABLEAU, Tableau
from attnflow.numerics.solve import SaveAt, Status, snapshot_count, solve
from attnflow.numerics.steps import AdaptiveSteps, ConstantSteps
from helpers_core import (
    factor_distance_bias,
    factor_none,
    gauge_generalized_zx,
    gauge_rope_full_period,
    make_kernel,
    uniform,
)


class FakeRK4(integrators.RK4):
    """RK4 stages with the weights of Euler (b = (1, 0, 0, 0)): claims order 4, is order 1."""

    tableau = Tableau(a=RK4_TABLEAU.a, b=(1.0, 0.0, 0.0, 0.0), c=RK4_TABLEAU.c)


def _field_rope_db(n=16, normalization="usa", causal=False):
    k = make_kernel(gauge_rope_full_period(n), factor_distance_bias(n), beta=1.0)
    return dynamics.make_vector_field(k, normalization=normalization, causal=causal)


@pytest.mark.parametrize("method", integrators.METHODS)
def test_norms_stay_one(method):
    n = 16
    integ = integrators.make_integrator(method, rtol=1e-8, atol=1e-10)
    traj = solve(
        _field_rope_db(n, "sa", True),
        uniform(n, 3, seed=1),
        integrator=integ,
        dt=0.05,
        t_end=2.0,
        save_every=0.5,
    )
    assert traj.status == "ok"
    np.testing.assert_allclose(traj.ts, [0.0, 0.5, 1.0, 1.5, 2.0], rtol=0, atol=1e-15)  # k·save_every
    # every step ends with a normalisation (or the exact exp map): |x| = 1 to a few ulps, never drifting
    np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, rtol=0, atol=1e-12)
    assert np.abs(traj.xs[-1] - traj.xs[0]).max() > 1e-2  # it moved
    if method != "adaptive":
        assert traj.steps == 40  # t_end / dt fixed steps, in four chunks of 10


# --- convergence order ---------------------------------------------------------------------------

DTS = np.array([0.1, 0.05, 0.025, 0.0125])
T_ORDER = 1.0


@pytest.fixture(scope="module")
def order_problem():
    n = 16
    k = make_kernel(gauge_generalized_zx(n), factor_distance_bias(n), beta=1.0)
    field = dynamics.make_vector_field(k)
    x0 = uniform(n, 3, seed=2)
    ref = solve(
        field,
        x0,
        integrator=integrators.Adaptive(rtol=1e-13, atol=1e-14),
        dt=1e-3,
        t_end=T_ORDER,
        save_every=T_ORDER,
    )
    assert ref.status == "ok"
    return field, x0, ref.xs[-1]


def _errors(integrator, problem):
    field, x0, x_ref = problem
    errs = []
    for dt in DTS:
        traj = solve(field, x0, integrator=integrator, dt=float(dt), t_end=T_ORDER, save_every=T_ORDER)
        errs.append(np.abs(traj.xs[-1] - x_ref).max())
    return np.asarray(errs)


def _slope(errs):
    return np.polyfit(np.log(DTS), np.log(errs), 1)[0]


@pytest.mark.parametrize(
    "integrator",
    [integrators.Euler(), integrators.RK4(), integrators.GeodesicRK4()],
    ids=["euler", "rk4", "geodesic_rk4"],
)
def test_convergence_order(integrator, order_problem):
    errs = _errors(integrator, order_problem)
    # the smallest RK4 error (measured 2e-11) stays ≥ 10× above the reference's ~1e-13 (DOPRI5 at
    # rtol 1e-13), so the fit is not floored by the reference
    assert errs.min() > 1e-12
    # ±0.3 around the declared order: the acceptance band of the issue (diffrax test_ode_order)
    assert abs(_slope(errs) - integrator.order) <= 0.3, (errs, _slope(errs))


def test_fake_rk4_fails_the_order_test(order_problem):
    fake = FakeRK4()
    assert fake.order == 4
    slope = _slope(_errors(fake, order_problem))
    # a first-order method measured with the same fit: slope 1 ± 0.3, outside 4 ± 0.3
    assert abs(slope - 1.0) <= 0.3, slope
    assert abs(slope - fake.order) > 0.3


def test_adaptive_error_scales_with_tolerance(order_problem):
    field, x0, x_ref = order_problem
    errs = []
    for rtol in (1e-4, 1e-6, 1e-8):
        traj = solve(
            field,
            x0,
            integrator=integrators.Adaptive(rtol=rtol, atol=rtol),
            dt=0.01,
            t_end=T_ORDER,
            save_every=T_ORDER,
        )
        assert traj.status == "ok"
        errs.append(np.abs(traj.xs[-1] - x_ref).max())
        # global error within 100·rtol: local control at rtol, accumulated over a unit time
        assert errs[-1] <= 100 * rtol, (rtol, errs[-1])
    # two decades of tolerance buy at least one decade of error (a 5th-order pair gives ~40×)
    assert errs[0] / errs[1] >= 10 and errs[1] / errs[2] >= 10, errs


def _equiangular_problem(n=8, beta=1.0, rho0=0.1):
    k = make_kernel(gauges.IdentityGauge(n=n, d=n), factor_none(n), beta=beta)
    return dynamics.make_vector_field(k), sphere.equiangular(n, n, rho0)


def _equiangular_rho(t_end, n=8, beta=1.0, rho0=0.1):
    ode = solve_ivp(_rho_rate("usa", n, beta), (0.0, t_end), [rho0], method="DOP853", rtol=1e-13, atol=1e-14)
    return ode.y[0, -1]


def test_adaptive_method_measured_order_on_the_equiangular_closed_form():
    """The Dormand–Prince method of ``Adaptive`` with fixed steps (``ConstantSteps``): its error in
    the pairwise cosine against the closed-form ODE falls as h^5; under error control the same
    error stays within 100 tol."""
    n, t_end = 32, 1.0
    field, x0 = _equiangular_problem(n=n, rho0=0.0)
    rho = _equiangular_rho(t_end, n=n, rho0=0.0)
    off = ~np.eye(n, dtype=bool)

    def error(traj):
        return abs((traj.xs[-1] @ traj.xs[-1].T)[off].mean() - rho)

    hs = np.array([0.1, 0.05, 0.025])
    errs = [
        error(solve(field, x0, integrator=integrators.Adaptive(), stepsize=ConstantSteps(float(h)),
                    saveat=SaveAt(t_end, t_end)))
        for h in hs
    ]  # fmt: skip
    # the smallest error (measured 7.5e-13) stays >= 10x above the DOP853 reference's ~1e-14; at
    # larger steps DOPRI5's small principal error constant lets higher-order terms show (slope > 5)
    assert min(errs) > 1e-13, errs
    slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert abs(slope - integrators.Adaptive.order) <= 0.3, (errs, slope)  # the band of the fixed-step methods
    for tol in (1e-6, 1e-9):
        traj = solve(field, x0, integrator=integrators.Adaptive(rtol=tol, atol=tol), dt=0.01, t_end=t_end,
                     save_every=t_end)  # fmt: skip
        # global error within 100 tol: local control at tol over a unit time
        assert error(traj) <= 100 * tol, (tol, error(traj))


def test_tableaus_validate_themselves():
    assert DOPRI5_TABLEAU.c[-1] == 1.0 and RK4_TABLEAU.c == (0.0, 0.5, 0.5, 1.0)
    with pytest.raises(
        ValueError, match=r"^Tableau: row 2 of `a` must sum to its node c\[2\] = 0\.5; got 0\.6"
    ):
        Tableau(a=((), (0.5,), (0.1, 0.5), (0.0, 0.0, 1.0)), b=RK4_TABLEAU.b, c=RK4_TABLEAU.c)
    with pytest.raises(ValueError, match=r"^Tableau: `b` must be 4 weights summing to 1; got .*\(sum 1\.1"):
        Tableau(a=RK4_TABLEAU.a, b=(0.25, 0.25, 0.25, 0.35), c=RK4_TABLEAU.c)
    with pytest.raises(ValueError, match=r"^Tableau: `a` must be strictly lower triangular \(row 1"):
        Tableau(a=((), (0.25, 0.25)), b=(0.5, 0.5), c=(0.0, 0.5))
    with pytest.raises(ValueError, match=r"^Tableau: `b` and `c` must have one entry per stage \(2\)"):
        Tableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0,))
    with pytest.raises(ValueError, match=r"^Tableau: `b_error` must be 2 weights summing to 1"):
        Tableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), b_error=(1.0, 1.0))


def test_step_policies_validate_and_replace_the_keywords():
    field = _field_rope_db()
    x0 = uniform(16, 3, seed=7)
    with pytest.raises(ValueError, match=r"^ConstantSteps: `dt` must be positive; got 0\.0\.$"):
        ConstantSteps(0.0)
    with pytest.raises(ValueError, match=r"^AdaptiveSteps: `max_steps` must be an integer in \[1, 2\^31\)"):
        AdaptiveSteps(max_steps=0)
    with pytest.raises(ValueError, match=r"must have an embedded error estimate .*; got RK4\."):
        solve(field, x0, integrator=integrators.RK4(), stepsize=AdaptiveSteps(), t_end=0.2, save_every=0.1)
    with pytest.raises(ValueError, match=r"^solve: `dt` must be given"):
        solve(field, x0, integrator=integrators.RK4(), t_end=0.2, save_every=0.1)
    keywords = solve(field, x0, integrator=integrators.RK4(), dt=0.05, t_end=0.4, save_every=0.2)
    objects = solve(
        field, x0, integrator=integrators.RK4(), stepsize=ConstantSteps(0.05), saveat=SaveAt(0.4, 0.2)
    )
    np.testing.assert_array_equal(keywords.xs, objects.xs)  # the keywords build exactly these objects


# --- equiangular closed form ----------------------------------------------------------------------


def _rho_rate(normalization, n, beta):
    if normalization == "usa":
        return lambda t, r: 2.0 / n * np.exp(beta * r) * (1 - r) * ((n - 1) * r + 1)
    return lambda t, r: (
        2.0 * np.exp(beta * r) * (1 - r) * ((n - 1) * r + 1) / (np.exp(beta) + (n - 1) * np.exp(beta * r))
    )


@pytest.mark.parametrize("beta", [1.0, 2.0])
@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_equiangular_closed_form(normalization, beta):
    n, rho0, t_end = 8, 0.1, 3.0
    x0 = sphere.equiangular(n, n, rho0)
    k = make_kernel(gauges.IdentityGauge(n=n, d=n), factor_none(n), beta=beta)  # Q = I, w = 1, c = 1
    field = dynamics.make_vector_field(k, normalization=normalization)
    traj = solve(field, x0, integrator=integrators.RK4(), dt=1e-3, t_end=t_end, save_every=0.5)
    ode = solve_ivp(
        _rho_rate(normalization, n, beta),
        (0.0, t_end),
        [rho0],
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=traj.ts,
    )
    off = ~np.eye(n, dtype=bool)
    for x, rho in zip(traj.xs, ode.y[0], strict=True):
        cosines = (x @ x.T)[off]
        # symmetry keeps all pairwise cosines equal: RK4 treats every pair alike, so only round-off
        assert np.ptp(cosines) <= 1e-12
        # RK4 at dt = 1e-3 (global ~1e-11) and DOP853 at 1e-12: the bound 1e-8 is safe
        np.testing.assert_allclose(cosines.mean(), rho, rtol=0, atol=1e-8)
    assert ode.y[0, -1] > 0.5  # the run goes well into the collapse, not a flat comparison


# --- statuses, noise, batches ---------------------------------------------------------------------


def test_nonfinite_status_keeps_finite_snapshots():
    x0 = uniform(8, 3, seed=3)
    traj = solve(lambda x: x * jnp.nan, x0, integrator=integrators.RK4(), dt=0.1, t_end=1.0, save_every=0.5)
    assert traj.status == "nonfinite"
    assert traj.xs.shape == (1, 8, 3)
    np.testing.assert_array_equal(traj.xs[0], np.asarray(x0))  # the initial snapshot, untouched
    np.testing.assert_array_equal(traj.ts, [0.0])

    rot = np.zeros((3, 3))
    rot[1, 0], rot[0, 1] = 1.0, -1.0  # rotation about e_3 at unit speed

    def field(x):  # turns every point about e_3, and becomes NaN once a point passes azimuth ~1.2 rad
        v = x @ jnp.asarray(rot).T
        return jnp.where(jnp.any(x[:, 1] > 0.9 * jnp.linalg.norm(x[:, :2], axis=1)), jnp.nan, 1.0) * v

    x0 = sphere.normalize(jnp.array([[1.0, 0.0, 0.5]]))
    traj = solve(field, x0, integrator=integrators.Euler(), dt=0.01, t_end=3.0, save_every=0.25)
    assert traj.status == "nonfinite"
    # azimuth (Euler then normalise advances the angle by arctan(dt) per step) reaches arcsin 0.9 ≈ 1.12
    # between 1.0 and 1.25: snapshots 0, 0.25, ..., 1.0 are kept, all finite
    np.testing.assert_allclose(traj.ts, [0.0, 0.25, 0.5, 0.75, 1.0], rtol=0, atol=1e-15)
    assert np.all(np.isfinite(traj.xs))


def test_nonfinite_status_adaptive():
    x0 = uniform(8, 3, seed=3)
    traj = solve(
        lambda x: x * jnp.nan,
        x0,
        integrator=integrators.Adaptive(),
        dt=0.1,
        t_end=1.0,
        save_every=0.5,
        max_steps_per_snapshot=1000,
    )
    assert traj.status == "nonfinite"
    assert traj.xs.shape == (1, 8, 3)


def test_max_steps_status():
    traj = solve(
        _field_rope_db(),
        uniform(16, 3, seed=4),
        integrator=integrators.Adaptive(rtol=1e-12, atol=1e-12),
        dt=0.1,
        t_end=1.0,
        save_every=0.5,
        max_steps_per_snapshot=3,
    )
    assert traj.status == "max_steps"
    assert traj.xs.shape == (1, 16, 3)


def test_max_steps_bounds_the_whole_run():
    """``max_steps`` counts every trial step of the run (not per snapshot): a run that needs more
    stops with status ``max_steps`` after exactly that many, keeping the snapshots it reached; a
    fixed-step run whose known step count is over the bound is refused before it starts."""
    opts = dict(dt=0.1, t_end=2.0, save_every=0.25)
    field, x0 = _field_rope_db(), uniform(16, 3, seed=4)
    free = solve(field, x0, integrator=integrators.Adaptive(rtol=1e-10, atol=1e-12), **opts)
    steps = int(free.accepted + free.rejected)
    assert free.status == "ok" and steps > 20
    bound = steps // 2
    tight = integrators.Adaptive(rtol=1e-10, atol=1e-12)
    capped = solve(field, x0, integrator=tight, max_steps=bound, **opts)
    assert capped.status == "max_steps" and int(capped.accepted + capped.rejected) == bound
    kept = capped.xs.shape[0]
    assert 1 < kept < free.xs.shape[0]
    np.testing.assert_array_equal(capped.xs, free.xs[:kept])  # the bound changes nothing before it
    with pytest.raises(ValueError, match=r"^solve: `max_steps` = 39 is fewer than the 40 fixed steps"):
        solve(field, x0, integrator=integrators.RK4(), max_steps=39, **(opts | {"dt": 0.05}))


def test_statuses_are_per_run_with_remedy_messages():
    """A batch whose run 1 goes non-finite: run 1 stops (NaN after its last finite snapshot), the
    others reach t_end, bitwise as when run alone."""

    def field(x):  # a rotation about e_3 that turns NaN once a point passes azimuth ~1.12 rad
        v = x @ jnp.asarray([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]).T
        return jnp.where(jnp.any(x[:, 1] > 0.9 * jnp.linalg.norm(x[:, :2], axis=1)), jnp.nan, 1.0) * v

    starts = [[1.0, 0.0, 0.5], [1.0, 0.0, 0.5], [1.0, -1.0, 0.5]]  # run 0 and 2 are turned back below
    x0 = sphere.normalize(jnp.asarray(starts))[:, None, :]
    x0 = x0.at[0].set(sphere.normalize(jnp.asarray([[1.0, -3.0, 0.5]])))  # 2.4 rad away: never passes
    x0 = x0.at[2].set(sphere.normalize(jnp.asarray([[1.0, -2.0, 0.5]])))  # 2.2 rad away: never passes
    opts = dict(integrator=integrators.Euler(), dt=0.01, t_end=2.0, save_every=0.25, workers=1)
    traj = solve(field, x0, **opts)
    assert list(traj.statuses) == [Status.ok, Status.nonfinite, Status.ok]
    assert traj.status == "nonfinite" and traj.status is Status.nonfinite  # the first that is not ok
    assert traj.xs.shape == (9, 3, 1, 3) and np.all(np.isfinite(traj.xs[:, [0, 2]]))
    alone = solve(field, x0[1], **opts)
    assert alone.status == Status.nonfinite and alone.statuses.shape == ()
    kept = len(alone.ts)  # 5: snapshots 0 .. 1.0
    np.testing.assert_array_equal(traj.xs[:kept, 1], alone.xs)
    assert np.all(np.isnan(traj.xs[kept:, 1]))
    np.testing.assert_array_equal(traj.xs[:, 0], solve(field, x0[0], **opts).xs)
    assert "reduce `dt` or `beta`, or use float64" in Status.nonfinite.message
    assert "max_steps_per_snapshot" in Status.max_steps.message
    assert "solver.max_steps" in Status.max_steps.message
    assert f"{Status.max_steps}" == "max_steps" and Status("ok") is Status.ok


def test_noise_norms_and_reproducibility():
    field = _field_rope_db()
    x0 = uniform(16, 3, seed=5)
    opts = dict(integrator=integrators.RK4(), dt=0.01, t_end=0.5, save_every=0.25, noise=0.2)
    a = solve(field, x0, key=jax.random.key(1), **opts)
    b = solve(field, x0, key=jax.random.key(1), **opts)
    c = solve(field, x0, key=jax.random.key(2), **opts)
    # renormalised after every noise increment: unit norms to a few ulps
    np.testing.assert_allclose(np.linalg.norm(a.xs, axis=-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.xs, b.xs)  # same key, same compiled program: bitwise reproducible
    # different keys: increments of size sqrt(2·0.2·0.01) = 0.06 per step leave O(0.1) differences
    # (so the noise does act: a deterministic run could not depend on the key)
    assert np.abs(a.xs[-1] - c.xs[-1]).max() > 1e-2
    with pytest.raises(ValueError, match=r"`noise` > 0 needs a fixed-step method"):
        solve(field, x0, integrator=integrators.Adaptive(), dt=0.01, t_end=0.5, save_every=0.25, noise=0.2)


@pytest.mark.parametrize("method", ["rk4", "adaptive"])
def test_batched_equals_single(method):
    n, b = 16, 2
    field = _field_rope_db(n)
    x0 = jnp.stack([uniform(n, 3, seed=10 + s) for s in range(b)])
    opts = dict(
        integrator=integrators.make_integrator(method, rtol=1e-8, atol=1e-10),
        dt=0.05,
        t_end=1.0,
        save_every=0.5,
    )
    batch = solve(field, x0, **opts)
    assert batch.status == "ok" and batch.xs.shape == (3, b, n, 3)
    for s in range(b):
        single = solve(field, x0[s], **opts)
        # on a CPU every run of a batch is the unbatched program (lax.map over the runs), with
        # its own adaptive step sequence: bitwise equal
        np.testing.assert_array_equal(batch.xs[:, s], single.xs)


def test_make_integrator_and_orders():
    assert [integrators.make_integrator(m).order for m in integrators.METHODS] == [1, 4, 4, 5]
    adaptive = integrators.make_integrator("adaptive", rtol=1e-5, atol=1e-7)
    assert (adaptive.rtol, adaptive.atol) == (1e-5, 1e-7)
    with pytest.raises(ValueError, match=r"`method` must be one of .*'rk4'.*; got 'rk5'"):
        integrators.make_integrator("rk5")
    assert snapshot_count(20.0, 0.1) == 201


def test_fixed_step_dt_not_dividing_save_every():
    field = _field_rope_db()
    x0 = uniform(16, 3, seed=7)
    with pytest.raises(ValueError, match=r"`save_every` must be a whole multiple of `dt` = 0\.03"):
        solve(field, x0, integrator=integrators.RK4(), dt=0.03, t_end=0.2, save_every=0.1)
    with pytest.raises(ValueError, match=r"`t_end` must be a whole multiple of `save_every`"):
        solve(field, x0, integrator=integrators.RK4(), dt=0.01, t_end=0.25, save_every=0.1)


def test_float32_solve_with_default_factor():
    """dtype float32 with the default factor: the scan carry stays float32 (no promotion by NoFactor)."""
    n = 16
    g = gauges.IdentityGauge(n=n, d=3)
    k = Kernel(g, factor_none(n), make_profile("exp", beta=1.0, dtype=jnp.float32))
    x0 = sphere.sample_uniform(jax.random.key(0), n, 3, dtype=jnp.float32)
    traj = solve(
        dynamics.make_vector_field(k), x0, integrator=integrators.RK4(), dt=0.01, t_end=0.1, save_every=0.05
    )
    assert traj.status == "ok" and traj.xs.dtype == np.float32
    # float32 renormalisation: unit norms to a few float32 ulps
    np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, rtol=0, atol=1e-6)
