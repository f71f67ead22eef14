"""A reproduce folder: its marker, one record per finished experiment, and what may be cleared.

``attnflow reproduce --out DIR`` writes, in this order:

1. ``.attnflow-reproduce`` (the marker, JSON): the settings of the run (``quick``, ``sizes``,
   ``seeds``, ``overrides``) and every file reproduce wrote there (``report``: the report's files;
   the records are found by name). A folder without it is not a reproduce folder and is never
   cleared;
2. ``experiments/<id>.json`` and ``experiments/<id>.npz``, as each experiment finishes: its jobs'
   measured values, timings and expectation rows (JSON), and the arrays its figures draw (NumPy,
   no pickle). The JSON is written last: it marks the experiment complete;
3. the report (``results.json``, ``report.md``, ``report.html``, ``table.md``, ``figures/``) over
   every experiment recorded in the folder.

The folder's lifecycle (claim, lock, resume, overwrite) is :mod:`attnflow.io.run_folder`'s, with
this module's :data:`LAYOUT` (a user's other files beside the report are kept, never refused):

- :func:`check_folder`: may reproduce write into ``DIR`` (raises :class:`OutFolderError`, a
  ``ValueError``, with one line; writes nothing); a resumed run must have the folder's settings;
- :func:`claimed`: the same check, then the folder held against a second reproduce (cleared
  with ``overwrite``: only what reproduce wrote);
- :func:`prepare_folder`: remove the earlier report, write the marker with the settings;
- :func:`write_record`, :func:`read_records`: one experiment's results;
- :func:`write_report`: write the report and record its files in the marker (a report that did
  not finish is removed).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.io import run_folder
from attnflow.io.atomic import replacing, write_json
from attnflow.io.outcomes import FigureData, JobResult
from attnflow.io.run_folder import OutFolderError

__all__ = [
    "MARKER",
    "RECORDS",
    "Record",
    "check_folder",
    "claimed",
    "make_settings",
    "prepare_folder",
    "read_records",
    "write_record",
    "write_report",
]

MARKER = ".attnflow-reproduce"
RECORDS = "experiments"
FORMAT = 1
TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{8}\.tmp")  # attnflow.io.atomic's temporary name of <name>
RECORD_NAME = re.compile(r"[A-Za-z]+[0-9]+\.(json|npz)")  # experiments/E0.json, experiments/E0.npz
OPTIONS = {"quick": "--quick", "sizes": "--sizes", "seeds": "--seeds", "overrides": "--set"}

Record = tuple[list[JobResult], list[dict[str, Any]]]  # an experiment's jobs and expectation rows


def make_settings(
    *, quick: bool, sizes: Sequence[int] | None, n_seeds: int | None, overrides: Sequence[str]
) -> dict[str, Any]:
    """The settings a resumed run must share with the folder's (``--only`` may differ)."""
    return {"quick": bool(quick), "sizes": None if sizes is None else [int(n) for n in sizes],
            "seeds": n_seeds, "overrides": list(overrides)}  # fmt: skip


def _marker(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / MARKER
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}  # a marker a crash left empty: still reproduce's folder
    return data if isinstance(data, dict) else {}


def _shown(key: str, value: Any) -> str:
    if key == "quick":
        return "on" if value else "off"
    if value is None or value == []:
        return "unset"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _check_settings(out_dir: Path, settings: dict[str, Any]) -> None:
    """A resumed run must have the settings of the run in ``out_dir`` (``--only`` may differ)."""
    earlier = (_marker(out_dir) or {}).get("settings", {})
    differ = [key for key in OPTIONS if key in earlier and earlier[key] != settings[key]]
    if differ:
        what = "; ".join(
            f"{OPTIONS[k]} {_shown(k, settings[k])} (folder: {_shown(k, earlier[k])})" for k in differ
        )
        raise OutFolderError(
            f"--resume: the settings must be those of the run in {str(out_dir)!r}; got {what}. "
            "Pass --overwrite to start again."
        )


def _own_paths(out_dir: Path) -> list[Path]:
    """Every file reproduce wrote into ``out_dir`` (and temporary files its killed writes left)."""
    marker = _marker(out_dir) or {}
    report = [out_dir / name for name in marker.get("report", [])]
    folder = out_dir / RECORDS
    records = [p for p in (folder.iterdir() if folder.is_dir() else ()) if RECORD_NAME.fullmatch(p.name)]
    own = [*report, *sorted(records)]
    names = {(p.parent, p.name) for p in [*own, out_dir / MARKER]}

    def written_by_us(path: Path) -> bool:  # a killed atomic write leaves ".<name>.<8 hex>.tmp"
        match = TEMPORARY.fullmatch(path.name)
        name = match and match.group(1)
        return bool(name) and bool(
            (path.parent, name) in names or (path.parent == folder and RECORD_NAME.fullmatch(name))
        )

    parents = {p.parent for p in own} | {folder, out_dir}
    temporary = [p for parent in parents if parent.is_dir() for p in parent.iterdir() if written_by_us(p)]
    return [p for p in own if p.exists()] + temporary


LAYOUT = run_folder.Layout(
    "reproduce",
    MARKER,
    own=_own_paths,
    keeps_foreign=True,  # a user's notes beside the report stay
)


def check_folder(
    out_dir: str | os.PathLike, settings: dict[str, Any], *, resume: bool, overwrite: bool
) -> None:
    """Raise :class:`OutFolderError` with one line unless reproduce may write into ``out_dir``: a new
    or empty folder; or a reproduce folder with ``overwrite``, or with ``resume`` and the same
    settings (:func:`attnflow.io.run_folder.check_claim`). Writes nothing."""
    out_dir = Path(out_dir)
    run_folder.check_claim(out_dir, LAYOUT, resume=resume, overwrite=overwrite)
    if resume and (out_dir / MARKER).is_file():
        _check_settings(out_dir, settings)


