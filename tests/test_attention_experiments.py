"""The attention experiments of the reproduction (E10-E13) pass, and each fails for a simulator that
ignores the part it tests (the quick settings, in this process).

A mutant is a :class:`~attnflow.numerics.heads_field.HeadsField` whose dynamics (``field(x)``) drop
one part of the layer, while its energy and its ``gradient_flow`` flag stay those of the layer as
configured: the experiments must notice the wrong motion itself, not a flag. It replaces the field
class that ``build`` constructs, so every job really runs it; the field's class is part of its
program's key (:func:`attnflow.numerics.program_cache.split_field`), so no program compiled for the
real layer can stand in for it.
"""

import dataclasses

import jax.numpy as jnp
import pytest

from attnflow.numerics import program_cache
from attnflow.numerics.heads_field import HeadsField
from attnflow.workflows import build as build_module
from attnflow.workflows import experiments as experiment_files
from attnflow.workflows import reproduce
from attnflow.workflows.reproduce_measure import LAYER_METRICS, is_layer, layer_values

LAYER_EXPERIMENTS = ("E10", "E11", "E12", "E13")


def _identity_maps(head):
    d_h, d = head.query.shape
    eye = jnp.eye(d_h, d, dtype=head.query.dtype)
    return dataclasses.replace(head, query=eye, key=eye, value=eye, output=eye.T)


def _swapped_values(head):
    return dataclasses.replace(head, values="plain" if head.values == "rotated" else "rotated")


# what each mutant's dynamics leave out: (field options, map of each head)
MUTATIONS = {
    "mask ignored": ({"causal": False}, None),
    "sources ignored": ({"sources": 0}, None),
    "maps ignored (identity maps)": ({}, _identity_maps),
    "values ignored (plain <-> rotated)": ({}, _swapped_values),
}


def make_mutant(name: str) -> type:
    options, per_head = MUTATIONS[name]

    class Mutant(HeadsField):
        def __call__(self, x):
            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(HeadsField)}
            heads = self.heads if per_head is None else tuple(map(per_head, self.heads))
            wrong = HeadsField(**(fields | options | {"heads": heads}))
            return HeadsField.__call__(wrong, x)

    Mutant.__name__ = Mutant.__qualname__ = f"Mutant[{name}]"
    return Mutant


def _run(ids, variants=None):
    """Results and expectation rows of the quick jobs of ``ids`` (``variants``: only those)."""
    experiments = experiment_files.load_experiments(ids)
    jobs = reproduce.plan(experiments, quick=True)
    jobs = [j for j in jobs if variants is None or j.variant.name in variants]
    results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=1)
    rows = []
    for experiment in experiments:
        rows += experiment_files.evaluate(experiment, [r for r in results if r.experiment == experiment.id])
    return results, rows


def _failed(rows, experiment, variant):
    return [r["metric"] for r in rows if r["experiment"] == experiment and r["variant"] == variant
            and r["status"] == "FAIL"]  # fmt: skip


@pytest.fixture(scope="module")
def honest():
    return _run(LAYER_EXPERIMENTS)


def test_the_attention_experiments_are_packaged():
    ids = experiment_files.experiment_ids()
    assert set(LAYER_EXPERIMENTS) <= set(ids)
    assert ids.index("E13") > ids.index("E9")  # after the paper's, in the report's order


@pytest.mark.slow
def test_every_attention_experiment_passes_with_the_real_layer(honest):
    results, rows = honest
    assert all(r.status == "ok" for r in results), [(r.label, r.status, r.reason) for r in results]
    assert {r["experiment"] for r in rows} == set(LAYER_EXPERIMENTS)
    failing = [(r["experiment"], r["variant"], r["text"], r["measured"]) for r in rows]
    assert not [row for row, r in zip(failing, rows, strict=True) if r["status"] != "PASS"]


