"""Two-sample rows: E0's collapse times, and E1's gauge collapse times (equal in law by conjugacy),
against a reference sample of E0's collapse times on seeds 1000-1039 stored in E0.toml; the sample
is what the real simulator gives, the row fails a clock at double speed, and its power is as stated."""

import dataclasses
import types

import numpy as np
import pytest

import mutants
from attnflow.io.config_errors import ConfigError
from attnflow.workflows import experiments, reproduce, reproduce_reference
from attnflow.workflows.reproduce_plan import plan

LEVEL = 0.01  # the rows' level (E0.toml, E1.toml)


def _e0():
    (experiment,) = experiments.load_experiments(["E0"])
    return experiment


def _row(experiment, result):
    rows = [r for r in experiments.evaluate(experiment, [result]) if r["scope"] == "two-sample"]
    assert len(rows) == 1
    return rows[0]


def test_the_sample_is_the_real_simulator_and_the_row_fails_a_clock_at_double_speed():
    """One job of E0 at n = 64 with seeds 0-9 and two seeds of the sample: the sample's values are
    the simulator's (to round-off of the saved times), the seeds 0-9 pass the row; the same seeds with
    the field times 2 (every collapse time halved) fail it."""
    experiment = _e0()
    sample = experiment.reference["E0.collapse_time"]
    assert sample.seeds == (1000, 1039) and set(sample.values) == set(experiment.sizes)
    (job,) = plan([experiment], quick=True)
    job = dataclasses.replace(job, seeds=(*range(10), 1000, 1001))
    result = reproduce.run_job(job, lambda units, stage=None: None)
    times = [v["final"]["collapse_time"] for v in result.values]
    np.testing.assert_allclose(times[10:], sample.values[64][:2], rtol=0, atol=1e-9)  # saved times k * 0.1
    real = dataclasses.replace(result, seeds=job.seeds[:10], values=result.values[:10])
    row = _row(experiment, real)
    assert row["status"] == "PASS" and row["measured"] >= 0.1  # 0.43 measured
    first_ten = dataclasses.replace(job, seeds=job.seeds[:10])
    with mutants.installed("time x 2"):
        wrong = reproduce.run_job(first_ten, lambda units, stage=None: None)
    halved = [v["final"]["collapse_time"] for v in wrong.values]
    np.testing.assert_allclose(halved, np.asarray(times[:10]) / 2, atol=0.1 + 1e-9)  # one saved time apart
    row = _row(experiment, wrong)
    assert row["status"] == "FAIL" and row["measured"] < 1e-4


def test_the_rows_have_the_power_they_state():
    """Against every time scaled by 0.5 or 2 (the clock x 2 or x 0.5), drawn from the sample's own law:
    power 1 at the full run's 10 seeds, at least 0.8 at the quick run's 3, at every size; and the
    row rejects the sample's own law at most at its level."""
    sample = _e0().reference["E0.collapse_time"]
    for n, values in sample.values.items():
        cases = ((10, 0.5), (10, 2.0), (10, 1.0), (3, 0.5), (3, 2.0))  # (seeds, every time times this)
        power = {case: reproduce_reference.power(values, *case, level=LEVEL, t_max=20.0, draws=200)
                 for case in cases}  # fmt: skip
        assert min(power[10, 0.5], power[10, 2.0]) >= 0.99, n
        assert min(power[3, 0.5], power[3, 2.0]) >= 0.8, n  # 0.85-1.0 measured with 1000 draws
        assert power[10, 1.0] <= LEVEL, n


def test_a_size_without_a_sample_is_skipped_and_a_missing_value_fails():
    experiment = _e0()

    def job(n, times):
        values = [{"seed": s, "final": {"collapse_time": t}} for s, t in enumerate(times)]
        return types.SimpleNamespace(n=n, variant="", status="ok", reason="", values=values)

    reference = experiment.reference["E0.collapse_time"].values[64]
    assert _row(experiment, job(512, reference[:3]))["status"] == "SKIP"
    assert _row(experiment, job(64, reference[:10]))["status"] == "PASS"
    assert _row(experiment, job(64, [*reference[:9], None]))["status"] == "FAIL"  # a seed never collapsed
    assert experiments.two_sample_p([1.0, 2.0], [1.0, 2.0]) == 1.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ('reference = "E0.collapse_time"\n', "exactly when `scope` = 'two-sample'"),
        ('scope = "two-sample"\nreference = "E0.nothing"\n', "of a \\[reference.<name>\\] table"),
        ('scope = "two-sample"\nreference = "E9.collapse_time"\n', "of a \\[reference.<name>\\] table"),
        ('scope = "two-sample"\n', "exactly when `scope` = 'two-sample'"),
    ],
)
def test_bad_two_sample_rows_are_refused_in_one_line(tmp_path, change, message):
    text = (experiments._experiments_folder() / "E0.toml").read_text()
    head = '[[expect]]\ntext = "n_eff = 1 at tau = 20"\n'
    assert head in text
    path = tmp_path / "E1.toml"  # another id: E0.toml of the same folder is looked up
    (tmp_path / "E0.toml").write_text(text)
    path.write_text(text.replace('id = "E0"', 'id = "E1"').replace(head, head + change))
    with pytest.raises(ConfigError, match=message) as caught:
        experiments.load_experiment(path)
    assert "\n" not in str(caught.value)


def test_a_sample_needs_one_value_per_seed_and_every_size(tmp_path):
    text = (experiments._experiments_folder() / "E0.toml").read_text()
    path = tmp_path / "E0.toml"
    path.write_text(text.replace("seeds = [1000, 1039]", "seeds = [1000, 1040]"))
    with pytest.raises(ConfigError, match="one value per seed of `seeds` \\(41"):
        experiments.load_experiment(path)
    start = text.index("\n256 = [")
    path.write_text(text[:start] + "\n")
    with pytest.raises(ConfigError, match="values at every size \\(\\[256\\] missing\\)"):
        experiments.load_experiment(path)
