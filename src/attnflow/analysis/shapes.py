"""The shape of a final state on ``S^2``: dirac, great circle, arc, antipodal arcs, small circle, clusters.

The Toeplitz-cosine experiments (sign-changing factors: the regimes D2 and D3) end on one great
circle, on arcs of it, or in clusters; the final snapshot ``x (n, 3)`` is put in one class by
these rules (:func:`classify_shape`), tried in order (the thresholds are the module constants):

- ``"dirac"``: ``mean_cosine ≥ 0.999`` (the collapse threshold of the diagnostics).
- ``"great_circle"``: on one great circle (``planarity ≤ 0.05``), with no gap of the arc test
  below, and uniform (``|m| ≤ 0.05``; 0 for equally spaced points).
- ``"arc"``: on one great circle, and the points form exactly one arc (see below) wider than
  0.1 rad (the default cluster angle θ_c; a narrower one is a cluster).
- ``"antipodal_arcs"``: on one great circle, exactly two arcs (possibly narrow: two clusters)
  whose mean directions are roughly opposite (cosine ≤ −0.5).
- ``"small_circle"``: off every great circle but on one circle: the points lie within 0.05 of
  the best affine plane (fitted to the centred cloud) and leave no wide gap on it (like a
  latitude circle).
- ``"clusters"``: everything else (three or more arcs or clusters, or spread off a circle).

Arcs: the azimuths of the points in the best plane (the two leading right singular vectors of
``X``) are sorted; a gap wider than ``max(0.5 rad, 3·2π/n)`` (three times the uniform spacing)
separates arcs, and a run of points between two wide gaps is an arc when it holds at least 10% of
the tokens (smaller runs are stray points and are not counted). ``n_arcs`` is 0 for a closed ring.

The classes name shapes, not optimality. In D3 (``w = cos 2π(ξ−ζ)``, ``ξ_i = i/n``, exp profile,
n = 64; measured with ``attnflow.analysis.landscape``): ``"great_circle"`` is a local maximum only
below β_c ≈ 1.545 (above, a saddle whose Morse index grows with β: 9 at β = 3); ``"arc"`` holds the
strict local maxima modulo rotations that the dynamics reach for β ≥ 1.75 - the clean arc (tokens
in label order) has the highest energy found at every β in [1.75, 4] (β = 3: 0.758807), and arcs
with a few tokens on the wrong side of the gap are lower local maxima (β = 3: 0.754939, 0.731142);
``"antipodal_arcs"`` are lower still (β = 3: a local maximum at 0.748020, a saddle of index 1 at
0.737988), whatever the crossing β* ≈ 2.7455 of the circle and antipodal-pair energies suggests.

These are tolerances for a state *at the end of a run*: a run too short to converge is classified
by where it is (the great circle of the paper's E5 needs τ = 100 at β = 1.5, n = 64: ``|m|`` is still 0.09
at τ = 20 on some seeds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SHAPES", "classify_shape", "shape_features"]

DIRAC_MEAN_COSINE = 0.999  # the collapse threshold (attnflow.analysis.summary.COLLAPSE_THRESHOLD)
PLANAR_TOL = 0.05  # planarity (max distance to the best plane) of "on one great circle"
UNIFORM_TOL = 0.05  # |mean| of a uniform great circle (0 when equally spaced)
GAP_MIN = 0.5  # radians; wide gaps (arc separators) exceed max(GAP_MIN, GAP_SPACINGS * 2π/n)
GAP_SPACINGS = 3.0
ARC_MIN_MASS = 0.1  # fraction of tokens an arc must hold to count
ARC_MIN_WIDTH = 0.1  # radians; a narrower arc is a cluster (the default cluster angle theta_c)
ANTIPODAL_COS = -0.5  # two arcs are antipodal when their mean directions have cosine <= this

SHAPES = ("dirac", "great_circle", "arc", "antipodal_arcs", "small_circle", "clusters")


def _arcs(phi: np.ndarray) -> list[np.ndarray]:
    """Indices of the runs of sorted azimuths between wide gaps, each in increasing azimuth
    (empty list: a closed ring)."""
    n = phi.size
    order = np.argsort(phi)
    sorted_phi = phi[order]
    gaps = np.diff(np.concatenate([sorted_phi, sorted_phi[:1] + 2 * np.pi]))  # gap k follows point k
    wide = np.flatnonzero(gaps > max(GAP_MIN, GAP_SPACINGS * 2 * np.pi / n))
    if wide.size == 0:
        return []
    runs = []
    for a, b in zip(wide, np.roll(wide, -1), strict=True):
        idx = np.arange(a + 1, b + 1 if b > a else b + 1 + n) % n
        runs.append(order[idx])
    return runs


def _principal_axes(x: np.ndarray) -> np.ndarray:
    """The right singular vectors of ``x (n, 3)`` as rows, largest first: all three, also for
    n = 2 tokens (from the 3 x 3 Gram matrix, so never an n x n factor)."""
    _, vectors = np.linalg.eigh(x.T @ x)
    return vectors[:, ::-1].T


def shape_features(x: Any) -> dict[str, Any]:
    """The features behind :func:`classify_shape` for one snapshot ``x (n, 3)`` of unit rows.

    ``mean_cosine``, ``resultant`` (``|m|``), ``planarity``, ``n_arcs`` (arcs holding ≥ 10% of the
    tokens; 0 for a closed ring), ``closed_ring`` (no wide gap), ``widest_arc`` (the largest
    angular width of those arcs, radians; ``None`` with none), ``arc_cosine`` (cosine between the
    mean directions of the two heaviest arcs; ``None`` with fewer than two), ``circle_spread``
    (the largest distance to the best affine plane, fitted to ``x − m``) and ``circle_closed`` (no
    wide gap in the azimuths about the centre in that plane).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 3 or x.shape[0] < 2:
        raise ValueError(f"shape_features: `x` must be an (n, 3) array with n >= 2; got shape {x.shape!r}.")
    n = x.shape[0]
    m = x.mean(axis=0)
    vt = _principal_axes(x)
    phi = np.arctan2(x @ vt[1], x @ vt[0])
    arcs = sorted(_arcs(phi), key=len, reverse=True)
    major = [arc for arc in arcs if arc.size >= ARC_MIN_MASS * n]
    vt_c = _principal_axes(x - m)
    phi_c = np.arctan2((x - m) @ vt_c[1], (x - m) @ vt_c[0])
    widths = [float(np.mod(phi[arc[-1]] - phi[arc[0]], 2 * np.pi)) for arc in major]
    arc_cosine = None
    if len(major) >= 2:
        c0, c1 = (x[arc].mean(axis=0) for arc in major[:2])
        arc_cosine = float(c0 @ c1 / (np.linalg.norm(c0) * np.linalg.norm(c1)))
    return {
        "mean_cosine": float((n * m @ m - 1) / (n - 1)),
        "resultant": float(np.linalg.norm(m)),
        "planarity": float(np.max(np.abs(x @ vt[2]))),
        "circle_spread": float(np.max(np.abs((x - m) @ vt_c[2]))),
        "circle_closed": not _arcs(phi_c),
        "n_arcs": len(major),
        "closed_ring": not arcs,
        "widest_arc": max(widths) if widths else None,
        "arc_cosine": arc_cosine,
    }


def classify_shape(x: Any) -> str:
    """The class of the state ``x (n, 3)``: one of :data:`SHAPES` (rules in the module doc)."""
    f = shape_features(x)
    if f["mean_cosine"] >= DIRAC_MEAN_COSINE:
        return "dirac"
    if f["planarity"] > PLANAR_TOL:
        on_one_circle = f["circle_closed"] and f["circle_spread"] <= PLANAR_TOL
        return "small_circle" if on_one_circle else "clusters"
    if f["closed_ring"]:
        return "great_circle" if f["resultant"] <= UNIFORM_TOL else "clusters"
    if f["n_arcs"] == 1 and f["widest_arc"] > ARC_MIN_WIDTH:
        return "arc"
    if f["n_arcs"] == 2 and f["arc_cosine"] <= ANTIPODAL_COS:
        return "antipodal_arcs"
    return "clusters"
