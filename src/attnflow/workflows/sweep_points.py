"""One point of a sweep: its run folder, written safely, and its row of the results table.

A point runs in a staging folder ``runs/<hash>.<id>.partial`` that is renamed to ``runs/<hash>``
when the point is finished (or has failed), so a killed sweep leaves only finished folders,
failed folders and stray staging folders (:func:`clear_unfinished` removes the last two). A
staging folder whose writer died (a killed Dask worker, whose task Dask then retries elsewhere)
is removed by the point's next attempt and at the end of the sweep (:func:`clear_stale_staging`);
one whose writer still runs is never touched there (its run holds the folder's lock,
:mod:`attnflow.io.run_folder`). A
point is finished when its folder holds a ``metrics.json`` with ``run.status``
(:func:`is_finished`). A failed point's folder holds ``error.json`` (``status`` "failed",
``error``, ``traceback``). :func:`collect_results` reads one row per point from the folders,
with the shape class of the final state (:func:`classify_run`,
:func:`attnflow.analysis.shapes.classify_shape`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import traceback
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.analysis.shapes import classify_shape, shape_features
from attnflow.io.atomic import write_json
from attnflow.io.config import config_from_dict
from attnflow.io.run_folder import RUN, in_use
from attnflow.io.store import open_dataset
from attnflow.workflows.run import run
from attnflow.workflows.sweep_plan import SweepPlan, SweepPoint

__all__ = [
    "ERROR_JSON",
    "classify_run",
    "clear_stale_staging",
    "clear_unfinished",
    "collect_results",
    "error_record",
    "is_finished",
    "record_failure",
    "run_point",
]

ERROR_JSON = "error.json"
STAGING_SUFFIX = ".partial"
# a staging folder without a run's marker is being created or published (milliseconds) or stale
UNMARKED_STALE_AFTER_S = 60.0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finished_metrics(folder: Path) -> dict | None:
    metrics = _read_json(folder / "metrics.json")
    if isinstance(metrics, dict) and isinstance(metrics.get("run"), dict) and "status" in metrics["run"]:
        return metrics
    return None


def is_finished(folder: str | os.PathLike) -> bool:
    """A point is finished when its folder holds a metrics.json with ``run.status``, whatever the
    status: a run that stopped early (``max_steps``, ``nonfinite``) is not run again (its config
    decides that outcome); the sweep reports it as not finished as asked on every run."""
    return _finished_metrics(Path(folder)) is not None


def _staging(final: Path) -> Path:
    return final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}{STAGING_SUFFIX}")


def _writer_gone(staging: Path) -> bool:
    """Whether no live process writes ``staging``: its run does not hold it
    (:func:`attnflow.io.run_folder.in_use`; the lock dies with the process, SIGKILL included) and
    it holds the run's marker or is older than ``UNMARKED_STALE_AFTER_S`` (a folder being created)."""
    if in_use(staging):
        return False
    try:
        return (
            staging / RUN.marker
        ).exists() or time.time() - staging.stat().st_mtime > UNMARKED_STALE_AFTER_S
    except FileNotFoundError:
        return False  # published or removed meanwhile


def clear_stale_staging(final: str | os.PathLike) -> list[Path]:
    """Remove the staging folders of the point folder ``final`` whose writer is gone (see
    :func:`_writer_gone`); returns them. A folder a live run writes is kept."""
    final = Path(final)
    stale = sorted(p for p in final.parent.glob(f"{final.name}.*{STAGING_SUFFIX}") if _writer_gone(p))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _publish(staging: Path, final: Path, *, ok: bool) -> bool:
    """Rename ``staging`` to ``final``; a finished ``final`` is kept, an unfinished one replaced
    by a finished ``staging``. Returns whether ``staging`` became ``final``."""
    with contextlib.suppress(OSError):
        os.rename(staging, final)  # fails if final exists and is not empty
        return True
    if ok and not is_finished(final):
        trash = _staging(final)
        with contextlib.suppress(OSError):
            os.rename(final, trash)
        with contextlib.suppress(OSError):
            os.rename(staging, final)
            shutil.rmtree(trash, ignore_errors=True)
            return True
    shutil.rmtree(staging, ignore_errors=True)
    return False


