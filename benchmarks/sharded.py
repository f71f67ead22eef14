"""Tokens sharded over 4 host devices (``attnflow.numerics.sharding``) against the same run unsharded.

The same RK4 run of the paper's field (E1-like: RoPE ``full_period``, d = 3, β = 1, usa, float64,
the automatic block size) three ways, each in a child process that sees the stated number of host
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count``, set before JAX starts):

- **single, 1 device**: the field as ``attnflow run`` evaluates it, on one device;
- **single, 4 devices**: the same field with its tile lanes spread over 4 host devices
  (``attnflow.numerics.lanes``), what the CLI does on a machine with 4 cores;
- **sharded, 4 devices**: ``ShardedField`` over the 4 devices (keys and values all-gathered, each
  device summing its own rows).

Seconds per step (wall and CPU, compile excluded, best of ``--repeats``), the ratios sharded/single
measured in the same run, the largest difference of the final states from the one-device run, and
the temporary memory XLA allocates for one compiled step (``memory_analysis``). Then the expansion
(n = 65536, no mask: the ``psum`` of the moments; causal: the prefix sums carried across the
devices). The date, the machine and its load are recorded: on a shared machine read the CPU ratios.

``python benchmarks/sharded.py --out benchmarks/RESULTS_sharded.json --render`` (about 7 min on 2 cores;
``--from benchmarks/RESULTS_sharded.json`` redraws the section of ``RESULTS.md``);
``--quick`` for small n.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import replace_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- sharded: begin -->", "<!-- sharded: end -->"
WAYS = (("single", 1), ("single", 4), ("sharded", 4))


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _field(n: int, *, interaction: str, causal):
    import jax.numpy as jnp
    import numpy as np

    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics
    from attnflow.workflows.build import auto_block_size

    d = 3
    xi = np.arange(n, dtype=float)
    rope = gauges.make_rope(xi, d, gauges.rope_frequencies(d, kind="full_period", n=n), dtype=jnp.float64)
    kernel = Kernel(rope, factors.NoFactor(n=n), make_profile("exp", beta=1.0))
    options = dict(interaction=interaction, causal=causal, block_size=auto_block_size(n))
    if interaction == "expansion":
        options["tolerance"] = 1e-10
    return dynamics.make_vector_field(kernel, **options)


def child(way: str, rows: list[dict], steps: int, repeats: int) -> list[dict]:
    """Measure ``rows`` (``n``, ``interaction``, ``causal``) the way ``way`` in this process."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from attnflow.core import sphere
    from attnflow.numerics import integrators, sharding
    from attnflow.numerics.solve import integrate

    out = []
    for row in rows:
        field = _field(row["n"], interaction=row["interaction"], causal=row["causal"])
        if way == "sharded":
            field = sharding.shard_tokens(field)
        x0 = sphere.sample_uniform(0, row["n"], 3)
        run = lambda f, x: integrate(f, x, integrator=integrators.RK4(), dt=0.01, steps=steps)  # noqa: E731
        if way == "sharded":  # the sharded field is a pytree argument
            compiled = jax.jit(run).lower(field, x0).compile()
            call = lambda compiled=compiled, field=field, x0=x0: compiled(field, x0)  # noqa: E731
        else:  # the field closed over, as solve runs it
            compiled = jax.jit(lambda x, f=field, run=run: run(f, x)).lower(x0).compile()
            call = lambda compiled=compiled, x0=x0: compiled(x0)  # noqa: E731
        memory = compiled.memory_analysis()
        final = np.asarray(call())  # the first call: warm
        walls, cpus = [], []
        for _ in range(repeats):
            c0, w0 = _cpu_s(), time.perf_counter()
            call().block_until_ready()
            walls.append(time.perf_counter() - w0)
            cpus.append(_cpu_s() - c0)
        out.append({
            **row, "way": way, "devices": len(jax.devices()), "wall_step_s": min(walls) / steps,
            "cpu_step_s": min(cpus) / steps, "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
            "final": final.tolist(),
        })  # fmt: skip
    return out


