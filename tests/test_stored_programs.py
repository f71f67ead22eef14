"""Compiled programs stored on disk (numerics.stored_programs): a later process (here: the in-process
cache cleared) loads a run's programs by the problem's structure, without tracing them, and computes
bit for bit what a fresh compilation computes; keys are written out by value or not at all."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import zarr

from attnflow.core.kernel import Profile
from attnflow.io.config import config_from_dict
from attnflow.numerics import integrators, program_cache, stored_programs
from attnflow.numerics.program_cache import split_field
from attnflow.numerics.solve import solve
from attnflow.workflows.run import run
from helpers_core import compilation_cache_folder, uniform
from test_program_cache import _field
from test_startup import _compiled_names


@pytest.fixture
def store(tmp_path):
    """A compilation cache folder set for the test (the store is ``programs/`` in it), then unset."""
    program_cache.clear()
    try:
        with compilation_cache_folder(tmp_path / "cache"):
            yield tmp_path / "cache" / stored_programs.FOLDER_NAME
    finally:
        program_cache.clear()


@dataclasses.dataclass(frozen=True)
class _Options:
    rtol: float
    kind: str


def test_key_text_is_by_value_or_none():
    texts = [stored_programs.key_text(v) for v in (1, 1.0, True, "1", None, (1,), [1], np.float64(1))]
    assert None not in texts and len(set(texts)) == len(texts)  # equal-looking values stay apart
    assert stored_programs.key_text(_Options(1e-8, "exp")) == stored_programs.key_text(_Options(1e-8, "exp"))
    assert stored_programs.key_text(_Options(1e-8, "exp")) != stored_programs.key_text(_Options(1e-9, "exp"))
    structure, _ = split_field(_field(8, 2.0))
    assert stored_programs.key_text(structure) == stored_programs.key_text(split_field(_field(8, 5.0))[0])
    field = _field(8, 2.0)
    linear = dataclasses.replace(
        field, kernel=dataclasses.replace(field.kernel, profile=Profile("linear", 2.0, 1.0))
    )
    assert stored_programs.key_text(structure) != stored_programs.key_text(split_field(linear)[0])
    shapes = [program_cache._avals((uniform(n, 3),)) for n in (8, 9)]  # shapes join the key as avals
    assert len({stored_programs.key_text(a) for a in shapes}) == 2
    # known only by identity: a function, the opaque field holding one, an object shown by address
    assert stored_programs.key_text(np.sin) is None
    assert stored_programs.key_text((1, split_field(np.sin)[0])) is None
    assert stored_programs.key_text(object()) is None
    assert stored_programs.key_text({"a": 1}) is None


def test_no_folder_no_store(tmp_path):
    with compilation_cache_folder(None):
        assert stored_programs.folder() is None and stored_programs.path_for("int:1") is None
    with compilation_cache_folder(tmp_path):
        assert stored_programs.folder() == tmp_path / stored_programs.FOLDER_NAME
        jax.config.update("jax_enable_compilation_cache", False)  # JAX's cache off: the store too
        try:
            assert stored_programs.folder() is None
        finally:
            jax.config.update("jax_enable_compilation_cache", True)


def test_a_stored_program_loads_and_computes_what_a_fresh_compilation_does(store, tmp_path):
    n, adaptive = 12, integrators.Adaptive(rtol=1e-7, atol=1e-9)
    opts = dict(integrator=adaptive, dt=0.05, t_end=0.4, save_every=0.2)
    field, x0 = _field(n, 2.0), uniform(n, 3, seed=4)
    with compilation_cache_folder(None):
        plain = solve(field, x0, **opts)  # no store: compiled as without one
    program_cache.clear()
    stored = solve(field, x0, **opts)
    files = sorted(store.glob("*.program"))
    assert [f.stat().st_mode & 0o777 for f in files] == [0o600]  # private, whatever the umask
    assert len(files) == 1 and program_cache.info() == {"hits": 0, "misses": 1, "loaded": 0, "size": 1}
    program_cache.clear()  # as a new process: only the disk remains
    loaded = solve(_field(n, 3.0), x0, **opts)  # other numbers, the same structure: the same file
    again = solve(_field(n, 2.0), x0, **opts)
    assert program_cache.info() == {"hits": 1, "misses": 1, "loaded": 1, "size": 1}
    for result in (stored, again):
        np.testing.assert_array_equal(result.xs, plain.xs)
        assert int(result.evaluations) == int(plain.evaluations)
    assert not np.allclose(loaded.xs[-1], plain.xs[-1])  # it computes the numbers it is given
    # another shape: another file
    solve(_field(n + 1, 2.0), uniform(n + 1, 3, seed=4), **opts)
    assert len(list(store.glob("*.program"))) == 2


def test_a_damaged_file_is_removed_and_compiled_again(store):
    n, opts = 10, dict(integrator=integrators.RK4(), dt=0.05, t_end=0.2, save_every=0.1)
    first = solve(_field(n, 1.0), uniform(n, 3, seed=5), **opts)
    (path,) = store.glob("*.program")
    path.write_bytes(b"not a program")
    program_cache.clear()
    second = solve(_field(n, 1.0), uniform(n, 3, seed=5), **opts)
    assert program_cache.info()["loaded"] == 0 and program_cache.info()["misses"] == 1
    assert path.read_bytes() != b"not a program"  # compiled again and stored again
    np.testing.assert_array_equal(second.xs, first.xs)


def test_a_file_others_may_write_is_not_read(store):
    n, opts = 10, dict(integrator=integrators.RK4(), dt=0.05, t_end=0.2, save_every=0.1)
    solve(_field(n, 1.0), uniform(n, 3, seed=5), **opts)
    (path,) = store.glob("*.program")
    path.chmod(0o666)
    program_cache.clear()
    solve(_field(n, 1.0), uniform(n, 3, seed=5), **opts)
    assert program_cache.info()["loaded"] == 0 and path.exists()  # not read, not removed: compiled
    path.chmod(0o644)
    program_cache.clear()
    solve(_field(n, 1.0), uniform(n, 3, seed=5), **opts)
    assert program_cache.info()["loaded"] == 1


def test_an_opaque_field_is_not_stored(store):
    def field(x):
        return -x

    solve(field, uniform(6, 3, seed=0), integrator=integrators.RK4(), dt=0.1, t_end=0.2, save_every=0.1)
    assert program_cache.info()["misses"] == 1 and not list(store.glob("*.program"))


_PROCESS = """
import json, sys
import jax
import numpy as np
from attnflow.numerics import integrators, program_cache
from attnflow.numerics.program_cache import enable_persistent_cache
from attnflow.numerics.solve import solve
from helpers_core import compilation_cache_folder, uniform
from test_program_cache import _field
from test_startup import _compiled_names

