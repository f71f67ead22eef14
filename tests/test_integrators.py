"""Integrators and the time loop (numerics.integrators, numerics.solve): norms, measured convergence
orders (and a fake RK4 that must fail them), adaptive tolerance proportionality, the equiangular closed
form of the equiangular ODE, solver statuses, noise and batching; a pytree state (a density's) stepped
as its flattened array, and a one-leaf pytree bitwise as the bare array."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow.core import gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.integrators import DOPRI5_TABLEAU, RK4_TABLEAU, Tableau
from attnflow.numerics.solve import Problem, SaveAt, Status, advance, snapshot_count, solve
from attnflow.numerics.steps import AdaptiveSteps, ConstantSteps, all_finite, time_dtype
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


@pytest.mark.slow
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


# --- pytree states (a density's) -------------------------------------------------------------------

_SHAPES = {"u": (3, 4), "v": (5,)}  # a state of two leaves, 17 numbers


def _flat_problem(seed=0):
    """A nonlinear field on R^17 (``A x + 0.3 sin x``) and the same field on the pytree of two leaves
    (flattened in, the same flat computation, split out): their values are the same numbers."""
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal((17, 17)) / 4.0)

    def flat_field(x):
        return a @ x + 0.3 * jnp.sin(x)

    def split(x):
        return {"u": x[:12].reshape(3, 4), "v": x[12:]}

    def join(tree):
        return jnp.concatenate([tree["u"].reshape(-1), tree["v"]])

    def tree_field(tree):
        return split(flat_field(join(tree)))

    x0 = jnp.asarray(rng.standard_normal(17))
    return flat_field, tree_field, x0, split, join


@pytest.mark.parametrize("method", ["euler", "rk4", "adaptive"])
def test_a_pytree_state_steps_as_its_flattened_array(method):
    """The stage sums are leaf by leaf, entry by entry: a step of the pytree is the step of the flat
    array, bitwise; the embedded error's RMS is over every entry of every leaf (the same number, up
    to the order of the sum)."""
    flat_field, tree_field, x0, split, join = _flat_problem()
    integrator = integrators.make_integrator(method)
    integrator = type(integrator)(retraction="none")
    step_flat = jax.jit(lambda x: integrator.step(flat_field, x, 0.1))
    step_tree = jax.jit(lambda x: integrator.step(tree_field, x, 0.1))
    stepped = step_flat(x0)
    assert np.abs(np.asarray(stepped - x0)).max() > 1e-2  # it moves
    np.testing.assert_array_equal(np.asarray(join(step_tree(split(x0)))), np.asarray(stepped))
    if method == "adaptive":
        flat, err_flat = integrator.step_with_error(flat_field, x0, 0.1, rtol=1e-8, atol=1e-10)
        tree, err_tree = integrator.step_with_error(tree_field, split(x0), 0.1, rtol=1e-8, atol=1e-10)
        np.testing.assert_array_equal(np.asarray(join(tree)), np.asarray(flat))
        assert float(err_flat) > 1.0  # a long step: the estimate is not round-off
        # one sum of 17 squares against two sums of 12 and 5: round-off of the sum only
        assert float(err_tree) == pytest.approx(float(err_flat), rel=1e-14)


def test_a_complex_leaf_counts_each_entry_once_in_the_error_norm():
    """A complex leaf ``z`` against the pytree of its real and imaginary parts under the same field:
    the steps agree, and the error norm's mean runs over the complex entries (``|z|²`` each), so it is
    ``sqrt 2`` times the pair's (twice as many real entries). A norm of ``z²`` (complex) would not be."""
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.standard_normal((6, 6)) / 3.0)
    z0 = jnp.asarray(rng.standard_normal(6) + 1j * rng.standard_normal(6))
    method = integrators.Adaptive(retraction="none")
    options = dict(rtol=0.0, atol=1e-8)
    z1, err_complex = method.step_with_error(lambda z: a @ z.real + 1j * (a @ z.imag), z0, 0.2, **options)
    pair = {"re": z0.real, "im": z0.imag}
    p1, err_pair = method.step_with_error(
        lambda p: {"re": a @ p["re"], "im": a @ p["im"]}, pair, 0.2, **options
    )
    assert np.iscomplexobj(np.asarray(z1)) and np.asarray(err_complex).dtype == np.float64
    # the same sums; the complex tensordot's promotion of the real weights may round differently
    np.testing.assert_allclose(np.asarray(z1.real), np.asarray(p1["re"]), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(z1.imag), np.asarray(p1["im"]), rtol=0, atol=1e-14)
    assert float(err_pair) > 1.0
    # the estimate is a difference of two numbers of size ~1 some 2e-7 apart: their round-off (the
    # steps' 1e-14 above) is 1e-9 of it
    assert float(err_complex) == pytest.approx(np.sqrt(2.0) * float(err_pair), rel=1e-8)
    assert time_dtype({"z": z0, "x": jnp.zeros(2, jnp.float32)}) == np.float64  # the real dtype of the state
    assert bool(all_finite(pair)) and not bool(all_finite({**pair, "im": pair["im"].at[0].set(jnp.inf)}))


