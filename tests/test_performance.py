"""Performance paths give the same answers (issue 5): blocked = dense on every kernel kind, vmapped
seeds and parameter batches = single runs, the compiled chunk is built once per run, float32 stays
within its documented distance of float64, results do not depend on the XLA thread settings, the
automatic block size, and the random-batch approximation's error decreasing with the batch size.

Speed and memory are measured by ``benchmarks/run.py`` (``benchmarks/RESULTS.md``), not here."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import textwrap
import unittest.mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, Profile, make_profile
from attnflow.numerics import dynamics, integrators, program_cache, random_batch, summation
from attnflow.numerics.solve import integrate, solve
from attnflow.workflows.build import (
    AUTO_BLOCK_ENTRIES,
    AUTO_BLOCK_MIN,
    AUTO_BLOCK_ROWS_FLOAT32,
    AUTO_BLOCK_SIZE,
    AUTO_BLOCK_THRESHOLD,
    AUTO_BLOCK_THRESHOLD_FLOAT32,
    auto_block_size,
)
from helpers_core import FACTORS, GAUGES, NONNEGATIVE_FACTORS, make_kernel, mean_cosine, uniform

N_BLOCK = 20  # with block size 8: three blocks, the last one padded


COMBOS = [
    (factor_name, normalization, causal, value)
    for normalization, causal, value in itertools.product(("usa", "sa"), (False, True), dynamics.VALUES)
    for factor_name in (NONNEGATIVE_FACTORS if normalization == "sa" else sorted(FACTORS))
]  # every factor × normalization × causal × value (sa needs w >= 0): 32 combinations


def _check_blocked_equals_dense(gauge_name, combos, *, unrolled_tiles: bool):
    g = GAUGES[gauge_name](N_BLOCK)
    x = uniform(N_BLOCK, g.d, seed=21)
    assert summation.dense_tile(N_BLOCK, jnp.float64) is None  # the dense field: one n × n matrix
    cases = []
    for factor_name, normalization, causal, value in combos:
        k = make_kernel(g, FACTORS[factor_name](N_BLOCK), beta=1.7)
        opts = dict(normalization=normalization, causal=causal, value=value)
        cases.append((f"{gauge_name} {factor_name} {opts}", k, opts))

    def fields(**extra):  # every combination in one compiled program, not one each
        program = jax.jit(
            lambda x: [dynamics.make_vector_field(k, **opts, **extra)(x) for _, k, opts in cases]
        )
        return program(x)

    dense, others = fields(), {"blocked": fields(block_size=8)}
    if unrolled_tiles:
        with unittest.mock.patch.object(summation, "DENSE_TILE", 4):  # dense by 15 unrolled tile pairs
            assert summation.dense_tile(N_BLOCK, jnp.float64) == 4
            others["unrolled tiles"] = fields()
    # every row is computed by the same arithmetic (only the matmul tiling may differ): O(e^β)
    # velocities agree to a few ulps, far inside the 1e-12 acceptance bound
    for name, values in others.items():
        for (label, _, _), field, reference in zip(cases, values, dense, strict=True):
            np.testing.assert_allclose(field, reference, rtol=0, atol=1e-12, err_msg=f"{name}: {label}")
    k = make_kernel(g, FACTORS["matrix_signed"](N_BLOCK), beta=1.7)
    # energy: 400 O(e^β/β) terms regrouped by row blocks, relative round-off ~1e-15 (both energies in
    # one compiled program, not op by op)
    blocked, dense = jax.jit(lambda x: (summation.energy(k, x, block_size=8), summation.energy(k, x)))(x)
    np.testing.assert_allclose(blocked, dense, rtol=1e-12)


@pytest.mark.parametrize("index, gauge_name", list(enumerate(sorted(GAUGES))))
def test_blocked_field_equals_dense_every_kind(index, gauge_name):
    """Each gauge with 2 of the 32 combinations, chosen so that the 8 gauges cover 16 of them with
    every factor, normalization, causal flag and value represented (the full product is ``slow``);
    also the dense evaluation by unrolled tiles (``summation.dense_tile``)."""
    _check_blocked_equals_dense(
        gauge_name, [COMBOS[(index + 13 * j) % 32] for j in range(2)], unrolled_tiles=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("gauge_name", sorted(GAUGES))
def test_blocked_field_equals_dense_full_product(gauge_name):
    _check_blocked_equals_dense(gauge_name, COMBOS, unrolled_tiles=False)


def test_vmapped_seeds_equal_single_runs_blocked():
    n, seeds = 24, 3
    g = GAUGES["prompt_haar"](n)
    k = make_kernel(g, FACTORS["distance_bias"](n), beta=1.0)
    field = dynamics.make_vector_field(k, normalization="sa", block_size=8)
    x0 = jnp.stack([uniform(n, 3, seed=s) for s in range(seeds)])
    opts = dict(integrator=integrators.RK4(), dt=0.05, t_end=1.0, save_every=0.5)
    # workers=1: the batch in this process (the lax.map below), not in spawned worker processes
    # (processes = this process: test_batch.py, test_solve_workers.py)
    batch = solve(field, x0, workers=1, **opts)
    assert batch.status == "ok" and batch.xs.shape == (3, seeds, n, 3)
    for s in range(seeds):
        single = solve(field, x0[s], **opts)
        # on a CPU every run of a batch is the unbatched program (lax.map over the runs): bitwise
        np.testing.assert_array_equal(batch.xs[:, s], single.xs)


def test_parameter_batch_with_integrate_equals_single_runs():
    n = 16
    g = GAUGES["rope_full_period"](n)
    x0 = uniform(n, 3, seed=3)
    opts = dict(integrator=integrators.RK4(), dt=0.02, steps=25)

    def final(beta):
        k = Kernel(g, factors.NoFactor(n), Profile("exp", beta, jnp.asarray(1.0)))
        return integrate(dynamics.make_vector_field(k), x0, **opts)

    betas = jnp.array([0.5, 1.0, 3.0])
    batch = jax.jit(jax.vmap(final))(betas)
    for i, beta in enumerate(betas):
        single = solve(
            dynamics.make_vector_field(make_kernel(g, factors.NoFactor(n), beta=float(beta))),
            x0,
            integrator=opts["integrator"],
            dt=opts["dt"],
            t_end=0.5,
            save_every=0.5,
        )
        # same steps, traced vs constant beta: e^{β} folded differently, round-off only
        np.testing.assert_allclose(batch[i], single.xs[-1], rtol=0, atol=1e-13)


@pytest.mark.slow
def test_chunk_compiled_once_per_structure():
    n = 8
    k = make_kernel(GAUGES["identity"](n), factors.NoFactor(n))
    inner = dynamics.make_vector_field(k)
    traces = []

    def field(x):  # Python runs only while JAX traces
        traces.append(1)
        return inner(x)

    # one snapshot per call in both runs: the same call shape (the automatic grouping depends on
    # the number of snapshots)
    opts = dict(integrator=integrators.RK4(), dt=0.1, save_every=0.2, snapshots_per_call=1)
    program_cache.clear()
    short = solve(field, uniform(n, 3), t_end=0.4, **opts)
    per_run = len(traces)
    long = solve(field, uniform(n, 3), t_end=2.0, **opts)
    assert short.xs.shape[0] == 3 and long.xs.shape[0] == 11
    # 10 chunks of the second run (same field, shapes and options) reuse the first run's program
    assert per_run > 0 and len(traces) == per_run
    assert short.compile_time_s > 0.0 and long.compile_time_s == 0.0


# Float32 accuracy (documented in attnflow.numerics.solve): measured over E0/E1 settings, n = 64, 128, 256,
# seeds 0–9, RK4 dt = 0.01 (benchmarks/RESULTS.md): max |x32 − x64| ≤ 6.6e-6 at t = 5 and ≤ 2.9e-6
# at t = 20; mean cosines ≤ 2e-6 apart, energies ≤ 3e-7 relative. Documented bounds: 2e-5 and 1e-5.
FLOAT32_STATE_BOUND = 2e-5
FLOAT32_METRIC_BOUND = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["E0", "E1a"])
def test_float32_within_documented_bound(setting):
    n, seeds = 64, 2

    def kernel(dtype):
        if setting == "E0":
            g = gauges.IdentityGauge(n=n, d=3)
        else:
            g = gauges.make_rope(
                np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n), dtype=dtype
            )
        return Kernel(g, factors.NoFactor(n), make_profile("exp", beta=1.0, dtype=dtype))

    x0 = jnp.stack([sphere.sample_uniform(jax.random.key(s), n, 3) for s in range(seeds)])
    runs = {}
    for dtype in (jnp.float64, jnp.float32):
        field = dynamics.make_vector_field(kernel(dtype))
        traj = solve(  # both seeds in this process (workers=1): the same results as in processes
            field,
            x0.astype(dtype),
            integrator=integrators.RK4(),
            dt=0.01,
            t_end=20.0,
            save_every=5.0,
            workers=1,
        )
        assert traj.status == "ok" and traj.xs.dtype == np.dtype(dtype)
        runs[dtype] = traj.xs.astype(np.float64)
    x64, x32 = runs[jnp.float64], runs[jnp.float32]
    assert np.abs(x64[1] - x32[1]).max() <= FLOAT32_STATE_BOUND  # t = 5
    assert np.abs(x64[-1] - x32[-1]).max() <= FLOAT32_STATE_BOUND  # t = 20
    k64 = kernel(jnp.float64)
    for s in range(seeds):
        assert abs(mean_cosine(x64[-1, s]) - mean_cosine(x32[-1, s])) <= FLOAT32_METRIC_BOUND
        e64, e32 = (float(summation.energy(k64, jnp.asarray(x[-1, s]))) for x in (x64, x32))
        assert abs(e64 - e32) / e64 <= FLOAT32_METRIC_BOUND


_THREAD_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np
    import attnflow
    from attnflow.core import factors, gauges, sphere
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics, integrators, lanes, summation
    from attnflow.numerics.solve import solve


    def main():  # not at import: a batch's worker processes import this script again
        devices = int(sys.argv[2])
        if devices > 1:
            attnflow.use_cpu_cores(devices)
        assert len(lanes.lane_devices()) == devices
        energy = jax.jit(summation.energy, static_argnames="block_size")  # one program, not op by op
        n = 1100  # 9 tiles of 128: 45 tile pairs dealt into 8 lanes, the last tile padded
        out = {}
        for dtype, block in (("float64", None), ("float64", 128), ("float32", 128)):
            frequencies = gauges.rope_frequencies(3, kind="full_period", n=n)
            g = gauges.make_rope(np.arange(n), 3, frequencies, dtype=dtype)
            xi = jax.numpy.arange(n, dtype=dtype) / n
            factor = factors.DistanceBias(xi=xi, slope=jax.numpy.ones((), dtype))
            k = Kernel(g, factor, make_profile("exp", beta=1.0, dtype=dtype))
            x0 = sphere.sample_uniform(0, n, 3).astype(dtype)
            for normalization, causal in (("sa", False), ("usa", True)):
                opts = dict(normalization=normalization, causal=causal, block_size=block)
                field = dynamics.make_vector_field(k, **opts)
                traj = solve(field, x0, integrator=integrators.RK4(), dt=0.01, t_end=0.04, save_every=0.02)
                out[f"{dtype}_{block}_{normalization}"] = traj.xs
            out[f"{dtype}_{block}_energy"] = np.asarray(energy(k, x0, block_size=block))
            if dtype == "float64":  # a batch of 5 seeds (a lax.map of the run), with this run's settings
                x0s = np.stack([sphere.sample_uniform(seed, n, 3) for seed in range(5)])
                # workers=1: in this process, under its flags and devices; in worker processes (one per
                # core) it would run single-threaded on one device whatever this run's settings
                # (processes = this process: test_batch.py)
                traj = solve(
                    field, x0s, integrator=integrators.RK4(), dt=0.01, t_end=0.02, save_every=0.02, workers=1
                )
                out[f"{dtype}_{block}_batch"] = traj.xs
        n = 256  # float64 dense: unrolled tiles (summation.dense_tile)
        g = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
        factor = factors.DistanceBias(xi=jax.numpy.arange(n) / n, slope=jax.numpy.ones(()))
        k = Kernel(g, factor, make_profile("exp", beta=1.0))
        for normalization, causal in (("sa", False), ("usa", True)):
            field = dynamics.make_vector_field(k, normalization=normalization, causal=causal)
            x0 = sphere.sample_uniform(1, n, 3)
            traj = solve(field, x0, integrator=integrators.RK4(), dt=0.01, t_end=0.04, save_every=0.02)
            out[f"dense_tiles_{normalization}"] = traj.xs
        np.savez(sys.argv[1], **out)


    if __name__ == "__main__":
        main()
    """
)