enable_persistent_cache()
result = solve(_field(12, 2.0), uniform(12, 3, seed=4), integrator=integrators.Adaptive(rtol=1e-7, atol=1e-9),
               dt=0.05, t_end=0.4, save_every=0.2)
files = sorted(p.name.split("-")[0] for p in program_cache.persistent_cache_folder().glob("*-cache"))
print(json.dumps({"info": program_cache.info(), "jax_files": files, "xs": np.asarray(result.xs).tolist()}))
"""


def test_a_new_process_loads_what_an_earlier_one_stored(tmp_path):
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, program_cache.CACHE_ENV: str(tmp_path / "cache"), "PYTHONPATH": path}

    def one_process() -> dict:
        done = subprocess.run(
            [sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = one_process(), one_process()
    assert cold["info"]["loaded"] == 0 and warm["info"]["loaded"] == 1
    assert cold["info"]["misses"] == warm["info"]["misses"] == 1
    assert warm["xs"] == cold["xs"]  # bit for bit (JSON keeps every digit of a float)
    # the time loop is not in JAX's own cache: an executable loaded from there does not serialize back
    assert "jit_program" not in cold["jax_files"] and "jit_program" not in warm["jax_files"]
    assert len(list((tmp_path / "cache" / stored_programs.FOLDER_NAME).glob("*.program"))) == 1


def test_a_warm_run_loads_its_programs_without_tracing_them(store, tmp_path, caplog):
    config = config_from_dict(
        {
            "model": {"n": 24},
            "aux": {"kind": "positions"},
            "gauge": {"kind": "rope"},
            "solver": {"method": "adaptive", "t_end": 0.5, "save_every": 0.1},
        }
    )
    run(config, tmp_path / "cold")
    program_cache.clear()
    jax.clear_caches()
    before_first: list[str] = []

    def progress(done, total):  # noqa: ARG001
        if done == 2 and not before_first:  # the first snapshot after t = 0
            before_first.extend(_compiled_names(caplog.records))

    with caplog.at_level(logging.WARNING), jax.log_compiles():
        run(config, tmp_path / "warm", progress=progress)
    assert before_first == []  # the snapshot's metrics and the time loop: both loaded, not traced
    assert program_cache.info()["loaded"] == 2
    cold, warm = (zarr.open_group(tmp_path / name / "trajectory.zarr", mode="r") for name in ("cold", "warm"))
    np.testing.assert_array_equal(np.asarray(warm["x"]), np.asarray(cold["x"]))
