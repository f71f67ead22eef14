"""Shared builders for the core numerics tests: gauges, factors, kernels and reference quantities.

Every builder takes ``n`` and returns a fresh object, so tests can mix gauges and factors freely.
Shapes are kept to a few fixed values (n = 16 for invariants) to bound JIT recompilation. The mean
cosine is written here from its definition (the tests do not depend on attnflow.analysis.metrics);
energy series use summation.energy, which test_kernels checks against an independent NumPy evaluation.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import summation

N_SMALL = 16  # the token count of the invariant tests


# --- gauges --------------------------------------------------------------------------------------


def commuting_generators_d4() -> list[np.ndarray]:
    """Two commuting skew generators in R^4: the planes (0,1) and (2,3), conjugated by a fixed rotation."""
    g1 = np.zeros((4, 4))
    g1[1, 0], g1[0, 1] = 1.0, -1.0
    g2 = np.zeros((4, 4))
    g2[3, 2], g2[2, 3] = 1.0, -1.0
    p = gauges.haar_orthogonal(jax.random.key(7), 1, 4)[0]
    return [p @ g1 @ p.T, p @ g2 @ p.T]


def gauge_identity(n: int):
    return gauges.IdentityGauge(n=n, d=3)


def gauge_rope_roformer(n: int):
    return gauges.make_rope(np.arange(n), 4, gauges.rope_frequencies(4, kind="roformer"))


def gauge_rope_full_period(n: int):
    return gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))


def gauge_rope_explicit_d5(n: int):
    """d = 5, two rotating pairs (0,1), (2,3); coordinate 4 stays fixed."""
    return gauges.make_rope(np.arange(n), 5, gauges.rope_frequencies(5, kind=[1.0, 0.37]))


def gauge_generalized_zx(n: int):
    """The non-commuting default generalized RoPE: exp(ωξ L_z) exp(3ωξ L_x), ω = 2π/n."""
    generators = [gauges.axis_generator("z"), gauges.axis_generator("x")]
    return gauges.make_generalized_rope(np.arange(n), generators, [1.0, 3.0], omega=2 * np.pi / n)


def gauge_generalized_commuting_d4(n: int):
    return gauges.make_generalized_rope(
        np.arange(n), commuting_generators_d4(), [1.0, 2.5], omega=2 * np.pi / n
    )


def gauge_prompt_haar(n: int):
    q_prompts = gauges.haar_orthogonal(jax.random.key(100), 4, 3)
    return gauges.make_prompt_gauge(np.arange(n) % 4, q_prompts)


def gauge_dense_haar(n: int):
    return gauges.DenseGauge(q=jnp.asarray(gauges.haar_orthogonal(jax.random.key(11), n, 3)))


GAUGES = {
    "identity": gauge_identity,
    "rope_roformer": gauge_rope_roformer,
    "rope_full_period": gauge_rope_full_period,
    "rope_explicit_d5": gauge_rope_explicit_d5,
    "generalized_zx": gauge_generalized_zx,
    "generalized_commuting_d4": gauge_generalized_commuting_d4,
    "prompt_haar": gauge_prompt_haar,
    "dense_haar": gauge_dense_haar,
}


# --- factors -------------------------------------------------------------------------------------


def factor_none(n: int):
    return factors.NoFactor(n=n)


def factor_distance_bias(n: int, slope: float = 1.0):
    return factors.DistanceBias(xi=jnp.arange(n) / n, slope=jnp.asarray(slope))


def factor_toeplitz_cos(n: int):
    return factors.ToeplitzCos(xi=jnp.arange(n) / n, omega=jnp.asarray(2 * np.pi))


def factor_matrix_nonneg(n: int):
    a = np.abs(np.random.default_rng(3).normal(size=(n, n)))
    return factors.make_matrix_factor((a + a.T) / 2, n=n)


def factor_matrix_signed(n: int):
    a = np.random.default_rng(4).normal(size=(n, n))
    return factors.make_matrix_factor((a + a.T) / 2, n=n)


FACTORS = {
    "none": factor_none,
    "distance_bias": factor_distance_bias,
    "toeplitz_cos": factor_toeplitz_cos,
    "matrix_nonneg": factor_matrix_nonneg,
    "matrix_signed": factor_matrix_signed,
}
NONNEGATIVE_FACTORS = ("none", "distance_bias", "matrix_nonneg")


# --- kernels and data ----------------------------------------------------------------------------


def make_kernel(gauge, factor, *, kind: str = "exp", beta: float = 1.0, time_scale: str = "plain"):
    return Kernel(gauge, factor, make_profile(kind, beta=beta, time_scale=time_scale))


def uniform(n: int, d: int, seed: int = 0) -> jax.Array:
    """Seeded on the host (NumPy): a JAX key would compile a sampler for every shape."""
    return sphere.sample_uniform(seed, n, d)


def mean_cosine(x) -> float:
    """The mean pairwise cosine ``(n |m|² − 1)/(n − 1)`` with ``m`` the mean of the unit rows."""
    x = np.asarray(x)
    n = x.shape[0]
    m = x.mean(axis=0)
    return float((n * m @ m - 1.0) / (n - 1))


def energy_series(kernel, xs) -> np.ndarray:
    """``E`` at every snapshot of ``xs (T, n, d)``."""
    return np.asarray(jax.vmap(lambda x: summation.energy(kernel, x))(jnp.asarray(xs)))


@contextlib.contextmanager
def compilation_cache_folder(folder):
    """JAX's compilation cache folder, hence attnflow's stored programs (``programs/`` in it), set to
    ``folder`` inside the block (None: no folder, no stored programs), then put back."""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None if folder is None else str(folder))
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
