"""analysis.plateaus on synthetic staircases, constructed merges and exact Arrhenius lifetimes."""

import numpy as np
import pytest

from attnflow.analysis.plateaus import (
    Plateau,
    closest_clusters,
    closest_pair_fraction,
    detect_plateaus,
    fit_line,
    is_metastable,
    lifetime_fits,
    merge_events,
    rescaled_time,
)
from attnflow.io.outcomes import METRICS
from attnflow.workflows.reproduce_measure import series_values


def staircase(s, levels, jumps, width):
    e = np.full_like(s, levels[0])
    for (lo, hi), at in zip(zip(levels, levels[1:], strict=False), jumps, strict=True):
        e += (hi - lo) * 0.5 * (1 + np.tanh((s - at) / width))
    return e


def test_synthetic_staircase():
    s = np.linspace(0.0, 100.0, 2001)
    levels, jumps = (1.0, 2.0, 2.5, 3.0), (20.0, 50.0, 80.0)
    plateaus = detect_plateaus(s, staircase(s, levels, jumps, width=0.5))
    assert [p.energy for p in plateaus] == pytest.approx(levels, abs=1e-3)  # tanh tails: e^{-2·4}
    bounds = [0.0, *jumps, 100.0]
    for p, a, b in zip(plateaus, bounds[:-1], bounds[1:], strict=True):
        # entry/exit within 4 widths of the step (the rate falls below the tolerance there)
        assert p.entry == pytest.approx(a, abs=4.0) and p.exit == pytest.approx(b, abs=4.0)
        assert p.lifetime > 15.0 and p.n_clusters is None  # 30 or 20 long, less 4 widths each end


def test_cluster_counts_and_rescaled_time():
    s = rescaled_time(np.linspace(0.0, 10.0, 101), beta=np.log(10.0))
    assert s[-1] == pytest.approx(100.0)
    e = staircase(s, (0.0, 1.0), (50.0,), width=0.5)
    two = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]] * 4)
    one = np.tile([1.0, 0.0, 0.0], (8, 1))
    xs = np.stack([two if t < 50 else one for t in s])
    plateaus = detect_plateaus(s, e, xs)
    assert [p.n_clusters for p in plateaus] == [2, 1]


