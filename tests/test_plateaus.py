"""analysis.plateaus on a synthetic staircase with known steps, and its errors."""

import numpy as np
import pytest

from attnflow.analysis.plateaus import detect_plateaus, rescaled_time


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
