"""The fields of the sharding checks, and the checks themselves, shared by ``test_sharding.py`` (4 host
devices, in a child process), ``test_sharding_processes.py`` (two processes, ``jax.distributed``)
and ``benchmarks/sharded.py``.

``python tests/sharding_cases.py DEVICES CASE[+] ...`` runs the checks on ``DEVICES`` host devices and
prints one JSON object: for every case the largest deviation of the sharded field from the
one-device field (``field``), of ``STEPS`` RK4 steps (``trajectory``, for the cases written with a
trailing ``+``, else None) and the field's size (``scale``, so that a comparison of zeros cannot
pass).
"""

from __future__ import annotations

import json
import os
import sys

N, D = 50, 4  # 50 tokens on 4 devices: 13 rows each, the last shard padded by 2 rows
# the expansion's prefix sums cut the tokens into pieces of whole 128-token chunks: 400 tokens make
# 4 pieces (128, 128, 128, 16), each summed from the carry of the ones before
PREFIX_N = 400
STEPS, DT = 10, 0.05
TRAJECTORIES = ("rope_bias_sa_causal", "heads_rope_alibi_causal")  # the default tests' trajectories
SLOW_TRAJECTORIES = ("expansion_rope_toeplitz", "expansion_bias_shuffled")
FIELD_CASES = (
    "paper_dense",
    "rope_bias_causal_tiny",
    "rope_bias_sa_causal",
    "prompt_toeplitz_strict_logits",
    "rope_matrix_blocks",
    "identity_sa_strict",
    "heads_rope_alibi_causal",
    "heads_prompt_matrix_sa_strict",
)
# the slow test's: the heads by the expansion (their one-device reference runs op by op) and the
# expansion's prefix sums (PREFIX_CASES)
SLOW_FIELD_CASES = ("expansion_rope_toeplitz", "heads_expansion_toeplitz", "expansion_identity_sa_logits")
PREFIX_CASES = (  # the expansion's prefix sums, at PREFIX_N tokens
    "expansion_toeplitz_causal",
    "expansion_none_sa_strict",
    "expansion_bias_causal_decreasing",
    "expansion_bias_shuffled",
    "heads_expansion_alibi_causal",
)
# not in the tests: its branches are those of expansion_bias_shuffled and of the heads' prefix
# sums, and its one-device reference runs op by op (`python tests/sharding_cases.py 4 CASE` runs it)
EXTRA_CASES = ("heads_expansion_bias_shuffled_sa",)


def size(case: str) -> int:
    """The number of tokens of ``case``."""
    if case == "rope_bias_causal_tiny":
        return 3  # fewer tokens than devices: one row each, the last device only padding
    return PREFIX_N if case in PREFIX_CASES + EXTRA_CASES else N


