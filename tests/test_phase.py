"""attnflow.viz.phase: a cell of the phase diagram that no row reached says "n/a"; a comparison's
value is read as its column's type (booleans true/false), a wrong type is refused; a missing value
satisfies no comparison, the row of a failed point is left out."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import EXIT_BAD_INPUT, app
from attnflow.io.results import read_results, write_results
from attnflow.viz.phase import phase_figure, phase_table


@pytest.mark.parametrize("metric", ["energy", "n_clusters>=2", "shape"])
def test_blank_phase_cells_say_not_available(metric):
    # three of the four (beta, n) cells are measured; (beta = 2, n = 16) is not
    rows = [
        {"model.beta": 1.0, "model.n": 8, "energy": 0.5, "n_clusters": 1, "shape": "dirac"},
        {"model.beta": 2.0, "model.n": 8, "energy": 0.7, "n_clusters": 3, "shape": "clusters"},
        {"model.beta": 1.0, "model.n": 16, "energy": 0.6, "n_clusters": 2, "shape": "circle"},
    ]
    fig = phase_figure(rows, "model.beta", "model.n", metric)
    ax = fig.axes[0]
    blank = [t for t in ax.texts if t.get_text() == "n/a"]
    assert len(blank) == 1
    assert blank[0].get_position() == (1, 1)  # column beta = 2, row n = 16


# --- comparisons: the value read as the column's type; missing values ------------------------------


def sweep_rows():
    """Two betas by three seeds, one failed point (no metrics): at beta = 1 no seed collapses
    (collapse_time null), at beta = 2 seeds 0 and 1 collapse before t = 10, seed 2 after."""
    rows = [
        {"hash": f"{beta}{seed}", "model.beta": beta, "init.seed": seed, "status": "ok", "error": None,
         "gradient_flow": True, "collapse_time": None if beta == 1.0 else 5.0 + 4.0 * seed,
         "n_clusters": 1 + seed, "shape": "dirac" if seed else "arc"}
        for beta in (1.0, 2.0)
        for seed in range(3)
    ]  # fmt: skip
    failed = {"hash": "f", "model.beta": 2.0, "init.seed": 0, "status": "failed", "error": "boom"}
    return [*rows, failed]


@pytest.fixture
def sweep_dir(tmp_path):
    write_results(sweep_rows(), tmp_path)  # the parquet round trip: one type per column, nulls
    return tmp_path


@pytest.mark.parametrize(
    "metric", ["gradient_flow==true", "gradient_flow==True", "gradient_flow!=false", "gradient_flow!=False"]
)
def test_a_boolean_column_compares_with_true_and_false(sweep_dir, metric):
    table = phase_table(read_results(sweep_dir), "model.beta", "init.seed", metric)
    assert table.probability and table.values.tolist() == [[1.0, 1.0]] * 3
    opposite = metric.replace("==", "!!").replace("!=", "==").replace("!!", "!=")
    assert phase_table(read_results(sweep_dir), "model.beta", "init.seed", opposite).values.max() == 0.0


def test_a_missing_value_satisfies_no_comparison(sweep_dir):
    rows = read_results(sweep_dir)
    early = phase_table(rows, "model.beta", "init.seed", "collapse_time<10")
    # beta = 1 (never collapsed): 0, not "n/a"; the failed point (beta = 2, seed 0) is left out
    assert early.values.tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert early.counts.tolist() == [[1, 1]] * 3
    late = phase_table(rows, "model.beta", "init.seed", "collapse_time>=10")
    assert late.values.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]  # "collapsed, after t = 10"
    assert phase_table(rows, "model.beta", "init.seed", "collapse_time!=5").values[0, 0] == 0.0
    mean = phase_table(rows, "model.beta", "init.seed", "collapse_time")  # a mean: over measured values
    assert np.isnan(mean.values[:, 0]).all() and mean.values[:, 1].tolist() == [5.0, 9.0, 13.0]
    # a value the failed point has is compared (its status)
    failed = phase_table(rows, "model.beta", "init.seed", "status==failed")
    assert failed.values[0].tolist() == [0.0, 0.5] and failed.counts[0].tolist() == [1, 2]
    text = [
        t.get_text() for t in phase_figure(rows, "model.beta", "init.seed", "collapse_time<10").axes[0].texts
    ]
    assert "n/a" not in text and text.count("0.00") == 4


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("gradient_flow==1", "the true/false column 'gradient_flow' with true or false"),
        ("gradient_flow==yes", "the true/false column 'gradient_flow' with true or false"),
        ("gradient_flow=='true'", "the true/false column 'gradient_flow' with true or false"),
        ("gradient_flow>false", "the true/false column 'gradient_flow' with == or !="),
        ("n_clusters==abc", "the numeric column 'n_clusters' with a number"),
        ("n_clusters>='2'", "the numeric column 'n_clusters' with a number"),
        ("n_clusters==nan", "the numeric column 'n_clusters' with a number"),
        ("shape>arc", "the text column 'shape' with == or !="),
    ],
)
def test_a_value_that_cannot_be_of_the_columns_type_is_refused(sweep_dir, metric, expected):
    with pytest.raises(ValueError, match=re.escape(f"phase: `--metric` must compare {expected}")):
        phase_table(read_results(sweep_dir), "model.beta", "init.seed", metric)
    axes = ["--x", "model.beta", "--y", "init.seed"]
    result = CliRunner().invoke(app, ["phase", str(sweep_dir), *axes, "--metric", metric])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.count("\n") == 1 and f"got {metric!r}" in result.stderr, result.stderr
    assert not (sweep_dir / "figures").exists()  # nothing written


def test_the_phase_command_compares_booleans(sweep_dir):
    out = sweep_dir / "p.png"
    axes = ["--x", "model.beta", "--y", "init.seed"]
    result = CliRunner().invoke(app, ["phase", str(sweep_dir), *axes, "--metric", "gradient_flow==true",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "true or false" in CliRunner().invoke(app, ["phase", "--help"]).stdout


def test_a_figure_name_that_is_not_a_png_is_refused(sweep_dir):
    # the figure is written as PNG: ph.pdf would have held PNG bytes under a PDF name
    axes = ["--x", "model.beta", "--y", "init.seed", "--metric", "energy"]
    result = CliRunner().invoke(app, ["phase", str(sweep_dir), *axes, "--out", str(sweep_dir / "ph.pdf")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr == f"error: phase: `--out` must end in '.png'; got {str(sweep_dir / 'ph.pdf')!r}.\n"
    assert not (sweep_dir / "ph.pdf").exists()
