"""A Llama-3-like head per RK4 step, and what the layer norms add to it.

Two measurements, each as ratios between numbers taken in this one run (the section states the
date, the machine and its load):

1. **One head as Llama-3 has them**: d = d_h = 128, RoPE with Llama-3's base 500000 (no scaling),
   gaussian query, key, value and output maps, plain values, usa, float32, n = 4096, the automatic
   row blocks. Fixed RK4 steps through ``attnflow.numerics.solve.solve`` (compile excluded, the
   snapshot at the end) against the same RK4 in NumPy (four evaluations of
   ``heads.numpy_heads``, the stage sums, the renormalisation; one BLAS thread), per CPU-second;
   and against the limit of the work done (the four evaluations' multiply-adds and exponentials
   at the matmul and exp rates per CPU-second XLA reaches in this run).
2. **The layer norms**: the same head under post-LN (the layer's field as it is), pre-LN, peri-LN
   and nGPT, RK4 steps per CPU-second, interleaved, best of ``--reps`` each; each is compared with
   post-LN (target: at most 5 % more).

``python benchmarks/layer.py [--quick] [--out FILE.json] [--render FILE.json]`` (``--render`` writes
the section of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the NumPy side on one BLAS thread, as heads.py

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import cpu_s, replace_section, setup_jax  # noqa: E402
from heads import numpy_heads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_BASE = 500000.0
D = 128
DT = 0.01
NORMS = ("post", "pre", "peri", "ngpt")


def _head(n: int, jdtype):
    """Llama-3-like head (module docstring): ``(field, maps, angles, x0)``."""
    import jax.numpy as jnp

    from attnflow.core import factors, gauges
    from attnflow.core import heads as H
    from attnflow.core.kernel import make_profile
    from attnflow.numerics.heads_field import HeadsField
    from attnflow.workflows.build import auto_block_size

    maps = H.gaussian_maps(0, 1, D, D)
    angles = np.outer(np.arange(n, dtype=np.float64), LLAMA3_BASE ** (-2.0 * np.arange(D // 2) / D))
    gauge = gauges.RoPE(angles=jnp.asarray(angles, jdtype), d=D)
    head = H.make_head(*(maps[name][0] for name in H.MAP_NAMES), gauge=gauge, factor=factors.NoFactor(n=n),
                       values="plain", dtype=jdtype)  # fmt: skip
    block = auto_block_size(n, jdtype)  # None: dense (one block of n rows)
    field = HeadsField((head,), make_profile("exp", beta=1.0, dtype=jdtype), block_size=block)
    x = np.random.default_rng(1).normal(size=(n, D))
    return field, maps, angles, x / np.linalg.norm(x, axis=1, keepdims=True), block or n


def _steps(field, x0, steps: int):
    """``solve`` with ``steps`` fixed RK4 steps, one snapshot at the end; returns the final state."""
    from attnflow.numerics.integrators import RK4
    from attnflow.numerics.layer_norms import LayerNormField
    from attnflow.numerics.solve import solve

    retraction = field.retraction if isinstance(field, LayerNormField) else "sphere"
    run = solve(field, x0, integrator=RK4(retraction=retraction), dt=DT, t_end=steps * DT,
                save_every=steps * DT, workers=1)  # fmt: skip
    return run.xs[-1]


def _timed(fn, reps: int) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of the repetition with the least CPU time."""
    best = []
    for _ in range(reps):
        start, c0 = time.perf_counter(), cpu_s()
        fn()
        best.append((time.perf_counter() - start, cpu_s() - c0))
    return min(best, key=lambda wc: wc[1])


