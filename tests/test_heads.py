"""Attention heads (query, key, value, output maps; per-head gauges and factors; masks and held
sources) against an independent NumPy implementation of the layer, written here from its formulas:

    q_i = G_i W_Q x_i, k_j = G_j W_K x_j, a_ij = w_ij c e^{β⟨q_i,k_j⟩}/n (usa) or row-normalised (sa)
    plain: out_i = W_O Σ_j a_ij W_V x_j;  rotated: out_i = W_O G_iᵀ Σ_j a_ij G_j W_V x_j
    dx_i/dt = P_{x_i}(Σ_h out_i^h), zero for the held sources.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow  # noqa: F401  (float64)
from attnflow.core import factors, gauges
from attnflow.core import heads as H
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics import dynamics, integrators, solve
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.summation import qkv_sum

FIELD_RTOL = 1e-12  # the acceptance bound: round-off of O(n d) sums of O(1) terms
FINAL_ATOL = 1e-10  # RK4 to tau = 2 at dt = 0.01: 200 steps of round-off


# --- the reference -----------------------------------------------------------------------------


def rope_matrices(xi, freqs, dim):
    """Block rotations by θ_k ξ on the pairs (2k, 2k+1), ``(n, dim, dim)``."""
    q = np.tile(np.eye(dim), (len(xi), 1, 1))
    for k, theta in enumerate(freqs):
        a = theta * np.asarray(xi)
        c, s = np.cos(a), np.sin(a)
        q[:, 2 * k, 2 * k], q[:, 2 * k, 2 * k + 1] = c, -s
        q[:, 2 * k + 1, 2 * k], q[:, 2 * k + 1, 2 * k + 1] = s, c
    return q


def factor_matrix(kind, xi, parameter):
    gap = np.subtract.outer(xi, xi)
    if kind == "none":
        return np.ones_like(gap)
    if kind == "distance_bias":
        return np.exp(-parameter * np.abs(gap))
    return np.cos(parameter * gap)


def reference_field(x, specs, *, beta, c, normalization, causal, sources):
    n = x.shape[0]
    total = np.zeros_like(x)
    j, i = np.meshgrid(np.arange(n), np.arange(n))
    seen = np.ones((n, n), bool) if causal is False else (j < i if causal == "strict" else j <= i)
    for spec in specs:
        g = spec["g"]
        q = np.einsum("nab,nb->na", g, x @ spec["query"].T)
        k = np.einsum("nab,nb->na", g, x @ spec["key"].T)
        a = np.where(seen, spec["w"] * c * np.exp(beta * (q @ k.T)), 0.0)
        if normalization == "usa":
            a = a / n
        else:
            rows = a.sum(axis=1, keepdims=True)
            a = np.divide(a, rows, out=np.zeros_like(a), where=rows > 0)
        v = x @ spec["value"].T
        if spec["values"] == "rotated":
            summed = np.einsum("nba,nb->na", g, a @ np.einsum("nab,nb->na", g, v))
        else:
            summed = a @ v
        total += summed @ spec["output"].T
    velocity = total - np.sum(total * x, axis=1, keepdims=True) * x
    velocity[:sources] = 0.0
    return velocity


def reference_rk4(x, specs, *, dt, steps, **options):
    f = lambda y: reference_field(y, specs, **options)  # noqa: E731
    for _ in range(steps):
        k1 = f(x)
        k2 = f(x + dt / 2 * k1)
        k3 = f(x + dt / 2 * k2)
        k4 = f(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


# --- the cases ---------------------------------------------------------------------------------


def unit_tokens(seed, n, d):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_case(*, heads, d, head_dim, values, factor, maps="gaussian", n=24, seed=0, scale=1.0):
    """``(attnflow heads, reference specs)``: head h has its own RoPE frequency and, for the
    distance bias, the ALiBi slope 2^{-8h/H}."""
    xi = np.arange(n, dtype=float)
    drawn = H.MAKERS[maps](seed, heads, head_dim, d, scale=scale)
    slopes = H.alibi_slopes(heads)
    out, specs = [], []
    for h in range(heads):
        freqs = np.array([2 * np.pi / n * (h + 1), 0.3 / (h + 1)])[: head_dim // 2]
        gauge = gauges.make_rope(xi, head_dim, freqs)
        if factor == "none":
            fac, parameter = factors.NoFactor(n=n), None
        elif factor == "distance_bias":
            fac, parameter = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(slopes[h])), slopes[h]
        else:
            fac, parameter = factors.ToeplitzCos(xi=jnp.asarray(xi), omega=jnp.asarray(0.7)), 0.7
        arrays = [drawn[name][h] for name in H.MAP_NAMES]
        out.append(H.make_head(*arrays, gauge=gauge, factor=fac, values=values))
        spec = dict(zip(H.MAP_NAMES, arrays, strict=True))
        spec.update(
            g=rope_matrices(xi, freqs, head_dim), w=factor_matrix(factor, xi, parameter), values=values
        )
        specs.append(spec)
    return tuple(out), specs


CASES = [  # heads, d, head_dim, values, factor, normalization, causal, sources, block_size
    (1, 3, 4, "plain", "none", "usa", False, 0, None),
    (2, 3, 2, "rotated", "distance_bias", "sa", True, 0, 8),
    (4, 8, 4, "plain", "distance_bias", "usa", "strict", 0, None),
    (2, 8, 6, "rotated", "toeplitz_cos", "usa", True, 3, 16),
    (1, 16, 8, "rotated", "none", "sa", "strict", 0, 8),
    (4, 16, 8, "plain", "toeplitz_cos", "usa", False, 2, None),
    (2, 16, 4, "rotated", "none", "usa", "strict", 1, 8),
    (1, 8, 2, "plain", "distance_bias", "sa", False, 2, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_field_equals_the_reference(case):
    count, d, head_dim, values, factor, normalization, causal, sources, block = case
    heads, specs = make_case(heads=count, d=d, head_dim=head_dim, values=values, factor=factor, scale=1.3)
    profile = make_profile("exp", beta=1.5)
    field = HeadsField(
        heads, profile, normalization=normalization, causal=causal, sources=sources, block_size=block
    )
    x = unit_tokens(1, 24, d)
    got = np.asarray(jax.jit(field)(jnp.asarray(x)))
    want = reference_field(
        x, specs, beta=1.5, c=1.0, normalization=normalization, causal=causal, sources=sources
    )
    assert np.max(np.abs(got - want)) <= FIELD_RTOL * max(1.0, np.max(np.abs(want)))
    assert np.all(got[:sources] == 0.0)
    if causal == "strict" and sources == 0:  # the first token sees nothing: it stays put
        assert np.all(got[0] == 0.0)


@pytest.mark.parametrize("case", [CASES[2], CASES[3], CASES[4]], ids=lambda c: "-".join(map(str, c)))
def test_rk4_trajectory_equals_the_reference(case):
    count, d, head_dim, values, factor, normalization, causal, sources, block = case
    heads, specs = make_case(heads=count, d=d, head_dim=head_dim, values=values, factor=factor, n=16)
    profile = make_profile("exp", beta=1.0)
    field = HeadsField(heads, profile, normalization=normalization, causal=causal, sources=sources)
    x0 = unit_tokens(2, 16, d)
    traj = solve.solve(
        field, jnp.asarray(x0), integrator=integrators.RK4(), dt=0.01, t_end=2.0, save_every=2.0
    )
    options = dict(beta=1.0, c=1.0, normalization=normalization, causal=causal, sources=sources)
    want = reference_rk4(x0, specs, dt=0.01, steps=200, **options)
    assert np.max(np.abs(np.asarray(traj.xs[-1]) - want)) <= FINAL_ATOL
    assert np.max(np.abs(want - x0)) > 1e-3  # the tokens moved: the comparison is not of x0 with itself


# --- the paper's model is one head with identity maps ---------------------------------------------


@pytest.mark.parametrize(("values", "value"), [("rotated", "gradient"), ("plain", "logits_only")])
def test_one_identity_head_is_the_paper_field(values, value):
    n, d = 20, 4
    xi = np.arange(n, dtype=float)
    rope = gauges.make_rope(xi, d, gauges.rope_frequencies(d, kind="roformer", base=10.0))
    factor = factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(0.2))
    profile = make_profile("exp", beta=2.0)
    eye = np.eye(d)
    head = H.make_head(eye, eye, eye, eye, gauge=rope, factor=factor, values=values)
    x = jnp.asarray(unit_tokens(3, n, d))
    for causal in (False, True):
        paper = dynamics.make_vector_field(Kernel(rope, factor, profile), causal=causal, value=value)
        heads = HeadsField((head,), profile, causal=causal)
        assert np.max(np.abs(np.asarray(paper(x) - heads(x)))) <= 1e-13
        assert float(paper.energy(x)) == pytest.approx(float(heads.energy(x)), rel=1e-13)


def test_strict_mask_and_sources_on_the_paper_field():
    """The paper's field (no heads) with a strict mask and held sources equals the reference."""
    n, d = 18, 3
    xi = np.arange(n, dtype=float)
    rope = gauges.make_rope(xi, d, np.array([2 * np.pi / n]))
    profile = make_profile("exp", beta=1.0)
    field = dynamics.make_vector_field(
        Kernel(rope, factors.NoFactor(n=n), profile), causal="strict", normalization="sa", sources=2
    )
    eye = np.eye(d)
    spec = dict(query=eye, key=eye, value=eye, output=eye, g=rope_matrices(xi, [2 * np.pi / n], d))
    spec.update(w=np.ones((n, n)), values="rotated")
    x = unit_tokens(4, n, d)
    want = reference_field(x, [spec], beta=1.0, c=1.0, normalization="sa", causal="strict", sources=2)
    assert np.max(np.abs(np.asarray(field(jnp.asarray(x))) - want)) <= FIELD_RTOL


