"""The long-context study (``workflows.context_study``): its closed forms, its gauge, and at small n
that it runs through ``build`` and ``solve``, writes its table, JSON and figure, and that the llama3
scaling changes what it measures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnflow.analysis import metrics
from attnflow.core import gauges, sphere
from attnflow.io.config import config_from_dict
from attnflow.workflows import context_study as cs
from attnflow.workflows.build import build


def test_crossing_time_is_exact_on_an_exponential_approach():
    # 1 − v = e^{−2t}: log(1 − v) is linear in t, so the interpolation is exact: ln(1000)/2 = 3.454
    ts = np.arange(0.0, 6.01, 0.5)
    values = 1.0 - np.exp(-2.0 * ts)
    assert metrics.collapse_time(ts, values) == 3.5  # the snapshot after the crossing
    assert cs.crossing_time(ts, values) == pytest.approx(math.log(1000.0) / 2, rel=1e-12)


def test_crossing_time_when_never_or_at_once():
    ts = np.arange(0.0, 2.01, 0.5)
    assert cs.crossing_time(ts, np.zeros_like(ts)) is None
    assert cs.crossing_time(ts, np.ones_like(ts)) == 0.0


@pytest.mark.parametrize("scaling", cs.SCALINGS)
def test_orbit_residual_through_the_gauge_is_the_metric(scaling):
    n = 16
    rope = gauges.make_rope(np.arange(n), cs.D, cs.frequencies(scaling), layout="half")
    x = np.asarray(sphere.sample_uniform(3, n, cs.D))
    expected = float(metrics.orbit_residual(x, rope.matrices()))
    assert cs.orbit_residual(x, rope) == pytest.approx(expected, rel=1e-13)  # the same sums, reordered
    u_star = np.asarray(sphere.sample_uniform(4, 1, cs.D))[0]
    on_orbit = np.asarray(rope.apply_transpose(np.broadcast_to(u_star, (n, cs.D))))
    assert cs.orbit_residual(on_orbit, rope) < 1e-14  # round-off: 0 on an orbit


@pytest.mark.parametrize("scaling", cs.SCALINGS)
def test_orbit_spread_closed_form_is_the_mean_of_the_orbit(scaling):
    n, omega = 300, cs.frequencies(scaling)
    rope = gauges.make_rope(np.arange(n), cs.D, omega, layout="half")
    u_star = np.asarray(sphere.sample_uniform(5, 1, cs.D))[0]
    x = np.asarray(rope.apply_transpose(np.broadcast_to(u_star, (n, cs.D))))
    direct = float(metrics.marginal_spread(x))
    assert cs.orbit_spread(u_star, omega, n) == pytest.approx(direct, abs=1e-13)  # two sums of n terms


def test_typical_orbit_spread_is_the_mean_over_uniform_base_points():
    n, omega = 256, cs.frequencies("none")
    u = np.asarray(sphere.sample_uniform(6, 2000, cs.D))
    mean_square = np.mean([(1.0 - cs.orbit_spread(v, omega, n)) ** 2 for v in u])
    # E|m|^2 = (1 - typical)^2; |m|^2 has a standard deviation of about 0.06, so the mean of 2000
    # samples is within 0.005 (3.5 sigma)
    assert mean_square == pytest.approx((1.0 - cs.typical_orbit_spread(omega, n)) ** 2, abs=0.005)


def test_the_llama3_scaling_lowers_the_typical_spread_at_long_contexts():
    # the rule slows the 35 pairs whose wavelength exceeds L/4 = 2048 positions: at n = 4096 they
    # turn 8 times less (closed form: 0.345 without the rule, 0.294 with it); at n = 16 no pair is
    # affected beyond 1e-5
    none, scaled = cs.frequencies("none"), cs.frequencies("preset")
    assert int(np.sum(none != scaled)) == 35
    assert cs.typical_orbit_spread(none, 4096) - cs.typical_orbit_spread(scaled, 4096) > 0.04
    assert abs(cs.typical_orbit_spread(none, 16) - cs.typical_orbit_spread(scaled, 16)) < 1e-5


@pytest.mark.parametrize("values", cs.VALUES)
@pytest.mark.parametrize("scaling", cs.SCALINGS)
def test_the_config_builds_the_head_with_the_scalings_frequencies(values, scaling):
    sim = build(config_from_dict(cs.study_config(8, values=values, scaling=scaling, seed=0)))
    (head,) = sim.field.heads
    assert head.values == values
    assert head.gauge.layout == "half"
    # the angles of position 1 are the frequencies themselves
    np.testing.assert_array_equal(np.asarray(head.gauge.angles)[1], cs.frequencies(scaling))


@pytest.mark.slow
def test_the_two_scalings_differ_and_rotated_values_keep_the_gauge_frame():
    """n = 256 to t = 6 (the gauge frame collapses at t = 3.9, the content of plain values at 4.4).
    Rotated values: the gauge frame follows the ungauged flow, so both scalings give one u(t), and
    the spreads differ by the closed form of the orbit of u* (7e-4). Plain values: the two heads
    move the tokens differently."""
    runs = {
        (v, s): cs.run_context(256, values=v, scaling=s, seed=0, t_end=6.0)
        for v in cs.VALUES
        for s in cs.SCALINGS
    }
    for run in runs.values():
        assert run.status == "ok"
        assert np.all(np.isfinite(run.mean_cosine)) and np.all(np.isfinite(run.orbit_residual))
    none, scaled = runs["rotated", "none"], runs["rotated", "preset"]
    # round-off of the gauge's rotations, carried over 30 steps
    np.testing.assert_allclose(none.gauge_mean_cosine, scaled.gauge_mean_cosine, rtol=0, atol=1e-10)
    np.testing.assert_allclose(none.u_star, scaled.u_star, rtol=0, atol=1e-10)
    assert none.spread - scaled.spread > 3e-4
    closed = cs.orbit_spread(none.u_star, cs.frequencies("none"), 256) - cs.orbit_spread(
        scaled.u_star, cs.frequencies("preset"), 256
    )
    # each law is within its orbit residual (1.7e-4 at t = 6) of its orbit, and its mean much closer
    assert none.spread - scaled.spread == pytest.approx(closed, abs=1e-5)
    assert max(none.orbit_residual[-1], scaled.orbit_residual[-1]) < 1e-3  # measured 1.7e-4
    plain_none, plain_scaled = runs["plain", "none"], runs["plain", "preset"]
    assert min(plain_none.mean_cosine[-1], plain_scaled.mean_cosine[-1]) > cs.THRESHOLD
    assert abs(plain_none.orbit_residual[-1] - plain_scaled.orbit_residual[-1]) > 1e-3  # measured 2.1e-3


@pytest.mark.slow
def test_the_command_writes_its_table_json_figure_and_keeps_its_runs(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--sizes", "32", "64", "--seeds", "0", "--t-end", "5"]
    cs.main(argv)
    runs = sorted((tmp_path / "runs").glob("*.npz"))
    assert len(runs) == 8  # 2 sizes x 2 values x 2 scalings
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["rows"]) == 8
    for row in results["rows"]:
        assert math.isfinite(row["spread"]) and math.isfinite(row["orbit_residual"])
        frame = "collapse_x" if row["values"] == "plain" else "collapse_u"
        assert 0.0 < row[frame] < 5.0  # every run has collapsed, in the frame where it does
    assert results["study"]["t_end"] == 5.0 and results["study"]["cpu_s"] > 0
    assert results["study"]["date"] and results["study"]["machine"]["cpus"] >= 1  # where and when it ran
    table = (tmp_path / "table.md").read_text()
    assert "Plain values" in table and "Rotated values" in table
    assert table.count("| 32 |") == table.count("| 64 |") == 2  # one row per n in each table
    assert (tmp_path / "context_study.png").stat().st_size > 10_000
    stamps = [path.stat().st_mtime_ns for path in runs]
    cs.main(argv)  # a rerun with the same t_end and dt reads the runs back
    assert [path.stat().st_mtime_ns for path in runs] == stamps
    assert (tmp_path / "table.md").read_text() == table  # the same runs, the same table
