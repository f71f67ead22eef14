"""workflows.long_context: β = γ log n with the softmax; the predicted crossover γ* and the final
law on its two sides."""

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy.special import i0

from attnflow.io.atomic import read_record, write_record
from attnflow.workflows import long_context as lc


def test_the_mass_of_the_others_has_its_closed_forms():
    for beta in (0.5, 3.0, 20.0):
        # d = 3: the cosine is uniform on [-1, 1], E e^{βs} = sinh(β)/β; d = 2: I_0(β)
        assert lc.log_mass(3, beta) == pytest.approx(math.log(math.sinh(beta) / beta), rel=1e-12)
        assert lc.log_mass(2, beta) == pytest.approx(math.log(i0(beta)), rel=1e-12)


def test_the_crossover_tends_to_one_in_high_d_and_runs_away_in_low_d():
    for n in (64, 1024):
        gamma = lc.critical_gamma(n, 32)
        # its definition: the self-weight is one half there
        assert lc.predicted_self_weight(n, 32, gamma * math.log(n)) == pytest.approx(0.5, abs=1e-9)
    # d = 3: e^β = (n − 1) sinh(β)/β gives β = (n − 1)(1 − e^{−2β})/2, and e^{−63} is nothing
    assert lc.critical_gamma(64, 3) * math.log(64) == pytest.approx(31.5, rel=1e-9)
    by_d = [lc.critical_gamma(1024, d) for d in (8, 32, 128, 512)]
    assert all(a > b > 1.0 for a, b in zip(by_d, by_d[1:], strict=False))
    assert by_d[-1] < 1.01  # near-orthogonal tokens: the equiangular γ_c = 1/(1 − ρ) at ρ = 0
    by_n = [lc.critical_gamma(n, 3) for n in (64, 1024, 100_000)]
    assert by_n[0] > 7 and by_n[1] > 70 and by_n[2] > 4000  # (n − 1)/(2 log n)


def test_the_finite_depth_crossover_lies_above_the_asymptotic_one_and_nears_it():
    # at β = 0 the mean of a law near the uniform one grows at E[1 − s²] = (d − 1)/d
    assert lc.mean_rate(32, 0.0) == pytest.approx(31 / 32, rel=1e-14)
    assert 0.8 < lc.mean_rate(32, 10.0) < lc.mean_rate(32, 5.0) < 31 / 32
    gaps = [lc.horizon_gamma(n, 32, 20.0) - lc.critical_gamma(n, 32) for n in (64, 256, 1024, 2048)]
    assert all(a > b > 0.0 for a, b in zip(gaps, gaps[1:], strict=False))  # 0.60, 0.40, 0.28, 0.24


def test_the_measured_self_weight_of_iid_tokens_is_the_predicted_one():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 32))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for gamma in (0.8, 1.2):
        beta = gamma * math.log(1024)
        measured = lc.measured_self_weight(x, beta)
        # the others' mass fluctuates by about 6 % from row to row at β = 8.3 (its variance is
        # e^{2β²/d} − e^{β²/d} per token); the mean of 512 rows is well within 10 %
        assert measured == pytest.approx(lc.predicted_self_weight(1024, 32, beta), rel=0.1)


def test_the_recorded_beta_is_gamma_log_n():
    for n, gamma in ((64, 0.8), (128, 1.5)):
        run = lc.run_long_context(n, 32, gamma, t_end=0.5)
        assert run.status == "ok"
        assert run.beta == pytest.approx(gamma * math.log(n), rel=1e-15)


def test_the_final_law_collapses_below_the_crossover_and_freezes_above():
    """d = 32, n = 256, t = 20: γ* = 1.10. At γ = 0.5 the tokens collapse (mean cosine 1); at γ = 3
    each token keeps 99.9 % of its own row and stays where it started."""
    critical, horizon = lc.critical_gamma(256, 32), lc.horizon_gamma(256, 32, lc.T_END)
    assert 0.5 < critical < horizon < 3.0  # 1.10 and 1.50
    below = lc.run_long_context(256, 32, 0.5)
    above = lc.run_long_context(256, 32, 3.0)
    assert below.status == above.status == "ok"
    assert below.mean_cosine[-1] > 0.999 and below.clusters == 1  # measured 1.0, one cluster
    assert below.overlap < 0.5  # measured 0.07: the tokens moved across the sphere
    assert above.overlap > 0.99  # measured 0.999
    assert above.clusters == above.sample == 256  # no two tokens within 0.1 rad
    assert abs(above.mean_cosine[-1]) < 0.05  # iid on S^31: about 1/n


def test_the_record_round_trips(tmp_path):
    run = lc.run_long_context(64, 2, 2.0, t_end=1.0)
    path = write_record(tmp_path / "run.npz", run)
    back = read_record(lc.LongContextRun, path)
    for field in dataclasses.fields(run):
        assert np.array_equal(getattr(back, field.name), getattr(run, field.name)), field.name


def test_the_command_writes_its_table_json_figure_and_keeps_its_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "QUICK", {32: ((64,), (0.5, 3.0))})
    argv = ["--out", str(tmp_path), "--quick", "--t-end", "10"]
    lc.main(argv)
    runs = sorted((tmp_path / "runs").glob("*.npz"))
    assert [path.name for path in runs] == ["d32_n64_gamma0.5.npz", "d32_n64_gamma3.npz"]
    results = json.loads((tmp_path / "results.json").read_text())
    study, rows = results["study"], results["rows"]
    assert study["quick"] and study["t_end"] == 10.0 and study["cpu_s"] > 0 and study["date"]
    assert study["machine"]["cpus"] >= 1
    assert [row["gamma"] for row in rows] == [0.5, 3.0]
    for row in rows:
        assert row["beta"] == pytest.approx(row["gamma"] * math.log(64), rel=1e-15)
    assert rows[0]["mean_cosine"] > 0.99 and rows[1]["overlap"] > 0.99
    table = (tmp_path / "table.md").read_text()
    assert table.count("| 32 | 64 |") == 2
    assert (tmp_path / "long_context.png").stat().st_size > 10_000
    stamps = [path.stat().st_mtime_ns for path in runs]
    lc.main(argv)  # a rerun with the same t_end reads the runs back
    assert [path.stat().st_mtime_ns for path in runs] == stamps
    assert (tmp_path / "table.md").read_text() == table
