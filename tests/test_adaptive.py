"""Adaptive Dormand–Prince (numerics.integrators.Adaptive, numerics.steps.AdaptiveSteps /
PIController): first-same-as-last stages counted, the dense output's order, snapshots interpolated
rather than stepped to, rejected steps retried, per-run step statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow.core import gauges, sphere
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.integrators import DOPRI5_DENSE, DOPRI5_TABLEAU
from attnflow.numerics.solve import SaveAt, solve
from attnflow.numerics.steps import AdaptiveSteps, PIController
from helpers_core import factor_none, make_kernel, uniform


def _equiangular(n=8, beta=1.0, rho0=0.1):
    kernel = make_kernel(gauges.IdentityGauge(n=n, d=n), factor_none(n), beta=beta)
    return dynamics.make_vector_field(kernel), sphere.equiangular(n, n, rho0)


def _rho(t_eval, n=8, beta=1.0, rho0=0.1):
    """The closed-form ODE of the equiangular cosine (unnormalised attention)."""
    rate = lambda t, r: 2.0 / n * np.exp(beta * r) * (1 - r) * ((n - 1) * r + 1)  # noqa: E731
    # a short first trial: SciPy's own first guess at beta = 10 overflows exp (then is rejected)
    ode = solve_ivp(rate, (0.0, max(t_eval)), [rho0], method="DOP853", rtol=1e-13, atol=1e-14, t_eval=t_eval,
                    first_step=1e-4)  # fmt: skip
    return ode.y[0]


def _cosine(x):
    n = x.shape[0]
    return (x @ x.T)[~np.eye(n, dtype=bool)].mean()


def test_dense_weights_reduce_to_the_step_at_theta_one():
    # the continuous extension ends where the step ends: sum_j P_ij = b_i (to the tableau round-off)
    np.testing.assert_allclose(np.sum(DOPRI5_DENSE, axis=1), DOPRI5_TABLEAU.b, rtol=0, atol=1e-14)


def test_fsal_six_evaluations_per_trial_step_counted():
    """Every field evaluation is counted by a host callback: one for the first slope, then 6 per
    trial step (accepted or rejected), as ``Trajectory.evaluations`` reports."""
    field, x0 = _equiangular(rho0=0.0)
    calls = []

    def counted(x):
        jax.debug.callback(lambda: calls.append(1))
        return field(x)

    traj = solve(counted, x0, integrator=integrators.Adaptive(rtol=1e-8, atol=1e-10), dt=0.5, t_end=2.0,
                 save_every=0.5)  # fmt: skip
    assert traj.status == "ok"
    trials = int(traj.accepted + traj.rejected)
    assert traj.rejected >= 1  # dt = 0.5 is too long a first trial at rtol 1e-8: at least one retry
    assert len(calls) == int(traj.evaluations) == 1 + 6 * trials, (len(calls), traj.statistics())
    assert traj.steps == trials
    assert traj.statistics() == {
        "steps_accepted": int(traj.accepted),
        "steps_rejected": int(traj.rejected),
        "evaluations": 1 + 6 * trials,
    }


def test_dense_output_is_fourth_order():
    """One step of length h from x0, the interpolant read at theta = 0.4: its error against the
    closed form falls as h^5 (a 4th-order dense output: local error O(h^5))."""
    n = 8
    field, x0 = _equiangular(n=n, rho0=0.0)
    method = integrators.Adaptive()
    theta = 0.4
    hs = np.array([0.4, 0.2, 0.1, 0.05])
    errs = []
    for h in hs:
        _, slopes, _ = method.fsal_step(field, x0, field(x0), h, rtol=1.0, atol=1.0)
        x = np.asarray(method.interpolate(x0, slopes, h, theta))
        errs.append(abs(_cosine(x) - _rho([theta * h], n=n, rho0=0.0)[0]))
    slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert min(errs) > 1e-13, errs  # above the reference's ~1e-14
    assert abs(slope - 5.0) <= 0.3, (errs, slope)  # local order 5 = dense output of order 4


def test_snapshots_are_interpolated_not_stepped_to():
    """100 snapshots from far fewer steps, each within the tolerance of the closed form."""
    n = 8
    field, x0 = _equiangular(n=n)
    traj = solve(field, x0, integrator=integrators.Adaptive(rtol=1e-8, atol=1e-10), dt=0.01, t_end=5.0,
                 save_every=0.05)  # fmt: skip
    assert traj.status == "ok" and len(traj.ts) == 101
    assert traj.accepted < 100, traj.statistics()  # a step per snapshot would be at least 100
    rho = _rho(traj.ts, n=n)
    errors = [abs(_cosine(x) - r) for x, r in zip(traj.xs, rho, strict=True)]
    # local control at 1e-8 over 5 time units, interpolation of the same order: within 1e-6
    assert max(errors) <= 1e-6, max(errors)
    np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, rtol=0, atol=1e-12)  # renormalised


def test_rejected_steps_shrink_and_retry_at_large_beta():
    """A long first trial step at beta = 10 is rejected (its error is huge or not finite) and
    retried shorter; the run ends ok on the closed form. (The collapsed state is stiff at this beta:
    an explicit method needs ~1e4 steps per unit time there, hence the short span.)"""
    n, beta = 8, 10.0
    field, x0 = _equiangular(n=n, beta=beta, rho0=0.5)
    traj = solve(field, x0, integrator=integrators.Adaptive(rtol=1e-8, atol=1e-10), dt=5.0, t_end=0.2,
                 save_every=0.1)  # fmt: skip
    assert traj.status == "ok", traj.status
    assert traj.rejected >= 1
    rho = _rho(traj.ts, n=n, beta=beta, rho0=0.5)
    # global error of the controlled run: 100 rtol (as the tolerance-scaling test)
    np.testing.assert_allclose([_cosine(x) for x in traj.xs], rho, rtol=0, atol=1e-6)


def test_nonfinite_trial_steps_are_rejected_not_fatal():
    """A field that is NaN away from the sphere (long trial steps leave it): the NaN trials are
    rejected and retried shorter; only a field that is NaN everywhere ends the run (at max_steps,
    reported as non-finite)."""
    rot = np.zeros((3, 3))
    rot[1, 0], rot[0, 1] = 10.0, -10.0  # fast rotation about e_3

    def field(x):
        off = jnp.any(jnp.abs(jnp.linalg.norm(x, axis=-1) - 1.0) > 0.5)
        return jnp.where(off, jnp.nan, 1.0) * (x @ jnp.asarray(rot).T)

    x0 = sphere.normalize(jnp.array([[1.0, 0.0, 0.5]]))
    traj = solve(field, x0, integrator=integrators.Adaptive(), dt=1.0, t_end=1.0, save_every=0.5)
    assert traj.status == "ok" and traj.rejected >= 1
    angle = np.arctan2(traj.xs[-1, 0, 1], traj.xs[-1, 0, 0])
    # 10 rad about e_3, modulo 2 pi; error control at rtol 1e-8 over 10 rad: 1e-6
    assert abs(np.angle(np.exp(1j * (angle - 10.0)))) <= 1e-6
    stuck = solve(lambda x: x * jnp.nan, x0, integrator=integrators.Adaptive(), dt=0.1, t_end=1.0,
                  save_every=0.5, max_steps_per_snapshot=50)  # fmt: skip
    assert stuck.status == "nonfinite" and int(stuck.rejected) == 50 and int(stuck.accepted) == 0


def test_pi_controller_validates_and_the_integral_controller_is_a_special_case():
    with pytest.raises(ValueError, match=r"^PIController: `pcoeff` must be >= 0; got -0\.1\.$"):
        PIController(pcoeff=-0.1)
    with pytest.raises(ValueError, match=r"^PIController: `safety` must be in \(0, 1\]; got 1\.5\.$"):
        PIController(safety=1.5)
    with pytest.raises(ValueError, match=r"^PIController: `factor_min` and `factor_max` must satisfy"):
        PIController(factor_min=2.0)
    integral = PIController(pcoeff=0.0, icoeff=1.0, factor_max=5.0)
    accept, h, prev = integral.adapt(jnp.asarray(0.1), jnp.asarray(2.0**-5), jnp.asarray(0.3), 5)
    assert bool(accept) and float(prev) == 2.0**-5
    np.testing.assert_allclose(float(h), 0.1 * 0.9 * 2.0, rtol=1e-14)  # safety · err^(-1/5) = 0.9 · 2
    accept, h, prev = integral.adapt(jnp.asarray(0.1), jnp.asarray(jnp.nan), jnp.asarray(0.3), 5)
    assert not bool(accept) and float(prev) == 0.3
    np.testing.assert_allclose(float(h), 0.1 * 0.2, rtol=1e-14)  # non-finite: the smallest factor
    # both controllers meet the tolerance on the same run; the PI one takes no more rejections here
    field, x0 = _equiangular(rho0=0.0)
    runs = {
        name: solve(field, x0, integrator=integrators.Adaptive(), saveat=SaveAt(3.0, 1.0),
                    stepsize=AdaptiveSteps(rtol=1e-8, atol=1e-10, dt0=0.01, controller=controller))
        for name, controller in (("i", integral), ("pi", PIController()))
    }  # fmt: skip
    rho = _rho([3.0], rho0=0.0)[0]
    for run in runs.values():
        assert run.status == "ok" and abs(_cosine(run.xs[-1]) - rho) <= 1e-6


def test_batch_statistics_are_per_run():
    field, x0 = _equiangular(n=8, rho0=0.0)
    xs = jnp.stack([x0, sphere.normalize(x0 + 0.05 * uniform(8, 8, seed=1))])
    opts = dict(integrator=integrators.Adaptive(), dt=0.1, t_end=1.0, save_every=0.5)
    batch = solve(field, xs, workers=1, **opts)
    assert batch.accepted.shape == (2,)
    for b in range(2):
        single = solve(field, xs[b], **opts)
        assert (int(batch.accepted[b]), int(batch.evaluations[b])) == (
            int(single.accepted),
            int(single.evaluations),
        )
        np.testing.assert_array_equal(batch.xs[:, b], single.xs)  # lax.map of the unbatched program
