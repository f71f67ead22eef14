"""The run folder of a density run: ``attnflow run``'s layout with ``density.zarr`` for its store.

The same folder rules as every run (:mod:`attnflow.io.run_folder`: claimed, locked, resumed,
overwritten), the same marker: a density run may replace a particle run's folder with
``--overwrite`` (a particle run refuses a folder holding ``density.zarr``); ``--resume`` continues a
folder holding ``density.zarr``.
Light (no JAX, no zarr): the command line checks ``--out`` with it before anything is imported.
"""

from __future__ import annotations

import dataclasses

from attnflow.io.run_folder import RUN

__all__ = ["DENSITY_RUN", "STORE"]

STORE = "density.zarr"

DENSITY_RUN = dataclasses.replace(
    RUN,
    entries=(*RUN.entries, STORE),
    resumable=lambda folder: (folder / STORE).exists(),  # stopped before its store: starts again
)
