"""A particle run against a density run of the same model: the distance between their laws over time.

``run_distance(particle_dir, density_dir)`` reads the two run folders (``trajectory.zarr`` and
``density.zarr``, as ``attnflow run`` writes them), checks that they are one model (``model.d``,
``beta``, ``profile``, ``normalization``, ``time_scale``, the ``[gauge]`` and ``[factor]`` sections
and ``aux.kind``; one line naming the first key that differs), and at every time both runs stored
gives the sliced 1-Wasserstein distance on (label, token) pairs between the particles and the
density's quadrature (``attnflow.analysis.density_distance``: on S^1 ``sliced_w1_density``, on S^2
``sliced_w1_sphere`` against the stored content-frame law on its Gauss–Legendre grid).

Each particle is compared within the slice of the label node nearest to its label: positions by
their phase on ``[0, 1)`` (``i/n`` for token ``i``: the density's positions), prompt ids and file
labels as they are. Particles whose labels lie between the nodes add the label quadrature's own
error; labels at the nodes (``aux.kind = "file"`` in both runs, with ``gauge.frequencies`` and
``factor.omega`` as numbers, which then mean the same in both) compare the laws alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from attnflow.analysis.density_distance import nearest_nodes, sliced_w1_density, sliced_w1_sphere
from attnflow.analysis.distances import label_phase
from attnflow.io.density_folder import STORE
from attnflow.io.density_store import read_density
from attnflow.io.store import read_trajectory

__all__ = ["RunDistance", "run_distance"]

SAME_MODEL = ("model.d", "model.beta", "model.profile", "model.normalization", "model.time_scale", "aux.kind")
SAME_SECTIONS = ("gauge", "factor")
REFINE = 16  # the cloud's own W1 is ~2π/(4·refine·M): 1.5e-3 at 64 angles, below n = 10^5 particles' noise
TIME_TOL = 1e-9  # stored times agree to round-off (k · save_every in both runs)


@dataclasses.dataclass(frozen=True)
class RunDistance:
    """``distance[k]``: the sliced W1 at time ``t[k]`` (the times both runs stored), between ``n``
    particles and the density on ``labels`` label nodes."""

    t: np.ndarray
    distance: np.ndarray
    n: int
    labels: int


def _value(config: dict, dotted: str):
    section, key = dotted.split(".")
    return config.get(section, {}).get(key)


def _check_same_model(particles: dict, density: dict) -> None:
    differing = [key for key in SAME_MODEL if _value(particles, key) != _value(density, key)]
    differing += [s for s in SAME_SECTIONS if particles.get(s) != density.get(s)]
    if differing:
        key = differing[0]
        shown = (
            (_value(particles, key), _value(density, key))
            if "." in key
            else (particles.get(key), density.get(key))
        )
        raise ValueError(
            f"density_compare: `{key}` must be the same in both runs (one model, particles and density); "
            f"got {shown[0]!r} (particles) and {shown[1]!r} (density)."
        )


def _particle_labels(xi: np.ndarray, aux_kind: str) -> np.ndarray:
    """The particles' labels in the density's coordinates: positions by their phase on [0, 1)."""
    return label_phase(xi) if aux_kind == "positions" else np.asarray(xi, dtype=np.float64)


def _sphere_quadrature(coords: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(points (k, 3), area (k,))`` of the stored lat/lon grid (Gauss–Legendre in sin(lat))."""
    lat, lon = np.radians(coords["lat"])[:, None], np.radians(coords["lon"])[None, :]
    points = np.stack(np.broadcast_arrays(np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)))
    weights = np.polynomial.legendre.leggauss(lat.shape[0])[1]
    area = np.broadcast_to(weights[:, None] * (2.0 * np.pi / lon.shape[1]), points.shape[1:])
    return points.reshape(3, -1).T, area.ravel()


def run_distance(
    particle_dir: str | os.PathLike,
    density_dir: str | os.PathLike,
    *,
    max_tokens: int | None = None,
    refine: int = REFINE,
    directions: int = 64,
    seed: int = 0,
) -> RunDistance:
    """The distance between a particle run folder and a density run folder of the same model at
    every time both stored (``max_tokens``: at most that many particles, spread over the tokens;
    ``refine``: S^1's quadrature cloud on ``refine`` times the density's grid)."""
    particle_dir, density_dir = Path(particle_dir), Path(density_dir)
    trajectory = read_trajectory(particle_dir / "trajectory.zarr", max_tokens=max_tokens)
    density = read_density(density_dir / STORE, arrays=("f",))
    particle_config = json.loads((particle_dir / "config.json").read_text())
    _check_same_model(particle_config, density.config)
    nodes, weights = density.coords["label"], density.coords["weight"]
    label_index = nearest_nodes(_particle_labels(trajectory.xi, particle_config["aux"]["kind"]), nodes)
    sphere = "lat" in density.coords
    if sphere:
        points, area = _sphere_quadrature(density.coords)
    times, distances = [], []
    for k, t in enumerate(trajectory.ts):
        match = np.flatnonzero(np.abs(density.ts - t) <= TIME_TOL)
        if match.size == 0:
            continue
        f = density.arrays["f"][match[0]]
        x = np.asarray(trajectory.xs[k], dtype=np.float64)
        options = dict(directions=directions, seed=seed)
        if sphere:
            value = sliced_w1_sphere(
                x, label_index, f.reshape(f.shape[0], -1), points, area, nodes, weights, **options
            )
        else:
            theta = np.arctan2(x[:, 1], x[:, 0])
            value = sliced_w1_density(theta, label_index, f, nodes, weights, refine=refine, **options)
        times.append(float(t))
        distances.append(value)
    if not times:
        raise ValueError(
            "density_compare: the runs must share stored times (the same solver.save_every); got particles "
            f"at {trajectory.ts[:3].tolist()}... and the density at {density.ts[:3].tolist()}...."
        )
    return RunDistance(
        t=np.asarray(times),
        distance=np.asarray(distances),
        n=int(trajectory.xs.shape[1]),
        labels=int(nodes.size),
    )