def _run_with_flags(tmp_path, name, xla_flags, *, devices=1, taskset=False):
    script = tmp_path / "thread_run.py"
    script.write_text(_THREAD_SCRIPT)
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    cmd = (["taskset", "-c", "0"] if taskset else []) + [sys.executable, str(script)]
    subprocess.run(cmd + [str(tmp_path / f"{name}.npz"), str(devices)], env=env, check=True, timeout=300)
    return dict(np.load(tmp_path / f"{name}.npz"))


@pytest.mark.slow
def test_results_independent_of_thread_settings_and_devices(tmp_path):
    one_device = "--xla_force_host_platform_device_count=1"
    default = _run_with_flags(tmp_path, "default", one_device)
    runs = [
        _run_with_flags(tmp_path, "two_devices", "", devices=2),  # lanes split over 2 CPU devices
        _run_with_flags(tmp_path, "eight_devices", "", devices=8),  # one lane per device
    ]
    # one thread: with one core visible, XLA's intra-op pool has one thread, so Eigen's products run
    # sequentially (what --xla_cpu_multi_thread_eigen=false asks for: a pool of one thread takes
    # Eigen's sequential product) and XLA's parallel loops run on one thread too: this run covers
    # that flag's run and more; the flag's run is the fallback where no taskset or one core only
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        runs.append(_run_with_flags(tmp_path, "one_core", one_device, taskset=True))  # one core visible
    else:
        runs.append(_run_with_flags(tmp_path, "single", f"{one_device} --xla_cpu_multi_thread_eigen=false"))
    for run in runs:
        assert run.keys() == default.keys()
        for key in default:
            np.testing.assert_array_equal(default[key], run[key], err_msg=key)  # bitwise: 0 ulp
    # tiled = dense: the same sums regrouped by tiles, unit-norm states after 4 RK4 steps: round-off only
    for normalization in ("sa", "usa"):
        tiled, dense = default[f"float64_128_{normalization}"], default[f"float64_None_{normalization}"]
        np.testing.assert_allclose(tiled, dense, rtol=0, atol=1e-13)
    np.testing.assert_allclose(default["float64_128_energy"], default["float64_None_energy"], rtol=1e-14)
    assert default["float64_128_batch"].shape == (2, 5, 1100, 3)


