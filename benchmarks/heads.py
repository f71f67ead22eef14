"""Speed of the attention layers with heads, and of the paper's model before and after them.

Three measurements, each as ratios between numbers taken in this one run (the report states the
date, the machine, its load and the process count):

1. **The paper's model per step** (``--base TREE``: a checkout of the tree before the heads): RK4
   steps of the USA field at n = 4096, d = 3 and d = 64 (the automatic block size, float64), in
   alternating child processes of the old and the new tree, best of ``--pairs`` each; the ratio
   new/old should be within 1.05.
2. **General heads**: H = 8, d = 512, d_h = 64, n = 4096, RoPE per head, gaussian maps, usa: one
   field evaluation of attnflow's ``HeadsField`` against a NumPy reference of the same arithmetic
   in row blocks of the same size (projections, logits, bounded ``exp``, value sums, read-out), per
   CPU-second (both sides' CPU time is measured), float32 and float64.
3. **The limit of the work done**: the multiply-adds and exponentials of that evaluation, divided by
   the matmul and exp rates XLA reaches in this run (one 2048² product; one 4096 × 512 exp).

``python benchmarks/heads.py --base /tmp/base --out benchmarks/RESULTS_heads.json`` (about 3 min on
2 cores); ``--quick`` for n = 1024 and one pair.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the NumPy side on one BLAS thread, as benchmarks/run.py

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import cpu_s, replace_section, setup_jax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- 1. the paper's model


def paper_steps(n: int, d: int, steps: int) -> dict:
    """Seconds per RK4 step of the USA field (this process's attnflow), compile excluded."""
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.core import factors, gauges, sphere
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics
    from attnflow.workflows.build import auto_block_size

    kernel = Kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n), make_profile("exp", beta=1.0))
    field = dynamics.make_vector_field(kernel, block_size=auto_block_size(n))
    x = sphere.sample_uniform(0, n, d)
    dt = 0.01

    def step(x, _):
        k1 = field(x)
        k2 = field(x + dt / 2 * k1)
        k3 = field(x + dt / 2 * k2)
        k4 = field(x + dt * k3)
        y = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return y / jnp.linalg.norm(y, axis=1, keepdims=True), None

    run = jax.jit(lambda x: jax.lax.scan(step, x, None, length=steps)[0])
    program = _without_debug_info(run.lower(x).compile().as_text())
    run(x).block_until_ready()
    start, c0 = time.perf_counter(), cpu_s()
    out = run(x).block_until_ready()
    wall, cpu = time.perf_counter() - start, cpu_s() - c0
    digest = hashlib.sha256(program.encode()).hexdigest()[:16]
    return {
        "step_s": wall / steps,
        "cpu_step_s": cpu / steps,
        "checksum": float(jnp.sum(out)),
        "program": digest,
    }


def _without_debug_info(text: str) -> str:
    """The optimised HLO without the source locations (file names and lines differ between trees)."""
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    return "\n".join(line for line in text.splitlines() if not re.match(r"^\d+ [\"{]", line))