# --- gradient flows ----------------------------------------------------------------------------


def _case_b_head(n, d, seed):
    """Identity gauge, W_Q = I, W_K = S symmetric, W_V = I, W_O = S: A = W_QᵀW_K = S = W_O W_V."""
    g = np.random.default_rng(seed).normal(size=(d, d))
    s = (g + g.T) / (2 * np.sqrt(d))
    return H.make_head(
        np.eye(d), s, np.eye(d), s, gauge=gauges.IdentityGauge(n=n, d=d), factor=factors.NoFactor(n=n)
    )


def test_gradient_cases_are_gradient_flows():
    n, d = 16, 5
    profile = make_profile("exp", beta=1.2)
    shared, _ = make_case(
        heads=2, d=d, head_dim=3, values="rotated", factor="distance_bias", maps="shared", n=n
    )
    random, _ = make_case(heads=2, d=d, head_dim=3, values="rotated", factor="none", n=n)
    x = jnp.asarray(unit_tokens(5, n, d))

    @jax.jit
    def field_and_gradient(field, x):  # one compiled program per case, not op by op
        return field(x), jax.grad(field.energy)(x)

    for heads in (shared, (_case_b_head(n, d, 0),)):
        field = HeadsField(heads, profile)
        assert field.gradient_flow
        velocity, gradient = (np.asarray(a) for a in field_and_gradient(field, x))
        v = n * (gradient - np.sum(gradient * np.asarray(x), axis=1, keepdims=True) * np.asarray(x))
        assert np.max(np.abs(velocity - v)) <= 1e-12
    assert not HeadsField(random, profile).gradient_flow
    assert not HeadsField(shared, profile, causal=True).gradient_flow
    assert not HeadsField(shared, profile, normalization="sa").gradient_flow
    plain = tuple(H.Head(h.query, h.key, h.value, h.output, h.gauge, h.factor, "plain") for h in shared)
    assert not HeadsField(plain, profile).gradient_flow