def error_record(error: BaseException) -> dict[str, Any]:
    message = " ".join(str(error).split()) or type(error).__name__
    return {
        "status": "failed",
        "error": f"{type(error).__name__}: {message}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def record_failure(final: Path, error: BaseException) -> None:
    staging = _staging(final)
    staging.mkdir(parents=True, exist_ok=True)
    write_json(staging / ERROR_JSON, error_record(error))
    _publish(staging, final, ok=False)


def run_point(config_data: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """Run one point into ``folder`` (the Dask task; also callable directly).

    Simulates in a staging folder next to ``folder`` and renames it into place when done. Never
    raises for a failed simulation: it writes ``error.json`` and reports ``status`` "failed".
    Returns ``{"hash", "status", "error", "warnings"}``.
    """
    final = Path(folder)
    outcome: dict[str, Any] = {"hash": final.name, "status": None, "error": None, "warnings": []}
    existing = _finished_metrics(final)
    if existing is not None:  # finished meanwhile (another sweep on the same folder)
        return {**outcome, "status": existing["run"]["status"]}
    clear_stale_staging(final)  # left by an attempt whose worker was killed
    staging = _staging(final)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = config_from_dict(config_data)
            result = run(config, staging)
        outcome["warnings"] = sorted({str(w.message) for w in caught})
        outcome["status"] = result.metrics["run"]["status"]
        _publish(staging, final, ok=True)
    except Exception as error:  # a failed point is recorded, never raised
        record = error_record(error)
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "metrics.json").unlink(missing_ok=True)  # finished means run() returned
        write_json(staging / ERROR_JSON, record)
        _publish(staging, final, ok=False)
        outcome.update(status="failed", error=record["error"])
    return outcome


def clear_unfinished(runs: Path, hashes: Sequence[str]) -> None:
    """Remove the failed or unfinished folders of ``hashes`` and their stray staging folders (a
    writer still running there, e.g. an orphaned task, then fails and its result is dropped)."""
    wanted = set(hashes)
    for path in runs.iterdir() if runs.is_dir() else ():
        name = path.name
        stem = name.split(".")[0]
        if stem in wanted and (name.endswith(STAGING_SUFFIX) or (name == stem and not is_finished(path))):
            shutil.rmtree(path, ignore_errors=True)


def classify_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``{"shape", "n_arcs"}`` of a run folder's final snapshot (``None`` unless d = 3 and the
    trajectory is readable)."""
    empty = {"shape": None, "n_arcs": None}
    try:
        with open_dataset(Path(run_dir) / "trajectory.zarr") as ds:
            if ds.sizes.get("dim") != 3 or ds.sizes.get("t", 0) == 0:
                return empty
            x = np.asarray(ds["x"].isel(t=-1).values, dtype=np.float64)
    except (OSError, ValueError, KeyError):
        return empty
    features = shape_features(x)
    return {"shape": classify_shape(x), "n_arcs": features["n_arcs"]}


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _row(point: SweepPoint, folder: Path, keys: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"hash": point.hash, **{key: point.values[key] for key in keys}}
    metrics = _finished_metrics(folder)
    if metrics is not None:
        row.update(status=metrics["run"]["status"], error=None)
        row.update({k: v for k, v in metrics.items() if _scalar(v)})
        row["wall_time_s"] = metrics["run"].get("wall_time_s")
        row.update(classify_run(folder))
        return row
    record = _read_json(folder / ERROR_JSON)
    if isinstance(record, dict):
        row.update(status=record.get("status", "failed"), error=record.get("error"))
    else:
        row.update(status="missing", error=None)
    return row


def collect_results(plan: SweepPlan, runs_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per point of ``plan`` (grid order), read from the run folders in ``runs_dir``."""
    runs = Path(runs_dir)
    return [_row(point, runs / point.hash, plan.keys) for point in plan.points]
