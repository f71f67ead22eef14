"""Tokens sharded across devices (``attnflow.numerics.sharding``).

The sharded field against the one-device field on 4 host devices runs in a child process
(``tests/sharding_cases.py``: the device count is fixed before JAX starts, and this process's JAX
has started); the pytree, the program cache and the errors are checked here on a mesh of one
device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import attnflow  # noqa: F401  (float64)
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators, program_cache, sharding, solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sharding_cases as cases  # noqa: E402

FIELD_TOL = (
    1e-13  # the bound: the sums are regrouped (row blocks, not symmetric tiles), round-off only
)
TRAJECTORY_TOL = 1e-12  # the bound: 10 RK4 steps of round-off-level differences
SCALE_MIN = 1e-2  # every field compared is of this size at least: agreement of zeros would prove nothing


def _four_devices(names, trajectories) -> dict:
    """The checks of ``names`` (and of the trajectories of ``trajectories``) on 4 host devices."""
    names = [name + ("+" if name in trajectories else "") for name in names]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    script = Path(cases.__file__)
    done = subprocess.run([sys.executable, str(script), "4", *names], env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def four_devices() -> dict:
    """The checks of every default case, in one child process with 4 host devices."""
    return _four_devices(cases.FIELD_CASES, cases.TRAJECTORIES)


def _assert_case(result: dict, case: str, trajectories) -> None:
    got = result["cases"][case]
    assert got["scale"] > SCALE_MIN, got
    assert got["field"] <= FIELD_TOL, got
    if case in trajectories:
        assert got["trajectory"] is not None and got["trajectory"] <= TRAJECTORY_TOL, got


@pytest.mark.slow
def test_the_child_had_four_devices(four_devices):
    assert four_devices["devices"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("case", cases.FIELD_CASES)
def test_sharded_field_equals_one_device(four_devices, case):
    """The paper's field (gauges none / RoPE / prompt; factors none, distance bias, Toeplitz, matrix;
    usa / sa; no mask, causal, strict; held sources; gradient / logits-only values; fewer tokens
    than devices) and the heads, exact: within 1e-13 of one device, trajectories within 1e-12."""
    _assert_case(four_devices, case, cases.TRAJECTORIES)


@pytest.mark.slow
def test_sharded_expansion_equals_one_device():
    """The expansion: its moments summed over the devices, and its causal and distance-bias prefix
    sums cut into 4 pieces carried across the devices (the pairs summed exactly, inside a chunk,
    are those of one device), so the two agree to round-off, not just to the expansion's
    tolerance; the paper's field and layers of heads; two trajectories of the paper's field."""
    names = (*cases.PREFIX_CASES, *cases.SLOW_FIELD_CASES)
    result = _four_devices(names, cases.SLOW_TRAJECTORIES)
    assert result["devices"] == 4
    for case in names:
        _assert_case(result, case, cases.SLOW_TRAJECTORIES)


# ----------------------------------------------------------------------------- one device, here


def _one_device():
    return sharding.make_token_mesh(jax.devices()[:1])


def _paper_field(n=12, d=3, beta=1.0, **options):
    xi = np.arange(n, dtype=float)
    rope = gauges.make_rope(xi, d, gauges.rope_frequencies(d, kind="full_period", n=n))
    kernel = Kernel(rope, factors.NoFactor(n=n), make_profile("exp", beta=beta))
    return dynamics.make_vector_field(kernel, **options)


def test_jit_compiles_once_per_structure_and_takes_the_numbers_as_arguments():
    """Two sharded fields that differ only in beta share one compiled program (the kernel's arrays
    are the pytree's children, the placement and the options its static data), yet give their own
    velocities."""
    traces = []

    @jax.jit
    def velocity(field, x):
        traces.append(1)
        return field(x)

    x = sphere.sample_uniform(0, 12, 3)
    first = velocity(sharding.ShardedField(_paper_field(beta=1.0), _one_device()), x)
    second = velocity(sharding.ShardedField(_paper_field(beta=3.0), _one_device()), x)
    assert len(traces) == 1
    assert float(jnp.max(jnp.abs(first - second))) > 1e-2  # beta = 3 is not beta = 1
    velocity(sharding.ShardedField(_paper_field(beta=1.0, causal=True), _one_device()), x)
    assert len(traces) == 2  # another option: another structure


def test_pytree_children_are_the_fields_arrays_and_round_trip():
    field = _paper_field()
    sharded = sharding.shard_tokens(field, _one_device())
    leaves, treedef = jax.tree_util.tree_flatten(sharded)
    expected = jax.tree_util.tree_leaves(field.kernel)
    assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected, strict=True))
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.placement == sharded.placement and rebuilt.field.causal == field.causal
    x = sphere.sample_uniform(1, 12, 3)
    velocity = jax.jit(lambda field, x: field(x))
    assert np.array_equal(np.asarray(velocity(rebuilt, x)), np.asarray(velocity(sharded, x)))


def test_the_expansion_is_static_whole():
    """The expansion's degree follows from a concrete beta: its field travels as static data."""
    field = _paper_field(interaction="expansion", tolerance=1e-6)
    assert jax.tree_util.tree_leaves(sharding.shard_tokens(field, _one_device())) == []


def test_solve_takes_the_sharded_field_and_the_program_cache_keys_it():
    """``solve`` runs a sharded field as it is (``program_cache.split_field`` gives it a hashable
    structure, a key for ``jax.jit``): the same trajectory as the field on one device, to round-off."""
    field = _paper_field(normalization="sa", causal="strict", sources=1)
    sharded = sharding.shard_tokens(field, _one_device())
    structure, _ = program_cache.split_field(sharded)
    assert isinstance(hash(structure), int)
    x0 = sphere.sample_uniform(2, 12, 3)
    options = dict(integrator=integrators.RK4(), dt=0.05, t_end=0.5, save_every=0.25)
    got, ref = solve.solve(sharded, x0, **options), solve.solve(field, x0, **options)
    assert got.xs.shape == ref.xs.shape == (3, 12, 3)
    # one device: the row sums are the one-device rows (the same products), round-off at most
    assert float(np.max(np.abs(got.xs - ref.xs))) <= TRAJECTORY_TOL
    assert float(np.max(np.abs(got.xs[-1] - x0))) > 1e-3  # the tokens moved


def test_pickling_says_to_stay_in_this_process():
    """A batch solved in worker processes pickles its field: a sharded field (its mesh holds this
    process's devices) says so, and names the fix."""
    import pickle

    with pytest.raises(TypeError, match=r"sharding: a ShardedField must stay in the process .* workers=1"):
        pickle.dumps(sharding.shard_tokens(_paper_field(), _one_device()))


def test_errors_name_the_parameter():
    field = _paper_field()
    with pytest.raises(
        TypeError, match=r"sharding: `field` must be an AttentionField or a HeadsField; got function\."
    ):
        sharding.ShardedField(lambda x: x, _one_device())
    with pytest.raises(TypeError, match=r"sharding: `placement` must be a TokenMesh .*; got Mesh\."):
        sharding.ShardedField(field, Mesh(np.array(jax.devices()[:1]), ("tokens",)))
    with pytest.raises(TypeError, match=r"sharding: `mesh` must be a jax.sharding.Mesh; got list\."):
        sharding.TokenMesh(jax.devices()[:1])
    with pytest.raises(
        ValueError, match=r"sharding: `mesh` must have the one axis 'tokens'; got axes \('x',\)"
    ):
        sharding.TokenMesh(Mesh(np.array(jax.devices()[:1]), ("x",)))
    with pytest.raises(
        ValueError, match=r"sharding: `devices` must be a non-empty list of devices; got \[\]\."
    ):
        sharding.make_token_mesh([])
