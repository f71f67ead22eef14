"""Compile once (``jax.jit`` over the problem's pytree; numerics.program_cache counts the traces): a
second solve of the same structure compiles nothing, whatever the kernel's numbers, ``dt``,
``save_every``, ``t_end`` or tolerances; a different structure compiles its own program."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from attnflow.core.kernel import Kernel, Profile
from attnflow.core.pytree import ByIdentity
from attnflow.numerics import dynamics, integrators, private_folder, program_cache
from attnflow.numerics.program_cache import join_field, split_field
from attnflow.numerics.solve import solve
from helpers_core import factor_distance_bias, gauge_rope_full_period, make_kernel, uniform


def _field(n, beta):
    return dynamics.make_vector_field(
        make_kernel(gauge_rope_full_period(n), factor_distance_bias(n), beta=beta)
    )


def test_fields_are_pytrees_and_plain_functions_their_own_structure():
    field = _field(8, 2.0)
    structure, leaves = split_field(field)
    rebuilt = join_field(structure, leaves)
    x = uniform(8, 3, seed=0)
    np.testing.assert_array_equal(np.asarray(rebuilt(x)), np.asarray(field(x)))  # the same field
    other, _ = split_field(_field(8, 5.0))
    assert other == structure and hash(other) == hash(structure)  # beta is a leaf, not structure
    # a field's arrays are leaves under jax.jit: one trace for two fields of the same structure
    traces = []

    @jax.jit
    def apply(f, x):
        traces.append(1)
        return f(x)

    apply(field, x), apply(_field(8, 5.0), x)
    assert len(traces) == 1
    opaque, none = split_field(np.sin)
    assert isinstance(opaque, ByIdentity) and none == () and join_field(opaque, ()) is np.sin
    assert split_field(np.sin)[0] == opaque and hash(split_field(np.sin)[0]) == hash(opaque)
    assert split_field(np.cos)[0] != opaque


def test_the_expansion_holds_its_kernel_as_structure():
    """Its degree is chosen from the concrete beta: its kernel is static (by identity), so two
    expansion fields never share a program with each other's numbers."""
    n = 8
    kernel = make_kernel(gauge_rope_full_period(n), factor_distance_bias(n), beta=1.0)
    a = dynamics.make_vector_field(kernel, interaction="expansion", tolerance=1e-6)
    b = dynamics.make_vector_field(kernel, interaction="expansion", tolerance=1e-6)
    assert split_field(a)[1] == () and split_field(a)[0] != split_field(b)[0]
    assert split_field(a)[0] == split_field(a)[0]


def test_second_solve_of_the_same_shape_compiles_nothing():
    n = 12
    opts = dict(integrator=integrators.Adaptive(rtol=1e-7, atol=1e-9), dt=0.05, t_end=0.4, save_every=0.2)
    program_cache.clear()
    first = solve(_field(n, 1.0), uniform(n, 3, seed=1), **opts)
    before = program_cache.info()
    second = solve(_field(n, 3.0), uniform(n, 3, seed=2), **opts)
    after = program_cache.info()
    assert before["misses"] == after["misses"] == 1
    assert first.compile_time_s > 0 and second.compile_time_s == 0.0
    # the reused program computes the second kernel, not the first: as a freshly compiled one would
    program_cache.clear()
    fresh = solve(_field(n, 3.0), uniform(n, 3, seed=2), **opts)
    np.testing.assert_array_equal(fresh.xs, second.xs)
    assert not np.allclose(first.xs[-1], second.xs[-1])
    # another n: other array shapes (part of the key), another program
    solve(_field(n + 4, 3.0), uniform(n + 4, 3, seed=2), **opts)
    assert program_cache.info()["misses"] == 2


def test_kernel_numbers_are_arguments_profile_kind_is_structure():
    n = 8
    base = make_kernel(gauge_rope_full_period(n), factor_distance_bias(n), beta=1.0)
    a = dynamics.make_vector_field(Kernel(base.gauge, base.factor, Profile("exp", 2.0, base.profile.c)))
    b = dynamics.make_vector_field(Kernel(base.gauge, base.factor, Profile("exp", 4.0, base.profile.c)))
    assert split_field(a)[0] == split_field(b)[0]
    linear = dynamics.make_vector_field(
        Kernel(base.gauge, base.factor, Profile("linear", 2.0, base.profile.c))
    )
    assert split_field(linear)[0] != split_field(a)[0]