def rates_per_cpu_s() -> dict:
    """Multiply-adds and exponentials per CPU-second that XLA reaches in this process (float32): one
    2048² product three times, one 4096 × 512 exp ten times (CPU time: robust to other load)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((2048, 2048), jnp.float32) / 2048
    mm = jax.jit(lambda a: a @ a)
    s = jnp.linspace(-1.0, 0.0, 4096 * 512, dtype=jnp.float32).reshape(4096, 512)
    ex = jax.jit(jnp.exp)
    mm(a).block_until_ready(), ex(s).block_until_ready()
    c0 = cpu_s()
    for _ in range(3):
        mm(a).block_until_ready()
    c1 = cpu_s()
    for _ in range(10):
        ex(s).block_until_ready()
    c2 = cpu_s()
    return {"macs_per_cpu_s": 3 * 2048**3 / (c1 - c0), "exps_per_cpu_s": 10 * s.size / (c2 - c1)}


def numpy_rk4(x, maps, angles, *, block: int, steps: int) -> np.ndarray:
    """The same RK4 steps in NumPy (post-LN: renormalised after each step)."""
    field = lambda y: numpy_heads(y, maps, angles, beta=1.0, block=block)  # noqa: E731
    for _ in range(steps):
        k1 = field(x)
        k2 = field(x + 0.5 * DT * k1)
        k3 = field(x + 0.5 * DT * k2)
        k4 = field(x + DT * k3)
        x = x + DT / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


def measure_head(n: int, steps: int, reps: int) -> dict:
    jax = setup_jax()
    import jax.numpy as jnp

    field, maps, angles, x, block = _head(n, jnp.float32)
    x0 = jnp.asarray(x, jnp.float32)
    ours_state = np.asarray(_steps(field, x0, steps))  # compiles
    ours = _timed(lambda: jax.block_until_ready(_steps(field, x0, steps)), reps)
    maps32 = {k: v.astype(np.float32) for k, v in maps.items()}
    reference = numpy_rk4(x.astype(np.float32), maps32, angles, block=block, steps=steps)
    ref = _timed(lambda: numpy_rk4(x.astype(np.float32), maps32, angles, block=block, steps=steps), reps)
    macs = 3 * n * D * D + 2 * n * n * D + n * D * D  # projections, logits and sums, read-out
    rates = rates_per_cpu_s()
    limit_s = steps * 4 * (macs / rates["macs_per_cpu_s"] + n * n / rates["exps_per_cpu_s"])
    return {
        "n": n, "d": D, "steps": steps, "block": block, "attnflow_wall_s": ours[0], "attnflow_cpu_s": ours[1],
        "numpy_wall_s": ref[0], "numpy_cpu_s": ref[1], "speedup_per_cpu_s": ref[1] / ours[1],
        "limit_cpu_s": limit_s, "limit_over_cpu": limit_s / ours[1],
        "max_abs_difference": float(np.max(np.abs(ours_state - reference))), **rates,
    }  # fmt: skip


def measure_norms(n: int, steps: int, reps: int) -> list[dict]:
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.numerics.layer_norms import LayerNormField

    layer, _, _, x, _ = _head(n, jnp.float32)
    x0 = jnp.asarray(x, jnp.float32)
    fields = {kind: layer if kind == "post" else LayerNormField(layer, kind=kind) for kind in NORMS}
    for field in fields.values():
        jax.block_until_ready(_steps(field, x0, steps))  # compiles
    times = {kind: [] for kind in NORMS}
    for _ in range(reps):  # interleaved: the load moves every norm alike
        for kind, field in fields.items():
            times[kind].append(_timed(lambda f=field: jax.block_until_ready(_steps(f, x0, steps)), 1))
    best = {kind: min(values, key=lambda wc: wc[1]) for kind, values in times.items()}
    return [
        {
            "norm": kind,
            "step_cpu_s": best[kind][1] / steps,
            "step_wall_s": best[kind][0] / steps,
            "over_post_cpu": best[kind][1] / best["post"][1],
        }  # fmt: skip
        for kind in NORMS
    ]


# ----------------------------------------------------------------------------- the report
# ruff: noqa: E501  (the report's table rows and sentences are kept whole)

BEGIN, END = "<!-- layer: begin -->", "<!-- layer: end -->"


def render(result: dict, results_md: Path) -> None:
    """Replace (or append) this benchmark's section of ``RESULTS.md`` with ``result``'s numbers."""
    load = lambda key: ", ".join(f"{v:.2f}" for v in result[key])  # noqa: E731
    h = result["head"]
    lines = [
        BEGIN,
        "## A Llama-3-like head per RK4 step, and the layer norms (`python benchmarks/layer.py`)",
        "",
        f"Run of {result['date']} on {result['machine']}; load average (1, 5, 15 min) {load('load_before')} "
        f"before, {load('load_after')} after (a shared machine: read the CPU-time ratios).",
        "",
        f"One head, d = d_h = {h['d']}, RoPE with Llama-3's base 500000, gaussian maps, plain values, usa, float32, "
        f"n = {h['n']}, row blocks of {h['block']}: {h['steps']} RK4 steps of dt = 0.01 through `solve` against the "
        "same RK4 in NumPy (one BLAS thread), and against the limit of the work (four evaluations' multiply-adds "
        "and exponentials at the rates per CPU-second XLA reaches in this run):",
        "",
        "| attnflow wall s | attnflow CPU s | NumPy CPU s | speed-up per CPU-s | limit CPU s | limit / attnflow CPU | max abs difference |",
        "|---|---|---|---|---|---|---|",
        f"| {h['attnflow_wall_s']:.3g} | {h['attnflow_cpu_s']:.3g} | {h['numpy_cpu_s']:.3g} | {h['speedup_per_cpu_s']:.2f} "
        f"| {h['limit_cpu_s']:.3g} | {h['limit_over_cpu']:.2f} | {h['max_abs_difference']:.2g} |",
        "",
        f"The same head under each layer norm, RK4 steps per CPU-second (interleaved, best of {result['reps']}; target: "
        "at most 1.05 of post-LN):",
        "",
        "| layer norm | CPU s per step | wall s per step | CPU / post-LN |",
        "|---|---|---|---|",
    ]
    for r in result["norms"]:
        lines.append(
            f"| {r['norm']} | {r['step_cpu_s']:.4g} | {r['step_wall_s']:.4g} | {r['over_post_cpu']:.3f} |"
        )
    lines += ["", END]
    replace_section(results_md, BEGIN, END, "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1024, one repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--render", type=Path, help="write this run's section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.render is not None:
        render(json.loads(args.render.read_text()), ROOT / "benchmarks" / "RESULTS.md")
        return
    n, reps = (1024, 1) if args.quick else (4096, args.reps)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_before": os.getloadavg(),
        "reps": reps,
        "head": measure_head(n, steps=2, reps=min(reps, 3)),
        "norms": measure_norms(n, steps=2, reps=reps),
        "load_after": os.getloadavg(),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
