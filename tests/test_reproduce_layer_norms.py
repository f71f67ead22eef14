"""E15, the layer-norm experiment of the reproduction: every row passes with the real layer norms
(its quick run is its full run: n = 4, one deterministic state), the values it names are measured
where they exist (radii for pre and peri, the orbit's distance with a gauge), the layer norm comes
from the experiment file only (another set by overrides is refused in one line), and equiangular
data are made in the gauge frame. The mutants that drop the layer norm, or get beta or the clock
wrong, fail it: tests/test_mutants.py (slow)."""

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.numerics.layer_norms import LayerNormField
from attnflow.workflows import build as build_module
from attnflow.workflows import experiments as experiment_files
from attnflow.workflows import reproduce

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutants  # noqa: E402

RADIAL = ("pre", "peri", "rope_pre", "rope_peri")
GAUGED = ("rope_post", "rope_pre", "rope_peri", "rope_ngpt")


@pytest.fixture(scope="module")
def e15():
    experiment = experiment_files.load_experiments(["E15"])[0]
    jobs = reproduce.plan([experiment], quick=True)
    results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=1)
    return experiment, jobs, results


def test_every_row_of_e15_passes_with_the_real_layer_norms(e15):
    experiment, _, results = e15
    assert all(r.status == "ok" for r in results), [(r.label, r.status, r.reason) for r in results]
    rows = experiment_files.evaluate(experiment, results)
    failing = [(r["variant"], r["text"], r["measured"]) for r in rows if r["status"] != "PASS"]
    assert not failing
    assert {r["variant"] for r in rows} == {v.name for v in experiment.variants}


def test_e15_measures_radii_and_the_orbit_where_they_exist(e15):
    _, jobs, results = e15
    for job, result in zip(jobs, results, strict=True):
        late = result.values[0]["t=8"]
        name = job.variant.name
        assert (late["equiangular_radius_error"] is not None) == (name in RADIAL), name
        assert (late["equiangular_orbit_error"] is not None) == (name in GAUGED), name
        if name in RADIAL:  # the radii grew (pre: like e t, peri: like t), every token alike
            assert late["mean_radius"] > 8.0
        else:
            assert late["mean_radius"] is None
        assert late["equiangular_error"] < 1e-10


def test_the_norms_collapse_at_their_own_speeds(e15):
    """At τ = 8 post and nGPT have collapsed (1 − ρ below 1e-12), pre and peri not (t^-2: above 1e-3),
    with or without the gauge (the same ODE in the gauge frame)."""
    _, jobs, results = e15
    deficit = {
        job.variant.name: 1.0 - r.values[0]["t=8"]["gauge_mean_cosine"]
        for job, r in zip(jobs, results, strict=True)
    }
    for name in ("post", "ngpt", "rope_post", "rope_ngpt"):
        assert deficit[name] < 1e-12, name
    for name in RADIAL:
        assert deficit[name] > 1e-3, name
    assert deficit["rope_pre"] == pytest.approx(deficit["pre"], abs=1e-10)


def test_a_layer_norm_set_by_overrides_is_refused_in_one_line():
    """reproduce runs a layer norm that an experiment file sets (E15); an override that sets one on
    a post-LN experiment is refused by ``build`` (the job is an error naming the key)."""
    experiment = experiment_files.load_experiments(["E14"])[0]
    job = reproduce.plan([experiment], quick=True, overrides=['model.layer_norm="pre"'])[0]
    result = reproduce.run_job(job, lambda units, stage=None: None)
    assert result.status == "error"
    assert "`model.layer_norm` must be 'post' here" in result.reason and "\n" not in result.reason


def test_equiangular_data_are_made_in_the_gauge_frame():
    experiment = experiment_files.load_experiments(["E15"])[0]
    job = next(j for j in reproduce.plan([experiment], quick=True) if j.variant.name == "rope_pre")
    config = job.simulation_config()
    sim = build_module.build(config, layer_norms=True)
    assert isinstance(sim.field, LayerNormField) and sim.field.kind == "pre" and sim.radial
    x = np.asarray(sim.x0)
    q = np.asarray(sim.kernel.gauge.matrices())
    u = np.einsum("nij,nj->ni", q, x)
    off = ~np.eye(len(x), dtype=bool)
    np.testing.assert_allclose((u @ u.T)[off], 0.1, rtol=0, atol=1e-14)  # the Cholesky construction
    assert np.ptp((x @ x.T)[off]) > 0.1  # the content itself is not equiangular


def test_the_tabulated_simulation_keeps_the_layer_norm():
    """reproduce solves every kernel as matrices: the layer norm stays around the tabulated field,
    whose velocity is the built one's to round-off."""
    experiment = experiment_files.load_experiments(["E15"])[0]
    for job in reproduce.plan([experiment], quick=True):
        config = job.simulation_config()
        sim = build_module.build(config, layer_norms=True)
        tabulated = reproduce._tabulated_kernel(sim, config)
        z = jnp.asarray(sim.x0) * (1.5 if sim.radial else 1.0)
        if config.model.layer_norm == "post":
            assert not isinstance(tabulated.field, LayerNormField)
        else:
            assert (tabulated.field.kind, tabulated.field.alpha) == (sim.field.kind, sim.field.alpha)
        np.testing.assert_allclose(tabulated.field(z), sim.field(z), rtol=0, atol=1e-15)


def test_layer_norm_dropped_runs_post_ln_in_the_state_s_coordinates():
    """The mutant "layer norm dropped": under nGPT it is the layer's own (post-LN) field; under pre
    and peri (state ``z = r x``) the direction moves as under post-LN and the radius stays."""
    experiment = experiment_files.load_experiments(["E15"])[0]
    for job in reproduce.plan([experiment], quick=True):
        config = job.simulation_config()
        sim = build_module.build(config, layer_norms=True)
        wrong = mutants.mutant(sim.field, "layer norm dropped")
        if not isinstance(sim.field, LayerNormField):  # post-LN: it cannot act
            assert not mutants.acts(sim.field, "layer norm dropped")
            continue
        assert mutants.acts(sim.field, "layer norm dropped")
        assert mutants.changes(sim.field, "layer norm dropped", sim.x0)
        x = jnp.asarray(sim.x0)
        post = np.asarray(sim.field.layer(x))
        v = np.asarray(wrong(2.0 * x if sim.radial else x))
        if sim.radial:
            np.testing.assert_allclose(np.sum(v * np.asarray(x), axis=1), 0.0, atol=1e-15)  # dr/dt = 0
            np.testing.assert_allclose(v / 2.0, post, rtol=0, atol=1e-15)  # dx/dt = (P v)/r = P_x A
        else:
            np.testing.assert_allclose(v, post, rtol=0, atol=0)