def _advance_adaptive(field, x0, *, t_end=2.0):
    """``solve.advance``, the loop's pure core, with error control from ``x0`` (an array or a pytree)."""
    method = integrators.Adaptive(retraction="none")
    policy = AdaptiveSteps(rtol=1e-9, atol=1e-11, dt0=0.01)
    problem = Problem(field, method, policy, SaveAt(t_end, t_end / 2))
    carry = (x0, jax.random.key(0), policy.init(method, x0), np.zeros((), np.int32))
    return advance(problem, carry, jnp.asarray([t_end / 2, t_end]))


def test_the_adaptive_controller_and_loop_take_a_pytree_state():
    """Error control, dense output and the loop on the pytree give the flat run: the same accepted
    and rejected steps, the same snapshots (the error norms differ by round-off, not enough to
    change a decision here)."""
    flat_field, tree_field, x0, split, join = _flat_problem(seed=1)
    _, (xs_flat, codes_flat, stats_flat) = _advance_adaptive(flat_field, x0)
    _, (xs_tree, codes_tree, stats_tree) = _advance_adaptive(tree_field, split(x0))
    assert np.asarray(codes_flat).tolist() == np.asarray(codes_tree).tolist() == [0, 0]
    np.testing.assert_array_equal(np.asarray(stats_tree), np.asarray(stats_flat))
    assert int(np.asarray(stats_flat)[:, 0].sum()) > 10  # controlled steps, not one
    assert xs_tree["u"].shape == (2, 3, 4)  # snapshots stacked leaf by leaf
    joined = jax.vmap(join)(xs_tree)
    np.testing.assert_allclose(np.asarray(joined), np.asarray(xs_flat), rtol=0, atol=1e-13)
    # against the exact flow of the same ODE: within the tolerance
    exact = solve_ivp(lambda t, x: np.asarray(flat_field(jnp.asarray(x))), (0.0, 2.0), np.asarray(x0),
                      method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1]  # fmt: skip
    assert np.abs(np.asarray(xs_flat[-1]) - exact).max() <= 1e-6 * max(1.0, np.abs(exact).max())


@pytest.mark.parametrize("method", ["euler", "rk4", "adaptive"])
def test_a_one_leaf_pytree_is_bitwise_the_array(method):
    """The particles' results stay what they were: a state wrapped in a one-leaf pytree takes the
    very operations of the bare array (the tree maps add nothing), so the steps, and for
    Dormand–Prince the slopes, error norm and dense output, are bitwise equal (the identity
    retraction: the sphere's renormalisation takes the bare array only)."""
    field = _field_rope_db()
    x0 = uniform(16, 3, seed=3)
    integrator = type(integrators.make_integrator(method))(retraction="none")

    def wrapped(tree):
        return {"x": field(tree["x"])}

    bare = jax.jit(lambda x: integrator.step(field, x, 0.1))(x0)
    tree = jax.jit(lambda tree: integrator.step(wrapped, tree, 0.1))({"x": x0})
    np.testing.assert_array_equal(np.asarray(tree["x"]), np.asarray(bare))
    if method != "adaptive":
        return

    @functools.partial(jax.jit, static_argnums=2)
    def trial(x, k1, f):
        new, slopes, err = integrator.fsal_step(f, x, k1, 0.1, rtol=1e-6, atol=1e-8)
        return new, slopes, err, integrator.interpolate(x, slopes, 0.1, 0.3)

    bare = trial(x0, field(x0), field)
    tree = trial({"x": x0}, {"x": field(x0)}, wrapped)
    for a, b in zip(bare, (tree[0]["x"], tree[1]["x"], tree[2], tree[3]["x"]), strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