def test_energy_is_non_decreasing_for_a_gradient_head():
    n, d = 16, 4
    heads, _ = make_case(
        heads=2, d=d, head_dim=4, values="rotated", factor="none", maps="shared", n=n, scale=1.5
    )
    field = HeadsField(heads, make_profile("exp", beta=1.0))
    traj = solve.solve(field, jnp.asarray(unit_tokens(6, n, d)), integrator=integrators.RK4(), dt=0.01,
                       t_end=3.0, save_every=0.1)  # fmt: skip
    energies = np.array([float(field.energy(x)) for x in traj.xs])
    assert np.all(np.diff(energies) >= -1e-12 * energies[-1])
    assert energies[-1] - energies[0] > 1e-3


# --- the expansion with unbounded logits --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("norm", [2.0, 3.0])
@pytest.mark.parametrize("causal", [False, "strict"])
def test_expansion_within_its_tolerance_for_large_logits(norm, causal):
    """``|W_Q^T W_K| = norm``: the expansion's sum stays within tolerance · c e^{β norm} max|v|."""
    n, d, tolerance = 300, 3, 1e-8
    rng = np.random.default_rng(7)
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    head = H.make_head(
        norm * np.eye(d),
        rotation,
        np.eye(d),
        np.eye(d),
        gauge=gauges.IdentityGauge(n=n, d=d),
        factor=factors.DistanceBias(xi=jnp.arange(n, dtype=float) / n, slope=jnp.asarray(1.0)),
    )
    assert np.linalg.norm(head.query.T @ head.key, 2) == pytest.approx(norm)
    profile = make_profile("exp", beta=1.0)
    x = jnp.asarray(unit_tokens(8, n, d))
    q, k, v = head.queries(x), head.keys(x), head.value_vectors(x)
    exact = qkv_sum(head.factor, profile, q, k, v, causal=causal)
    from attnflow.numerics.expansion import expansion_qkv_sum

    approx = expansion_qkv_sum(head, profile, q, k, v, causal=causal, tolerance=tolerance)
    scale = np.exp(norm) * float(jnp.max(jnp.abs(v)))
    error = float(jnp.max(jnp.abs(approx - exact)))
    assert error <= tolerance * scale
    assert float(jnp.max(jnp.abs(exact))) > 1e-3 * scale  # the sums are not negligible against the scale


