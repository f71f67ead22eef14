"""Closed-form theory: energy bounds and maximiser sets (SPEC §1.3, §2).

- ``energy_max(kernel)``: the maximum of ``E`` over configurations with the kernel's labels, where
  the theory gives it, else ``None``:
  - gauge kernels with ``w = 1``: ``φ(1)/2`` (``c e^β/(2β)`` for exp, ``c/2`` for linear),
    attained on the orbit ``{Q(ξ_i)ᵀ v}``;
  - a non-negative factor with a non-decreasing profile: ``φ(1) · mean(W) / 2`` (D1), attained in
    the gauge frame at a Dirac;
  - the Toeplitz cosine factor with the linear profile and no gauge: ``c λ_max(W) / (2n)`` when
    ``W`` has a double top eigenvalue (full-period positions), attained by the uniform great
    circle (D2);
  - otherwise ``None`` (e.g. D3: exponential profile with a sign-changing factor).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from attnflow.factors import NoFactor, ToeplitzCos
from attnflow.gauges import IdentityGauge
from attnflow.kernels import Kernel


def energy_max(kernel: Kernel) -> float | None:
    """Maximal energy for the kernel's labels where SPEC §2 gives it in closed form, else ``None``."""
    phi_one = float(kernel.profile.phi(jnp.asarray(1.0)))
    factor = kernel.factor
    if isinstance(factor, NoFactor):
        return phi_one / 2.0
    if factor.nonnegative:
        return phi_one * float(jnp.mean(factor.matrix())) / 2.0
    linear_cosine = kernel.profile.kind == "linear" and isinstance(factor, ToeplitzCos)
    if linear_cosine and isinstance(kernel.gauge, IdentityGauge):
        # tr(WG) <= λ_max(W) tr(G) = λ_max n for any Gram G; the great circle x_i = (cos ωξ_i,
        # sin ωξ_i) has G = W, which attains it when the two eigenvalues of W are equal.
        top = np.linalg.eigvalsh(np.asarray(factor.matrix()))[-2:]
        if abs(top[1] - top[0]) <= 1e-9 * abs(top[1]):
            return float(kernel.profile.c) * float(top[1]) / (2.0 * factor.n)
    return None