def test_dense_tile_only_where_the_upper_tiles_save_entries():
    assert summation.dense_tile(256, jnp.float64) == summation.DENSE_TILE == 128  # 3 pairs: 3/4 of n²
    assert summation.dense_tile(512, jnp.float64) == 128  # 10 pairs: 5/8 of n²
    assert summation.dense_tile(200, jnp.float64) is None  # 3 pairs of 128²: more than 40 000 entries
    assert summation.dense_tile(128, jnp.float64) is None  # one tile: the matrix itself
    assert summation.dense_tile(640, jnp.float64) is None  # above DENSE_TILES_MAX
    assert summation.dense_tile(256, jnp.float32) is None  # float32: the products dominate


def test_auto_block_size():
    assert auto_block_size(AUTO_BLOCK_THRESHOLD) is None  # dense up to the threshold
    assert auto_block_size(AUTO_BLOCK_THRESHOLD_FLOAT32, jnp.float32) is None
    for n in (AUTO_BLOCK_THRESHOLD + 1, 4096, 65536, 10**7):
        assert auto_block_size(n) == AUTO_BLOCK_SIZE  # float64 tiles: memory O(n d + block²) whatever n
    for n in (AUTO_BLOCK_THRESHOLD_FLOAT32 + 1, 4096, 65536, 10**7):
        rows = auto_block_size(n, jnp.float32)  # float32 row blocks: memory O(n · block)
        assert AUTO_BLOCK_MIN <= rows <= AUTO_BLOCK_ROWS_FLOAT32 and rows & (rows - 1) == 0
        assert rows * n <= max(AUTO_BLOCK_ENTRIES, AUTO_BLOCK_MIN * n)


