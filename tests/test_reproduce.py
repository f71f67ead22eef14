"""``attnflow reproduce``: experiment files, the generic evaluator, the report and the command line."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.config import ConfigError
from attnflow.io.outcomes import JobResult
from attnflow.viz import expectation_table
from attnflow.workflows import experiments, reproduce_plan
from attnflow.workflows.experiments import (
    Experiment,
    evaluate,
    experiment_ids,
    load_experiment,
    load_experiments,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "final_states",
    "mean_cosine",
    "energy",
    "metastability",
    "realisation_orbit",
    "realisation_sphere",
)  # no comparison.png: the report embeds each E*.png

TINY = """
id = "T0"
title = "tiny"
setting = "n = 8, tau = 1"
sizes = [8]
seeds = [0, 1]
report_times = [0.0]

[config.solver]
t_end = 1.0
save_every = 0.5

[[expect]]
text = "energy monotone"
metric = "energy_monotone"
op = "=="
bound = true

[[expect]]
text = "impossible: mean_cosine > 2"
metric = "mean_cosine"
op = ">"
bound = 2.0
"""


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _experiment(**changes) -> Experiment:
    data = {"id": "X", "title": "x", "setting": "x", "sizes": [8, 16], "seeds": [0, 1, 2],
            "expect": [{"text": "t", "metric": "mean_cosine", "op": ">=", "bound": 0.5}]}  # fmt: skip
    return Experiment.model_validate(data | changes)


def _job(
    n: int, values: list, *, variant: str = "", key: str = "mean_cosine", status: str = "ok"
) -> JobResult:
    per_seed = [{"seed": s, "final": {key: v, "bound": 1.0}} for s, v in enumerate(values)]
    return JobResult("X", variant, "X", n, tuple(range(len(values))), status, "", per_seed)


# --------------------------------------------------------------------------- experiment files


def test_every_packaged_experiment_loads_and_names_known_metrics():
    ids = experiment_ids()
    # the paper's experiments E0-E9, the attention layers' E10-E13 (docs/experiments-attention.md),
    # E14 the equiangular reduction, E15 the layer norms in it (docs/mutants.md), E16 the particles
    # against the mean-field density (docs/density.md), E17 long contexts (docs/experiments-attention.md)
    assert ids == [f"E{k}" for k in range(18)]
    loaded = load_experiments()
    assert [e.id for e in loaded] == ids
    reproduce_plan.plan(loaded)  # raises on an unknown metric name
    reproduce_plan.plan(loaded, quick=True)


def test_a_broken_experiment_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "T0.toml"
    path.write_text(TINY.replace('op = ">"', 'op = "=>"'))
    with pytest.raises(ConfigError, match=r"T0\.toml: `expect\.1\.op` must be"):
        load_experiment(path)
    path.write_text(TINY.replace("t_end = 1.0", "t_end = 1.2"))  # not a multiple of save_every
    with pytest.raises(ConfigError, match=r"T0\.toml: `solver\.t_end` must be a whole multiple"):
        load_experiment(path)
    path.write_text(TINY.replace('op = ">"', 'op = ">"\nvariants = ["nope"]'))
    with pytest.raises(ConfigError, match=r"`expect\.variants` must be names of \[\[variants\]\]"):
        load_experiment(path)


# --------------------------------------------------------------------------- the evaluator


def test_every_seed_scope_fails_on_one_seed_and_names_it():
    rows = evaluate(_experiment(), [_job(8, [0.9, 0.4, 0.7]), _job(16, [0.9, 0.8, 0.7])])
    assert [(r["n"], r["status"]) for r in rows] == [(8, "FAIL"), (16, "PASS")]
    assert rows[0]["failing_seeds"] == [1]
    assert rows[0]["measured"] == 0.4  # the worst seed for ">="
    assert rows[1]["measured"] == 0.7


def test_aggregate_scopes_median_count_and_some_size():
    median = {"text": "m", "metric": "mean_cosine", "op": "in", "bound": [5.0, 11.0], "scope": "median"}
    count = {"text": "c", "metric": "mean_cosine", "op": ">=", "bound": 2.0, "scope": "count",
             "min_count": 2, "across": "some size"}  # fmt: skip
    rows = evaluate(
        _experiment(expect=[median, count]), [_job(8, [4.0, 6.0, 20.0]), _job(16, [2.0, 3.0, 1.0])]
    )
    assert [(r["n"], r["measured"], r["status"]) for r in rows[:2]] == [(8, 6.0, "PASS"), (16, 2.0, "FAIL")]
    assert rows[2]["n"] == "some" and rows[2]["status"] == "PASS"
    assert rows[2]["measured"] == {"8": 3, "16": 2}


def test_bound_metric_tolerance_none_and_skipped_jobs():
    close = {"text": "a", "metric": "mean_cosine", "op": "~=", "bound_metric": "bound", "tol": 1e-3}
    below = {"text": "b", "metric": "mean_cosine", "op": "<=", "bound_metric": "bound", "tol": 1e-6}
    experiment = _experiment(expect=[close, below])
    rows = evaluate(experiment, [_job(8, [1.0005, 1.0, 1.0 + 1e-7]), _job(16, [1.0, None, 1.0])])
    by = {(r["text"], r["n"]): r for r in rows}
    assert by["a", 8]["status"] == "PASS" and by["b", 8]["status"] == "FAIL"  # 1.0005 > 1 + 1e-6
    assert by["a", 16]["status"] == "FAIL" and by["a", 16]["failing_seeds"] == [1]  # None never passes
    skipped = evaluate(_experiment(), [_job(8, [], status="skipped")])
    assert skipped[0]["status"] == "SKIP"


# --------------------------------------------------------------------------- command line


def test_bad_only_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "rep"
    result = invoke("reproduce", "--only", "E1,E41", "--out", str(out))
    assert result.exit_code == 2
    assert "`--only` must be a comma-separated list of experiment ids" in result.output
    assert "Did you mean 'E4'?" in result.output  # the closest packaged id (E0-E14)
    assert not out.exists()


def test_a_failing_expectation_exits_1_and_prints_the_row(tmp_path, monkeypatch):
    folder = tmp_path / "experiments"
    folder.mkdir()
    (folder / "T0.toml").write_text(TINY)
    monkeypatch.setattr(experiments, "_experiments_folder", lambda: folder)
    out = tmp_path / "rep"
    result = invoke("reproduce", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "FAIL T0" in result.output and "impossible: mean_cosine > 2" in result.output
    data = json.loads((out / "results.json").read_text())
    statuses = [row["status"] for row in data["experiments"]["T0"]["expectations"]]
    assert statuses == ["PASS", "FAIL"]
    assert data["passed"] is False


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 1024, path  # a real figure, not an empty canvas


@pytest.mark.slow  # about 1.5 min alone, several under load
def test_reproduce_quick_passes_every_expectation_and_writes_the_report(tmp_path):
    out = tmp_path / "rep"
    result = invoke("reproduce", "--quick", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["quick"] is True and data["passed"] is True
    assert sorted(data["experiments"], key=lambda i: int(i[1:])) == experiment_ids()
    for eid, experiment in data["experiments"].items():
        assert experiment["runs"], eid
        for run in experiment["runs"]:
            assert run["status"] == "ok", (eid, run["reason"])
            assert run["per_seed"] and all("final" in seed for seed in run["per_seed"])
        assert experiment["expectations"], eid
        for row in experiment["expectations"]:
            assert row["measured"] is not None, (eid, row["text"])
            assert row["status"] == "PASS", (eid, row["text"], row["measured"])
    figures = FIGURES
    for name in figures:
        _assert_png(out / "figures" / f"{name}.png")
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(data["figures"]) >= len(figures)
    assert "<script" not in page and "http://" not in page and "https://" not in page  # self-contained
    assert "## E5" in (out / "report.md").read_text()
    table = (out / "table.md").read_text()  # every row of results.json, grouped by variant
    rows = [(e, r["index"], r["variant"]) for e, x in data["experiments"].items() for r in x["expectations"]]
    assert table.count("\n| E") == len(set(rows))


# --------------------------------------------------------------------------- the generated table


def test_the_expectation_table_has_every_row_and_the_readme_block_is_replaced():
    below = {"text": "below | one", "metric": "mean_cosine", "op": "<=", "bound": 1.0}
    some = {"text": "some size", "metric": "mean_cosine", "op": ">=", "bound": 0.4, "across": "some size"}
    experiment = _experiment(expect=[below, some], variants=[{"name": "a"}, {"name": "b"}])
    jobs = [_job(n, [0.5, 2.0] if v == "b" else [0.5, 0.95], variant=v) for n in (8, 16) for v in "ab"]
    rows = evaluate(experiment, jobs)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    results = {"experiments": {"X": {"expectations": rows}}, "counts": counts, "quick": True,
               "attnflow_version": "0", "wall_time_s": 1.5}  # fmt: skip
    lines = expectation_table.table_rows(results)
    # one line per (expectation, variant); the sizes side by side; the worst status wins
    assert [(line[1], line[4]) for line in lines] == [
        ("a: below | one", "PASS"), ("b: below | one", "FAIL"),
        ("a: some size", "PASS"), ("b: some size", "PASS"),
    ]  # fmt: skip
    assert lines[1][3] == "n=8: 2 (failing seeds [1]) / n=16: 2 (failing seeds [1])"
    table = expectation_table.markdown_table(results)
    assert table.count("\n| X |") == 4 and "below \\| one" in table
    readme = f"intro\n{expectation_table.START}\nold\n{expectation_table.END}\nafter\n"
    new = expectation_table.replace_block(readme, table)
    assert new.startswith("intro\n") and new.endswith(f"{expectation_table.END}\nafter\n")
    assert "old" not in new and table in new
    with pytest.raises(ValueError, match="must hold <!-- reproduce-table -->"):
        expectation_table.replace_block("no markers", table)


# --------------------------------------------------------------------------- closed-form rates


def test_fitted_rate_reads_the_first_stretch_above_the_error_floor():
    from attnflow.workflows.reproduce_rates import RATE_WINDOW, fitted_rate

    ts = np.arange(0.0, 20.0, 0.1)
    deficit = 1e-3 * np.exp(-5.0 * ts)  # 1e-3 (above the window) down to round-off
    floor = np.where(ts > 6.0, 1e-10 * (1.5 + np.sin(7 * ts)), deficit)  # an error floor inside the window
    # the slope of the first stretch in the window, not of the floor after it: exact for an exponential
    assert fitted_rate(ts, floor) == pytest.approx(5.0, rel=1e-9)
    assert fitted_rate(ts, deficit, last=3) == pytest.approx(5.0, rel=1e-9)
    assert fitted_rate(ts[:3], deficit[:3]) is None  # never inside the window: no rate
    assert fitted_rate(ts, np.full_like(ts, 1e-2)) is None  # never decays into it
    assert RATE_WINDOW[0] < RATE_WINDOW[1]


@pytest.mark.parametrize("speed", [1.0, 0.5, 2.0])
def test_realisation_rate_ratio_is_the_gauge_frames_rate_over_2_c_e_beta(speed):
    """A gauge frame closing in on a point at the linearisation's rate ``c e^β`` per displacement
    (``1 − mean cosine`` at ``2 c e^β``) has ratio 1; at half or double speed (a wrong clock) 0.5 or 2."""
    from attnflow.workflows.reproduce_rates import realisation_rate_ratio

    rng = np.random.default_rng(0)
    n, beta, c = 32, 1.0, 1.0
    eps = rng.normal(size=(n, 3)) * [1.0, 1.0, 0.0]  # tangent at e_3
    ts = np.arange(0.0, 12.0, 0.2)
    rate = speed * c * np.exp(beta)
    us = np.array([0.0, 0.0, 1.0]) + eps * np.exp(-rate * ts)[:, None, None]
    us /= np.linalg.norm(us, axis=-1, keepdims=True)
    # 1 - mean cosine is quadratic in eps (relative corrections 1e-4 in the window)
    assert realisation_rate_ratio(ts, us, beta=beta, c=c) == pytest.approx(speed, rel=1e-3)
    sparse = realisation_rate_ratio(ts[::25], us[::25], beta=beta, c=c)
    assert sparse is None  # too few snapshots in the window: no rate
