"""Measured growth rates of the circle's angular modes: one particle simulation, fitted.

The closed form and the fit are :mod:`attnflow.analysis.stability`; here the dynamics run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis.stability import fit_growth_rates, perturbed_circle
from attnflow.core.factors import NoFactor
from attnflow.core.gauges import IdentityGauge
from attnflow.core.kernel import Kernel, Profile
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import RK4
from attnflow.numerics.solve import solve

__all__ = ["measure_growth_rates"]


def measure_growth_rates(
    ks,
    *,
    n: int = 4000,
    beta: float = 5.0,
    c: float = 1.0,
    eps: float = 1e-8,
    t_end: float = 0.3,
    dt: float = 0.02,
    block_size: int | None = None,
) -> np.ndarray:
    """Fitted growth rates of the modes ``ks`` from one particle simulation on ``S^1``.

    Starts from :func:`~attnflow.analysis.stability.perturbed_circle` (``eps`` per mode),
    integrates the USA field (``w = 1``, ``Q = I``, exp profile with constant ``c``) with RK4 up to
    ``t_end`` and fits ``log a_k(t)`` by least squares. Keep ``eps · exp(λ_max t_end)`` small
    (linear regime) and ``λ_max dt`` small (RK4 accuracy).
    """
    profile = Profile(kind="exp", beta=jnp.asarray(beta, jnp.float64), c=jnp.asarray(c, jnp.float64))
    kernel = Kernel(gauge=IdentityGauge(n=n, d=2), factor=NoFactor(n=n), profile=profile)
    field = make_vector_field(kernel, block_size=block_size)
    x0 = jnp.asarray(perturbed_circle(n, ks, eps=eps))
    trajectory = solve(field, x0, integrator=RK4(), dt=dt, t_end=t_end, save_every=dt, key=jax.random.key(0))
    return fit_growth_rates(trajectory.ts, trajectory.xs, ks)