def memory_child(way: str, rows: list[dict]) -> list[dict]:
    """XLA's memory for one compiled RK4 step at each row's ``n``, per device, compiled only (no run):
    temporaries, arguments and outputs, in bytes per token."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    from attnflow.numerics import integrators, sharding
    from attnflow.numerics.solve import integrate

    out = []
    for row in rows:
        field = _field(row["n"], interaction=row["interaction"], causal=row["causal"])
        x = jax.ShapeDtypeStruct((row["n"], 3), jnp.float64)
        run = lambda f, x: integrate(f, x, integrator=integrators.RK4(), dt=0.01, steps=1)  # noqa: E731
        if way == "sharded":
            compiled = jax.jit(run).lower(sharding.shard_tokens(field), x).compile()
        else:
            compiled = jax.jit(lambda x, f=field, run=run: run(f, x)).lower(x).compile()
        m = compiled.memory_analysis()
        total = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
        out.append({**row, "way": way, "devices": len(jax.devices()), "bytes_per_token": total / row["n"]})
    return out


def _children(mode: str, rows: list[dict], *extra: str) -> dict:
    """``mode`` ("--child" or "--memory") of every way of ``WAYS``, each in its own child process."""
    results = {}
    for way, devices in WAYS:
        env = {
            **os.environ,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu",
        }
        args = [sys.executable, __file__, mode, way, json.dumps(rows), *extra]
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            results[(r["n"], r["interaction"], str(r["causal"]), way, devices)] = r
    return results


def memory(rows: list[dict]) -> list[dict]:
    """Bytes per token per device of one compiled RK4 step, the three ways."""
    results = _children("--memory", rows)
    table = []
    for row in rows:
        key = (row["n"], row["interaction"], str(row["causal"]))
        table.append(
            {
                **row,
                **{
                    f"{way}{devices}": results[(*key, way, devices)]["bytes_per_token"]
                    for way, devices in WAYS
                },
            }
        )
    return table


def measure(rows: list[dict], steps: int, repeats: int) -> list[dict]:
    """Every way of ``WAYS`` in its own child process; returns the rows with the ratios."""
    results = {}
    for way, devices in WAYS:
        env = {
            **os.environ,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu",
        }
        args = [sys.executable, __file__, "--child", way, json.dumps(rows), str(steps), str(repeats)]
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            results[(r["n"], r["interaction"], str(r["causal"]), way, devices)] = r
    import numpy as np

    table = []
    for row in rows:
        key = (row["n"], row["interaction"], str(row["causal"]))
        one, lanes, sharded = (results[(*key, way, devices)] for way, devices in WAYS)
        reference = np.asarray(one["final"])
        table.append({
            **row,
            "single1_wall_s": one["wall_step_s"], "single1_cpu_s": one["cpu_step_s"],
            "single4_wall_s": lanes["wall_step_s"], "single4_cpu_s": lanes["cpu_step_s"],
            "sharded4_wall_s": sharded["wall_step_s"], "sharded4_cpu_s": sharded["cpu_step_s"],
            "sharded_over_single4_wall": sharded["wall_step_s"] / lanes["wall_step_s"],
            "sharded_over_single4_cpu": sharded["cpu_step_s"] / lanes["cpu_step_s"],
            "sharded_over_single1_wall": sharded["wall_step_s"] / one["wall_step_s"],
            "difference_single4": float(np.max(np.abs(np.asarray(lanes["final"]) - reference))),
            "difference_sharded4": float(np.max(np.abs(np.asarray(sharded["final"]) - reference))),
            "temp_mib": {way + str(devices): (r["temp_bytes"] or 0) / 2**20 for (way, devices), r in
                         zip(WAYS, (one, lanes, sharded), strict=True)},
        })  # fmt: skip
    return table


# ----------------------------------------------------------------------------- the report
# ruff: noqa: E501  (the report's table rows and sentences are kept whole)


def render(result: dict, results_md: Path) -> None:
    """Replace (or append) this benchmark's section of ``RESULTS.md`` with ``result``'s numbers."""
    load = lambda key: ", ".join(f"{v:.2f}" for v in result[key])  # noqa: E731
    lines = [
        BEGIN,
        "## Tokens sharded over 4 host devices (`python benchmarks/sharded.py`)",
        "",
        f"Run of {result['date']} on {result['machine']}; load average (1, 5, 15 min) {load('load_before')} "
        f"before, {load('load_after')} after (a shared machine: read the CPU-time ratios).",
        "",
        f"RK4 steps (dt = 0.01, {result['steps']} per call, best of {result['repeats']}, compile excluded) of the paper's field, "
        "RoPE full_period, d = 3, β = 1, usa, float64, automatic block size: unsharded on 1 host device, unsharded with its "
        "lanes on 4 host devices, and `ShardedField` over the same 4 devices. Seconds per step; the ratios are "
        "sharded / unsharded on 4 devices; the differences are the largest of the final states from the 1-device run; "
        "temporary memory is what XLA allocates for the compiled run, per device (`memory_analysis`).",
        "",
        "| path | mask | n | 1 device s/step | 4 devices s/step | sharded s/step | sharded / 4 devices (wall) | (CPU) "
        "| difference (4 devices) | difference (sharded) | temp MiB 1 / 4 / sharded |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        mib = r["temp_mib"]
        lines.append(
            f"| {r['interaction']} | {r['causal']} | {r['n']} | {r['single1_wall_s']:.4g} | {r['single4_wall_s']:.4g} "
            f"| {r['sharded4_wall_s']:.4g} | {r['sharded_over_single4_wall']:.2f} | {r['sharded_over_single4_cpu']:.2f} "
            f"| {r['difference_single4']:.2g} | {r['difference_sharded4']:.2g} "
            f"| {mib['single1']:.1f} / {mib['single4']:.1f} / {mib['sharded4']:.1f} |"
        )
    if "memory" in result:
        lines += [
            "",
            "Memory of one compiled RK4 step (XLA's `memory_analysis`: temporaries, arguments and outputs, per device; "
            "compiled only, not run), in bytes per token: what a device must hold besides the Python process, "
            "the snapshots and the run's own copies of the state.",
            "",
            "| path | mask | n | 1 device | 4 devices (lanes) | sharded, per device |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["memory"]:
            lines.append(
                f"| {r['interaction']} | {r['causal']} | {r['n']} | {r['single1']:.0f} | {r['single4']:.0f} | {r['sharded4']:.0f} |"
            )
    lines += ["", *result.get("notes", []), END]
    replace_section(results_md, BEGIN, END, "\n".join(lines))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        way, rows, steps, repeats = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(child(way, rows, steps, repeats)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--memory":
        print(json.dumps(memory_child(sys.argv[2], json.loads(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small n, one repeat")
    parser.add_argument("--out", type=Path, help="write the raw result (JSON) here")
    parser.add_argument("--render", action="store_true", help="write the section of benchmarks/RESULTS.md")
    parser.add_argument("--from", dest="source", type=Path, help="render a saved result instead of measuring")
    args = parser.parse_args()
    if args.source is not None:
        render(json.loads(args.source.read_text()), ROOT / "benchmarks" / "RESULTS.md")
        return
    exact = (1024, 2048) if args.quick else (4096, 16384)
    expansion = 4096 if args.quick else 65536
    rows = [{"n": n, "interaction": "exact", "causal": False} for n in exact]
    rows += [{"n": expansion, "interaction": "expansion", "causal": c} for c in (False, True)]
    steps, repeats = (1, 1) if args.quick else (2, 2)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}",
        "load_before": os.getloadavg(),
        "steps": steps,
        "repeats": repeats,
    }
    result["rows"] = measure(rows, steps, repeats)
    large = 10**5 if args.quick else 10**6
    big = [{"n": large, "interaction": "exact", "causal": False}]
    big += [{"n": large, "interaction": "expansion", "causal": c} for c in (False, True)]
    result["memory"] = memory(big)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    if args.render:
        render(result, ROOT / "benchmarks" / "RESULTS.md")


if __name__ == "__main__":
    main()