# --- bad input ---------------------------------------------------------------------------------


def test_head_errors_name_the_parameter():
    n, d = 8, 3
    gauge = gauges.IdentityGauge(n=n, d=2)
    with pytest.raises(ValueError, match=r"`key` must have the shape of `query`"):
        H.make_head(
            np.eye(2, 3), np.eye(3), np.eye(2, 3), np.eye(3, 2), gauge=gauge, factor=factors.NoFactor(n=n)
        )
    with pytest.raises(ValueError, match=r"`value` must be finite; got 1 non-finite"):
        bad = np.eye(2, 3)
        bad[0, 0] = np.nan
        H.make_head(np.eye(2, 3), np.eye(2, 3), bad, np.eye(3, 2), gauge=gauge, factor=factors.NoFactor(n=n))
    with pytest.raises(ValueError, match=r"gauge must act on the head dimension d_h = 2"):
        H.make_head(np.eye(2, 3), np.eye(2, 3), np.eye(2, 3), np.eye(3, 2),
                    gauge=gauges.IdentityGauge(n=n, d=d), factor=factors.NoFactor(n=n))  # fmt: skip
    toeplitz = factors.ToeplitzCos(xi=jnp.arange(n, dtype=float), omega=jnp.asarray(1.0))
    head = H.make_head(np.eye(2, 3), np.eye(2, 3), np.eye(2, 3), np.eye(3, 2), gauge=gauge, factor=toeplitz)
    with pytest.raises(ValueError, match=r"'sa' requires a non-negative factor .* in head 0"):
        HeadsField((head,), make_profile(), normalization="sa")
    with pytest.raises(ValueError, match=r"`sources` must be below n = 8"):
        HeadsField((head,), make_profile(), sources=8)
    maps = (np.eye(2, 3), np.eye(2, 3), np.eye(2, 3), np.eye(3, 2))
    with pytest.raises(
        ValueError, match=r"head: `factor` must be over the gauge's n = 8 tokens; got one over"
    ):
        H.make_head(*maps, gauge=gauge, factor=factors.NoFactor(n=9))
    nine = H.make_head(*maps, gauge=gauges.IdentityGauge(n=9, d=2), factor=factors.NoFactor(n=9))
    with pytest.raises(ValueError, match=r"every head must be over the same n tokens; got \[8, 9\]"):
        HeadsField((head, nine), make_profile())
    field, steps = HeadsField((head,), make_profile()), dict(dt=0.1, t_end=0.1, save_every=0.1)
    shape = r"solve: `x0` must have shape \(n, d\) with \(n, d\) = \(8, 3\), the heads'; got \(9, 3\)\."
    with pytest.raises(ValueError, match=shape):
        solve.solve(field, jnp.ones((9, 3)), integrator=integrators.RK4(), **steps)
    with pytest.raises(
        ValueError, match=r"`x0` must hold real floats \(float64, or float32 with float32 heads"
    ):
        solve.solve(field, np.ones((8, 3), np.int32), integrator=integrators.RK4(), **steps)


