"""The kernel's parts as pytrees (core.pytree): the tree definitions of two classes never compare
equal, so no cache keyed by them (JAX's compiled programs, attnflow's program cache) can hand one
class's program to another; flattening and rebuilding round-trip."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.core.pytree import pytree_dataclass

N = 8
XI = jnp.asarray(np.arange(N) / N)
PARTS = {
    "factor": [
        factors.NoFactor(n=N),
        factors.DistanceBias(xi=XI, slope=jnp.asarray(2.0)),
        factors.ToeplitzCos(xi=XI, omega=jnp.asarray(2.0)),
        factors.make_matrix_factor(np.ones((N, N)), n=N),
    ],
    "gauge": [
        gauges.IdentityGauge(n=N, d=3),
        gauges.make_rope(np.arange(N), 3, gauges.rope_frequencies(3, kind="full_period", n=N)),
        gauges.DenseGauge(q=jnp.broadcast_to(jnp.eye(3), (N, 3, 3))),
    ],
}


def test_tree_definitions_of_different_classes_differ():
    for parts in PARTS.values():
        for a, b in itertools.combinations(parts, 2):
            assert jax.tree.structure(a) != jax.tree.structure(b), (type(a), type(b))
    # the pair that jax.tree_util.register_dataclass made equal: two arrays each, nothing static
    kernels = [Kernel(PARTS["gauge"][0], f, make_profile("exp", beta=1.0)) for f in PARTS["factor"][1:3]]
    assert jax.tree.structure(kernels[0]) != jax.tree.structure(kernels[1])


def test_a_jitted_function_tells_the_factor_classes_apart():
    first_row = jax.jit(lambda f: f.rows(jnp.arange(1)))
    bias, cosine = PARTS["factor"][1], PARTS["factor"][2]
    for _ in range(3):  # alternated: each class its own program, whatever was compiled before
        np.testing.assert_allclose(first_row(bias)[0], np.exp(-2.0 * np.abs(XI)), rtol=1e-15)
        np.testing.assert_allclose(first_row(cosine)[0], np.cos(2.0 * XI), rtol=1e-15)


def test_flatten_and_unflatten_round_trip_without_init():
    for part in (*PARTS["factor"], *PARTS["gauge"]):
        leaves, treedef = jax.tree.flatten(part)
        rebuilt = jax.tree.unflatten(treedef, leaves)
        assert type(rebuilt) is type(part)
        for field in dataclasses.fields(part):
            a, b = getattr(part, field.name), getattr(rebuilt, field.name)
            assert a is b  # the same leaves and static values, not copies
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(PARTS["factor"][2])[0]]
    assert paths == [".xi", ".omega"]

    @pytree_dataclass(data_fields=["x"], meta_fields=["kind"])
    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: object
        kind: str

        def __post_init__(self):
            if not isinstance(self.x, float):
                raise TypeError("x must be a float")

    # rebuilt with a placeholder leaf (as JAX does inside transformations): no __init__, no check
    leaves, treedef = jax.tree.flatten(Checked(x=1.0, kind="ok"))
    placeholder = object()
    rebuilt = jax.tree.unflatten(treedef, [placeholder])
    assert rebuilt.x is placeholder and rebuilt.kind == "ok"
