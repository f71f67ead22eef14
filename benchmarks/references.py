"""The NumPy references of the benchmark: the same field and steps as attnflow, in NumPy.

- ``naive_field``: a naive dense evaluation, written the way the published codes are: an explicit
  ``n × n`` matrix per evaluation, ``A = exp(β X Xᵀ)``, ``g = A X / n``, the tangent projection.
- ``blocked_field``: the engine's blocking in NumPy, same arithmetic (``exp(β(s − 1))`` with the
  constant ``e^β / n`` factored out): symmetric tiles of ``block × block`` (each tile pair once,
  for both directions), row blocks of ``block`` rows, or, where the engine evaluates densely, one
  ``n × n`` buffer with the ``exp`` in place. It shows what attnflow adds beyond blocking
  (compilation, fusion, the lanes on every core).

Both are single NumPy processes: ufuncs such as ``exp`` run on one core, the matrix products on
OpenBLAS's threads.
"""

from __future__ import annotations

import numpy as np

BETA = 1.0
DT = 0.01


def _project(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g - np.sum(g * x, axis=1, keepdims=True) * x


def naive_field(x: np.ndarray, *, beta: float = BETA) -> np.ndarray:
    """The USA field (Q = I, w = 1) as a naive dense step: an explicit n × n matrix per evaluation."""
    n = x.shape[0]
    a = np.exp(beta * (x @ x.T))
    return _project(x, (a @ x) / n)


def _dense_sum(x: np.ndarray, beta: float) -> np.ndarray:
    a = x @ x.T
    a -= 1.0
    a *= beta
    np.exp(a, out=a)
    return a @ x


def _row_sum(x: np.ndarray, beta: float, block: int) -> np.ndarray:
    n = x.shape[0]
    g = np.empty_like(x)
    for start in range(0, n, block):
        w = x[start : start + block] @ x.T
        w -= 1.0
        w *= beta
        np.exp(w, out=w)
        g[start : start + block] = w @ x
    return g


def _tile_sum(x: np.ndarray, beta: float, block: int) -> np.ndarray:
    n, d = x.shape
    m = -(-n // block)
    ut = np.zeros((m * block, d), x.dtype)  # zero padding rows: finite weights, zero values
    ut[:n] = x
    ut = ut.reshape(m, block, d)
    g = np.zeros_like(ut)
    for i in range(m):
        for j in range(i, m):
            w = ut[i] @ ut[j].T
            w -= 1.0
            w *= beta
            np.exp(w, out=w)
            g[i] += w @ ut[j]
            if j != i:
                g[j] += w.T @ ut[i]
    return g.reshape(m * block, d)[:n]


def blocked_field(x: np.ndarray, *, path: str, block: int | None, beta: float = BETA) -> np.ndarray:
    """The USA field evaluated on the engine's ``path`` ("dense", "unrolled tiles", "tiles", "rows";
    see ``work.evaluation_work``) with its ``block``, in NumPy."""
    n = x.shape[0]
    if path == "dense":
        g = _dense_sum(x, beta)
    elif path == "rows":
        g = _row_sum(x, beta, block)
    else:
        g = _tile_sum(x, beta, block)
    g *= x.dtype.type(np.exp(beta) / n)
    return _project(x, g)


def step(field, x: np.ndarray, method: str, dt: float = DT) -> np.ndarray:
    """One Euler or RK4 step of ``field``, renormalised onto the sphere."""
    if method == "euler":
        x = x + dt * field(x)
    else:
        k1 = field(x)
        k2 = field(x + 0.5 * dt * k1)
        k3 = field(x + 0.5 * dt * k2)
        k4 = field(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def naive_run(x: np.ndarray, *, steps: int, save_every_steps: int) -> list[np.ndarray]:
    """A whole RK4 run of the naive field with snapshots, as a Python loop over steps."""
    xs = [x.copy()]
    for k in range(1, steps + 1):
        x = step(naive_field, x, "rk4")
        if k % save_every_steps == 0:
            xs.append(x.copy())
    return xs


def initial(n: int, d: int, dtype: str = "float64", seed: int = 0) -> np.ndarray:
    """Uniform points on the sphere from NumPy's PCG64 stream (``seed``)."""
    x = np.random.default_rng(seed).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)