def build(case: str, n: int = N, d: int = D):
    """The one-device field of ``case`` (an ``AttentionField`` or a ``HeadsField``) on ``n`` tokens."""
    import jax.numpy as jnp
    import numpy as np

    from attnflow.core import factors, gauges
    from attnflow.core import heads as H
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics
    from attnflow.numerics.heads_field import HeadsField

    xi = np.arange(n, dtype=float)
    profile = make_profile("exp", beta=2.0)
    rope = lambda dim: gauges.make_rope(xi, dim, gauges.rope_frequencies(dim, kind="roformer"))  # noqa: E731
    prompt = lambda dim: gauges.make_prompt_gauge(np.arange(n) % 3, gauges.haar_orthogonal(7, 3, dim))  # noqa: E731
    alibi = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(0.1))
    w = np.exp(-np.abs(np.subtract.outer(xi, xi)) / 7.0) * (1.0 + 0.5 * np.cos(np.add.outer(xi, xi)))
    matrix = factors.make_matrix_factor(np.abs(w), n=n)
    toeplitz = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(0.3))
    kernel = lambda gauge, factor: Kernel(gauge, factor, profile)  # noqa: E731
    field = dynamics.make_vector_field
    if case == "paper_dense":
        return field(kernel(gauges.IdentityGauge(n=n, d=d), factors.NoFactor(n=n)))
    if case == "rope_bias_causal_tiny":
        return field(kernel(rope(d), alibi), causal=True)
    if case == "rope_bias_sa_causal":
        return field(kernel(rope(d), alibi), normalization="sa", causal=True, sources=2, block_size=16)
    if case == "prompt_toeplitz_strict_logits":
        return field(kernel(prompt(d), toeplitz), causal="strict", value="logits_only")
    if case == "rope_matrix_blocks":
        return field(kernel(rope(d), matrix), block_size=8)
    identity = gauges.IdentityGauge(n=n, d=d)
    if case == "identity_sa_strict":
        sa_strict = dict(normalization="sa", causal="strict", block_size=16)  # a running maximum, 4 tiles
        return field(kernel(identity, factors.NoFactor(n=n)), **sa_strict)
    # the expansion at beta = 1 and a loose tolerance: a low degree, a cheap compile (the sharded and
    # the one-device evaluation use the same features whatever the tolerance)
    expansion = dict(interaction="expansion", tolerance=1e-6)
    mild = lambda gauge, factor: Kernel(gauge, factor, make_profile("exp", beta=1.0))  # noqa: E731
    if case == "expansion_rope_toeplitz":
        return field(mild(rope(d), toeplitz), **expansion)
    if case == "expansion_identity_sa_logits":
        sa_logits = dict(normalization="sa", value="logits_only")
        return field(mild(identity, factors.NoFactor(n=n)), **sa_logits, **expansion)
    circle = gauges.make_rope(xi, d, gauges.rope_frequencies(d, kind="full_period", n=n))
    if case == "expansion_toeplitz_causal":
        return field(mild(circle, toeplitz), causal=True, sources=3, **expansion)
    if case == "expansion_none_sa_strict":
        return field(mild(circle, factors.NoFactor(n=n)), normalization="sa", causal="strict", **expansion)
    if case == "expansion_bias_causal_decreasing":  # labels decreasing in token order
        decreasing = factors.DistanceBias(xi=jnp.asarray(-xi / 10), slope=jnp.asarray(0.5))
        return field(mild(circle, decreasing), normalization="sa", causal=True, **expansion)
    if case == "expansion_bias_shuffled":  # labels in no order: the sums run in label order
        shuffled = np.random.default_rng(1).permutation(n) / 10.0
        return field(
            mild(circle, factors.DistanceBias(xi=jnp.asarray(shuffled), slope=jnp.asarray(0.2))), **expansion
        )
    head_dim = 4
    maps = H.gaussian_maps(3, 2, head_dim, d)
    slopes = H.alibi_slopes(2)
    if case == "heads_rope_alibi_causal":
        heads = [
            H.make_head(
                *(maps[name][h] for name in H.MAP_NAMES),
                gauge=rope(head_dim),
                factor=factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(slopes[h])),
                values="plain",
            )
            for h in range(2)
        ]
        return HeadsField(tuple(heads), profile, causal=True, block_size=16)
    if case == "heads_prompt_matrix_sa_strict":
        heads = [
            H.make_head(*(maps[name][h] for name in H.MAP_NAMES), gauge=prompt(head_dim), factor=matrix)
            for h in range(2)
        ]
        return HeadsField(tuple(heads), profile, normalization="sa", causal="strict", sources=1, block_size=8)
    # heads by the expansion: orthogonal maps (|W_Q|₂ = |W_K|₂ = 1, so beta' = beta = 1: a low degree)
    unit_maps = H.orthogonal_maps(5, 2, head_dim, d)
    unit = lambda h, gauge, factor, values="rotated": H.make_head(  # noqa: E731
        *(unit_maps[name][h] for name in H.MAP_NAMES), gauge=gauge, factor=factor, values=values
    )
    mild_profile = make_profile("exp", beta=1.0)
    if case == "heads_expansion_toeplitz":
        heads = [unit(h, rope(head_dim), toeplitz, "plain") for h in range(2)]
        return HeadsField(tuple(heads), mild_profile, **expansion)
    circle_h = gauges.make_rope(xi, head_dim, gauges.rope_frequencies(head_dim, kind="full_period", n=n))
    if case == "heads_expansion_alibi_causal":
        heads = [
            unit(h, circle_h, factors.DistanceBias(xi=jnp.asarray(xi / 10), slope=jnp.asarray(slopes[h])))
            for h in range(2)
        ]
        return HeadsField(tuple(heads), mild_profile, causal="strict", sources=1, **expansion)
    if case == "heads_expansion_bias_shuffled_sa":
        shuffled = np.random.default_rng(2).permutation(n) / 10.0
        bias = factors.DistanceBias(xi=jnp.asarray(shuffled), slope=jnp.asarray(0.3))
        heads = [unit(h, circle_h, bias, "plain") for h in range(2)]
        return HeadsField(tuple(heads), mild_profile, normalization="sa", **expansion)
    known = (*FIELD_CASES, *SLOW_FIELD_CASES, *PREFIX_CASES, *EXTRA_CASES)
    raise ValueError(f"sharding_cases: `case` must be one of {known}; got {case!r}.")


