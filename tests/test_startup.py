"""Start-up of `attnflow run`: what its path imports, that building a run compiles only its noise
key, and that it compiles three programs before its first snapshot.

A warm process (the persistent compilation cache filled) still traces and lowers every eager JAX
operation to look its program up, so the build's constants are made on the host
(``attnflow.core.host``); these tests pin that down, and that the host versions equal JAX's.
"""

import logging
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import gauges, sphere
from attnflow.core.host import to_device
from attnflow.core.kernel import make_profile
from attnflow.io.config import config_from_dict
from attnflow.numerics import program_cache
from attnflow.workflows.build import build
from attnflow.workflows.run import run
from helpers_core import compilation_cache_folder

HEAVY = ("xarray", "pandas", "matplotlib", "dask", "scipy")


def test_the_run_path_imports_no_xarray_pandas_matplotlib_or_scipy():
    code = (
        "import sys, attnflow.cli, attnflow.workflows.run; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("d", [2, 3, 16, 64])
def test_seeded_samples_are_jax_normalisation_to_round_off(d, dtype):
    ours = np.asarray(sphere.sample_uniform(3, 500, d, dtype=dtype))
    gaussians = jnp.asarray(np.random.default_rng(3).standard_normal((500, d)), dtype=dtype)
    theirs = np.asarray(sphere.normalize(gaussians))
    assert ours.dtype == theirs.dtype == np.dtype(dtype)
    spacing = np.spacing(np.ones((), ours.dtype))
    # the same operations; the sum of squares, the square root and the division round differently
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=8 * spacing)
    np.testing.assert_allclose(np.linalg.norm(ours.astype(float), axis=1), 1.0, atol=4 * spacing)
    cap = np.asarray(sphere.sample_cap(3, 500, np.ones(d), sigma=0.2, dtype=dtype))
    jax_cap = sphere.normalize(sphere.normalize(jnp.ones(d, dtype)) + 0.2 * gaussians)
    np.testing.assert_allclose(cap, np.asarray(jax_cap), rtol=0, atol=8 * spacing)


def test_host_constants_are_jax_arrays_of_the_dtype_not_weakly_typed():
    for dtype in (jnp.float64, jnp.float32):
        profile = make_profile("exp", beta=1.5, time_scale="rescaled", dtype=dtype)
        for value in (profile.beta, profile.c, to_device([1.0, 2.0], dtype)):
            assert isinstance(value, jax.Array) and value.dtype == dtype and not value.weak_type
        assert float(profile.c) == np.float64(np.asarray(jnp.exp(-1.5), dtype))  # JAX's e^{-β}


def _compiled_names(records) -> list[str]:
    messages = [r.getMessage() for r in records]
    return [m.split("Compiling jit(")[1].split(")")[0] for m in messages if m.startswith("Compiling jit(")]


@pytest.mark.parametrize(
    "sections",
    [
        {"model": {"n": 64}, "aux": {"kind": "positions"}, "gauge": {"kind": "rope"}},
        {"model": {"n": 40, "d": 16, "noise": 0.1}, "solver": {"dtype": "float32"}},
        {"model": {"n": 8}, "aux": {"kind": "positions"}, "factor": {"kind": "distance_bias"}},
        {"model": {"n": 4, "d": 6}, "init": {"kind": "equiangular", "rho0": 0.3}},
    ],
)
def test_building_a_run_compiles_only_its_noise_key(sections, caplog):
    config = config_from_dict(sections)
    jax.clear_caches()  # every eager operation would compile again: none may run but the key's
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        sim = build(config, streamed=True)
    assert _compiled_names(caplog.records) == ["noise_key"]
    assert sim.x0.shape == (config.model.n, config.model.d)


@pytest.fixture
def no_stored_programs():
    """No compilation cache folder during the test: an earlier test's program would be loaded from
    JAX's persistent cache, not compiled."""
    with compilation_cache_folder(None):
        yield


@pytest.mark.usefixtures("no_stored_programs")
@pytest.mark.parametrize("method", ["adaptive", "rk4"])
def test_a_run_compiles_three_programs_before_its_first_snapshot(method, tmp_path, caplog):
    # the noise key, the metrics of a snapshot and the solver's time loop (one program each): every other
    # eager operation on the way would be one more program to trace, lower and load in a warm process
    solver = {"method": method, "t_end": 0.5, "save_every": 0.1} | ({"dt": 0.05} if method == "rk4" else {})
    config = config_from_dict(
        {"model": {"n": 24}, "aux": {"kind": "positions"}, "gauge": {"kind": "rope"}, "solver": solver}
    )
    before_first: list[str] = []

    def progress(done, total):  # noqa: ARG001
        if done == 2 and not before_first:  # the first snapshot after t = 0
            before_first.extend(_compiled_names(caplog.records))

    jax.clear_caches()
    program_cache.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        run(config, tmp_path / "run", progress=progress)
    assert before_first == ["noise_key", "_exact_snapshot", "_program"]


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize(("d", "frequencies"), [(3, "full_period"), (8, "roformer"), (7, "roformer")])
def test_compiled_gauge_matrices_equal_the_eager_ones_bit_for_bit(d, frequencies, dtype):
    n = 50
    gauge = gauges.make_rope(
        np.arange(n) * 0.37, d, gauges.rope_frequencies(d, kind=frequencies, n=n), dtype=dtype
    )
    eye = jnp.broadcast_to(jnp.eye(d, dtype=dtype), (n, d, d))
    with jax.disable_jit():  # operation by operation, as the matrices were made before
        eager = np.asarray(jax.vmap(gauge.apply, in_axes=2, out_axes=2)(eye))
        identity = np.asarray(jnp.broadcast_to(jnp.eye(d), (n, d, d)))
    np.testing.assert_array_equal(np.asarray(gauge.matrices()), eager)
    assert gauge.matrices().dtype == dtype
    np.testing.assert_array_equal(np.asarray(gauges.IdentityGauge(n=n, d=d).matrices()), identity)