def claimed(
    out_dir: str | os.PathLike, settings: dict[str, Any], *, resume: bool, overwrite: bool
) -> contextlib.AbstractContextManager[run_folder.Claim]:
    """``out_dir`` held for reproduce (:func:`attnflow.io.run_folder.claimed`): checked, cleared
    with ``overwrite``; a second reproduce into it meanwhile is refused."""
    check = functools.partial(_check_settings, settings=settings)
    return run_folder.claimed(out_dir, LAYOUT, resume=resume, overwrite=overwrite, check=check)


def prepare_folder(out_dir: str | os.PathLike, settings: dict[str, Any]) -> None:
    """Make the claimed ``out_dir`` this run's: remove the earlier report (it is written again,
    over every recorded experiment, when the run ends), then write the marker."""
    out_dir = Path(out_dir)
    marker = _marker(out_dir) or {}
    run_folder.remove([out_dir / name for name in marker.get("report", [])], out_dir)
    write_json(out_dir / MARKER, {"format": FORMAT, "settings": settings, "report": []})


def write_report(out_dir: str | os.PathLike, write: Callable[[], Iterable[Path]]) -> None:
    """Run ``write()`` (which writes the report into ``out_dir`` and returns its files) and record
    those files in the marker, so that they can be cleared, and no others. If ``write`` does not
    finish (Ctrl-C included), the files it had written are removed: no half report is left to
    present itself as the run's."""
    out_dir = Path(out_dir)
    before = {p for p in out_dir.rglob("*") if p.is_file()}
    try:
        paths = list(write())
    except BaseException:
        run_folder.remove([p for p in out_dir.rglob("*") if p.is_file() and p not in before], out_dir)
        raise
    marker = _marker(out_dir) or {}
    marker["report"] = sorted(str(Path(p).relative_to(out_dir)) for p in paths)
    write_json(out_dir / MARKER, marker)


# --------------------------------------------------------------------------- records


def _arrays(index: int, figure: FigureData) -> dict[str, np.ndarray]:
    arrays = {}
    if figure.color is not None:
        arrays[f"{index}/color"] = figure.color
    for label, (x, u) in figure.states.items():
        arrays[f"{index}/states/{label}/x"] = x
        if u is not None:
            arrays[f"{index}/states/{label}/u"] = u
    for group in ("series", "seed_series"):
        for key, value in getattr(figure, group).items():
            arrays[f"{index}/{group}/{key}"] = value
    if figure.target is not None:
        arrays[f"{index}/target/target"], arrays[f"{index}/target/realised"] = figure.target[1:]
    if figure.density is not None:
        arrays[f"{index}/density/grid"], arrays[f"{index}/density/pdf"] = figure.density
    return {key: np.asarray(value) for key, value in arrays.items()}


def _figure(index: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> FigureData:
    figure = FigureData(beta=float(meta.get("beta", 1.0)))
    prefix = f"{index}/"
    for key, value in arrays.items():
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].split("/")
        if parts == ["color"]:
            figure.color = value
        elif parts[0] == "states" and parts[-1] == "x":
            label = "/".join(parts[1:-1])
            figure.states[label] = (value, arrays.get(f"{prefix}states/{label}/u"))
        elif parts[0] in ("series", "seed_series"):
            getattr(figure, parts[0])["/".join(parts[1:])] = value
    if meta.get("target") is not None:
        figure.target = (meta["target"], arrays[f"{prefix}target/target"], arrays[f"{prefix}target/realised"])
    if f"{prefix}density/grid" in arrays:
        figure.density = (arrays[f"{prefix}density/grid"], arrays[f"{prefix}density/pdf"])
    return figure


_FIELDS = ("experiment", "variant", "label", "n", "seeds", "status", "reason", "values", "timing")


def write_record(out_dir: str | os.PathLike, experiment: str, jobs: Sequence[JobResult], rows: list) -> Path:
    """Write one finished experiment's record (arrays first, then the JSON that marks it complete)."""
    folder = Path(out_dir) / RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {key: value for i, job in enumerate(jobs) for key, value in _arrays(i, job.figure).items()}
    with replacing(folder / f"{experiment}.npz") as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    meta = [{field: getattr(job, field) for field in _FIELDS}
            | {"figure": {"beta": job.figure.beta, "target": job.figure.target and job.figure.target[0]}}
            for job in jobs]  # fmt: skip
    return write_json(folder / f"{experiment}.json", {"format": FORMAT, "jobs": meta, "rows": rows}, indent=1)


def read_records(out_dir: str | os.PathLike) -> dict[str, Record]:
    """The complete experiments recorded in ``out_dir``, by id (a record whose JSON or arrays cannot
    be read is not complete: the experiment runs again)."""
    records = {}
    for path in sorted((Path(out_dir) / RECORDS).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            with np.load(path.with_suffix(".npz"), allow_pickle=False) as npz:
                arrays = {key: npz[key] for key in npz.files}
        except (OSError, ValueError):
            continue
        jobs = [
            JobResult(**{field: meta[field] for field in _FIELDS if field != "seeds"},
                      seeds=tuple(meta["seeds"]), figure=_figure(i, meta["figure"], arrays))
            for i, meta in enumerate(data["jobs"])
        ]  # fmt: skip
        records[path.stem] = (jobs, data["rows"])
    return records