def test_persistent_cache_folder_is_private_and_overridable(tmp_path, monkeypatch):
    monkeypatch.setenv(private_folder.CACHE_ENV, str(tmp_path / "mine"))
    assert program_cache.persistent_cache_folder() == tmp_path / "mine"
    monkeypatch.delenv(private_folder.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert program_cache.persistent_cache_folder() == tmp_path / "xdg" / "attnflow" / "jax"
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        folder = program_cache.enable_persistent_cache(tmp_path / "shared" / "jax")
        assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700  # private: owner only
        assert jax.config.jax_compilation_cache_dir == str(folder)
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_the_user_docs_name_the_cache_folder_and_its_variable(tmp_path, monkeypatch):
    running = (Path(__file__).parents[1] / "docs" / "running.md").read_text()
    monkeypatch.delenv(private_folder.CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    default = program_cache.persistent_cache_folder().relative_to(tmp_path)
    assert f"`~/{default}`" in running and f"`{private_folder.CACHE_ENV}`" in running


def test_tolerances_are_arguments():
    n = 12
    opts = dict(dt=0.05, t_end=2.0, save_every=0.5)
    x0 = uniform(n, 3, seed=3)
    program_cache.clear()
    loose = solve(_field(n, 2.0), x0, integrator=integrators.Adaptive(rtol=1e-4, atol=1e-6), **opts)
    tight = solve(_field(n, 2.0), x0, integrator=integrators.Adaptive(rtol=1e-9, atol=1e-11), **opts)
    assert program_cache.info()["misses"] == 1  # one program for both tolerances
    # and for other snapshot times (adaptive steps step to the times they are given)
    solve(_field(n, 2.0), x0, integrator=integrators.Adaptive(), dt=0.05, t_end=1.0, save_every=0.25)
    assert program_cache.info()["misses"] == 1
    # the reused program runs at its call's tolerances: many more steps at the tight ones, and the
    # same steps as a program compiled for them alone
    assert int(tight.accepted) > 2 * int(loose.accepted)
    program_cache.clear()
    fresh = solve(_field(n, 2.0), x0, integrator=integrators.Adaptive(rtol=1e-9, atol=1e-11), **opts)
    assert int(fresh.evaluations) == int(tight.evaluations)
    np.testing.assert_array_equal(fresh.xs, tight.xs)


def test_another_dt_save_every_or_t_end_compiles_nothing_and_runs_its_own_numbers():
    """Fixed steps: ``dt`` and ``save_every`` are leaves of the problem (the step count per snapshot
    is their rounded ratio, computed in the program), ``t_end`` only sets the snapshot times."""
    n = 12
    field, x0 = _field(n, 2.0), uniform(n, 3, seed=4)
    rk4 = integrators.RK4()
    program_cache.clear()
    base = solve(field, x0, integrator=rk4, dt=0.05, t_end=0.4, save_every=0.2, snapshots_per_call=1)
    assert program_cache.info()["misses"] == 1
    runs = {
        "dt": dict(dt=0.025, t_end=0.4, save_every=0.2),
        "save_every": dict(dt=0.05, t_end=0.4, save_every=0.1),
        "t_end": dict(dt=0.05, t_end=1.0, save_every=0.2),
    }
    warm = {name: solve(field, x0, integrator=rk4, snapshots_per_call=1, **o) for name, o in runs.items()}
    assert program_cache.info()["misses"] == 1  # none of them compiled a program
    assert all(run.compile_time_s == 0.0 for run in warm.values())
    # each ran its own numbers: as many steps as its dt and t_end make, and the snapshots of a
    # program compiled for it alone (bit for bit)
    assert int(warm["dt"].accepted) == 16 and int(warm["t_end"].accepted) == 20 and int(base.accepted) == 8
    np.testing.assert_array_equal(warm["save_every"].xs[::2], base.xs)  # same steps, twice the snapshots
    assert np.max(np.abs(warm["dt"].xs[-1] - base.xs[-1])) > 1e-9  # another step: another trajectory
    for name, opts in runs.items():
        program_cache.clear()
        fresh = solve(field, x0, integrator=rk4, snapshots_per_call=1, **opts)
        np.testing.assert_array_equal(fresh.xs, warm[name].xs)
