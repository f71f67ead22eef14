"""The Markdown report (RESULTS.md) drawn from the raw results (RESULTS.json): formatting only."""

from __future__ import annotations

import work


def fmt_t(seconds) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def fmt_r(value) -> str:
    return "—" if value is None else f"{value:.2f}×"


def fmt_count(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _speedup(ref_wall, ref_cpu, wall, cpu) -> str:
    """``ref / ours`` in wall time, the CPU-time ratio in brackets."""
    w, c = work.ratio(ref_wall, wall), work.ratio(ref_cpu, cpu)
    if w is None:
        return "—"
    return f"{w:.1f}×" + ("" if c is None else f" ({c:.1f}×)")


def row_limit_s(row: dict, rates: dict, method: str) -> float:
    """The limit of one step of ``method`` of a per-step row at ``rates``."""
    w = row["work"]
    per_eval = work.limit_s(
        work.Work(w["exps"], w["flops"], w["items"]), exp_rate=rates["exp"], matmul_rate=rates["matmul"]
    )
    return row[method]["evaluations"] * per_eval


def header(res: dict) -> list[str]:
    info = res["info"]
    loads = [tuple(round(v, 2) for v in load) for load in res["loads"]]
    affinity = info["affinity"]
    cores = f"{info['cores']} cores" + (
        "" if affinity is None else f", affinity {affinity} ({len(affinity)} usable)"
    )
    return [
        "# attnflow benchmark results",
        "",
        f"Produced by `{res['command']}` on {info['date']} ({res['elapsed_s'] / 60:.1f} min);",
        "every number below comes from that run (raw data: `RESULTS.json`; `--render` redraws this file).",
        "",
        "## Machine, load and versions",
        "",
        f"- CPU: {info['cpu']}, {cores}, {info['memory_gb']} GB RAM; `{info['uname']}`",
        f"- load average (1, 5, 15 min): {loads[0]} at the start, {loads[1]} at the end. The machine may be",
        "  shared: times are the best of interleaved repetitions, with the CPU time (all threads, waited-for",
        "  children included) next to them as a load-robust cross-check.",
        f"- Python {info['python']}, NumPy {info['numpy']} ({info['blas']}; the NumPy references run on "
        f"{info['numpy_blas_threads'] or 'default'} BLAS thread(s)), JAX {info['jax']} "
        f"(jaxlib {info['jaxlib']}), attnflow {info['attnflow']} at `{info['commit'] or 'unknown'}`",
        f"- `XLA_FLAGS`: `{info['xla_flags'] or '(unset)'}`; attnflow sees {info['cpu_devices']} CPU "
        f"device(s) (`use_cpu_cores()`, as the CLI does), its tile lanes run on {info['lane_devices']}",
    ] + (
        ["- time per section: " + "; ".join(f"{k} {v:.0f} s" for k, v in res["sections_s"].items())]
        if res.get("sections_s")
        else []
    )


def rates_section(res: dict) -> list[str]:
    lines = ["", "## Machine rates (XLA, the engine's library, dtype and devices)", ""]
    lines += _table(
        [
            "dtype",
            "exp: tiles, one stream per lane device",
            "exp: one stream × lane devices",
            "exp: one device",
            "matmul: one per lane device",
            "matmul: one device",
            "used: exp",
            "used: matmul",
        ],
        [
            [
                dt,
                f"{r['exp_lanes'] / 1e9:.2f} G/s",
                f"{r['exp_stream_scaled'] / 1e9:.2f} G/s",
                f"{r['exp_one_device'] / 1e9:.2f} G/s",
                f"{r['matmul_lanes'] / 1e9:.1f} GFLOP/s",
                f"{r['matmul_one_device'] / 1e9:.1f} GFLOP/s",
                f"{r['exp'] / 1e9:.2f} G/s",
                f"{r['matmul'] / 1e9:.1f} GFLOP/s",
            ]
            for dt, r in res["rates"].items()
        ],
    )
    when = ", ".join(r["when"] for r in res["rate_runs"])
    again = (
        f", over the {len(res['rate_runs'])} measurements of the run ({when}): the fastest the machine was"
    )
    lines += [
        "",
        "exp: `exp(β(s − 1))` summed, the elementwise pass of a tile, in a `fori_loop` on 128 × 128",
        "tiles, one stream on each lane device at once (`shard_map`), one such stream alone times the",
        "number of lane devices (perfect lanes), and on a 1024 × 1024 array on one device (XLA's",
        "threads). matmul: one 1024² product on each lane device at once, and one 2048²",
        f"product on one device (2 m³ flop each). Used: the best of each kind{again}.",
        "The engine's products are small (a 128 × 128 tile against 4 or 64 columns) and reach less than",
        "this: the limit below is a lower bound on the time of the work done.",
    ]
    return lines


def work_section(res: dict) -> list[str]:
    lines = [
        "",
        "## Work per field evaluation and its limit",
        "",
        "Counted on the path the engine takes (`benchmarks/work.py`), padding included, for the values `u`",
        "padded to `dv` columns (a multiple of 4): **dense** `n²` exponentials, `2n²(d + dv)` flops;",
        "**unrolled tiles** (the dense evaluation at n ≤ 512, float64) and **tiles** (float64, tiles of",
        "`b × b`): `m = ⌈n/b⌉`, `m(m+1)/2` tile pairs of `b²` exponentials and `2b²(d + 2dv)` flops",
        "(logits, `C v` and `Cᵀ v`; unrolled diagonal tiles skip `Cᵀ v`); **rows** (float32, blocks of",
        "`b` rows): `⌈n/b⌉·b` rows of `n` exponentials and `2n(d + dv)` flops. Limit = exponentials / exp",
        "rate + flops / matmul rate, at the rates above; a step is 1 (Euler) or 4 (RK4) evaluations.",
        "Not counted: the O(n d) work per evaluation (projection, RK stages, renormalisation).",
        "",
    ]
    rows = []
    for row in res["steps"]:
        w, rates = row["work"], res["rates"][row["dtype"]]
        path = w["path"] + ("" if w["tile"] is None else f" {w['tile']}")
        items = f"{w['items']} {'pairs' if 'tiles' in w['path'] else 'rows'}"
        limit = work.limit_s(
            work.Work(w["exps"], w["flops"], w["items"]), exp_rate=rates["exp"], matmul_rate=rates["matmul"]
        )
        rows.append(
            [
                row["n"],
                row["d"],
                row["dtype"],
                path,
                items,
                fmt_count(w["exps"]),
                fmt_count(w["flops"]),
                f"{w['exps'] / (row['n'] ** 2):.2f}",
                fmt_t(limit),
            ]
        )
    lines += _table(["n", "d", "dtype", "path", "items", "exponentials", "flops", "exps / n²", "limit"], rows)
    return lines


def steps_section(res: dict) -> list[str]:
    lines = [
        "",
        "## Per step",
        "",
        "attnflow: the compiled loop (`numerics.solve.integrate`, steady state, compilation excluded), the",
        "automatic block size, on all lane devices. ×limit = attnflow time / the limit of the work it does",
        "(table above; 1.00× would be the machine's exp and matmul rates with nothing else). **NumPy naive",
        "dense**: a naive dense step as the published codes write it (an explicit `exp(β X Xᵀ)` per",
        "evaluation, a Python loop over steps). **NumPy blocked**: the engine's path in NumPy (the same",
        "tiles or row blocks, same arithmetic; one in-place n × n buffer where the engine is dense): what",
        "attnflow adds beyond blocking. ×: reference time / attnflow time, wall (CPU in brackets: the",
        "references use one core, attnflow all lane devices). — : not run (too large or too slow).",
        "",
    ]
    rows = []
    for row in res["steps"]:
        rates = res["rates"][row["dtype"]]
        for method in ("euler", "rk4"):
            m = row.get(method)
            if not m:
                continue
            ours, cpu = m["attnflow_s"], m["attnflow_cpu_s"]
            limit = row_limit_s(row, rates, method)
            rows.append(
                [
                    row["n"],
                    row["d"],
                    row["dtype"],
                    method,
                    fmt_t(ours),
                    fmt_t(limit),
                    fmt_r(work.ratio(ours, limit)),
                    fmt_t(m.get("naive_s")),
                    _speedup(m.get("naive_s"), m.get("naive_cpu_s"), ours, cpu),
                    fmt_t(m.get("blocked_s")),
                    _speedup(m.get("blocked_s"), m.get("blocked_cpu_s"), ours, cpu),
                    f"{row['max_rss_mb']:.0f} MB",
                ]
            )
    lines += _table(
        [
            "n",
            "d",
            "dtype",
            "method",
            "attnflow",
            "limit",
            "×limit",
            "NumPy naive dense",
            "×naive",
            "NumPy blocked",
            "×blocked",
            "process peak RSS*",
        ],
        rows,
    )
    lines += [
        "",
        "\\* of the measuring subprocess, NumPy references included (the naive n × n arrays dominate",
        "from n = 4096); attnflow alone: see the memory table.",
    ]
    return lines


def whole_section(res: dict) -> list[str]:
    s, b = res["single"], res["batches"]
    ours, ref = b["attnflow"], b["numpy"]
    lines = [
        "",
        f"## Whole runs: n = {s['n']}, d = 3, RK4, dt = 0.01, τ = {s['t_end']:g}, snapshots every 0.1",
        "",
        "One seed, in the benchmark's process: the `solve` call timed whole (wall; CPU of the process and",
        "its waited-for children), the start-up (compilation) `solve` reports, and the run = call −",
        "start-up; against the naive NumPy run (one process), interleaved, the best of the repetitions.",
        "",
    ]
    run = None if s.get("startup_s") is None else s["attnflow_s"] - s["startup_s"]
    lines += _table(
        [
            "",
            "solve call",
            "start-up (in the call)",
            "run",
            "NumPy naive run",
            "× (call)",
            "× (run)",
            "× CPU (call)",
        ],
        [
            [
                "one seed",
                fmt_t(s["attnflow_s"]),
                fmt_t(s.get("startup_s")),
                fmt_t(run),
                fmt_t(s["numpy_s"]),
                fmt_r(work.ratio(s["numpy_s"], s["attnflow_s"])),
                fmt_r(work.ratio(s["numpy_s"], run)),
                fmt_r(work.ratio(s["numpy_cpu_s"], s["attnflow_cpu_s"])),
            ]
        ],
    )
    lines += [
        "",
        f"Final states of attnflow and the NumPy run agree to {s['max_diff']:.1e}.",
        "",
        f"{b['seeds']} seeds, each side a fresh process timed from outside, start-up included",
        "(interpreter, imports, compilation, starting workers): attnflow's batch `solve` (`x0` of shape",
        f"`({b['seeds']}, n, d)`, its own runner) against the naive NumPy runs over a pool of",
        f"{b['processes']} processes (one per core available to the process, as attnflow's runner; one BLAS",
        "thread each). CPU: the process and every descendant it waited for (`RUSAGE_CHILDREN` of the",
        "benchmark).",
        "",
    ]
    lines += _table(
        ["", "wall (whole process)", "CPU", "of which: imports", "solve call", "start-up (in the call)"],
        [
            [
                "attnflow",
                fmt_t(ours["process_wall_s"]),
                fmt_t(ours["process_cpu_s"]),
                fmt_t(ours["import_s"]),
                fmt_t(ours["solve_s"]),
                fmt_t(ours.get("startup_s")),
            ],
            [
                f"NumPy naive, {b['processes']} processes",
                fmt_t(ref["process_wall_s"]),
                fmt_t(ref["process_cpu_s"]),
                "—",
                f"pool: {fmt_t(ref['pool_s'])}",
                "—",
            ],
            [
                "× (NumPy / attnflow)",
                fmt_r(work.ratio(ref["process_wall_s"], ours["process_wall_s"])),
                fmt_r(work.ratio(ref["process_cpu_s"], ours["process_cpu_s"])),
                "",
                "",
                "",
            ],
        ],
    )
    return lines


def memory_section(res: dict) -> list[str]:
    lines = ["", "## Memory and large n (a fresh subprocess per row; peak RSS from `/usr/bin/time -v`)", ""]
    lines += _table(
        ["engine", "n", "block", "peak RSS", "steps", "Euler step", "start-up", "one energy evaluation"],
        [
            [
                "attnflow" if r["engine"] == "attnflow" else "NumPy naive dense",
                r["n"],
                r.get("block_size") or ("dense" if r["engine"] == "attnflow" else "n × n"),
                f"{r['max_rss_mb']:.0f} MB",
                r.get("steps", 1),
                fmt_t(r["step_s"]) + (" (incl. start-up)" if r.get("step_includes_startup") else ""),
                fmt_t(r.get("startup_s")),
                fmt_t(r.get("energy_s")),
            ]
            for r in res["memory"]
        ],
    )
    return lines + [
        "",
        f"Baseline: a tiny attnflow run (n = 64) peaks at {res['baseline']['max_rss_mb']:.0f} MB "
        "(Python, JAX, XLA).",
        "attnflow's step: `solve`'s wall time less its start-up, per step.",
    ]


def blocks_section(res: dict) -> list[str]:
    lines = [
        "",
        "## Block size (one field evaluation, d = 3)",
        "",
        "float64 blocks are symmetric tiles (block × block), float32 blocks are row blocks (block rows);",
        "dense: one evaluation without blocks (float64 from 256 to 512 tokens: unrolled 128-tiles).",
        "",
    ]
    return lines + _table(
        ["dtype", "n", "block", "time"],
        [[r["dtype"], r["n"], r["block"] or "dense", fmt_t(r["eval_s"])] for r in res["blocks"]],
    )


def other_sections(res: dict) -> list[str]:
    lines = ["", "## Thread and device settings (same RK4 run, τ = 0.5, RoPE, automatic block size)", ""]
    for n, diffs in res["threads"].items():
        parts = ", ".join(f"{k}: {v:.1e}" for k, v in diffs.items())
        lines.append(f"- n = {n}: max |difference| vs one CPU device — {parts}")
    lines += ["", "## float32 vs float64 (RK4, dt = 0.01; max over tokens and seeds)", ""]
    lines += _table(
        [
            "setting",
            "n",
            "seeds",
            "state t = 5",
            "state t = 20",
            "mean cos t = 20",
            "gauge mean cos",
            "energy",
        ],
        [
            [
                r["setting"],
                r["n"],
                r["seeds"],
                f"{r['state_t5']:.1e}",
                f"{r['state_t20']:.1e}",
                f"{r['mean_cosine_t20']:.1e}",
                f"{r['gauge_mean_cosine_t20']:.1e}",
                f"{r['energy_rel_t20']:.1e} rel.",
            ]
            for r in res["float32"]
        ],
    )
    rb = res["random_batch"]
    lines += [
        "",
        f"## Random-batch approximation (n = {rb['n']}, Euler, dt = 0.01, to t = {rb['t_end']:g})",
        "",
        f"An approximation, not the model. Exact dynamics: {fmt_t(rb['exact_step_s'])} per step",
        "(compiled loop).",
        "Error against the exact trajectory from the same initial data (RMS over tokens of |x_RB − x|).",
        "",
    ]
    lines += _table(
        ["p", "RMS error", "max error", "whole call incl. compilation"],
        [[r["p"], f"{r['rms_error']:.2e}", f"{r['max_error']:.2e}", fmt_t(r["run_s"])] for r in rb["rows"]],
    )
    if rb.get("large"):
        big = rb["large"]
        lines += [
            "",
            f"n = {big['n']}, p = {big['p']}: {fmt_t(big['run_s'] / big['steps'])} per Euler step over "
            f"{big['steps']} steps (incl. compilation), peak RSS {big['max_rss_mb']:.0f} MB.",
        ]
    return lines


def targets(res: dict) -> list[str]:
    """The issue-5 targets, on the measures above."""

    def verdict(value, ok):
        return "not measured" if value is None else ("met" if ok(value) else "**missed**")

    out = ["", "## Targets (issue 5)", ""]
    for row in res["steps"]:
        if (row["n"], row["d"], row["dtype"]) != (4096, 3, "float64"):
            continue
        for method in ("euler", "rk4"):
            m = row.get(method)
            if not m:
                continue
            speed = work.ratio(m.get("naive_s"), m["attnflow_s"])
            limit = work.ratio(m["attnflow_s"], row_limit_s(row, res["rates"]["float64"], method))
            blocked = work.ratio(m.get("blocked_s"), m["attnflow_s"])
            out.append(
                f"- n = 4096, d = 3, float64, {method}: {fmt_r(speed)} faster than the naive dense NumPy "
                f"step (≥ 3×: {verdict(speed, lambda v: v >= 3)}), {fmt_r(blocked)} than the blocked one; "
                f"{fmt_r(limit)} its limit (≤ 2×: {verdict(limit, lambda v: v <= 2)})"
            )
    s, b = res["single"], res["batches"]
    run = None if s.get("startup_s") is None else s["attnflow_s"] - s["startup_s"]
    one, call = work.ratio(s["numpy_s"], run), work.ratio(s["numpy_s"], s["attnflow_s"])
    out.append(
        f"- n = 256, RK4, τ = {s['t_end']:g}: one run, start-up excluded, {fmt_r(one)} faster than the naive "
        f"NumPy run (≥ 2×: {verdict(one, lambda v: v >= 2)}); the whole `solve` call, start-up included: "
        f"{fmt_r(call)}"
    )
    wall = work.ratio(b["numpy"]["process_wall_s"], b["attnflow"]["process_wall_s"])
    cpu = work.ratio(b["numpy"]["process_cpu_s"], b["attnflow"]["process_cpu_s"])
    out.append(
        f"- {b['seeds']} seeds, fresh processes, start-up included, {b['processes']} processes each: "
        f"{fmt_r(wall)} faster in wall time, {fmt_r(cpu)} per CPU-second (≥ 3×: "
        f"{verdict(wall, lambda v: v >= 3)} / {verdict(cpu, lambda v: v >= 3)})"
    )
    for row in res["memory"]:
        if row["engine"] == "attnflow" and row["n"] >= 65536:
            goal = (
                f"< 2 GB: {verdict(row['max_rss_mb'], lambda v: v < 2048)}" if row["n"] == 65536 else "usable"
            )
            out.append(
                f"- n = {row['n']}, d = 3: peak RSS {row['max_rss_mb']:.0f} MB ({goal}), "
                f"{fmt_t(row['step_s'])} per Euler step"
            )
    return out


def render(res: dict) -> str:
    lines = header(res) + rates_section(res) + work_section(res) + steps_section(res) + whole_section(res)
    lines += memory_section(res) + blocks_section(res) + other_sections(res) + targets(res)
    return "\n".join(lines) + "\n"
