"""analysis.landscape (Newton, Lanczos index) and workflows.landscape (search, continuation, folder, CLI).

References are independent: the dense Riemannian Hessian of ``attnflow.analysis.theory`` (autodiff,
``(nd)²`` entries), the closed-form stationarity of the great circle, and the D3 energies measured
with both (tests/test_findings.py).
"""

import csv
import re

import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.analysis import landscape, theory
from attnflow.cli import EXIT_BAD_INPUT, EXIT_OK, app
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.config import ConfigError, config_from_dict
from attnflow.workflows import landscape as search
from attnflow.workflows.build import build

D3 = {
    "model": {"n": 64, "d": 3, "beta": 3.0, "profile": "exp"},
    "aux": {"kind": "positions", "spacing": "unit"},
    "factor": {"kind": "toeplitz_cos", "omega": 2 * np.pi},
    "solver": {"method": "rk4", "dt": 0.01, "t_end": 400.0, "save_every": 400.0},
}


def d3_config(**model):
    return config_from_dict({**D3, "model": {**D3["model"], **model}})


def d3_kernel(n, beta):
    xi = jnp.arange(n) / n
    factor = factors.ToeplitzCos(xi=xi, omega=jnp.asarray(2 * np.pi))
    return Kernel(gauges.IdentityGauge(n=n, d=3), factor, make_profile("exp", beta=beta)), np.asarray(xi)


