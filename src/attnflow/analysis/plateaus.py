"""Metastability measured: the plateaus of the energy staircase, their lifetimes, and the merges.

From data in the metastable regime the energy rises in steps: long plateaus (a few clusters that
barely move) separated by fast merges. Time is rescaled to ``s = t e^β`` (the time of the
normalised dynamics, whose field is O(1); plateaus of different β are compared on one axis).

Plateaus (:func:`detect_plateaus`). Lifetimes range over decades (they grow like ``e^{aβ}``), so
flatness is judged per e-fold of time, the same at every scale: a sample is flat when
``|dE/d log s| ≤ rate_tol · (E_max − E_min)`` (finite differences in ``log s``; samples at
``s ≤ 0`` are skipped), and a plateau is a maximal run of flat samples lasting at least
``min_length`` e-folds (``log(exit/entry) ≥ min_length``). A merge at time ``s_m`` completes in a
time O(1) while ``s_m`` is large, so it is a sharp step in ``log s``; the formation of the first
clusters from spread data is a slow rise, not a plateau. No threshold depends on the length of the
run, so a plateau is measured the same way in a short and in a long run. Each :class:`Plateau` has
its energy (the mean over the run of samples), its entry and exit times and sample indices, the
cluster count at its middle sample (when the snapshots are given) and whether it was still going
on at the last sample (``censored``: its lifetime is only a lower bound).

Lifetimes against β (:func:`fit_line`): the metastability literature predicts ``log T ≈ a + bβ``
(two clusters at angle ``δ`` attract at the rate ``e^{β(cos δ − 1)}`` in rescaled time, so
``b ≈ 1 − cos δ``); the least-squares line with the standard error of its slope and ``r²``.

The pairing picture (:func:`merge_events`): between two consecutive plateaus, which clusters of the
first ended in one cluster of the second, and whether the two closest clusters (largest cosine of
their mean directions) were among them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from attnflow.analysis.metrics import cluster_labels

RATE_TOL = 0.02  # flat: the energy changes by less than 2% of its whole rise per e-fold of time
MIN_LENGTH = 0.1  # and the plateau lasts at least 0.1 e-fold (its exit is >= 1.105 times its entry)
MAX_CLUSTERS = 8  # a metastable state has a few clusters (the spread initial data has ~n)
MIN_SEPARATION = 0.3  # rad, 3 cluster thresholds: closer "clusters" are one cluster still forming

__all__ = [
    "LifetimeFits",
    "LineFit",
    "Merge",
    "Plateau",
    "closest_clusters",
    "closest_pair_fraction",
    "detect_plateaus",
    "fit_line",
    "is_metastable",
    "lifetime_fits",
    "merge_events",
    "rescaled_time",
]


@dataclasses.dataclass(frozen=True)
class Plateau:
    energy: float
    entry: float  # rescaled time s = t e^β of its first sample
    exit: float  # ... and of its last
    n_clusters: int | None  # at the middle sample, when the snapshots were given
    closest_angle: float | None = None  # angle of the two closest clusters there (None: fewer than 2)
    first: int = 0  # sample index of the entry
    last: int = 0  # ... and of the exit
    censored: bool = False  # still flat at the last sample: the lifetime is a lower bound

    @property
    def lifetime(self) -> float:
        return self.exit - self.entry


@dataclasses.dataclass(frozen=True)
class Merge:
    """The clusters of plateau ``before`` (labels at its exit sample) that share a cluster of the
    next plateau (labels at its entry sample)."""

    before: int  # index of the plateau the merge ends
    groups: tuple[tuple[int, ...], ...]  # old cluster labels that ended in one new cluster
    closest: tuple[int, int]  # the two old clusters with the smallest angle between their mean directions
    closest_angle: float  # that angle (rad)

    @property
    def closest_pair(self) -> bool:
        """Whether the two closest clusters merged with each other."""
        return any(set(self.closest) <= set(group) for group in self.groups)


@dataclasses.dataclass(frozen=True)
class LineFit:
    """``y ≈ intercept + slope · x`` by least squares."""

    slope: float
    intercept: float
    slope_stderr: float  # sqrt(residual variance / Σ (x − x̄)²), residual variance on m − 2 dof
    r2: float  # 1 − residual / total sum of squares
    points: int


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
    if not min_length >= 0:
        raise ValueError(f"detect_plateaus: `min_length` must be >= 0 (e-folds of time); got {min_length!r}.")
    start = int(np.searchsorted(s, 0.0, side="right"))  # the samples at s > 0
    if e.size - start < 3:
        raise ValueError(f"detect_plateaus: `s` must have at least 3 samples > 0; got {e.size - start}.")
    u = np.log(s[start:])
    span_e = float(np.max(e) - np.min(e))
    # a constant energy is flat everywhere (its finite differences in log s are round-off, not 0)
    flat = np.abs(np.gradient(e[start:], u)) <= rate_tol * span_e if span_e > 0 else np.ones(u.size, bool)
    plateaus, i, last = [], 0, u.size - 1
    while i <= last:
        if not flat[i]:
            i += 1
            continue
        j = i
        while j < last and flat[j + 1]:
            j += 1
        if u[j] - u[i] >= min_length:
            first, end = start + i, start + j
            plateaus.append(
                Plateau(
                    energy=float(e[first : end + 1].mean()),
                    entry=float(s[first]),
                    exit=float(s[end]),
                    **_middle(xs, (first + end) // 2, theta_c),
                    first=first,
                    last=end,
                    censored=j == last,
                )
            )
        i = j + 1
    return plateaus


def _middle(xs, k: int, theta_c: float) -> dict:
    if xs is None:
        return {"n_clusters": None}
    x = np.asarray(xs[k], dtype=np.float64)
    labels = cluster_labels(x, theta_c=theta_c)
    closest = closest_clusters(x, labels)
    return {"n_clusters": int(labels.max()) + 1, "closest_angle": None if closest is None else closest[2]}


def closest_clusters(x, labels) -> tuple[int, int, float] | None:
    """The two clusters (labels ``i < j``) of ``x (n, d)`` whose mean directions make the smallest
    angle, and that angle (rad); None with fewer than two clusters."""
    x = np.asarray(x, dtype=np.float64)
    labels = np.asarray(labels)
    count = int(labels.max()) + 1
    if count < 2:
        return None
    sums = np.zeros((count, x.shape[1]))
    np.add.at(sums, labels, x)
    directions = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    cosines = directions @ directions.T
    np.fill_diagonal(cosines, -np.inf)
    i, j = np.unravel_index(int(np.argmax(cosines)), cosines.shape)
    return int(min(i, j)), int(max(i, j)), math.acos(min(1.0, max(-1.0, float(cosines[i, j]))))


def merge_events(plateaus: list[Plateau], xs, *, theta_c: float = 0.1) -> list[Merge]:
    """The merges between consecutive plateaus (module doc), from the snapshots ``xs (T, n, d)``.

    Old clusters: the labels at the exit sample of a plateau; new clusters: at the entry sample of
    the next one. Old clusters whose tokens (the majority of them) sit in one new cluster merged. A
    transition where no two old clusters merged (the count did not drop) gives no event."""
    events = []
    for k, (a, b) in enumerate(zip(plateaus, plateaus[1:], strict=False)):
        x_old = np.asarray(xs[a.last], dtype=np.float64)
        old = cluster_labels(x_old, theta_c=theta_c)
        new = cluster_labels(np.asarray(xs[b.first]), theta_c=theta_c)
        count = int(old.max()) + 1
        if count < 2:
            continue
        # the new cluster holding most of the tokens of each old one
        target = np.array([np.bincount(new[old == c]).argmax() for c in range(count)])
        groups = tuple(
            tuple(int(c) for c in np.flatnonzero(target == t))
            for t in np.unique(target)
            if np.sum(target == t) >= 2
        )
        if not groups:
            continue
        i, j, angle = closest_clusters(x_old, old)
        events.append(Merge(before=k, groups=groups, closest=(i, j), closest_angle=angle))
    return events


def closest_pair_fraction(events: list[Merge]) -> float | None:
    """Fraction of the merges in which the two closest clusters merged (None without merges)."""
    return None if not events else sum(e.closest_pair for e in events) / len(events)


def fit_line(x, y) -> LineFit:
    """Least-squares line through ``(x_i, y_i)`` (at least 3 points, ``x`` not all equal), with the
    standard error of the slope and ``r²``. For lifetimes: ``x = β``, ``y = log T``."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 3 or np.ptp(x) == 0:
        raise ValueError(
            f"fit_line: `x` and `y` must be 1-d of one length >= 3 with x not all equal; got shapes "
            f"{x.shape} and {y.shape}."
        )
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    sxx = float(np.sum((x - x.mean()) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum(residual**2))
    return LineFit(
        slope=float(slope),
        intercept=float(intercept),
        slope_stderr=math.sqrt(ss_res / (x.size - 2) / sxx),
        r2=1.0 - ss_res / total if total > 0 else 1.0,
        points=int(x.size),
    )


@dataclasses.dataclass(frozen=True)
class LifetimeFits:
    """The two fits of ``log T`` over the completed plateaus (module doc)."""

    beta: LineFit  # log T against β, plateaus with `clusters` clusters
    barrier: LineFit  # log T against β (1 − cos δ), every plateau with >= 2 clusters
    clusters: int


def lifetime_fits(
    betas,
    plateaus,
    *,
    clusters: int = 2,
    max_clusters: int = MAX_CLUSTERS,
    min_separation: float = MIN_SEPARATION,
) -> LifetimeFits:
    """Fits of the lifetimes of the completed metastable plateaus (``betas`` and ``plateaus`` aligned,
    one β per plateau): ``log T`` against β over those with ``clusters`` clusters (the same kind of
    metastable state at every β), and against the barrier ``β (1 − cos δ)``, ``δ`` the angle of the
    two closest clusters (prediction: slope 1), over all of them.

    Metastable: not censored, between 2 and ``max_clusters`` clusters (the spread initial data is
    flat at first too, with ~n "clusters"), the closest two at least ``min_separation`` apart (else
    one cluster is still forming, split in two by the cluster threshold)."""
    if len(betas) != len(plateaus):
        raise ValueError(
            f"lifetime_fits: `betas` must have one entry per plateau ({len(plateaus)}); got {len(betas)}."
        )
    options = {"max_clusters": max_clusters, "min_separation": min_separation}
    done = [(float(b), p) for b, p in zip(betas, plateaus, strict=True) if is_metastable(p, **options)]
    same = [(b, p) for b, p in done if p.n_clusters == clusters]
    barrier = [b * (1.0 - math.cos(p.closest_angle)) for b, p in done]
    return LifetimeFits(
        beta=fit_line([b for b, _ in same], [math.log(p.lifetime) for _, p in same]),
        barrier=fit_line(barrier, [math.log(p.lifetime) for _, p in done]),
        clusters=clusters,
    )


def is_metastable(
    plateau: Plateau, *, max_clusters: int = MAX_CLUSTERS, min_separation: float = MIN_SEPARATION
) -> bool:
    """A completed plateau of a few separated clusters (:func:`lifetime_fits`)."""
    p = plateau
    return (
        not p.censored
        and p.n_clusters is not None
        and 2 <= p.n_clusters <= max_clusters
        and p.closest_angle is not None
        and p.closest_angle >= min_separation
    )