def child(tree: Path, n: int, d: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    code = f"import json, heads; print(json.dumps(heads.paper_steps({n}, {d}, {steps})))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parent, env=env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_paper(base: Path, *, n: int, pairs: int) -> list[dict]:
    rows = []
    for d, steps in ((3, 20), (64, 10)):
        old, new = [], []
        for _ in range(pairs):  # alternating, so that a change of load hits both
            old.append(child(base, n, d, steps))
            new.append(child(ROOT, n, d, steps))
        best_old = min(r["step_s"] for r in old)
        best_new = min(r["step_s"] for r in new)
        cpu_old, cpu_new = min(r["cpu_step_s"] for r in old), min(r["cpu_step_s"] for r in new)
        rows.append(
            {
                "n": n,
                "d": d,
                "old_step_s": best_old,
                "new_step_s": best_new,
                "ratio_new_old": best_new / best_old,
                "cpu_ratio_new_old": cpu_new / cpu_old,
                "same_result": old[0]["checksum"] == new[0]["checksum"],
                "same_program": old[0]["program"] == new[0]["program"],
            }
        )
    return rows


# ----------------------------------------------------------------------------- 2. general heads


def head_arrays(seed: int, heads: int, d: int, head_dim: int, n: int):
    from attnflow.core import heads as H

    maps = H.gaussian_maps(seed, heads, head_dim, d)
    freqs = 10000.0 ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    angles = np.outer(np.arange(n, dtype=float), freqs)
    return maps, angles


def rope_apply(v: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    even, odd = v[:, 0::2], v[:, 1::2]
    out = np.empty_like(v)
    out[:, 0::2] = cos * even - sin * odd
    out[:, 1::2] = sin * even + cos * odd
    return out


def numpy_heads(x, maps, angles, *, beta: float, block: int) -> np.ndarray:
    """The same layer in NumPy, row blocks of ``block`` rows: q, k, v per head, bounded exp, sums."""
    n = x.shape[0]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    total = np.zeros_like(x)
    for h in range(maps["query"].shape[0]):
        q = rope_apply(x @ maps["query"][h].T, cos, sin)
        k = rope_apply(x @ maps["key"][h].T, cos, sin)
        v = x @ maps["value"][h].T
        bound = np.sqrt(np.max(np.sum(q * q, 1)) * np.max(np.sum(k * k, 1)))
        summed = np.empty_like(v)
        for start in range(0, n, block):
            s = q[start : start + block] @ k.T
            s -= bound
            s *= beta
            np.exp(s, out=s)
            summed[start : start + block] = s @ v
        total += (summed * (np.exp(beta * bound) / n)) @ maps["output"][h].T
    return total - np.sum(total * x, axis=1, keepdims=True) * x


def measure_heads(*, n: int, heads: int, d: int, head_dim: int, dtype: str, reps: int) -> dict:
    jax = setup_jax()
    import jax.numpy as jnp

    from attnflow.core import factors, gauges
    from attnflow.core import heads as H
    from attnflow.core.kernel import make_profile
    from attnflow.numerics.heads_field import HeadsField

    jdtype = jnp.float32 if dtype == "float32" else jnp.float64
    block = 512 if dtype == "float32" else 128  # build.auto_block_size's row blocks at this n
    maps, angles = head_arrays(0, heads, d, head_dim, n)
    gauge = gauges.RoPE(angles=jnp.asarray(angles, jdtype), d=head_dim)
    built = tuple(
        H.make_head(*(maps[name][h] for name in H.MAP_NAMES), gauge=gauge, factor=factors.NoFactor(n=n),
                    values="plain", dtype=jdtype)
        for h in range(heads)
    )  # fmt: skip
    field = jax.jit(HeadsField(built, make_profile("exp", beta=1.0, dtype=jdtype), block_size=block))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    xj = jnp.asarray(x, jdtype)
    field(xj).block_until_ready()

    def best(fn):
        out = []
        for _ in range(reps):
            start, c0 = time.perf_counter(), cpu_s()
            fn()
            out.append((time.perf_counter() - start, cpu_s() - c0))
        return min(out, key=lambda wc: wc[1])

    ours = best(lambda: field(xj).block_until_ready())
    xn = x.astype(dtype)
    mapsn = {k: v.astype(dtype) for k, v in maps.items()}
    ref = best(lambda: numpy_heads(xn, mapsn, angles, beta=1.0, block=block))
    reference = numpy_heads(xn, mapsn, angles, beta=1.0, block=block)
    agree = float(np.max(np.abs(np.asarray(field(xj)) - reference)))
    macs = heads * (3 * n * d * head_dim + 2 * n * n * head_dim + n * head_dim * d)
    exps = heads * n * n
    rates = xla_rates(jdtype)
    limit_s = macs / rates["macs_per_s"] + exps / rates["exps_per_s"]
    return {
        "n": n, "heads": heads, "d": d, "head_dim": head_dim, "dtype": dtype, "block": block,
        "attnflow_wall_s": ours[0], "attnflow_cpu_s": ours[1], "numpy_wall_s": ref[0], "numpy_cpu_s": ref[1],
        "speedup_per_cpu_s": ref[1] / ours[1], "max_abs_difference": agree,
        "macs": macs, "exps": exps, **rates, "limit_s": limit_s, "fraction_of_limit": limit_s / ours[0],
    }  # fmt: skip


def xla_rates(jdtype) -> dict:
    import jax
    import jax.numpy as jnp

    a = jnp.ones((2048, 2048), jdtype) / 2048
    mm = jax.jit(lambda a: a @ a)
    mm(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(3):
        mm(a).block_until_ready()
    macs_per_s = 3 * 2048**3 / (time.perf_counter() - start)
    s = jnp.linspace(-1.0, 0.0, 4096 * 512, dtype=jdtype).reshape(4096, 512)
    ex = jax.jit(lambda s: jnp.exp(s))
    ex(s).block_until_ready()
    start = time.perf_counter()
    for _ in range(10):
        ex(s).block_until_ready()
    exps_per_s = 10 * s.size / (time.perf_counter() - start)
    return {"macs_per_s": macs_per_s, "exps_per_s": exps_per_s}


# ----------------------------------------------------------------------------- the report
# ruff: noqa: E501  (the report's table rows and sentences are kept whole)

BEGIN, END = "<!-- heads: begin -->", "<!-- heads: end -->"


def render(result: dict, results_md: Path) -> None:
    """Replace (or append) this benchmark's section of ``RESULTS.md`` with ``result``'s numbers."""
    load = lambda key: ", ".join(f"{v:.2f}" for v in result[key])  # noqa: E731
    lines = [
        BEGIN,
        "## Attention heads and the paper's model around them (`python benchmarks/heads.py`)",
        "",
        f"Run of {result['date']} on {result['machine']}; load average (1, 5, 15 min) {load('load_before')} "
        f"before, {load('load_after')} after (a shared machine: read the CPU-time ratios).",
        "",
    ]
    if "paper" in result:
        lines += [
            "The paper's model, RK4 steps of the USA field (automatic block size, float64), the tree before "
            "the heads (old) against this one (new), alternating child processes, best of each:",
            "",
            "| n | d | old s/step | new s/step | new/old (wall) | new/old (CPU) | same program | same result |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in result["paper"]:
            lines.append(
                f"| {r['n']} | {r['d']} | {r['old_step_s']:.4g} | {r['new_step_s']:.4g} | {r['ratio_new_old']:.3f} "
                f"| {r.get('cpu_ratio_new_old', float('nan')):.3f} | {r.get('same_program', '—')} "
                f"| {r['same_result']} |"
            )
        lines.append("")
    if "heads" in result:
        lines += [
            "One field evaluation of H = 8 heads (d = 512, d_h = 64, RoPE, gaussian maps, plain values, usa) "
            "against a NumPy reference of the same arithmetic in the same row blocks (one BLAS thread), and "
            "against the limit of its work (multiply-adds and exponentials at the rates XLA reaches in this run):",
            "",
            "| dtype | n | block | attnflow wall s | attnflow CPU s | NumPy CPU s | speed-up per CPU-s "
            "| limit s | limit / wall | max abs difference |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["heads"]:
            lines.append(
                f"| {r['dtype']} | {r['n']} | {r['block']} | {r['attnflow_wall_s']:.3g} | {r['attnflow_cpu_s']:.3g} "
                f"| {r['numpy_cpu_s']:.3g} | {r['speedup_per_cpu_s']:.2f} | {r['limit_s']:.3g} "
                f"| {r['fraction_of_limit']:.2f} | {r['max_abs_difference']:.2g} |"
            )
        lines.append("")
    lines.append(END)
    replace_section(results_md, BEGIN, END, "\n".join(lines))


# ----------------------------------------------------------------------------- the command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="the tree before the heads (skip section 1 without it)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--section", choices=["all", "paper", "heads"], default="all")
    parser.add_argument("--render", type=Path, help="write this run's section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.render is not None:
        render(json.loads(args.render.read_text()), ROOT / "benchmarks" / "RESULTS.md")
        return
    n = 1024 if args.quick else 4096
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_before": os.getloadavg(),
    }
    if args.base is not None and args.section in ("all", "paper"):
        result["paper"] = measure_paper(args.base, n=n, pairs=1 if args.quick else args.pairs)
    if args.section in ("all", "heads"):
        result["heads"] = [
            measure_heads(n=n, heads=8, d=512, head_dim=64, dtype=dtype, reps=1 if args.quick else 3)
            for dtype in ("float32", "float64")
        ]
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
