"""Metastability measured: the plateaus of the energy staircase.

From data in the metastable regime the energy rises in steps: long plateaus (a few clusters that
barely move) separated by fast merges. Time is rescaled to ``s = t e^β`` (the merge times grow like
``e^β``: plateaus of different β are compared on one axis).

:func:`detect_plateaus` splits a sampled series ``E(s)`` into plateaus: maximal runs of samples
where the rate ``|dE/ds|`` (finite differences) stays below ``rate_tol · (E_max − E_min) / (s_max −
s_min)`` (a fraction of the mean rate of the whole rise), lasting at least ``min_length`` of the
rescaled span. Each :class:`Plateau` has its energy (the mean over the run), its entry and exit
times (rescaled), and, when the snapshots are given, the cluster count at its middle sample
(``attnflow.analysis.metrics.n_clusters``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from attnflow.analysis.metrics import n_clusters

RATE_TOL = 0.05  # a plateau's rate is below 5% of the mean rate of the whole rise
MIN_LENGTH = 0.02  # and it lasts at least 2% of the rescaled time span

__all__ = ["Plateau", "detect_plateaus", "rescaled_time"]


@dataclasses.dataclass(frozen=True)
class Plateau:
    energy: float
    entry: float  # rescaled time s = t e^β of its first sample
    exit: float  # ... and of its last
    n_clusters: int | None  # at the middle sample, when the snapshots were given

    @property
    def lifetime(self) -> float:
        return self.exit - self.entry


def rescaled_time(ts, beta: float) -> np.ndarray:
    """``s = t e^β``."""
    return np.asarray(ts, dtype=np.float64) * np.exp(beta)


def detect_plateaus(
    s,
    energies,
    xs=None,
    *,
    rate_tol: float = RATE_TOL,
    min_length: float = MIN_LENGTH,
    theta_c: float = 0.1,
) -> list[Plateau]:
    """The plateaus of ``energies (T,)`` sampled at increasing rescaled times ``s (T,)`` (module doc);
    ``xs (T, n, d)`` optional, for the cluster counts."""
    s = np.asarray(s, dtype=np.float64)
    e = np.asarray(energies, dtype=np.float64)
    if s.ndim != 1 or s.shape != e.shape or s.size < 3 or not np.all(np.diff(s) > 0):
        raise ValueError(
            f"detect_plateaus: `s` and `energies` must be 1-d of one length >= 3 with s increasing; "
            f"got shapes {s.shape} and {e.shape}."
        )
    if not rate_tol > 0:
        raise ValueError(f"detect_plateaus: `rate_tol` must be > 0; got {rate_tol!r}.")
    span_s, span_e = s[-1] - s[0], float(np.max(e) - np.min(e))
    if span_e == 0:
        return [Plateau(float(e.mean()), float(s[0]), float(s[-1]), _count(xs, e.size // 2, theta_c))]
    rate = np.abs(np.gradient(e, s))
    flat = rate <= rate_tol * span_e / span_s
    plateaus, i = [], 0
    while i < e.size:
        if not flat[i]:
            i += 1
            continue
        j = i
        while j + 1 < e.size and flat[j + 1]:
            j += 1
        if s[j] - s[i] >= min_length * span_s:
            mid = (i + j) // 2
            plateaus.append(
                Plateau(float(e[i : j + 1].mean()), float(s[i]), float(s[j]), _count(xs, mid, theta_c))
            )
        i = j + 1
    return plateaus


def _count(xs, k: int, theta_c: float) -> int | None:
    return None if xs is None else n_clusters(np.asarray(xs[k]), theta_c=theta_c)
