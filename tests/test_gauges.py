"""Gauges Q(ξ) (attnflow.core.gauges): orthogonality, apply vs matrices, the RoPE relative property,
generalized RoPE (commuting and not), prompt gauges, Haar sampling and the validation errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from attnflow.core import gauges
from attnflow.core.sphere import sample_uniform
from helpers_core import GAUGES, N_SMALL, commuting_generators_d4, uniform


@pytest.mark.parametrize("name", sorted(GAUGES))
def test_gauge_matrices_orthogonal_and_apply_consistent(name):
    g = GAUGES[name](N_SMALL)
    q = np.asarray(g.matrices())
    assert q.shape == (N_SMALL, g.d, g.d)
    # every gauge is built from exact rotations (cos/sin blocks, Schur-form exponentials, QR): ulps
    np.testing.assert_allclose(
        np.einsum("nki,nkj->nij", q, q), np.broadcast_to(np.eye(g.d), q.shape), rtol=0, atol=1e-14
    )
    x = uniform(N_SMALL, g.d, seed=1)
    # apply / apply_transpose are the matrix-vector products of matrices(): same sums, round-off only
    np.testing.assert_allclose(g.apply(x), np.einsum("nij,nj->ni", q, x), rtol=0, atol=1e-15)
    np.testing.assert_allclose(g.apply_transpose(x), np.einsum("nji,nj->ni", q, x), rtol=0, atol=1e-15)
    # Qᵀ(Q x) = x up to the orthogonality defect (ulps)
    np.testing.assert_allclose(g.apply_transpose(g.apply(x)), x, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "d, frequencies",
    [
        (4, gauges.rope_frequencies(4, kind="roformer")),
        (5, np.array([1.0, 0.37])),
        (3, np.array([2 * np.pi / 16])),
    ],
)
def test_rope_relative_property(d, frequencies):
    xi = np.arange(16.0)
    r = np.asarray(gauges.make_rope(xi, d, frequencies).matrices())
    lhs = np.einsum("aki,bkj->abij", r, r)  # R(ξ_a)ᵀ R(ξ_b)
    diff = (xi[None, :] - xi[:, None]).reshape(-1)  # ζ − ξ for every pair (a, b)
    rhs = np.asarray(gauges.make_rope(diff, d, frequencies).matrices()).reshape(lhs.shape)
    # angle-addition identities hold to a few ulps of the O(1) cos/sin values (angles ≤ 15 rad)
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-14)


def test_rope_block_structure_and_fixed_coordinate():
    freqs = np.array([1.0, 0.37])
    r = np.asarray(gauges.make_rope(np.arange(16.0), 5, freqs).matrices())
    # d = 5 with two pairs: coordinate 4 is untouched, exactly
    np.testing.assert_array_equal(r[:, 4, :], np.broadcast_to(np.eye(5)[4], (16, 5)))
    np.testing.assert_array_equal(r[:, :, 4], np.broadcast_to(np.eye(5)[4], (16, 5)))
    # block (0,1) of token 3 is r(θ_1·3) = [[cos, −sin], [sin, cos]] (RoFormer convention)
    a = 3.0 * freqs[0]
    # same cos/sin calls, exact up to one rounding
    np.testing.assert_allclose(
        r[3, :2, :2], [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]], rtol=0, atol=1e-16
    )
    # the two pairs do not mix: off-diagonal blocks are exactly zero
    np.testing.assert_array_equal(r[:, :2, 2:], 0.0)


def test_rope_frequencies_values():
    # roformer θ_k = base^{−2(k−1)/d}, one per pair: the same power computed two ways, ulps apart
    np.testing.assert_allclose(
        gauges.rope_frequencies(6, kind="roformer", base=100.0),
        [1.0, 100.0 ** (-1 / 3), 100.0 ** (-2 / 3)],
        rtol=1e-15,
    )
    full = gauges.rope_frequencies(3, kind="full_period", n=16)
    np.testing.assert_allclose(full, [2 * np.pi / 16], rtol=1e-16)  # one division, exact up to rounding
    r = np.asarray(gauges.make_rope([16.0], 3, full).matrices())[0]
    # full period: position n is one full turn; cos(2π)/sin(2π) are within 3e-16 of 1/0
    np.testing.assert_allclose(r, np.eye(3), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(gauges.rope_frequencies(5, kind=[0.5]), [0.5])


def test_rope_frequencies_errors():
    with pytest.raises(
        ValueError, match=r"`frequencies` must be 'roformer', 'full_period' or a list; got 'rofromer'"
    ):
        gauges.rope_frequencies(4, kind="rofromer")
    with pytest.raises(ValueError, match=r"`n` is required for full_period"):
        gauges.rope_frequencies(4, kind="full_period")
    with pytest.raises(
        ValueError,
        match=r"`frequencies` must be at most `d` // 2 = 2 \(one frequency per coordinate pair\); "
        r"got \[1\.0, 2\.0, 3\.0\]\.$",
    ):
        gauges.rope_frequencies(5, kind=[1.0, 2.0, 3.0])


def test_axis_generators():
    for axis in "xyz":
        g = gauges.axis_generator(axis)
        np.testing.assert_array_equal(g, -g.T)  # skew-symmetric, exactly
    # right-handed: exp(a L_z) e_x = (cos a, sin a, 0); exp(a L_x) e_y = (0, cos a, sin a)
    a = 0.7
    # expm of a 3×3 skew matrix: accurate to ~1e-15
    np.testing.assert_allclose(
        scipy.linalg.expm(a * gauges.axis_generator("z")) @ [1, 0, 0],
        [np.cos(a), np.sin(a), 0],
        rtol=0,
        atol=1e-15,
    )
    np.testing.assert_allclose(
        scipy.linalg.expm(a * gauges.axis_generator("x")) @ [0, 1, 0],
        [0, np.cos(a), np.sin(a)],
        rtol=0,
        atol=1e-15,
    )


def test_generalized_rope_default_is_rz_times_rx():
    n = 16
    omega = 2 * np.pi / n
    q = np.asarray(GAUGES["generalized_zx"](n).matrices())

    def rz(a):
        return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])

    def rx(a):
        return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])

    expected = np.stack([rz(omega * i) @ rx(3 * omega * i) for i in range(n)])
    # both sides are exact rotations; angles up to 17.7 rad carry ~|θ|·ulp phase error
    np.testing.assert_allclose(q, expected, rtol=0, atol=1e-13)


def test_generalized_rope_relative_property_commuting_only():
    n = 16
    xi = np.arange(0.0, n, 2.0)  # 8 positions, 64 pairs (each pair is an expm product)
    # commuting generators (d = 4): LieRE-type relative property
    gens = commuting_generators_d4()
    np.testing.assert_allclose(gens[0] @ gens[1], gens[1] @ gens[0], rtol=0, atol=1e-15)  # they commute
    q = np.asarray(gauges.make_generalized_rope(xi, gens, [1.0, 2.5], omega=2 * np.pi / n).matrices())
    diff = (xi[None, :] - xi[:, None]).reshape(-1)
    q_diff = np.asarray(gauges.make_generalized_rope(diff, gens, [1.0, 2.5], omega=2 * np.pi / n).matrices())
    # exact rotations of angles up to ~14 rad: phase error ~|θ|·ulp per factor
    np.testing.assert_allclose(
        np.einsum("aki,bkj->abij", q, q).reshape(q_diff.shape), q_diff, rtol=0, atol=1e-12
    )
    # non-commuting z, x (d = 3): the relative property fails by O(1) (the wavy orbit)
    zx = [gauges.axis_generator("z"), gauges.axis_generator("x")]
    qz = np.asarray(gauges.make_generalized_rope(xi, zx, [1.0, 3.0], omega=2 * np.pi / n).matrices())
    qz_diff = np.asarray(gauges.make_generalized_rope(diff, zx, [1.0, 3.0], omega=2 * np.pi / n).matrices())
    # an O(1) defect: far above any round-off, so this is a real structural difference
    assert np.abs(np.einsum("aki,bkj->abij", qz, qz).reshape(qz_diff.shape) - qz_diff).max() > 0.1


def test_haar_orthogonal_and_prompt_gauge():
    qs = gauges.haar_orthogonal(jax.random.key(5), 6, 4)
    # QR factor with sign fix: orthogonal to round-off
    np.testing.assert_allclose(
        np.einsum("kji,kjl->kil", qs, qs), np.broadcast_to(np.eye(4), qs.shape), rtol=0, atol=1e-14
    )
    np.testing.assert_array_equal(qs, gauges.haar_orthogonal(jax.random.key(5), 6, 4))  # seeded, bitwise
    ids = np.array([0, 3, 1, 3, 5, 0])
    g = gauges.make_prompt_gauge(ids, qs)
    # token i carries exactly Q_{ids[i]} (a gather, no arithmetic)
    np.testing.assert_array_equal(np.asarray(g.matrices()), qs[ids])


def test_check_orthogonal_errors():
    q = np.broadcast_to(np.eye(3), (4, 3, 3)).copy()
    np.testing.assert_array_equal(gauges.check_orthogonal(q), q)
    with pytest.raises(ValueError, match=r"gauge matrices must have shape \(n, d, d\); got \(4, 3\)"):
        gauges.check_orthogonal(np.zeros((4, 3)))
    bad = q.copy()
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"must be finite"):
        gauges.check_orthogonal(bad)
    bad = q.copy()
    bad[2] *= 1.01
    with pytest.raises(ValueError, match=r"must be orthogonal .* got 0\.0201 for token 2"):
        gauges.check_orthogonal(bad, name="Q.npy")
    with pytest.raises(ValueError, match=r"^prompt gauge: gauge matrices must be orthogonal"):
        gauges.make_prompt_gauge([0, 1], 2.0 * np.broadcast_to(np.eye(3), (2, 3, 3)))


def test_dense_gauge_apply_is_jittable_pytree():
    g = GAUGES["dense_haar"](N_SMALL)
    x = uniform(N_SMALL, 3, seed=2)
    # a pytree gauge passes through jit; XLA may fuse multiply-adds (FMA), so allow one ulp-level rounding
    np.testing.assert_allclose(jax.jit(lambda g, x: g.apply(x))(g, x), g.apply(x), rtol=0, atol=1e-15)
    r = GAUGES["rope_full_period"](N_SMALL)
    np.testing.assert_allclose(jax.jit(lambda g, x: g.apply(x))(r, x), r.apply(x), rtol=0, atol=1e-15)
    assert jnp.asarray(r.angles).shape == (N_SMALL, 1)


def test_generalized_rope_orthogonal_to_round_off():
    q = np.asarray(GAUGES["generalized_zx"](32).matrices())
    # products of two exact rotations should be orthogonal to a few ulps, like RoPE's cos/sin blocks
    np.testing.assert_allclose(
        np.einsum("nki,nkj->nij", q, q), np.broadcast_to(np.eye(3), q.shape), rtol=0, atol=1e-14
    )


def test_make_rope_rejects_too_many_frequencies():
    with pytest.raises(ValueError, match=r"frequencies"):
        gauges.make_rope(np.arange(4), 3, np.array([1.0, 2.0]))


def _dense_rope(xi: np.ndarray, d: int, frequencies: np.ndarray) -> np.ndarray:
    """RoPE as dense matrices, built block by block: ``blockdiag(r(θ_1 ξ), …, r(θ_m ξ), I)``."""
    q = np.zeros((xi.size, d, d))
    for i, position in enumerate(xi):
        q[i] = np.eye(d)
        for k, theta in enumerate(frequencies):
            c, s = np.cos(theta * position), np.sin(theta * position)
            q[i, 2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = [[c, -s], [s, c]]
    return q


@pytest.mark.parametrize("d, kind", [(2, "roformer"), (5, "roformer"), (8, "roformer"), (7, [0.3, 1.7])])
def test_compact_rope_equals_the_dense_construction(d, kind):
    xi = np.arange(12.0) - 3.5
    freqs = gauges.rope_frequencies(d, kind=kind)
    rope = gauges.make_rope(xi, d, freqs)
    assert rope.angles.shape == (12, freqs.size)  # stored: one angle per token and plane
    dense = _dense_rope(xi, d, freqs)
    # the same cos and sin of the same float64 angles (NumPy and XLA may differ in the last ulp)
    np.testing.assert_allclose(np.asarray(rope.matrices()), dense, rtol=0, atol=4e-16)
    x = np.asarray(sample_uniform(0, 12, d))
    np.testing.assert_allclose(
        np.asarray(rope.apply(x)), np.einsum("nij,nj->ni", dense, x), rtol=0, atol=1e-15
    )
    u = np.asarray(rope.apply(x))
    np.testing.assert_allclose(np.asarray(rope.apply_transpose(u)), x, rtol=0, atol=1e-15)


def test_large_d_rope_is_stored_and_applied_compactly():
    n, d = 64, 5000
    rope = gauges.make_rope(np.arange(n), d, gauges.rope_frequencies(d, kind="roformer"))
    assert rope.angles.nbytes == n * (d // 2) * 8  # 2.6 MB, where n x d x d matrices are 12.8 GB
    x = np.asarray(sample_uniform(1, n, d))
    u = jax.jit(rope.apply)(x)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(u), axis=1), 1.0, rtol=0, atol=1e-13)  # rotations
    np.testing.assert_allclose(np.asarray(rope.apply_transpose(u)), x, rtol=0, atol=1e-14)


def test_the_memory_estimate_counts_rope_compactly():
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import memory_estimate

    n, d = 64, 5000
    data = {"model": {"n": n, "d": d}, "aux": {"kind": "positions"}}
    rope = memory_estimate(config_from_dict({**data, "gauge": {"kind": "rope", "frequencies": "roformer"}}))
    dense = n * d * d * 8
    # the simulation and the store hold the angles; the metrics still take the matrices (1 copy)
    assert rope["model.d"] == n * (d // 2) * 8 + dense


def test_float32_rope_angles_are_reduced_in_float64_so_the_field_stays_within_1e6():
    """Positions 0..4095 with RoFormer frequencies: raw angles up to 4095 rad would be rounded to
    float32 with errors up to 2.4e-4; reduced to [-π, π) in float64 first, the float32 field at
    d = 64, n = 4096 is 4.9e-9 off the float64 one (measured), against 3.8e-7 with the raw angles
    rounded to float32: the bound 5e-8 (well inside the wanted 1e-6) tells the two apart."""
    from attnflow.core.factors import NoFactor
    from attnflow.core.kernel import Kernel, make_profile
    from attnflow.numerics.dynamics import make_vector_field

    n, d = 4096, 64
    xi = np.arange(n, dtype=np.float64)
    freqs = gauges.rope_frequencies(d, kind="roformer")
    angles32 = gauges.make_rope(xi, d, freqs, dtype=jnp.float32).angles
    assert float(jnp.max(jnp.abs(angles32))) <= np.pi
    exact = np.outer(xi, freqs)
    # the reduced float32 angle is the float64 one modulo 2π, up to float32 rounding of π-sized numbers
    assert np.max(np.abs(np.sin(np.asarray(angles32, np.float64)) - np.sin(exact))) < 2e-7
    x = np.asarray(sample_uniform(0, n, d))

    def field(dtype):
        rope = gauges.make_rope(xi, d, freqs, dtype=dtype)
        kernel = Kernel(rope, NoFactor(n), make_profile(beta=1.0, dtype=dtype))
        v = jax.jit(make_vector_field(kernel, block_size=512))(jnp.asarray(x, dtype))
        return np.asarray(v, np.float64)

    assert np.max(np.abs(field(jnp.float32) - field(jnp.float64))) < 5e-8


def test_a_gauge_rotates_a_state_in_the_state_s_dtype():
    # a float32 state with a float64 gauge: the rotation in float32 (it promoted the state to float64,
    # and a fixed-step solve then failed on its loop's carry type)
    import attnflow
    from attnflow.core import factors

    n, d = 16, 4
    x32 = sample_uniform(0, n, d, dtype=jnp.float32)
    rope = gauges.make_rope(range(n), d, gauges.rope_frequencies(d, kind="full_period", n=n))
    dense = gauges.DenseGauge(q=rope.matrices())
    for gauge in (rope, dense):
        for turn in (gauge.apply, gauge.apply_transpose):
            assert turn(x32).dtype == jnp.float32
            np.testing.assert_allclose(turn(x32), turn(x32.astype(jnp.float64)), rtol=0, atol=1e-6)
        x64 = sample_uniform(0, n, d)
        assert gauge.apply(x64).dtype == jnp.float64
    field = attnflow.make_vector_field(
        attnflow.Kernel(rope, factors.NoFactor(n), attnflow.make_profile("exp", beta=1.0))
    )
    traj = attnflow.solve(field, x32, integrator=attnflow.RK4(), dt=0.05, t_end=0.5, save_every=0.5)
    assert traj.status == "ok" and traj.xs.dtype == np.float32