def test_float32_row_blocks_equal_dense():
    n, f32 = 40, jnp.float32
    g = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n), dtype=f32)
    factor = factors.DistanceBias(xi=jnp.arange(n, dtype=f32) / n, slope=jnp.asarray(1.0, f32))
    k = Kernel(g, factor, make_profile("exp", beta=1.0, dtype=f32))
    x = uniform(n, 3, seed=8).astype(f32)
    options = [dict(normalization="usa", causal=False), dict(normalization="sa", causal=True)]

    def evaluate(x):  # every field and energy in one compiled program, not op by op
        fields = [
            (
                dynamics.make_vector_field(k, **opts)(x),
                dynamics.make_vector_field(k, block_size=16, **opts)(x),
            )
            for opts in options
        ]
        return fields, (summation.energy(k, x, block_size=16), summation.energy(k, x))

    fields, energies = jax.jit(evaluate)(x)
    for dense, blocked in fields:
        assert blocked.dtype == jnp.float32
        # the same row arithmetic in float32 (row blocks, no regrouping): a few float32 ulps at most
        np.testing.assert_allclose(blocked, dense, rtol=0, atol=1e-5)
    np.testing.assert_allclose(*energies, rtol=1e-6)


@pytest.mark.slow
def test_random_batch_exact_at_p_equals_n_and_error_decreases_with_p():
    n = 64
    g = GAUGES["rope_full_period"](n)
    k = make_kernel(g, factors.NoFactor(n), beta=1.0)
    x = uniform(n, 3, seed=5)
    batches, valid = random_batch.partition(jax.random.key(1), n, n)

    def both(x):  # every field in one compiled program, not op by op
        return [
            (
                random_batch.make_random_batch_field(k, batches, valid, normalization=norm, causal=causal)(x),
                dynamics.make_vector_field(k, normalization=norm, causal=causal)(x),
            )
            for norm, causal in (("usa", False), ("sa", True))
        ]

    for approx, exact in jax.jit(both)(x):
        # one batch holding every token: the exact sums in a permuted order, round-off only
        np.testing.assert_allclose(approx, exact, rtol=0, atol=1e-13)
    batches, valid = random_batch.partition(jax.random.key(2), 10, 4)
    assert batches.shape == (3, 4) and sorted(np.asarray(batches)[np.asarray(valid)]) == list(range(10))

    opts = dict(integrator=integrators.Euler(), dt=0.01, t_end=1.0, save_every=1.0)
    exact = solve(dynamics.make_vector_field(k), x, **opts).xs[-1]
    errors = []
    for p in (2, 8, 32):
        approx = random_batch.solve_random_batch(k, x, p=p, key=jax.random.key(p), **opts).xs[-1]
        errors.append(np.sqrt(np.mean(np.sum((approx - exact) ** 2, axis=1))))  # RMS over tokens
    # the strong error of the random-batch method scales like sqrt(dt/(p−1)): ~2× per 4× in p;
    # require a clear decrease at each step (measured RMS over 3 keys: 0.09–0.10, 0.031–0.035, 0.011–0.013)
    assert errors[0] > 1.5 * errors[1] > 2.25 * errors[2], errors
    with pytest.raises(ValueError, match=r"`p` must be an integer in \[2, n\] = \[2, 64\]; got 1\."):
        random_batch.solve_random_batch(k, x, p=1, key=jax.random.key(0), **opts)


