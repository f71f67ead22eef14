"""A density through the particles' orchestration (numerics.solve with a pytree state): the same
snapshots as the density's own one-snapshot loop, a batch of laws equal to single runs, adaptive
steps that conserve mass and meet the fixed-step run, and the resolution check that ends a run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core.factors import ToeplitzCos
from attnflow.core.kernel import make_profile
from attnflow.numerics import density_circle as dc
from attnflow.numerics import density_sphere as ds
from attnflow.numerics.density_solve import integrate, run_status
from attnflow.numerics.integrators import RK4, Adaptive
from attnflow.numerics.solve import solve
from attnflow.numerics.status import Status

GRID = 40  # above kernel_grid(1.0) = 36
RK4_DENSITY = RK4(retraction="none")


def _field(beta: float = 1.0, grid: int = GRID, count: int = 2, time_scale: str = "plain"):
    labels = dc.position_labels(count)
    return dc.make_circle_field(
        make_profile("exp", beta=beta, time_scale=time_scale),
        grid=grid,
        labels=labels,
        gauge=dc.rope_circle_gauge(labels, 2 * np.pi),
        factor=ToeplitzCos(xi=labels.nodes, omega=jnp.asarray(2 * np.pi)),
    )


def _law(grid: int, phase: float, count: int = 2) -> jnp.ndarray:
    theta = dc.grid_angles(grid)
    rows = [1.0 + 0.3 * np.cos(theta - phase - 2.0 * k) + 0.1 * np.sin(2 * theta) for k in range(count)]
    return jnp.asarray(np.stack(rows) / (2 * np.pi))


@pytest.mark.slow
def test_solve_takes_a_density_fixed_adaptive_and_batched():
    field = _field()
    f0 = dc.CircleDensity(_law(GRID, 0.0))
    options = dict(dt=0.05, t_end=1.0, save_every=0.25, check=run_status)
    run = solve(field, f0, integrator=RK4_DENSITY, **options)
    assert isinstance(run.xs, dc.CircleDensity) and run.xs.f.shape == (5, 2, GRID)
    assert run.status is Status.ok and int(run.accepted) == 20
    ts, states, codes = integrate(
        field, f0, integrator=RK4_DENSITY, dt=0.05, steps_per_snapshot=5, snapshots=4,
        status=lambda s: dc.status_code(field, s),
    )  # fmt: skip
    # the same steps from the same compiled step function: the density's own loop, bit for bit
    assert np.array_equal(run.ts, np.asarray(ts)) and np.array_equal(run.xs.f, np.asarray(states.f))
    assert np.all(np.asarray(codes) == Status.ok.code)
    # a batch of two laws (one compiled program, lax.map on a CPU): each run is its single run
    other = dc.CircleDensity(_law(GRID, 1.0))
    both = dc.CircleDensity(jnp.stack([f0.f, other.f]))
    batch = solve(field, both, integrator=RK4_DENSITY, batch=True, workers=1, **options)
    assert batch.xs.f.shape == (5, 2, 2, GRID) and list(batch.statuses) == [Status.ok, Status.ok]
    assert np.array_equal(batch.xs.f[:, 0], run.xs.f)
    assert not np.allclose(batch.xs.f[-1, 1], run.xs.f[-1])  # the second law is another run
    # Dormand-Prince with error control: each label's mass to round-off, and the fixed-step run
    # within RK4's own error at dt = 0.05 (measured ~1e-7 of the law's size here)
    adaptive = solve(field, f0, integrator=Adaptive(retraction="none", rtol=1e-10, atol=1e-12), **options)
    assert adaptive.status is Status.ok and int(adaptive.rejected) >= 0 and int(adaptive.accepted) > 0
    mass = 2 * np.pi * np.asarray(adaptive.xs.f).mean(axis=-1)
    assert np.max(np.abs(mass - 1.0)) <= 1e-12
    moved = np.max(np.abs(run.xs.f[-1] - run.xs.f[0]))
    assert moved > 1e-3  # the law moves
    assert np.max(np.abs(adaptive.xs.f[-1] - run.xs.f[-1])) <= 1e-5 * moved


@pytest.mark.slow
def test_solve_takes_a_sphere_density_with_complex_coefficients():
    """S^2 (harmonic coefficients, complex leaves): Dormand-Prince meets RK4 and keeps each mass."""
    field = ds.make_sphere_field(make_profile("exp", beta=1.0), lmax=8, labels=dc.position_labels(2))
    x = np.asarray(field.grid_points())
    f = (1 + 0.3 * x[0] + 0.1 * x[0] * x[1])[None] * np.array([1.0, 0.5])[:, None, None] / (4 * np.pi)
    state = jax.jit(lambda fl, v: fl.initial(v))(field, jnp.asarray(f))
    options = dict(t_end=0.5, save_every=0.25, check=run_status)
    fixed = solve(field, state, integrator=RK4_DENSITY, dt=0.025, **options)
    adaptive = solve(field, state, integrator=Adaptive(retraction="none"), dt=0.05, **options)
    assert fixed.status is Status.ok and adaptive.status is Status.ok
    assert isinstance(adaptive.xs, ds.SphereDensity) and adaptive.xs.a.shape == (3, 2, 9, 9)
    mass = np.sqrt(4 * np.pi) * adaptive.xs.a[:, :, 0, 0].real
    np.testing.assert_allclose(mass, np.broadcast_to(mass[0], mass.shape), rtol=0, atol=1e-13)
    moved = np.max(np.abs(fixed.xs.a[-1] - fixed.xs.a[0]))
    assert moved > 1e-3 and np.max(np.abs(adaptive.xs.a - fixed.xs.a)) <= 1e-5 * moved


def test_the_resolution_check_ends_a_solve_at_its_last_resolved_law():
    # beta = 5 on 64 angles: the mode-3 instability cascades into the top third of the modes by
    # t = 20 (the run folder's under-resolved case)
    field = _field(beta=5.0, grid=64, count=1, time_scale="rescaled")
    theta = dc.grid_angles(64)
    f0 = dc.CircleDensity(jnp.asarray((1.0 + 0.05 * np.cos(3 * theta))[None] / (2 * np.pi)))
    options = dict(integrator=RK4_DENSITY, dt=0.1, t_end=40.0, save_every=5.0)
    checked = solve(field, f0, check=run_status, **options)
    assert checked.status is Status.under_resolved and 2 <= checked.xs.f.shape[0] < 9
    codes = [int(dc.status_code(field, dc.CircleDensity(f))) for f in checked.xs.f]
    assert codes == [Status.ok.code] * len(codes)  # only resolved laws are handed on
    unchecked = solve(field, f0, **options)  # without the check the run goes on: a wrong law
    assert unchecked.status is Status.ok and unchecked.xs.f.shape[0] == 9
    last = int(dc.status_code(field, dc.CircleDensity(unchecked.xs.f[-1])))
    assert last == Status.under_resolved.code
