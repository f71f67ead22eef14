"""E17, the long-context experiment of the reproduction: its bounds are the closed forms of what the
configuration promises (the orbit of a preset's scaled RoPE frequencies; the equiangular ODE at
beta = gamma log n), computed here without the build; every row passes with the real build, and
the two mistakes of the build (tests/mutants.py BUILD_MUTANTS: the preset's scaling rule dropped,
beta = model.beta instead of gamma log n) each fail the rows that pin them, by orders of magnitude
more than their tolerance."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from attnflow.analysis import theory
from attnflow.core import gauges, rope_presets, sphere
from attnflow.workflows import experiments as experiment_files
from attnflow.workflows import reproduce

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutants  # noqa: E402


def _experiment():
    return experiment_files.load_experiments(["E17"])[0]


def _pinned(experiment, variant: str) -> list:
    """The rows of ``variant`` that compare the mean cosine with a number of the closed form."""
    return [e for e in experiment.expect if e.metric == "mean_cosine" and e.variants == (variant,)]


def _orbit_mean_cosine(config, freqs: np.ndarray) -> float:
    """The content's mean cosine on the orbit ``x_i = Q(ξ_i)ᵀ u*``, ``u*`` the normalised centroid of
    the equiangular initial gauge frame (it never moves: every permutation of the tokens is a symmetry)."""
    n, d = config.model.n, config.model.d
    u = np.asarray(sphere.equiangular(n, d, config.init.rho0))
    u_star = u.sum(axis=0) / np.linalg.norm(u.sum(axis=0))
    xi = np.arange(n) * float(config.aux.spacing)
    layout = rope_presets.get_preset(config.gauge.preset).layout
    q = np.asarray(gauges.make_rope(xi, d, freqs, layout=layout).matrices())
    x = np.einsum("nji,j->ni", q, u_star)
    m = x.mean(axis=0)
    return float((n * m @ m - 1.0) / (n - 1))


def test_the_bounds_are_the_closed_forms_of_the_configuration():
    """(a) the orbit of the preset's scaled frequencies; (b) rho(t) at beta = gamma log n. A build that
    drops either gives a value at least 1e4 tolerances away."""
    experiment = _experiment()
    variants = {v.name: v for v in experiment.variants}
    rows = _pinned(experiment, "llama3.1")
    assert {row.sizes for row in rows} == {(n,) for n in experiment.sizes}
    for row in rows:
        config = experiment.simulation_config(variants["llama3.1"], row.sizes[0])
        preset = rope_presets.get_preset(config.gauge.preset)
        assert preset.scaling is not None and preset.scaling.rule == "llama3"
        assert row.at is None and row.op == "~="  # the end state, tau = 8: 1 - rho below 1e-16
        expected = _orbit_mean_cosine(config, rope_presets.scaled_frequencies(preset))
        unscaled = _orbit_mean_cosine(config, rope_presets.base_frequencies(preset))
        assert row.bound == pytest.approx(expected, abs=1e-14)  # the angles' round-off
        assert abs(unscaled - row.bound) > 1e4 * row.tol, row.text
    rows = _pinned(experiment, "log_n")
    assert {row.sizes for row in rows} == {(n,) for n in experiment.sizes}
    for row in rows:
        config = experiment.simulation_config(variants["log_n"], row.sizes[0])
        model = config.model
        assert model.beta_scaling == "log_n"
        scaled, fixed = (
            theory.equiangular_rho([row.at], rho0=config.init.rho0, n=model.n, beta=beta)[0]
            for beta in (model.gamma * math.log(model.n), model.beta)
        )
        assert row.bound == pytest.approx(scaled, abs=1e-13)  # the ODE solved by DOP853 to 1e-13
        assert abs(fixed - row.bound) > 1e4 * row.tol, row.text


@pytest.fixture(scope="module")
def e17():
    experiment = _experiment()
    jobs = reproduce.plan([experiment], quick=True)
    return experiment, jobs


def _failing(experiment, results) -> set:
    rows = experiment_files.evaluate(experiment, results)
    return {(r["variant"], r["n"], r["metric"], r["at"]) for r in rows if r["status"] != "PASS"}


def test_every_row_of_e17_passes_with_the_real_build(e17):
    experiment, jobs = e17
    results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=1)
    assert all(r.status == "ok" for r in results), [(r.label, r.status, r.reason) for r in results]
    assert not _failing(experiment, results)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "variant", "times"),
    [
        ("preset scaling ignored", "llama3.1", {"final"}),
        ("beta fixed instead of scaled", "log_n", {"t=0.5", "t=1"}),
    ],
)
def test_each_build_mistake_fails_the_rows_that_pin_it(e17, name, variant, times):
    """Only the rows of the closed form of the configuration fail: the rest of the flow is the real
    flow of what the wrong build made (the gauge frame follows the ODE at the beta that ran)."""
    experiment, jobs = e17
    results, acted = mutants.run(name, [experiment], jobs)
    sizes = experiment.quick.sizes
    assert {label for label, acts in acted.items() if acts} == {("E17", variant, n) for n in sizes}
    assert _failing(experiment, results) == {(variant, n, "mean_cosine", at) for n in sizes for at in times}


def test_the_build_mutants_change_the_build_and_are_undone():
    from attnflow.workflows import build as build_module

    experiment = _experiment()
    variants = {v.name: v for v in experiment.variants}
    config = experiment.simulation_config(variants["log_n"], 32)
    preset = rope_presets.get_preset("llama3.1")
    real_beta, real_freqs = build_module.model_beta(config), rope_presets.scaled_frequencies(preset)
    assert real_beta == pytest.approx(0.5 * math.log(32))
    with mutants.installed("beta fixed instead of scaled"):
        assert build_module.model_beta(config) == config.model.beta == 1.0
        assert float(build_module.build(config).kernel.profile.beta) == 1.0
    with mutants.installed("preset scaling ignored"):
        np.testing.assert_array_equal(
            rope_presets.scaled_frequencies(preset), rope_presets.base_frequencies(preset)
        )
    assert build_module.model_beta(config) == real_beta
    np.testing.assert_array_equal(rope_presets.scaled_frequencies(preset), real_freqs)