def rope_bias_kernel(n, beta):
    xi = np.arange(n, dtype=float)
    gauge = gauges.make_rope(xi, 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    factor = factors.DistanceBias(xi=jnp.asarray(xi / n), slope=jnp.asarray(3.0))
    return Kernel(gauge, factor, make_profile("exp", beta=beta))


def test_gradient_and_hessian_vector_match_the_dense_forms():
    kernel = rope_bias_kernel(12, 2.0)
    x = sphere.sample_uniform(3, 12, 3)
    np.testing.assert_allclose(  # the field over n is P∇E (autodiff of E); 1e-15: round-off of sums
        landscape.riemannian_gradient(kernel, x), theory.riemannian_gradient(kernel, x), atol=1e-15
    )
    bases = np.asarray(theory.tangent_bases(x))
    c = np.random.default_rng(0).normal(size=(12, 2))
    eta = np.einsum("iak,ik->ia", bases, c)
    dense = np.asarray(theory.riemannian_hessian(kernel, x)) @ c.reshape(-1)
    hv = np.asarray(landscape.hessian_vector(kernel, x, jnp.asarray(eta)))
    scale = np.max(np.abs(dense))
    np.testing.assert_allclose(np.einsum("iak,ia->ik", bases, hv).reshape(-1), dense, atol=1e-13 * scale)
    # the Hessian maps into the tangent spaces
    assert np.max(np.abs(np.sum(hv * np.asarray(x), axis=1))) < 1e-15


def test_symmetry_modes_are_zero_modes_and_count_the_orbit():
    kernel, xi = d3_kernel(16, 2.0)
    circle = theory.great_circle(xi, 2 * np.pi)
    modes = landscape.symmetry_modes(kernel, circle)
    assert modes.shape == (3, 48)  # a state spanning a plane: all 3 rotations move it
    assert landscape.symmetry_modes(kernel, theory.antipodal_pair(xi, 2 * np.pi)).shape[0] == 2  # a line
    for mode in modes:
        hv = landscape.hessian_vector(kernel, jnp.asarray(circle), jnp.asarray(mode.reshape(16, 3)))
        assert float(jnp.max(jnp.abs(hv))) < 1e-15  # stationary state: rotations are zero modes


def _stationary_states(count):
    """Newton from compressed circles (arcs of f·2π), from the antipodal pair perturbed, and straight
    from uniform data: local maxima and saddles of many indices, D3 (n = 32) and RoPE × distance bias."""
    rng = np.random.default_rng(0)
    starts = []
    for beta in (1.0, 2.0, 3.0, 4.0):
        kernel, xi = d3_kernel(32, beta)
        for f in (0.5, 0.8, 0.9, 1.0):
            starts.append(
                (kernel, theory.great_circle_arc(xi, 2 * np.pi, f) + 1e-3 * rng.normal(size=(32, 3)))
            )
        starts.append((kernel, theory.antipodal_pair(xi, 2 * np.pi) + 0.05 * rng.normal(size=(32, 3))))
    starts += [(rope_bias_kernel(24, 2.0), sphere.sample_uniform(seed, 24, 3)) for seed in range(10)]
    states = []
    for kernel, x0 in starts:
        result = landscape.newton(kernel, x0)
        if result.converged:
            states.append((kernel, result.x))
        if len(states) == count:
            break
    return states


@pytest.mark.slow
def test_lanczos_index_equals_the_dense_index_on_20_stationary_states():
    states = _stationary_states(20)
    assert len(states) == 20
    indices = []
    for kernel, x in states:
        spectrum = landscape.hessian_spectrum(kernel, x)
        dense = theory.certify(kernel, x)
        assert dense.gradient_norm <= 1e-13
        assert spectrum.index == int(np.sum(dense.hessian_eigenvalues > spectrum.threshold))
        top = dense.hessian_eigenvalues[::-1][: spectrum.index]
        # 1e-10 relative: Lanczos (ARPACK, tol 1e-13) against LAPACK on the same operator
        np.testing.assert_allclose(spectrum.eigenvalues[: spectrum.index], top, rtol=1e-8, atol=1e-12)
        indices.append(spectrum.index)
    assert len(set(indices)) >= 3  # the states are not all of one kind


def test_newton_refuses_a_wrong_shape():
    kernel, _ = d3_kernel(8, 1.0)
    with pytest.raises(
        ValueError, match=r"newton: `x0` must be a finite \(n, d\) = \(8, 3\) array; got shape"
    ):
        landscape.newton(kernel, np.ones((7, 3)))


@pytest.mark.slow
def test_d3_search_finds_the_arc_the_antipodal_arcs_and_the_unstable_great_circle(tmp_path):
    result = search.run_landscape(d3_config(), tmp_path / "d3", starts=4)
    energies = np.array([s.energy for s in result.states])
    assert energies[0] == pytest.approx(0.758807, abs=5e-6)  # the clean arc is reported first (best)
    assert result.states[0].shape == "arc" and result.states[0].morse_index == 0

    def found(energy):
        hits = [s for s in result.states if abs(s.energy - energy) < 5e-6]
        assert len(hits) == 1, energy  # found, and once (deduplicated)
        return hits[0]

    assert found(0.754939).shape == "arc"  # an arc with a token pair on the wrong side of the gap
    assert found(0.748020).shape == "antipodal_arcs" and found(0.748020).morse_index == 0
    circle = found(0.658895)
    assert circle.shape == "great_circle" and circle.morse_index == 9 and circle.eigenvalues[0] > 0
    with open(tmp_path / "d3" / "states.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["energy"]) for r in rows] == sorted((float(r["energy"]) for r in rows), reverse=True)
    assert {"energy", "morse_index", "shape", "gradient_norm", "lambda_1"} <= set(rows[0])
    assert all(float(r["gradient_norm"]) <= 1e-13 for r in rows)
    saved = np.load(tmp_path / "d3" / "states.npz")
    assert saved["x"].shape == (len(rows), 64, 3)


def test_continuation_of_the_great_circle_finds_beta_c():
    config = d3_config(beta=1.5)
    sim = build(config)
    circle = theory.great_circle(sim.xi, 2 * np.pi)
    state = search.describe(sim.kernel, circle, start="great_circle", block_size=None, gradient_norm=0.0)
    rows, transitions = search.follow(config, state, search.parse_continuation("beta=1.3:1.7:0.1"))
    assert [r["morse_index"] for r in rows] == [0, 0, 0, 1, 1]
    assert [r["model.beta"] for r in rows] == pytest.approx([1.3, 1.4, 1.5, 1.6, 1.7])
    assert len(transitions) == 1 and transitions[0]["index_below"] == 0
    assert transitions[0]["model.beta"] == pytest.approx(1.545, abs=1e-3)  # measured 1.545127


@pytest.mark.parametrize(
    "spec",
    ["beta", "beta=1:2", "beta=1:2:0", "beta=2:1:0.1", "beta=a:2:0.1", "=1:2:0.1"],
)
def test_parse_continuation_errors(spec):
    with pytest.raises(ValueError, match=r"^--continue: `KEY=START:STOP:STEP` must be .*; got '"):
        search.parse_continuation(spec)


def test_parse_continuation_grid():
    c = search.parse_continuation("beta=0.5:5:0.1")
    assert c.key == "model.beta" and c.values.size == 46 and c.values[-1] == 5.0
    assert search.parse_continuation("factor.omega=1:2:0.5").values.tolist() == [1.0, 1.5, 2.0]


@pytest.mark.slow
def test_lanczos_index_at_n_4096():
    # matrix-free: the great circle at n = 4096 (tiles of 128) keeps the index 9 of n = 64 and 256
    config = d3_config(n=4096)
    sim = build(config)
    x = theory.great_circle(sim.xi, 2 * np.pi)
    result = landscape.newton(sim.kernel, x, block_size=sim.block_size)
    assert result.converged and result.iterations == 0  # stationary by symmetry
    # k = 12 eigenvalues asked for, past the index 9: one Lanczos pass (the default k = 8 sees only
    # ascent directions, then doubles k and runs again: twice the matvecs). The 10th is -7.8e-5 against
    # a threshold of 8.7e-12 (measured); an index above 12 would still double k and be counted
    spectrum = landscape.hessian_spectrum(sim.kernel, result.x, block_size=sim.block_size, k=12)
    assert spectrum.index == 9 and spectrum.symmetry_dim == 3


@pytest.mark.slow
def test_cli_landscape(tmp_path):
    path = tmp_path / "d3.toml"
    path.write_text(
        '[model]\nn = 16\nbeta = 2.0\n[aux]\nkind = "positions"\nspacing = "unit"\n'
        '[factor]\nkind = "toeplitz_cos"\nomega = 6.283185307179586\n'
        "[solver]\nt_end = 20.0\nsave_every = 20.0\n"
    )
    runner = CliRunner()
    out = tmp_path / "out"
    args = ["landscape", str(path), "--out", str(out), "--starts", "2", "--continue", "beta=1.8:2.2:0.2"]
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_OK, result.output
    # progress from the first start on, counted in starts (off a terminal: plain lines)
    first = re.search(r"^landscape: solving 0/(\d+) starts \(0%\) \[\d+\.\d s\]$", result.stdout, re.M)
    assert first, result.stdout
    assert re.search(rf"^landscape: solving {first[1]}/{first[1]} starts \(100%\)", result.stdout, re.M)
    for name in (
        "states.csv",
        "states.npz",
        "landscape.json",
        "branches.csv",
        "transitions.csv",
        "branches.png",
    ):
        assert (out / name).is_file()
    with open(out / "branches.csv") as f:
        branches = list(csv.DictReader(f))
    assert {r["model.beta"] for r in branches} <= {"1.8", "2.0", "2.2"}
    bad = runner.invoke(app, ["landscape", str(path), "--out", str(tmp_path / "bad"), "--continue", "beta=1"])
    assert bad.exit_code == EXIT_BAD_INPUT and not (tmp_path / "bad").exists()
    assert "--continue: `KEY=START:STOP:STEP` must be" in bad.output
    wrong = runner.invoke(
        app, ["landscape", str(path), "--out", str(tmp_path / "w"), "--continue", "model.bta=1:2:1"]
    )
    assert wrong.exit_code == EXIT_BAD_INPUT and "model.bta" in wrong.output


def test_states_are_deduplicated_modulo_rotation_and_relabelling():
    kernel, xi = d3_kernel(32, 3.0)
    arc = landscape.newton(kernel, theory.great_circle_arc(xi, 2 * np.pi, 0.6)).x
    rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]
    shifted = np.roll(arc, 5, axis=0)  # a cyclic relabelling maps the Toeplitz kernel to itself
    states = [
        search.describe(kernel, y, start=str(i), block_size=None, gradient_norm=0.0)
        for i, y in enumerate((arc, arc @ rotation.T, shifted))
    ]
    assert search.same_state(kernel, states[0], states[1]) and search.same_state(kernel, states[0], states[2])
    circle = search.describe(
        kernel, theory.great_circle(xi, 2 * np.pi), start="c", block_size=None, gradient_norm=0.0
    )
    assert not search.same_state(kernel, states[0], circle)


def test_continuation_locates_where_the_single_arc_begins():
    # the clean arc of D3 (n = 64) followed down from beta = 1.8: Newton converges at 1.7 and 1.6, not
    # at 1.5; the bisection puts the branch's end within 0.1 / 2^6 of where Newton stops converging
    config = d3_config(beta=1.8)
    sim = build(config)
    arc = landscape.newton(sim.kernel, theory.great_circle_arc(sim.xi, 2 * np.pi, 0.6))
    assert arc.converged
    state = search.describe(sim.kernel, arc.x, start="arc", block_size=None, gradient_norm=arc.gradient_norm)
    assert state.shape == "arc" and state.morse_index == 0
    rows, transitions = search.follow(config, state, search.parse_continuation("beta=1.5:1.8:0.1"))
    assert [r["model.beta"] for r in rows] == pytest.approx([1.6, 1.7, 1.8])
    assert all(r["shape"] == "arc" and r["morse_index"] == 0 for r in rows)
    ends = [t for t in transitions if t["kind"] == "end"]
    assert len(ends) == 1 and len(transitions) == 1
    assert np.isnan(ends[0]["index_below"]) and ends[0]["index_above"] == 0
    assert 1.5 < ends[0]["model.beta"] < 1.6  # measured 1.5359 (the great circle's beta_c: 1.5451)


# --- bad --continue and --set values: one line naming the option, before any solve, nothing written


SMALL = (
    '[model]\nn = 8\nbeta = 2.0\n[aux]\nkind = "positions"\nspacing = "unit"\n'
    '[factor]\nkind = "toeplitz_cos"\nomega = 6.283185307179586\n'
    "[solver]\nt_end = 2.0\nsave_every = 2.0\n"
)


def refused(tmp_path, *args, text=SMALL):
    """The output of ``attnflow landscape`` on ``text`` with ``args``: exit 2, one line, nothing
    solved (no progress line) and nothing written."""
    path = tmp_path / "small.toml"
    path.write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["landscape", str(path), "--out", str(out), "--starts", "1", *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.count("\n") == 1 and "solving" not in result.stdout, result.output
    assert not out.exists()
    return result.stderr.strip()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [  # keys that the config's chosen kinds do not read: flat, identical branches
        ("factor.slope=1:2:0.5", "`factor.slope` must be left out when `factor.kind` = 'toeplitz_cos'"),
        ("slope=0:1:0.5", "`factor.slope` must be left out when `factor.kind` = 'toeplitz_cos'"),
        ("init.sigma=0.1:0.3:0.1", "`init.sigma` must be left out when `init.kind` = 'uniform'"),
        ("model.gamma=1:2:1", "`model.gamma` must be left out when `model.beta_scaling` = 'none'"),
    ],
)
def test_continue_refuses_a_key_the_kind_does_not_read(tmp_path, spec, expected):
    error = refused(tmp_path, "--continue", spec)
    assert error.startswith(f"error: --continue: {expected}") and "(which does not read it)" in error


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("beta=-1:1:0.5", "`model.beta` must be a number > 0; got -1."),
        ("beta=2:-1:-0.5", "`model.beta` must be a number > 0; got -1."),  # the far end, before solving
        ("model.sources=-2:0:1", "`model.sources` must be an integer >= 0; got -2."),  # an integer key
        ("model.sources=0:1:0.5", "`model.sources` must be an integer >= 0; got 0.5."),
        ("model.sources=0:2:1", "`model.sources` must be 0 (held sources change the stationary states)"),
        ("model.n=4:6:1", "`KEY` must be a key that keeps the states' shape (not model.n or model.d"),
    ],
)
def test_continue_errors_name_continue(tmp_path, spec, expected):
    assert refused(tmp_path, "--continue", spec).startswith(f"error: --continue: {expected}")


def test_a_dynamics_other_than_the_gradient_flow_names_set_or_the_file(tmp_path):
    error = refused(tmp_path, "--set", "model.causal=true")
    assert error.startswith(
        "error: --set: `model.causal` must be false (a causal mask is not a gradient flow)"
    )
    error = refused(tmp_path, text=SMALL.replace("beta = 2.0\n", "beta = 2.0\nsources = 1\n"))
    assert error.startswith(f"error: {tmp_path / 'small.toml'}: `model.sources` must be 0")


def test_with_value_reports_for_continue():
    config = d3_config()
    assert search.with_value(config, "model.beta", 2.0).model.beta == 2.0
    with pytest.raises(ConfigError, match=r"^--continue: `factor\.slope` must be left out when"):
        search.with_value(config, "factor.slope", 2.0)
    with pytest.raises(ConfigError, match=r"^--continue: `model\.sources` must be 0 \(held sources"):
        search.with_value(config, "model.sources", 1.0)  # an integral value for an integer key
