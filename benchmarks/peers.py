"""Time to accuracy: attnflow's adaptive Dormand–Prince against the peer codes' published schemes.

The peers' schemes, re-expressed in NumPy (one thread, the same physics: USA, Q = I, w = 1, plain
time scale, so ``v_i = P_{x_i} (1/n) Σ_j e^{β⟨x_i, x_j⟩} x_j``):

- **sphere**: explicit Euler on the unprojected sum ``x_i ← normalise(x_i + dt (1/n) Σ_j
  e^{β⟨x_i,x_j⟩} x_j)`` (the normalisation removes the radial part to first order), dt = 0.1 as
  published, then halved until the target accuracy is met;
- **circle** (d = 2): explicit Euler on the angles, ``θ_i ← θ_i + dt (1/n) Σ_j e^{β cos(θ_j − θ_i)}
  sin(θ_j − θ_i)``.

The reference is attnflow's DP5 at rtol = 1e-12; the error is the largest distance of a particle
at ``t_end``. For each target accuracy: the peer's CPU time at the largest dt (0.1 / 2^k) that
meets it, attnflow's at the loosest rtol (10^-k) that meets it (its program compiled once before,
as for a second run in a process; the compile time is reported beside it). Ratios peer / attnflow.

    python benchmarks/peers.py --quick      # n = 32, t_end = 5, targets 1e-2, 1e-4
    python benchmarks/peers.py              # n = 128, t_end = 10, targets 1e-2 ... 1e-6
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from attnflow.core import factors, gauges, sphere  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics import dynamics, integrators  # noqa: E402
from attnflow.numerics.solve import solve  # noqa: E402

jax.config.update("jax_enable_x64", True)
BETA = 1.0


def peer_sphere(x: np.ndarray, *, dt: float, t_end: float) -> np.ndarray:
    n = x.shape[0]
    for _ in range(int(round(t_end / dt))):
        x = x + dt * (np.exp(BETA * (x @ x.T)) @ x) / n
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def peer_circle(theta: np.ndarray, *, dt: float, t_end: float) -> np.ndarray:
    n = theta.shape[0]
    for _ in range(int(round(t_end / dt))):
        diff = theta[None, :] - theta[:, None]
        theta = theta + dt * np.sum(np.exp(BETA * np.cos(diff)) * np.sin(diff), axis=1) / n
    return np.stack([np.cos(theta), np.sin(theta)], axis=1)


def attnflow_final(x0: np.ndarray, *, rtol: float, t_end: float) -> tuple[np.ndarray, float, float]:
    """``(x(t_end), cpu_s, compile_s)`` of attnflow's DP5 at ``rtol`` (atol = rtol / 100)."""
    n, d = x0.shape
    kernel = Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n), make_profile("exp", beta=BETA))
    field = dynamics.make_vector_field(kernel)
    options = dict(integrator=integrators.Adaptive(rtol=rtol, atol=rtol / 100), dt=0.01, t_end=t_end,
                   save_every=t_end)  # fmt: skip
    first = solve(field, jax.numpy.asarray(x0), **options)  # compiles (or reuses) the program
    start = time.process_time()
    traj = solve(field, jax.numpy.asarray(x0), **options)
    return traj.xs[-1], time.process_time() - start, first.compile_time_s


def timed(fn, *args, **kwargs):
    start = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - start


def error(x, ref) -> float:
    return float(np.max(np.linalg.norm(np.asarray(x) - ref, axis=1)))


def compare(name: str, x0: np.ndarray, peer, peer_start, *, t_end: float, targets, max_halvings: int) -> list:
    ref, _, _ = attnflow_final(x0, rtol=1e-12, t_end=t_end)
    rows = []
    for target in targets:
        dt, peer_row = 0.1, None
        for _ in range(max_halvings + 1):
            x, cpu = timed(peer, peer_start, dt=dt, t_end=t_end)
            if error(x, ref) <= target:
                peer_row = {"dt": dt, "cpu_s": cpu, "error": error(x, ref)}
                break
            dt /= 2
        ours = None
        for k in range(2, 12):
            x, cpu, compile_s = attnflow_final(x0, rtol=10.0**-k, t_end=t_end)
            if error(x, ref) <= target:
                ours = {"rtol": 10.0**-k, "cpu_s": cpu, "compile_s": compile_s, "error": error(x, ref)}
                break
        ratio = None if peer_row is None or ours is None else peer_row["cpu_s"] / max(ours["cpu_s"], 1e-6)
        rows.append({"problem": name, "target": target, "peer": peer_row, "attnflow": ours,
                     "peer_over_attnflow_cpu": ratio})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, t_end = (32, 5.0) if args.quick else (128, 10.0)
    targets = (1e-2, 1e-4) if args.quick else (1e-2, 1e-4, 1e-6)
    halvings = 8 if args.quick else 14
    x0 = np.asarray(sphere.sample_uniform(jax.random.key(0), n, 3))
    rows = compare("sphere d=3", x0, peer_sphere, x0, t_end=t_end, targets=targets, max_halvings=halvings)
    theta0 = np.random.default_rng(0).uniform(0.0, 2 * np.pi, n)
    circle0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=1)
    rows += compare(
        "circle d=2", circle0, peer_circle, theta0, t_end=t_end, targets=targets, max_halvings=halvings
    )
    print(json.dumps({"n": n, "t_end": t_end, "beta": BETA, "load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