def _steps(field, x):
    """``STEPS`` RK4 steps of ``DT`` from ``x`` (``attnflow.numerics.solve.integrate``)."""
    from attnflow.numerics import integrators
    from attnflow.numerics.solve import integrate

    return integrate(field, x, integrator=integrators.RK4(), dt=DT, steps=STEPS)


def measure(cases, *, trajectories=(), placement=None, d: int = D) -> dict:
    """For each case: ``field``, ``trajectory`` (for the cases in ``trajectories``, else None) and
    ``scale`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from attnflow.core import sphere
    from attnflow.numerics import sharding
    from attnflow.numerics.heads_field import HeadsField

    out = {}
    for case in cases:
        n = size(case)
        x = sphere.sample_uniform(0, n, d)
        field = build(case, n, d)
        sharded = sharding.shard_tokens(field, placement)
        if isinstance(field, HeadsField) and field.interaction == "expansion":
            one = field(x)  # op by op: expansion_qkv_sum refuses to be traced (its beta' is a jnp value)
        else:
            one = jax.jit(lambda x, field=field: field(x))(x)  # the field closed over
        many = jax.jit(lambda f, x: f(x))(sharded, x)  # the sharded field as a pytree argument
        result = {"field": float(jnp.max(jnp.abs(many - one))), "scale": float(jnp.max(jnp.abs(one)))}
        result["trajectory"] = None
        if case in trajectories:
            ref = jax.jit(lambda x, field=field: _steps(field, x))(x)
            got = jax.jit(_steps)(sharded, x)
            result["trajectory"] = float(jnp.max(jnp.abs(got - ref)))
        out[case] = result
    return out


PROCESS_CASES = ("rope_bias_sa_causal", "heads_rope_alibi_causal")
SOLVE = dict(dt=0.05, t_end=0.5, save_every=0.25)  # the two-process trajectory (``solve``, RK4)
RECIPE_N = 256  # the setting of the cluster script of docs/large-runs.md, at a small n


def recipe():
    """The field of the cluster script of ``docs/large-runs.md`` (RoPE full period, block 128)."""
    from attnflow.core import factors, gauges
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics import dynamics

    n, d = RECIPE_N, 3
    rope = gauges.make_rope(range(n), d, gauges.rope_frequencies(d, kind="full_period", n=n))
    kernel = Kernel(rope, factors.NoFactor(n=n), make_profile("exp", beta=1.0))
    return dynamics.make_vector_field(kernel, block_size=128)


def process_main(argv: list[str]) -> None:
    """``--process ID PORT OUT``: process ``ID`` of two on this machine (``jax.distributed``, two CPU
    devices each, CPU collectives by gloo) evaluates the fields of ``PROCESS_CASES`` sharded over
    the 4 devices of both, and ``solve``s the first one; writes what it reads back to ``OUT``."""
    import jax
    import numpy as np

    process, port, out = int(argv[0]), int(argv[1]), argv[2]
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process, initialization_timeout=60
    )

    from attnflow.core import sphere
    from attnflow.numerics import integrators, sharding, solve

    placement = sharding.make_token_mesh()  # every device of both processes
    x = sphere.sample_uniform(0, N, D)
    arrays = {"devices": np.asarray(len(jax.devices())), "local": np.asarray(len(jax.local_devices()))}
    velocity = jax.jit(lambda field, x: field(x))
    for case in PROCESS_CASES:
        arrays[case] = np.asarray(velocity(sharding.shard_tokens(build(case), placement), x))
    sharded = sharding.shard_tokens(build(PROCESS_CASES[0]), placement)
    arrays["trajectory"] = solve.solve(sharded, x, integrator=integrators.RK4(), **SOLVE).xs
    x = sphere.sample_uniform(0, RECIPE_N, 3)
    sharded = sharding.shard_tokens(recipe(), placement)
    arrays["recipe"] = solve.solve(sharded, x, integrator=integrators.RK4(), **SOLVE).xs
    np.savez(out, **arrays)
    jax.distributed.shutdown()


def main(argv: list[str]) -> None:
    if argv[0] == "--process":
        return process_main(argv[1:])
    devices = int(argv[0])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax

    jax.config.update("jax_enable_x64", True)
    names = [name.rstrip("+") for name in argv[1:]]
    trajectories = [name.rstrip("+") for name in argv[1:] if name.endswith("+")]
    result = {"devices": len(jax.devices()), "cases": measure(names, trajectories=trajectories)}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
