"""The expansion and the exact path on an accelerator at large n (``python benchmarks/gpu.py``).

For a machine with a GPU (JAX installed with its CUDA plugin); never needed for CI. At each n
(default 10^5 and 10^6), d = 3, beta = 1, tolerance 1e-8, float64: one field evaluation and one
RK4 step of each path (the exact path in row blocks, as ``attnflow run`` builds it; the expansion
of ``solver.interaction = "expansion"``), compile time apart, the best of ``--repeats``; their
ratio and the largest difference of the two steps. Prints JSON and writes it to ``--out``
(default ``gpu_results.json``) with the device, the date and the JAX version.

``--device cpu --sizes 2048`` runs the same script on the CPU (how the tests keep it working).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

from expansion import rk4_step as _rk4  # noqa: E402  (benchmarks/expansion.py: the same RK4 step)

from attnflow.core import factors, gauges, sphere  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics.dynamics import make_vector_field  # noqa: E402
from attnflow.workflows.build import auto_block_size  # noqa: E402


def _best(fn, x, repeats: int) -> tuple[float, float]:
    """(compile-and-first-call seconds, best of ``repeats`` later calls)."""
    start = time.perf_counter()
    fn(x).block_until_ready()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return first, min(times)


def measure(n: int, *, d: int = 3, beta: float = 1.0, tolerance: float = 1e-8, repeats: int = 3) -> dict:
    kernel = Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=beta))
    x = sphere.sample_uniform(jax.random.key(0), n, d)
    fields = {
        "exact": make_vector_field(kernel, block_size=auto_block_size(n)),
        "expansion": make_vector_field(kernel, interaction="expansion", tolerance=tolerance),
    }
    row: dict = {"n": n, "d": d, "beta": beta, "tolerance": tolerance, "rank": fields["expansion"].rank}
    steps = {}
    for name, field in fields.items():
        steps[name] = _rk4(field)
        row[f"{name}_field_first_s"], row[f"{name}_field_s"] = _best(jax.jit(field), x, repeats)
        row[f"{name}_rk4_first_s"], row[f"{name}_rk4_s"] = _best(steps[name], x, repeats)
    row["ratio_field"] = row["exact_field_s"] / row["expansion_field_s"]
    row["ratio_rk4"] = row["exact_rk4_s"] / row["expansion_rk4_s"]
    row["rk4_difference"] = float(jnp.max(jnp.abs(steps["exact"](x) - steps["expansion"](x))))
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("gpu_results.json"))
    args = parser.parse_args(argv)
    device = jax.devices(args.device)[0]  # raises if JAX sees no such device
    with jax.default_device(device):
        rows = [measure(n, repeats=args.repeats) for n in args.sizes]
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(device.device_kind),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
