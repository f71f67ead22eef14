"""The mutation test of the reproduction (issue 25): every wrong simulator of :mod:`mutants` (the
sign, beta x 0.5 and x 2, the clock x 0.5 and x 2, the gauge ignored, the labels shuffled, Q^T for Q,
the values swapped, the factor ignored, the mask ignored, sa computed as usa, the expansion's
tolerance loosened, the layer norm dropped; and two mistakes of the build: a preset's RoPE scaling
ignored, beta = model.beta instead of gamma log n) fails at least one row of every experiment in
which it can act, at the quick sizes; the cells where it cannot act, or acts without a trace in law, are the
ones listed in :data:`mutants.CANNOT_ACT` and :data:`mutants.BLIND` (docs/mutants.md gives the
reasons).

The table is computed once (one test); in each cell the mutant's jobs run one at a time
and stop at the first failing row. scripts/mutants_table.py writes the same table at full size.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import mutants
from attnflow.numerics import program_cache
from attnflow.workflows import build as build_module
from attnflow.workflows import experiments as experiment_files
from attnflow.workflows import reproduce


@pytest.mark.slow
def test_each_mutant_fails_a_row_of_every_experiment_where_it_can_act():
    """Every mutant against every experiment at quick sizes, in one test (the table is computed
    once: split over tests, each test worker would compute it again). Where a mutant cannot act
    (the part it changes is not in the field) and where it acts without a trace in law (not run
    here; scripts/mutants_table.py runs them): exactly the listed cells."""
    # the blind cells (no failure to find: every acting job would run) are the script's to show
    cells = mutants.table(experiment_files.load_experiments(), quick=True, skip=mutants.BLIND)
    unexplained = [key for key, (status, _) in cells.items() if status == "PASS" and key not in mutants.BLIND]
    assert not unexplained, f"every row passes for (mutant, experiment) in {unexplained}"
    cannot = {key for key, (status, _) in cells.items() if status == "cannot act"}
    assert cannot == set(mutants.CANNOT_ACT)
    assert {key for key, (status, _) in cells.items() if status == "not run"} == set(mutants.BLIND)
    assert not set(mutants.CANNOT_ACT) & set(mutants.BLIND)
    assert {name for name, _ in cells} == set(mutants.MUTANTS)  # every mutant was tried


def _paper_job(eid: str, variant: str = ""):
    jobs = reproduce.plan(experiment_files.load_experiments([eid]), quick=True)
    return next(j for j in jobs if j.variant.name == variant)


def test_a_mutant_is_its_own_program_and_moves_otherwise():
    """Each mutant of the paper's field (as reproduce solves it: tabulated) has its own compiled
    program (its class is in the key) and a field that differs where it can act."""
    job = _paper_job("E1", "a")
    config = job.simulation_config()
    sim = reproduce._tabulated_kernel(build_module.build(config), config)
    x = jnp.asarray(build_module.make_initial(config, sim.kernel.gauge, sim.x0.dtype))
    real_key = program_cache.split_field(sim.field)[0]
    for name in ("sign flipped", "beta x 0.5", "time x 2", "gauge ignored", "labels shuffled", "Q^T for Q",
                 "values swapped"):  # fmt: skip
        wrong = mutants.mutant(sim.field, name)
        # the mutants that differ by a number share a class (the number a leaf): clock, beta
        assert type(wrong).__name__ == f"Mutant[{mutants._SHARED.get(name, name)}]"
        wrong_key, wrong_leaves = program_cache.split_field(wrong)
        assert wrong_key != real_key
        # a pytree like the real field: its arrays are arguments, so every run of one structure shares
        # one program (as a leaf, each instance was its own program, with the arrays as constants)
        assert wrong_leaves and program_cache.split_field(mutants.mutant(sim.field, name))[0] == wrong_key
        assert mutants.acts(sim.field, name) and mutants.changes(sim.field, name, x), name
    # sign flipped and time x 2: one program (the same key), their own number as an argument
    flipped, doubled = (
        program_cache.split_field(mutants.mutant(sim.field, n)) for n in ("sign flipped", "time x 2")
    )
    assert flipped[0] == doubled[0] and (float(flipped[1][-1]), float(doubled[1][-1])) == (-1.0, 2.0)
    np.testing.assert_array_equal(mutants.mutant(sim.field, "sign flipped")(x), -sim.field(x))
    # no factor, no mask, usa, exact, post-LN: these cannot act on E1 (the field is the real one)
    for name in ("factor ignored", "causal ignored", "sa as usa", "expansion loosened", "layer norm dropped"):
        assert not mutants.acts(sim.field, name) and not mutants.changes(sim.field, name, x), name
        assert float(jnp.max(jnp.abs(mutants.mutant(sim.field, name)(x) - sim.field(x)))) == 0.0


def test_cannot_act_means_the_same_field():
    """Where ``acts`` says a mutant cannot act (E0: no gauge, no factor, no mask), its field is the
    real one at the initial state, to the last bit."""
    job = _paper_job("E0")
    config = job.simulation_config()
    sim = reproduce._tabulated_kernel(build_module.build(config), config)
    x = jnp.asarray(build_module.make_initial(config, sim.kernel.gauge, sim.x0.dtype))
    quiet = [name for name in mutants.MUTANTS if not mutants.acts(sim.field, name)]
    assert set(quiet) == {"gauge ignored", "labels shuffled", "Q^T for Q", "values swapped", "factor ignored",
                          "causal ignored", "sa as usa", "expansion loosened", "layer norm dropped",
                          *mutants.BUILD_MUTANTS}  # fmt: skip
    for name in quiet:
        assert not mutants.changes(sim.field, name, x), name


def test_the_mutant_field_is_the_wrong_model():
    """beta x 2 is the field of the kernel with beta doubled; time x 0.5 is half the field."""
    job = _paper_job("E0")
    config = job.simulation_config()
    sim = build_module.build(config)
    x = jnp.asarray(build_module.make_initial(config, sim.kernel.gauge, sim.x0.dtype))
    profile = dataclasses.replace(sim.kernel.profile, beta=2 * sim.kernel.profile.beta)
    doubled = dataclasses.replace(sim.kernel, profile=profile)
    expected = dataclasses.replace(sim.field, kernel=doubled)(x)
    np.testing.assert_allclose(mutants.mutant(sim.field, "beta x 2")(x), expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(mutants.mutant(sim.field, "time x 0.5")(x), 0.5 * sim.field(x), rtol=0, atol=0)


def test_the_build_mutants_act_where_the_build_changes():
    """The cheap pass records a build mutant on the jobs whose build it changes (E17: the preset's
    scaling on (a), gamma log n on (b)) and nowhere in E0 (no preset, beta as given)."""
    jobs = reproduce.plan(experiment_files.load_experiments(["E0", "E17"]), quick=True)
    where = mutants.acting(jobs, list(mutants.BUILD_MUTANTS))
    acted = {key for key, acts in where.items() if acts}
    sizes = experiment_files.load_experiments(["E17"])[0].quick.sizes
    expected = {("preset scaling ignored", ("E17", "llama3.1", n)) for n in sizes}
    expected |= {("beta fixed instead of scaled", ("E17", "log_n", n)) for n in sizes}
    assert acted == expected


def test_installed_replaces_every_solve_and_restores_it():
    import attnflow.numerics.solve as solve_module

    original = solve_module.solve
    with mutants.installed("sign flipped") as record:
        assert reproduce.solve is not original and solve_module.solve is not original
        assert record == {}
    assert reproduce.solve is original and solve_module.solve is original