@pytest.mark.parametrize("normalization", ["usa", "sa"])
def test_strict_mask_through_the_paper_expansion(normalization):
    """The paper's expansion with a strict mask: within its tolerance of the exact strict sum, and the
    first token's velocity exactly zero (it sees nothing)."""
    n, d, tolerance = 300, 3, 1e-9
    xi = np.arange(n, dtype=float) / n
    kernel = Kernel(
        gauges.make_rope(xi, d, np.array([2 * np.pi])),
        factors.DistanceBias(xi=jnp.asarray(xi), slope=jnp.asarray(2.0)),
        make_profile("exp", beta=1.0),
    )
    options = dict(causal="strict", normalization=normalization)
    exact = dynamics.make_vector_field(kernel, **options)
    approx = dynamics.make_vector_field(kernel, interaction="expansion", tolerance=tolerance, **options)
    x = jnp.asarray(unit_tokens(9, n, d))
    v_exact, v_approx = np.asarray(exact(x)), np.asarray(approx(x))
    scale = np.e if normalization == "usa" else 1.0  # the field's scale: phi'(1) max|x| (usa), max|x| (sa)
    assert np.max(np.abs(v_exact - v_approx)) <= 2 * tolerance * scale  # the sum's bound, through P_x
    assert np.all(v_exact[0] == 0.0) and np.all(v_approx[0] == 0.0)


def test_a_layer_of_other_maps_reuses_the_compiled_program():
    """The heads' arrays are arguments of the compiled time loop: other weights of the same shapes
    compile nothing, and still give their own trajectory."""
    from attnflow.numerics import program_cache

    n, d = 12, 3
    profile = make_profile("exp", beta=1.0)
    x0 = jnp.asarray(unit_tokens(10, n, d))
    finals = []
    for seed in (0, 1):
        heads, _ = make_case(heads=2, d=d, head_dim=2, values="plain", factor="distance_bias", n=n, seed=seed)
        field = HeadsField(heads, profile, causal="strict")
        before = program_cache.info()["misses"]
        traj = solve.solve(field, x0, integrator=integrators.RK4(), dt=0.05, t_end=0.5, save_every=0.5)
        finals.append(np.asarray(traj.xs[-1]))
        misses = program_cache.info()["misses"] - before
    assert misses == 0  # the second layer: no new program
    assert np.max(np.abs(finals[0] - finals[1])) > 1e-6  # and its own numbers


@pytest.mark.slow
def test_a_layer_by_the_expansion_runs_in_solve_like_the_exact_path():
    """The expansion's degree is chosen from a concrete beta' = beta |W_Q| |W_K| even inside the
    compiled time loop (it was made with a JAX operation, hence traced, and refused there)."""
    n, d = 12, 3
    layer, _ = make_case(heads=2, d=d, head_dim=2, values="plain", factor="none", n=n, seed=4)
    x0 = jnp.asarray(unit_tokens(11, n, d))
    opts = dict(integrator=integrators.RK4(), dt=0.05, t_end=0.5, save_every=0.25)
    profile = make_profile("exp", beta=1.0)
    exact = solve.solve(HeadsField(layer, profile), x0, **opts)
    expanded = solve.solve(HeadsField(layer, profile, interaction="expansion", tolerance=1e-10), x0, **opts)
    np.testing.assert_allclose(expanded.xs, exact.xs, atol=1e-9)  # within the tolerance's consequence