@pytest.mark.slow
def test_the_layers_are_measured_with_their_own_energy_and_flag(honest):
    """The heads' energy (not the identity kernel's) and the field's gradient_flow reach the rows."""
    results, _ = honest
    by_label = {r.label: r for r in results}
    shared = by_label["E11 (a) shared W"].values[0]
    gaussian = by_label["E11 (b) Gaussian maps"].values[0]
    assert shared["final"]["gradient_flow"] is True and gaussian["final"]["gradient_flow"] is False
    # E of W x, not of x: the identity kernel's energy of a state on the axis would be e^beta / 2
    assert shared["final"]["energy"] == pytest.approx(1.004, abs=0.01)
    assert shared["final"]["energy_gap"] is None  # no closed-form maximum for a layer
    causal = by_label["E10 (b) W_Q = W_K = I"].values[0]
    assert causal["final"]["gradient_flow"] is False and set(LAYER_METRICS) <= set(causal["final"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutant", "experiment", "variants", "claim"),
    [
        ("mask ignored", "E10", ("random", "identity", "strict"), "first_token_displacement"),
        ("sources ignored", "E12", ("",), "first_token_displacement"),
        ("maps ignored (identity maps)", "E11", ("gradient",), "qk_axis_alignment"),
        ("values ignored (plain <-> rotated)", "E13", ("",), "orbit_residual"),
    ],
)
def test_each_attention_experiment_fails_when_its_part_is_ignored(
    monkeypatch, honest, mutant, experiment, variants, claim
):
    mutant_class = make_mutant(mutant)
    monkeypatch.setattr(build_module, "HeadsField", mutant_class)
    job = reproduce.plan(experiment_files.load_experiments([experiment]), quick=True)[0]
    assert type(build_module.build(job.simulation_config()).field) is mutant_class  # what the jobs run
    results, rows = _run([experiment], variants)
    assert all(r.status == "ok" for r in results), [(r.label, r.status, r.reason) for r in results]
    for variant in variants:
        failed = _failed(rows, experiment, variant)
        assert claim in failed, f"{experiment} {variant}: {mutant} fails only {failed}"
        assert not _failed(honest[1], experiment, variant)  # the same rows pass with the real layer


def _config(eid: str, variant: str, n: int):
    experiment = experiment_files.load_experiments([eid])[0]
    return experiment.simulation_config(next(v for v in experiment.variants if v.name == variant), n)


def test_the_mutants_change_the_motion_not_the_flag():
    """A mutant keeps the configured layer's energy and gradient_flow: only ``field(x)`` is wrong."""
    config = _config("E10", "random", 16)
    real = build_module.build(config).field
    x = build_module.make_initial(config, real.heads[0].gauge, jnp.float64)
    for name in MUTATIONS:
        mutant = make_mutant(name)(**{f.name: getattr(real, f.name) for f in dataclasses.fields(HeadsField)})
        assert program_cache.split_field(mutant)[0] != program_cache.split_field(real)[0]  # its own program
        assert mutant.gradient_flow == real.gradient_flow
        assert float(mutant.energy(x)) == float(real.energy(x))
        moved = float(jnp.max(jnp.abs(mutant(x) - real(x))))
        if name in ("mask ignored", "maps ignored (identity maps)"):
            assert moved > 1e-3, name  # E10 is causal with random W_Q, W_K: these parts act
        else:
            assert moved == 0.0, name  # no sources, no gauge: plain and rotated values agree


def test_layer_values_measure_the_first_token_and_the_logit_axis():
    real = build_module.build(_config("E12", "", 4)).field
    assert is_layer(real)
    x = jnp.asarray([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0], [0.6, 0.8, 0.0]])
    values = layer_values(real, x, jnp.asarray([0.0, 1.0, 0.0]), jnp.asarray([0.0, 0.0, 1.0]))
    assert values["first_token_distance"] == pytest.approx(2.0**0.5)  # |e_3 - e_2| (and |e_1 - e_2|)
    assert values["first_token_displacement"] == pytest.approx(2.0**0.5)
    assert values["qk_axis_alignment"] == 0.0  # e_1 is orthogonal to the axis e_3
    assert values["gradient_flow"] is True  # usa, no mask, identity maps (sources keep it one)


def test_a_layer_is_never_measured_from_the_paper_field_in_its_place():
    """Dense jobs have their kernel tabulated and their field rebuilt from it by reproduce (the
    paper's field): a layer solved that way is an error, never rows measured on the wrong field;
    a layer solved as built passes."""
    experiment = experiment_files.load_experiments(["E11"])[0]
    jobs = [j for j in reproduce.plan([experiment], quick=True, overrides=["solver.block_size=4096"])
            if j.variant.name == "gradient"]  # fmt: skip
    (result,) = reproduce.run_jobs(jobs, lambda units, stage=None: None)
    if result.status == "error":
        assert "solved as built" in result.reason and "solver.block_size" in result.reason
    else:  # reproduce solves layers as built: then the rows hold
        rows = experiment_files.evaluate(experiment, [result])
        assert result.status == "ok" and all(r["status"] == "PASS" for r in rows)


def test_random_qk_maps_are_random_logits_with_identity_values():
    from attnflow.core.heads import MAKERS, random_qk_maps
    from attnflow.io.config_rules import WEIGHT_MAKERS

    assert "random_qk" in WEIGHT_MAKERS and MAKERS["random_qk"] is random_qk_maps
    maps = random_qk_maps(3, 2, 4, 6, scale=2.0)
    assert {k: v.shape for k, v in maps.items()} == {
        "query": (2, 4, 6), "key": (2, 4, 6), "value": (2, 4, 6), "output": (2, 6, 4)
    }  # fmt: skip
    assert (maps["value"] == jnp.eye(4, 6)).all() and (maps["output"] == jnp.eye(6, 4)).all()
    assert not jnp.allclose(maps["query"], maps["key"])  # independent draws
    again = random_qk_maps(3, 2, 4, 6, scale=2.0)
    assert all((again[k] == maps[k]).all() for k in maps)  # seeded
    # entries N(0, scale^2 / d): 96 entries, the sample std within 25% (a 3-sigma band is ~22%)
    std = float(jnp.std(jnp.concatenate([maps["query"].ravel(), maps["key"].ravel()])))
    assert abs(std - 2.0 / 6**0.5) < 0.25 * 2.0 / 6**0.5
    field = build_module.build(_config("E10", "random", 8)).field
    assert not field.gradient_flow and (field.heads[0].value == jnp.eye(3)).all()