@pytest.mark.slow
def test_random_batch_masks_are_the_exact_fields():
    """At ``p = n`` the random-batch field is the exact field for every mask of ``summation.MASKS``
    (``"strict"`` drops ``j = i``: token 0 sees nothing and stays still); a batch that holds none of
    a token's allowed keys gives it zero, not NaN; a value outside ``MASKS`` is refused."""
    n = 24
    k = make_kernel(GAUGES["rope_full_period"](n), FACTORS["distance_bias"](n), beta=1.0)
    x = uniform(n, 3, seed=8)
    combos = list(itertools.product(("usa", "sa"), summation.MASKS))
    assert (False, True, "strict") == summation.MASKS

    def fields(x):  # every field in one compiled program, not op by op
        return [
            (
                random_batch.RandomBatchField(k, n, normalization=norm, causal=causal)(x, jax.random.key(3)),
                dynamics.make_vector_field(k, normalization=norm, causal=causal)(x),
                random_batch.RandomBatchField(k, 4, normalization=norm, causal=causal)(x, jax.random.key(4)),
            )
            for norm, causal in combos
        ]

    results = jax.jit(fields)(x)
    for (norm, causal), (whole, exact, _) in zip(combos, results, strict=True):
        # one batch holding every token: the exact sums in a permuted order, round-off only (under
        # usa the j = i term is projected away, so it is sa that tells "strict" from True)
        np.testing.assert_allclose(whole, exact, rtol=0, atol=1e-14, err_msg=f"{norm} causal={causal!r}")
    for (norm, causal), (whole, _, small) in zip(combos, results, strict=True):
        assert np.all(np.isfinite(small)), (norm, causal)
        if causal == "strict":
            np.testing.assert_array_equal(whole[0], 0.0)
            np.testing.assert_array_equal(small[0], 0.0)
    message = r"random_batch: `causal` must be one of \(False, True, 'strict'\); got 'anything'\."
    with pytest.raises(ValueError, match=message):
        random_batch.RandomBatchField(k, n, causal="anything")
    batches, valid = random_batch.partition(jax.random.key(0), n, 4)
    with pytest.raises(ValueError, match=message):
        random_batch.make_random_batch_field(k, batches, valid, causal="anything")
    opts = dict(integrator=integrators.Euler(), dt=0.1, t_end=0.1, save_every=0.1)
    with pytest.raises(ValueError, match=message):
        random_batch.solve_random_batch(k, x, p=4, key=jax.random.key(0), causal="anything", **opts)