def test_errors():
    with pytest.raises(ValueError, match=r"detect_plateaus: `s` and `energies` must be 1-d"):
        detect_plateaus([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"with s increasing"):
        detect_plateaus([0.0, 2.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"detect_plateaus: `s` must have at least 3 samples > 0; got 2"):
        detect_plateaus([-1.0, 0.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"detect_plateaus: `min_length` must be >= 0"):
        detect_plateaus([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], min_length=-1.0)


# --------------------------------------------------------------------------- per e-fold, censoring


def test_plateaus_do_not_depend_on_the_unit_of_time():
    """Flatness is judged per e-fold of time: rescaling s (t -> t e^β) rescales entries and exits."""
    s = np.linspace(0.0, 100.0, 2001)
    e = staircase(s, (1.0, 2.0, 2.5, 3.0), (20.0, 50.0, 80.0), width=0.5)
    plain, rescaled = detect_plateaus(s, e), detect_plateaus(s * np.exp(4.0), e)
    assert len(plain) == len(rescaled) == 4
    for p, q in zip(plain, rescaled, strict=True):
        assert q.entry == pytest.approx(p.entry * np.exp(4.0), rel=1e-12)
        assert q.lifetime == pytest.approx(p.lifetime * np.exp(4.0), rel=1e-12)
        assert (p.first, p.last, p.energy) == (q.first, q.last, q.energy)
    # only the last one is still going on at the end of the run
    assert [p.censored for p in plain] == [False, False, False, True]


def test_a_constant_energy_is_one_censored_plateau_from_the_first_positive_time():
    s = np.linspace(0.0, 10.0, 101)
    (p,) = detect_plateaus(s, np.full_like(s, 0.3))
    assert (p.entry, p.exit, p.first, p.censored, p.energy) == (pytest.approx(0.1), 10.0, 1, True, 0.3)


def test_a_steady_rise_has_no_plateau():
    """E = log s rises by the same amount per e-fold: 1/log(s_end/s_1) of the span, > rate_tol."""
    s = np.linspace(0.0, 100.0, 1001)
    assert detect_plateaus(s, np.log(np.maximum(s, 1e-3))) == []


# --------------------------------------------------------------------------- merges


def _clusters(directions, sizes, *, spread=0.0, seed=0):
    """Tokens at the given unit ``directions`` (sizes each), jittered by ``spread``."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.tile(d, (m, 1)) for d, m in zip(directions, sizes, strict=True)])
    x = x + spread * rng.standard_normal(x.shape)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _direction(polar, azimuth):
    return np.array([np.sin(polar) * np.cos(azimuth), np.sin(polar) * np.sin(azimuth), np.cos(polar)])


def test_closest_clusters_are_found_with_their_angle():
    dirs = [_direction(0.0, 0.0), _direction(1.0, 0.0), _direction(2.6, 0.0)]
    x = _clusters(dirs, (5, 3, 4))
    labels = np.repeat([0, 1, 2], (5, 3, 4))
    assert closest_clusters(x, labels) == (0, 1, pytest.approx(1.0, abs=1e-12))
    assert closest_clusters(x[:5], labels[:5]) is None


def _merge_run(merged):
    """Three clusters (angles 0.6 apart for 0-1, 1.6 for 1-2), then ``merged`` (two of them) join."""
    dirs = [_direction(0.0, 0.0), _direction(0.6, 0.0), _direction(2.2, 0.0)]
    before = _clusters(dirs, (4, 4, 4))
    after_dirs = list(dirs)
    meet = (dirs[merged[0]] + dirs[merged[1]]) / np.linalg.norm(dirs[merged[0]] + dirs[merged[1]])
    after_dirs[merged[0]] = after_dirs[merged[1]] = meet
    after = _clusters(after_dirs, (4, 4, 4))
    xs = np.stack([before] * 3 + [after] * 3)
    return [Plateau(1.0, 1.0, 3.0, 3, first=0, last=2), Plateau(2.0, 4.0, 6.0, 2, first=3, last=5)], xs


def test_merge_events_name_the_merged_clusters_and_whether_they_were_the_closest():
    plateaus, xs = _merge_run((0, 1))
    (event,) = merge_events(plateaus, xs)
    assert event.groups == ((0, 1),) and event.closest == (0, 1) and event.closest_pair
    assert event.closest_angle == pytest.approx(0.6, abs=1e-12)
    plateaus, xs = _merge_run((1, 2))
    (far,) = merge_events(plateaus, xs)
    assert far.groups == ((1, 2),) and far.closest == (0, 1) and not far.closest_pair
    assert closest_pair_fraction([event, far]) == 0.5 and closest_pair_fraction([]) is None


def test_no_merge_event_when_no_two_clusters_joined():
    plateaus, xs = _merge_run((0, 1))
    xs = np.stack([xs[0]] * 6)  # the same three clusters on both plateaus
    assert merge_events(plateaus, xs) == []


# --------------------------------------------------------------------------- fits


def test_fit_line_is_exact_on_a_line_and_its_stderr_is_numpys():
    x = np.arange(6.0)
    fit = fit_line(x, 2.0 + 0.5 * x)
    assert (fit.slope, fit.intercept, fit.r2, fit.points) == (pytest.approx(0.5), pytest.approx(2.0), 1.0, 6)
    assert fit.slope_stderr == pytest.approx(0.0, abs=1e-12)
    y = 2.0 + 0.5 * x + np.array([0.1, -0.2, 0.05, 0.3, -0.1, 0.0])
    fit = fit_line(x, y)
    coefficients, cov = np.polyfit(x, y, 1, cov=True)  # numpy scales by the residual / (m - 2)
    assert fit.slope == pytest.approx(coefficients[0], rel=1e-12)
    assert fit.slope_stderr == pytest.approx(np.sqrt(cov[0, 0]), rel=1e-10)
    assert fit.r2 == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, rel=1e-12)
    with pytest.raises(ValueError, match=r"fit_line: `x` and `y` must be 1-d of one length >= 3"):
        fit_line([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


def test_lifetime_fits_recover_an_arrhenius_law_and_skip_what_is_not_metastable():
    """Lifetimes T = 3 e^{β (1 − cos δ)} exactly: slope 1 against the barrier, r² = 1."""
    betas, plateaus = [], []
    for beta in (2.0, 3.0, 4.0, 5.0):
        for count, delta in ((2, 2.0), (3, 1.2), (4, 0.9)):
            lifetime = 3.0 * np.exp(beta * (1.0 - np.cos(delta)))
            plateaus.append(Plateau(0.0, 10.0, 10.0 + lifetime, count, closest_angle=delta))
            betas.append(beta)
    skipped = [
        Plateau(0.0, 10.0, 1e6, 2, closest_angle=2.0, censored=True),  # still going on
        Plateau(0.0, 10.0, 1e6, 30, closest_angle=0.5),  # spread data, not a few clusters
        Plateau(0.0, 10.0, 1e6, 2, closest_angle=0.1),  # one cluster still forming
    ]
    assert not any(is_metastable(p) for p in skipped)
    fits = lifetime_fits([*betas, 2.0, 3.0, 4.0], [*plateaus, *skipped])
    assert fits.barrier.slope == pytest.approx(1.0, rel=1e-9) and fits.barrier.r2 == pytest.approx(1.0)
    assert fits.barrier.intercept == pytest.approx(np.log(3.0), rel=1e-9)
    assert fits.beta.slope == pytest.approx(1.0 - np.cos(2.0), rel=1e-9) and fits.beta.points == 4
    with pytest.raises(
        ValueError, match=r"lifetime_fits: `betas` must have one entry per plateau \(3\); got 2"
    ):
        lifetime_fits([1.0, 2.0], skipped)


# --------------------------------------------------------------------------- in the reproduction


def test_series_values_report_the_plateaus_of_the_energy():
    ts = np.linspace(0.0, 100.0, 2001)
    e = staircase(ts, (1.0, 2.0, 2.5, 3.0), (20.0, 50.0, 80.0), width=0.5)
    cos = np.linspace(0.0, 1.0, ts.size)
    values = series_values(ts, e, cos, cos, None)
    keys = ("n_plateaus", "plateau_longest", "plateau_first_entry", "plateau_last_lifetime")
    assert set(keys) <= set(values) <= set(METRICS)
    assert values["n_plateaus"] == 4
    assert values["plateau_longest"] == pytest.approx(30.0, abs=8.0)  # 20..50 or 50..80, less the steps
    assert values["plateau_first_entry"] == pytest.approx(0.05)  # flat from the first time > 0
    assert values["plateau_last_lifetime"] == pytest.approx(20.0, abs=4.0)
    frozen = series_values(ts, np.full_like(ts, 2.0), cos, cos, None)  # a simulator that never moves
    assert (frozen["n_plateaus"], frozen["plateau_longest"]) == (1, pytest.approx(100.0 - 0.05))
    early = series_values(ts[:2], e[:2], cos[:2], cos[:2], None)  # too few samples for plateaus
    assert early["n_plateaus"] is None and early["plateau_first_entry"] is None
