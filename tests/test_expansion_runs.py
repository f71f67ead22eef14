"""The expansion wired in: ``make_vector_field(..., interaction=...)`` (validated once, "auto" by the
cost model, picklable), the config keys ``solver.interaction`` / ``solver.tolerance``, the path and
rank recorded in ``metrics.json``, bad combinations as one line and exit 2 at the CLI, and
trajectories of the paper's experiments that match the exact path."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.config import apply_overrides, config_from_dict
from attnflow.numerics import dynamics, expansion
from attnflow.numerics.solve import solve
from attnflow.workflows.build import build
from attnflow.workflows.experiments import load_experiments

SMALL = """
[model]
n = 16
d = 3
[aux]
kind = "positions"
[gauge]
kind = "rope"
[factor]
kind = "distance_bias"
[solver]
dt = 0.05
t_end = 1.0
save_every = 0.5
"""


def _kernel(n: int, d: int = 3, *, factor: str = "none", beta: float = 1.0) -> Kernel:
    positions = jnp.arange(n) / n
    chosen = {  # built only for the kind asked for (the matrix of ones at n = 16384 would be 2 GiB)
        "none": lambda: factors.NoFactor(n=n),
        "toeplitz": lambda: factors.ToeplitzCos(xi=positions, omega=jnp.asarray(3.0)),
        "matrix": lambda: factors.make_matrix_factor(np.ones((n, n)), n=n),
    }[factor]()
    gauge = gauges.make_rope(np.arange(n), d, gauges.rope_frequencies(d, kind=[0.3]))
    return Kernel(gauge=gauge, factor=chosen, profile=make_profile("exp", beta=beta))


@pytest.mark.parametrize("factor", ["none", "toeplitz"])
@pytest.mark.parametrize("value", ["gradient", "logits_only"])
def test_expansion_field_matches_the_exact_field_within_the_tolerance(factor, value):
    kernel = _kernel(200, factor=factor)
    x = sphere.sample_uniform(jax.random.key(1), 200, 3)
    exact = dynamics.make_vector_field(kernel, value=value)
    field = dynamics.make_vector_field(kernel, value=value, interaction="expansion", tolerance=1e-10)
    assert (field.interaction, exact.interaction) == ("expansion", "exact")
    assert exact.rank is None and field.rank == expansion.expansion_rank(3, 1.0, 1e-10)
    scale = float(kernel.profile.scale)  # the field's scale: φ'(1) max|y|, |y| = 1
    difference = jax.jit(lambda x: field(x) - exact(x))  # both paths in one compiled program
    error = float(jnp.max(jnp.abs(difference(x))))
    assert error <= 1e-10 * scale  # the requested tolerance, relative to the scale


@pytest.mark.slow
def test_expansion_field_pickles_and_evaluates_the_same():
    kernel = _kernel(64, factor="toeplitz")
    field = dynamics.make_vector_field(kernel, interaction="expansion", tolerance=1e-8)
    copy = pickle.loads(pickle.dumps(field))
    x = sphere.sample_uniform(jax.random.key(2), 64, 3)
    assert (copy.interaction, copy.rank, copy.tolerance) == ("expansion", field.rank, 1e-8)
    np.testing.assert_array_equal(np.asarray(copy(x)), np.asarray(field(x)))  # the same computation


@pytest.mark.slow
def test_auto_follows_the_cost_model():
    small, large = _kernel(64), _kernel(16384)
    options = dict(normalization="usa", causal=False, tolerance=1e-8)
    assert not expansion.prefer_expansion(small, 3, **options)
    assert expansion.prefer_expansion(large, 3, **options)
    assert dynamics.make_vector_field(small, interaction="auto", tolerance=1e-8).interaction == "exact"
    chosen = dynamics.make_vector_field(large, interaction="auto", tolerance=1e-8)
    assert (chosen.interaction, chosen.rank) == ("expansion", expansion.expansion_rank(3, 1.0, 1e-8))
    matrix = dynamics.make_vector_field(_kernel(4096, factor="matrix"), interaction="auto")
    assert matrix.interaction == "exact"  # no low-rank label structure: the exact path, never an error


def test_bad_combinations_are_value_errors_at_creation():
    with pytest.raises(ValueError, match=r"expansion: `factor` must be none, distance_bias or toeplitz_cos"):
        dynamics.make_vector_field(_kernel(16, factor="matrix"), interaction="expansion")
    with pytest.raises(ValueError, match=r"expansion: `d` must be small enough for the tolerance"):
        dynamics.make_vector_field(_kernel(16, d=12, beta=9.0), interaction="expansion", tolerance=1e-13)
    with pytest.raises(ValueError, match=r"dynamics: `interaction` must be one of .*; got 'fast'"):
        dynamics.make_vector_field(_kernel(16), interaction="fast")
    with pytest.raises(ValueError, match=r"dynamics: `tolerance` must be in \(0, 1\); got 0.0"):
        dynamics.make_vector_field(_kernel(16), interaction="expansion", tolerance=0.0)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.slow
def test_metrics_record_the_path_that_ran_and_its_rank(config_file, tmp_path):
    runs = {}
    for interaction in ("exact", "expansion"):
        out = tmp_path / interaction
        result = _invoke(
            "run", str(config_file), "--out", str(out), "--set", f'solver.interaction="{interaction}"'
        )
        assert result.exit_code == 0, result.output
        runs[interaction] = json.loads((out / "metrics.json").read_text())
    assert runs["exact"]["run"]["interaction"] == "exact" and runs["exact"]["run"]["rank"] is None
    assert runs["expansion"]["run"]["interaction"] == "expansion"
    default_rank = expansion.expansion_rank(3, 1.0, 1e-10)  # at the default tolerance
    assert runs["expansion"]["run"]["rank"] == default_rank
    # both paths integrate the same dynamics: the energies agree to the tolerance's order
    assert abs(runs["exact"]["energy"] - runs["expansion"]["energy"]) < 1e-9


def test_a_matrix_factor_with_the_expansion_exits_2_in_one_line(config_file, tmp_path):
    np.save(tmp_path / "w.npy", np.ones((16, 16)))
    sets = ["factor.kind=file", f"factor.path={tmp_path / 'w.npy'}", 'solver.interaction="expansion"']
    out = tmp_path / "run"
    result = _invoke("run", str(config_file), "--out", str(out), *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "solver.interaction" in message and "factor.kind" in message and "'expansion'" in message
    assert not out.exists()


def test_a_dimension_too_large_for_the_tolerance_exits_2_in_one_line(config_file, tmp_path):
    sets = ["model.d=12", "model.beta=9", "gauge.kind=none", "factor.kind=none", "aux.kind=none",
            'solver.interaction="expansion"', "solver.tolerance=1e-13"]  # fmt: skip
    out = tmp_path / "run"
    result = _invoke("run", str(config_file), "--out", str(out), *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "`solver.interaction` = 'expansion'" in message and "`d` must be small enough" in message
    assert not out.exists()


@pytest.mark.parametrize("key,value", [("solver.interaction", '"fast"'), ("solver.tolerance", "1.5")])
def test_bad_solver_options_exit_2_naming_the_key(config_file, tmp_path, key, value):
    result = _invoke("run", str(config_file), "--out", str(tmp_path / "run"), "--set", f"{key}={value}")
    assert result.exit_code == 2, result.output
    assert key in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _paper_config(experiment_id: str, variant_index: int, n: int, interaction: str):
    experiment = load_experiments([experiment_id])[0]
    variant = experiment.variants[variant_index]
    overrides = [f"model.n={n}", *variant.overrides, f'solver.interaction="{interaction}"']
    return config_from_dict(apply_overrides(experiment.config, overrides), where=experiment_id)


@pytest.mark.slow
@pytest.mark.parametrize("experiment_id,variant_index", [("E1", 0), ("E1", 1), ("E2", 0)])
def test_paper_trajectories_match_the_exact_path(experiment_id, variant_index):
    finals = {}
    for interaction in ("exact", "expansion"):
        sim = build(_paper_config(experiment_id, variant_index, 256, interaction))
        assert sim.interaction == interaction
        trajectory = solve(sim.field, sim.x0, integrator=sim.integrator, dt=sim.dt, t_end=sim.t_end,
                           save_every=sim.save_every)  # fmt: skip
        assert trajectory.status == "ok" and trajectory.ts[-1] == pytest.approx(20.0)
        finals[interaction] = np.asarray(trajectory.xs[-1])
    # field errors of 1e-10 of its scale per step, integrated over tau = 20 of a contracting flow
    assert np.max(np.abs(finals["expansion"] - finals["exact"])) <= 1e-8