@pytest.mark.slow
def test_random_batch_field_is_a_stochastic_field_of_solve():
    """``RandomBatchField`` runs through ``solve`` like any field: with one batch of all n tokens it
    is the exact dynamics (round-off only); each run of a batch of stochastic runs is bitwise its
    single run; adaptive steps are refused."""
    n = 24
    k = make_kernel(GAUGES["rope_full_period"](n), FACTORS["distance_bias"](n), beta=1.0)
    x = uniform(n, 3, seed=6)
    opts = dict(integrator=integrators.RK4(), dt=0.02, t_end=0.4, save_every=0.2)
    whole = random_batch.RandomBatchField(k, n, normalization="sa")
    approx = solve(whole, x, key=jax.random.key(4), **opts)
    exact = solve(dynamics.make_vector_field(k, normalization="sa"), x, **opts)
    # one batch: the exact sums in a permuted order, 20 RK4 steps of unit-norm states: round-off
    np.testing.assert_allclose(approx.xs, exact.xs, rtol=0, atol=1e-13)
    x0s = jnp.stack([x, uniform(n, 3, seed=7)])
    batch_run = solve(random_batch.RandomBatchField(k, 4), x0s, key=jax.random.key(5), workers=1, **opts)
    for s in range(2):  # a batch of stochastic runs: run s draws from split(key, 2)[s], bitwise
        single = solve(
            random_batch.RandomBatchField(k, 4), x0s[s], key=jax.random.split(jax.random.key(5), 2)[s], **opts
        )
        np.testing.assert_array_equal(batch_run.xs[:, s], single.xs)
    with pytest.raises(
        ValueError, match=r"a stochastic `field` \(random batches\) needs a fixed-step method"
    ):
        solve(whole, x, integrator=integrators.Adaptive(), dt=0.01, t_end=0.2, save_every=0.1)


@pytest.mark.slow
def test_snapshot_groups_give_identical_results():
    n = 16
    k = make_kernel(GAUGES["rope_full_period"](n), FACTORS["distance_bias"](n), beta=1.0)
    field = dynamics.make_vector_field(k)
    x0 = jnp.stack([uniform(n, 3, seed=s) for s in range(2)])
    # workers=1: the groups are compiled and run in this process, not in spawned worker processes
    # (the same grouping code runs there; processes = this process: test_batch.py)
    opts = dict(integrator=integrators.RK4(), dt=0.02, t_end=1.2, save_every=0.1, noise=0.1, workers=1)
    one = solve(field, x0, snapshots_per_call=1, **opts)
    grouped = solve(field, x0, snapshots_per_call=4, **opts)
    auto = solve(field, x0, **opts)  # tiny problem: the automatic group is the whole run (12 snapshots)
    for traj in (grouped, auto):
        # the same steps and noise keys in nested scans: bitwise equal
        np.testing.assert_array_equal(traj.xs, one.xs)
        np.testing.assert_array_equal(traj.ts, one.ts)
        assert traj.steps == one.steps == 60
    with pytest.raises(ValueError, match=r"`snapshots_per_call` must be a positive divisor .*\(12\); got 5"):
        solve(field, x0, snapshots_per_call=5, **opts)


def test_nonfinite_inside_a_snapshot_group():
    def field(x):  # finite until the first coordinate of token 0 passes 0.5, then NaN
        v = jnp.zeros_like(x).at[:, 0].set(1.0)
        return jnp.where(x[0, 0] > 0.5, jnp.nan, 1.0) * sphere.project(x, v)

    x0 = sphere.normalize(jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    traj = solve(
        field, x0, integrator=integrators.Euler(), dt=0.01, t_end=2.0, save_every=0.1, snapshots_per_call=20
    )
    assert traj.status == "nonfinite" and np.all(np.isfinite(traj.xs))
    reference = solve(
        field, x0, integrator=integrators.Euler(), dt=0.01, t_end=2.0, save_every=0.1, snapshots_per_call=1
    )
    np.testing.assert_array_equal(traj.xs, reference.xs)  # stops at the same last finite snapshot
    assert 1 < len(traj.ts) < 21 and traj.steps == reference.steps
