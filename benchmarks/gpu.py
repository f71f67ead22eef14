"""The exact path, the expansion and attention heads on an accelerator (``python benchmarks/gpu.py``).

One prepared script for a machine with a GPU (JAX installed with its CUDA plugin); never needed for
CI. For each dtype (``--dtypes``, default float64 and float32) and each n (``--sizes``, default
10^4, 10^5 and 10^6), d = 3, beta = 1, tolerance 1e-8: one field evaluation and one RK4 step of
each path (the exact path in row blocks, as ``attnflow run`` builds it; the expansion of
``solver.interaction = "expansion"``), compile time apart, the best of ``--repeats``; their ratio
and the largest difference of the two steps. Then a layer of ``--heads`` Gaussian heads at each
head dimension of ``--head-dims`` (default 64 and 128; d = heads x head_dim, n = ``--heads-n``):
one field evaluation. The same rows on the CPU (``--cpu-sizes``, default the smallest size only,
and the heads) in the same run give the ratios ``cpu_s / gpu_s``. Prints JSON and writes it to
``--out`` (default ``gpu_results.json``) with the devices, the date and the JAX version.

``--device cpu --sizes 512 --cpu-sizes`` runs it on the CPU alone (how the tests keep it working).
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
from attnflow.core.heads import MAP_NAMES, gaussian_maps, make_head  # noqa: E402
from attnflow.core.kernel import Kernel, make_profile  # noqa: E402
from attnflow.numerics.dynamics import make_vector_field  # noqa: E402
from attnflow.numerics.heads_field import HeadsField  # noqa: E402
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


def measure(
    n: int, *, d: int = 3, beta: float = 1.0, tolerance: float = 1e-8, repeats: int = 3, dtype=jnp.float64
) -> dict:
    kernel = Kernel(
        gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=beta, dtype=dtype)
    )
    x = sphere.sample_uniform(jax.random.key(0), n, d, dtype=dtype)
    fields = {
        "exact": make_vector_field(kernel, block_size=auto_block_size(n)),
        "expansion": make_vector_field(kernel, interaction="expansion", tolerance=tolerance),
    }
    row: dict = {"n": n, "d": d, "beta": beta, "tolerance": tolerance, "rank": fields["expansion"].rank,
                 "dtype": jnp.dtype(dtype).name}  # fmt: skip
    steps = {}
    for name, field in fields.items():
        steps[name] = _rk4(field)
        row[f"{name}_field_first_s"], row[f"{name}_field_s"] = _best(jax.jit(field), x, repeats)
        row[f"{name}_rk4_first_s"], row[f"{name}_rk4_s"] = _best(steps[name], x, repeats)
    row["ratio_field"] = row["exact_field_s"] / row["expansion_field_s"]
    row["ratio_rk4"] = row["exact_rk4_s"] / row["expansion_rk4_s"]
    row["rk4_difference"] = float(jnp.max(jnp.abs(steps["exact"](x) - steps["expansion"](x))))
    return row


def measure_heads(n: int, *, heads: int, head_dim: int, repeats: int = 3, dtype=jnp.float32) -> dict:
    """One field evaluation of a layer of ``heads`` Gaussian heads (plain values, no gauge), d =
    heads x head_dim, in row blocks as ``attnflow run`` builds it."""
    d = heads * head_dim
    maps = gaussian_maps(0, heads, head_dim, d)
    layer = tuple(
        make_head(*(maps[name][h] for name in MAP_NAMES), gauge=gauges.IdentityGauge(n=n, d=head_dim),
                  factor=factors.NoFactor(n=n), values="plain", dtype=dtype)
        for h in range(heads)
    )  # fmt: skip
    field = HeadsField(layer, make_profile("exp", beta=1.0, dtype=dtype), block_size=auto_block_size(n))
    x = sphere.sample_uniform(jax.random.key(0), n, d, dtype=dtype)
    first, best = _best(jax.jit(field), x, repeats)
    return {"n": n, "heads": heads, "head_dim": head_dim, "d": d, "dtype": jnp.dtype(dtype).name,
            "field_first_s": first, "field_s": best}  # fmt: skip


def _rows(args, sizes: list[int]) -> dict:
    dtypes = [jnp.dtype(name) for name in args.dtypes]
    return {
        "paths": [measure(n, repeats=args.repeats, dtype=t) for t in dtypes for n in sizes],
        "heads": [measure_heads(args.heads_n, heads=args.heads, head_dim=h, repeats=args.repeats, dtype=t)
                  for t in dtypes for h in args.head_dims],  # fmt: skip
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--cpu-sizes", type=int, nargs="*", default=None, help="default: the smallest size")
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads-n", type=int, default=4096)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("gpu_results.json"))
    args = parser.parse_args(argv)
    device = jax.devices(args.device)[0]  # raises if JAX sees no such device
    with jax.default_device(device):
        rows = _rows(args, args.sizes)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(device.device_kind),
        "platform": platform.platform(),
        "jax": jax.__version__,
        **rows,
    }
    cpu_sizes = [min(args.sizes)] if args.cpu_sizes is None else args.cpu_sizes
    if args.device != "cpu" and cpu_sizes:  # the same rows on the CPU, in the same run
        with jax.default_device(jax.devices("cpu")[0]):
            cpu = _rows(args, cpu_sizes)
        result["cpu"] = cpu
        result["cpu_over_device"] = {
            "paths": [
                {"n": c["n"], "dtype": c["dtype"], "exact_rk4": c["exact_rk4_s"] / g["exact_rk4_s"],
                 "expansion_rk4": c["expansion_rk4_s"] / g["expansion_rk4_s"]}
                for c in cpu["paths"] for g in rows["paths"] if (g["n"], g["dtype"]) == (c["n"], c["dtype"])
            ],
            "heads": [
                {"head_dim": c["head_dim"], "dtype": c["dtype"], "field": c["field_s"] / g["field_s"]}
                for c, g in zip(cpu["heads"], rows["heads"], strict=True)
            ],
        }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
