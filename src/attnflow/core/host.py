"""Constant arrays made on the host: ``to_device(value, dtype)`` converts with NumPy and places the
result on the default device with ``jax.device_put``, a transfer that runs no JAX operation;
``folded_key(seed, data)`` is ``jax.random.fold_in(jax.random.key(seed), data)`` computed likewise.

An eager ``jnp`` call (``jnp.asarray(1.0, dtype)``, ``jnp.exp`` of a scalar, a row normalisation)
traces, lowers and compiles a small program the first time a process meets its shape, which a
run's start-up pays once per constant even when the persistent compilation cache holds the
programs (benchmarks/RESULTS.md, "Start-up of `attnflow run`"). The constants a build makes (the
profile's numbers, RoPE's angles, gauge matrices, initial data, the noise key) are therefore
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


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = 0x1BD11BDA
_U32 = 0xFFFFFFFF


def _threefry2x32(key: tuple[int, int], x: tuple[int, int]) -> tuple[int, int]:
    """The Threefry-2x32 block (20 rounds) of one counter pair, as JAX's ``threefry2x32``."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ _THREEFRY_PARITY)
    x0, x1 = (x[0] + ks[0]) & _U32, (x[1] + ks[1]) & _U32
    for block in range(5):
        for r in _THREEFRY_ROTATIONS[block % 2]:
            x0 = (x0 + x1) & _U32
            x1 = ((x1 << r) | (x1 >> (32 - r))) & _U32
            x1 ^= x0
        x0 = (x0 + ks[(block + 1) % 3]) & _U32
        x1 = (x1 + ks[(block + 2) % 3] + block + 1) & _U32
    return x0, x1


def _threefry_seed(seed: int) -> tuple[int, int]:
    """The key data of ``jax.random.key(seed)`` (a 64-bit seed's two 32-bit halves)."""
    bits = int(np.int64(seed).view(np.uint64)) if seed < 0 else int(seed)
    return (bits >> 32) & _U32, bits & _U32


def folded_key(seed: int, data: int) -> jax.Array:
    """``jax.random.fold_in(jax.random.key(seed), data)``, computed on the host (no JAX
    operation runs) for JAX's default generator, Threefry-2x32; with another generator
    configured, by JAX itself."""
    if jax.config.jax_default_prng_impl != "threefry2x32":
        return jax.random.fold_in(jax.random.key(seed), data)
    words = _threefry2x32(_threefry_seed(seed), _threefry_seed(int(np.uint32(data))))
    return jax.random.wrap_key_data(jax.device_put(np.asarray(words, dtype=np.uint32)), impl="threefry2x32")
