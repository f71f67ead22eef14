"""Constant arrays made on the host: ``to_device(value, dtype)`` converts with NumPy and places the
result on the default device with ``jax.device_put``, a transfer that runs no JAX operation.

An eager ``jnp`` call (``jnp.asarray(1.0, dtype)``, ``jnp.exp`` of a scalar, a row normalisation)
traces, lowers and compiles a small program the first time a process meets its shape, which a
run's start-up pays once per constant even when the persistent compilation cache holds the
programs (benchmarks/RESULTS.md, "Start-up of `attnflow run`"). The constants a build makes (the
profile's numbers, RoPE's angles, gauge matrices, initial data) are therefore
computed with NumPy, in the same operations: bit for bit where no rounding is involved, to
round-off for the initial data (NumPy's and XLA's sums, square roots and divisions may round the
last bit differently).
"""

from __future__ import annotations

import jax
import numpy as np


def to_device(value, dtype) -> jax.Array:
    """``value`` as a JAX array of ``dtype`` (NumPy's conversion; not weakly typed)."""
    return jax.device_put(np.asarray(value, dtype=dtype))
