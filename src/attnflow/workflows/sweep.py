"""Cartesian sweeps over config keys on Dask distributed, resumable (SPEC §7.1).

A sweep is a base config and a grid: one or more axes ``section.key = v1, v2, ...``; the points
are the Cartesian product (the first axis varies slowest). Planning is pure and needs no engine::

    axes = [parse_grid("model.beta=1,2,4"), parse_grid("init.seed=0,1")]
    plan = plan_sweep(load_config("base.toml"), axes)   # 6 validated points, or a ConfigError
    summary = run_sweep(plan, "sweeps/beta")             # Dask LocalCluster, one worker per core

Grid syntax (``--grid``): ``section.key=v1,v2,...``. The values are split on the commas that lie
outside brackets and quotes, and each one is read like a ``--set`` value (a TOML value when it
parses as one, else a bare string) and validated with the field's type, so lists are written in
brackets: ``--grid 'gauge.frequencies=[1.0],[0.5,0.25]'`` is two points.

The sweep folder ``DIR``::

    DIR/sweep.json        the base config, the grid, the points (hash and grid values)
    DIR/runs/<hash>/      one run folder per point (``attnflow.workflows.run.run``), named by config_hash
    DIR/results.parquet   one row per point: hash, grid values (columns named by the keys),
    DIR/results.csv       status, error, every top-level scalar of metrics.json, wall_time_s,
                          and the shape class of the final state (``attnflow.viz.phase``)
    DIR/jax_cache/        compiled programs shared by the worker processes (safe to delete)

Resumable: a point whose folder holds a ``metrics.json`` with ``run.status`` is finished and is
skipped. Each point runs in a staging folder ``runs/<hash>.<id>.partial`` that is renamed to
``runs/<hash>`` when the point is finished (or has failed), so a killed sweep leaves only finished
folders, failed folders and stray staging folders; the next run removes the last two and redoes
those points. A failed point does not stop the sweep: its folder holds ``error.json`` (``status``
"failed", ``error``, ``traceback``) and its row has status "failed" and the message. The tables
are rebuilt from the run folders at the end of every run, so a resumed sweep has no duplicates.
A point is known by its config hash only: after a code change that alters results, use a new DIR.

Execution: by default a ``LocalCluster`` on 127.0.0.1 with one single-threaded worker process per
core (``processes=True, threads_per_worker=1``): one single-threaded simulation per worker is the
fastest layout for small runs, and results do not depend on the thread count. Worker processes
get :data:`WORKER_ENVIRON` before they start (through the dask config
``distributed.nanny.pre-spawn-environ``): XLA, OpenMP, MKL and OpenBLAS limited to one thread, and
``MALLOC_TRIM_THRESHOLD_`` set deliberately (see the constant), plus a JAX compilation cache in
``DIR/jax_cache/`` (:func:`compilation_cache_environ`) so that each worker process does not
compile the same programs again. ``scheduler="tcp://host:port"`` (or a scheduler file) uses an
existing cluster instead: start its workers with the same environment variables (see
``examples/sweeps/README.md``), on machines where ``DIR`` has the same path.

Python scripts that call :func:`run_sweep` without ``scheduler`` must guard the call with
``if __name__ == "__main__":``: Dask spawns its worker processes by re-importing the main module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

from attnflow import __version__
from attnflow.io.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    config_hash,
    resolved_dict,
)
from attnflow.numerics.batch import SINGLE_THREAD_ENVIRON, available_cores, single_thread_environ

__all__ = [
    "GridAxis",
    "SweepPlan",
    "SweepPoint",
    "SweepSummary",
    "WORKER_ENVIRON",
    "collect_results",
    "compilation_cache_environ",
    "connect",
    "is_finished",
    "parse_grid",
    "plan_sweep",
    "read_results",
    "run_point",
    "run_sweep",
    "split_values",
    "write_results",
]

GRID = "--grid"
RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"
SWEEP_JSON = "sweep.json"
RUNS = "runs"
ERROR_JSON = "error.json"
STAGING_SUFFIX = ".partial"
CONNECT_TIMEOUT = "20s"  # how long the client waits for an existing scheduler
JAX_CACHE = "jax_cache"

# Environment of each local worker process, set before it starts: single-threaded (small
# simulations only contend for cores, and results must not depend on the thread count; see
# attnflow.numerics.batch.SINGLE_THREAD_ENVIRON), and
# MALLOC_TRIM_THRESHOLD_: Dask's default (65536) returns freed memory to the OS eagerly, which the
# SPEC probe found to double the time of short runs. Here 128 MiB keeps freed memory in the worker
# between runs. Probe on the 2-core machine (16 runs, n = 8, 2 workers, a loaded machine, CPU time
# of the workers, two trials): 65536: 7.9/8.1 s, unset (glibc adaptive): 8.2/7.9 s, 128 MiB:
# 7.5/7.7 s; runs that write figures and a store are not sensitive to it beyond that noise.
WORKER_ENVIRON: dict[str, str] = {**SINGLE_THREAD_ENVIRON, "MALLOC_TRIM_THRESHOLD_": str(128 * 2**20)}


def compilation_cache_environ(cache_dir: str | os.PathLike) -> dict[str, str]:
    """Environment that makes JAX keep every compiled program in ``cache_dir`` (on disk), so that
    a worker process compiles each program once per sweep folder, not once per process."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


Progress = Callable[[int, int], None]


# --- the grid (pure) -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GridAxis:
    """One axis of a grid: a dotted config key and its values (Python values, as TOML reads them)."""

    key: str
    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point: its validated config, the config hash (its folder name) and its grid values."""

    hash: str
    values: dict[str, Any]
    config: Config


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: the base config, the axes and the points, in grid order."""

    base: Config
    axes: tuple[GridAxis, ...]
    points: tuple[SweepPoint, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(axis.key for axis in self.axes)


def _grid_error(key: str | None, constraint: str, value: Any, hint: str = "") -> ConfigError:
    return ConfigError.from_parts(key, constraint, value, hint=hint, where=GRID)


_FORMAT = "given as section.key=v1,v2,... (comma-separated values)"
_EXAMPLE = "For example: --grid model.beta=0.5,1,2 or --grid 'gauge.frequencies=[1.0],[0.5,0.25]'."
_CLOSING = {"[": "]", "{": "}"}


def split_values(text: str) -> list[str]:
    """Split ``text`` on the commas outside brackets (``[]``, ``{}``) and quotes; strip each item.

    ``"1,2"`` → ``["1", "2"]``; ``"[1.0],[0.5, 0.25]"`` → ``["[1.0]", "[0.5, 0.25]"]``;
    ``'"a,b",c'`` → ``['"a,b"', "c"]``. Unbalanced brackets or quotes raise a ConfigError.
    """
    items, current, stack, quote = [], [], [], None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in _CLOSING:
            stack.append(_CLOSING[char])
        elif char in "]}":
            if not stack or stack.pop() != char:
                raise _grid_error(None, "a list of values with balanced brackets", text, hint=_EXAMPLE)
        elif char == "," and not stack:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if stack or quote is not None:
        raise _grid_error(None, "a list of values with balanced brackets and quotes", text, hint=_EXAMPLE)
    items.append("".join(current).strip())
    return items


def parse_grid(spec: str) -> GridAxis:
    """Parse one ``--grid`` option, ``section.key=v1,v2,...``, into a :class:`GridAxis`.

    Each value is read like a ``--set`` value (TOML, else a bare string). The key must exist; the
    values are checked against the field's type by :func:`plan_sweep`. Errors are ConfigErrors
    whose message starts with ``--grid:`` and names the key, the rule and the value.
    """
    key, sep, text = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise _grid_error(key or None, _FORMAT, spec, hint=_EXAMPLE)
    if not text.strip():
        raise _grid_error(key, "a non-empty, comma-separated list of values", text, hint=_EXAMPLE)
    texts = split_values(text)
    if any(not item for item in texts):
        raise _grid_error(
            key, "a comma-separated list of values with no empty entry", text, hint="Remove the extra comma."
        )
    values = []
    for item in texts:
        parsed = apply_overrides({}, [f"{key}={item}"], where=GRID)  # checks the key exists
        section, name = key.split(".")
        values.append(parsed[section][name])
    for i, value in enumerate(values):
        if any(_same(value, other) for other in values[:i]):
            raise _grid_error(key, "a list of distinct values", text, hint=f"{texts[i]!r} is repeated.")
    return GridAxis(key=key, values=tuple(values))


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_is_number(a) and _is_number(b) and a == b)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _with_values(base: Mapping[str, Any], assignment: Mapping[str, Any]) -> dict[str, Any]:
    data = deepcopy(dict(base))
    for key, value in assignment.items():
        section, name = key.split(".")
        if name == "path" and isinstance(value, str) and value:
            value = str((Path.cwd() / Path(value).expanduser()).resolve())  # like --set
        data[section] = {**data.get(section, {}), name: value}
    return data


def _describe(assignment: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={json.dumps(value)}" for key, value in assignment.items())


def _validate(base: Mapping[str, Any], assignment: Mapping[str, Any]) -> Config:
    try:
        return config_from_dict(_with_values(base, assignment), where=GRID)
    except ConfigError as error:
        if len(assignment) == 1 and error.key in assignment:
            raise  # the message already names this key and its value
        where = f"At grid point {_describe(assignment)}."
        if error.constraint is None:
            raise ConfigError(f"{error} {where}") from None
        hint = f"{error.hint} {where}".strip()
        raise _grid_error(error.key, error.constraint, error.value, hint=hint) from None


def plan_sweep(base: Config, axes: Sequence[GridAxis]) -> SweepPlan:
    """Validate every point of the grid ``axes`` over ``base`` (pure: nothing runs or is written).

    Each value is first checked alone (so an error names the axis and the value), then every
    combination (rules that tie keys together). Raises ConfigError (``--grid: ...``).
    """
    axes = tuple(axes)
    if not axes:
        raise _grid_error(None, "at least one axis (--grid section.key=v1,v2,...)", [], hint=_EXAMPLE)
    seen: set[str] = set()
    for axis in axes:
        if axis.key in seen:
            raise _grid_error(axis.key, "given in one --grid option only", axis.key, hint="Merge the values.")
        seen.add(axis.key)
        if not axis.values:
            raise _grid_error(axis.key, "a non-empty list of values", [], hint=_EXAMPLE)
    data = resolved_dict(base)
    for axis in axes:
        for value in axis.values:
            _validate(data, {axis.key: value})
    points, hashes = [], {}
    for combination in itertools.product(*(axis.values for axis in axes)):
        assignment = dict(zip((axis.key for axis in axes), combination, strict=True))
        config = _validate(data, assignment)
        digest = config_hash(config)
        if digest in hashes:
            raise _grid_error(
                None,
                "a grid of distinct configurations",
                _describe(assignment),
                hint=f"It resolves to the same config as {_describe(hashes[digest])} (hash {digest}).",
            )
        hashes[digest] = assignment
        resolved = resolved_dict(config)
        values = {key: resolved[key.split(".")[0]][key.split(".")[1]] for key in assignment}
        points.append(SweepPoint(hash=digest, values=values, config=config))
    return SweepPlan(base=base, axes=axes, points=tuple(points))


# --- run folders -----------------------------------------------------------------------------------


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
    """A point is finished when its folder holds a metrics.json with ``run.status``."""
    return _finished_metrics(Path(folder)) is not None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)


def _staging(final: Path) -> Path:
    return final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}{STAGING_SUFFIX}")


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


def _error_record(error: BaseException) -> dict[str, Any]:
    message = " ".join(str(error).split()) or type(error).__name__
    return {
        "status": "failed",
        "error": f"{type(error).__name__}: {message}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def _record_failure(final: Path, error: BaseException) -> None:
    staging = _staging(final)
    staging.mkdir(parents=True, exist_ok=True)
    _write_json(staging / ERROR_JSON, _error_record(error))
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
    staging = _staging(final)
    try:
        from attnflow.workflows.run import run  # imported on the worker

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = config_from_dict(config_data)
            result = run(config, staging)
        outcome["warnings"] = sorted({str(w.message) for w in caught})
        outcome["status"] = result.metrics["run"]["status"]
        _publish(staging, final, ok=True)
    except Exception as error:  # a failed point is recorded, never raised
        record = _error_record(error)
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "metrics.json").unlink(missing_ok=True)  # finished means run() returned
        _write_json(staging / ERROR_JSON, record)
        _publish(staging, final, ok=False)
        outcome.update(status="failed", error=record["error"])
    return outcome


def _clear_unfinished(runs: Path, hashes: Sequence[str]) -> None:
    """Remove the failed or unfinished folders of ``hashes`` and their stray staging folders (a
    writer still running there, e.g. an orphaned task, then fails and its result is dropped)."""
    wanted = set(hashes)
    for path in runs.iterdir() if runs.is_dir() else ():
        name = path.name
        stem = name.split(".")[0]
        if stem in wanted and (name.endswith(STAGING_SUFFIX) or (name == stem and not is_finished(path))):
            shutil.rmtree(path, ignore_errors=True)


# --- Dask ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _restored_environ() -> Iterator[None]:
    """The Nanny writes the pre-spawn environment into this process's ``os.environ``; undo it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def connect(
    scheduler: str | None = None, workers: int | None = None, *, environ: Mapping[str, str] | None = None
) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` (an address or a scheduler file), or to a new
    LocalCluster on 127.0.0.1 with ``workers`` single-threaded worker processes (default: one per
    available core, ``attnflow.numerics.batch.available_cores``) whose environment is
    :data:`WORKER_ENVIRON` plus ``environ``."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            if Path(scheduler).is_file():
                client = Client(scheduler_file=scheduler, timeout=CONNECT_TIMEOUT)
            else:
                client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as error:
            raise ValueError(
                f"--scheduler: `ADDRESS` must be a reachable Dask scheduler (tcp://host:port or a "
                f"scheduler file); got {scheduler!r} ({' '.join(str(error).split())})."
            ) from None
        with client:
            yield client
        return
    environ = {**WORKER_ENVIRON, **single_thread_environ(), **(environ or {})}
    with _restored_environ():
        for key in environ:  # the Nanny lets os.environ override the config; ours must win
            os.environ.pop(key, None)
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
            cluster = LocalCluster(
                n_workers=workers or available_cores(),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,  # no dashboard; its HTTP server on a free loopback port:
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR,
            )
        with cluster, Client(cluster) as client:
            yield client


# --- the sweep -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepSummary:
    """What a :func:`run_sweep` call did: counts, the table paths, and failures/warnings."""

    out_dir: Path
    points: int
    done: int  # simulated now and finished
    skipped: int  # finished before this call
    failed: int  # failed now
    wall_time_s: float
    results: Path
    failures: dict[str, str]  # hash -> error message
    warnings: dict[str, int]  # distinct worker warnings -> number of points


def _check_execution(out_dir: Path, scheduler: str | None, workers: int | None) -> None:
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"sweep: `--workers` must be a positive integer; got {workers!r}.")
    if workers is not None and scheduler is not None:
        raise ValueError(
            f"sweep: `--workers` must be left out with `--scheduler` (the cluster has its own "
            f"workers); got {workers!r}."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"sweep: `--out` must be a folder; got {str(out_dir)!r} (a file).")


def _sweep_record(plan: SweepPlan) -> dict[str, Any]:
    return {
        "attnflow_version": __version__,
        "base": resolved_dict(plan.base),
        "grid": {axis.key: list(axis.values) for axis in plan.axes},
        "points": [{"hash": p.hash, "values": p.values} for p in plan.points],
    }


def run_sweep(
    plan: SweepPlan,
    out_dir: str | os.PathLike,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> SweepSummary:
    """Run every unfinished point of ``plan`` on Dask and write the results tables in ``out_dir``.

    Finished points are skipped; failed and unfinished ones are (re)done. ``progress(done,
    total)`` is called as points complete (``total`` counts the points to run now). Nothing is
    written before the cluster is reached. Call under ``if __name__ == "__main__":`` when
    ``scheduler`` is None (Dask spawns worker processes).
    """
    start = time.perf_counter()
    out_dir = Path(out_dir).absolute()
    _check_execution(out_dir, scheduler, workers)
    runs = out_dir / RUNS
    todo = [p for p in plan.points if not is_finished(runs / p.hash)]
    done = failed = 0
    failures: dict[str, str] = {}
    caught: dict[str, int] = {}
    if progress is not None:
        progress(0, len(todo))
    with contextlib.ExitStack() as stack:
        if todo:  # reach the cluster before writing anything
            cache = compilation_cache_environ(out_dir / JAX_CACHE)
            client = stack.enter_context(connect(scheduler, workers, environ=cache))
        runs.mkdir(parents=True, exist_ok=True)
        _write_json(out_dir / SWEEP_JSON, _sweep_record(plan))
        _clear_unfinished(runs, [p.hash for p in plan.points])
        if todo:
            done, failed = _execute(client, todo, runs, progress, failures, caught)
    rows = collect_results(plan, runs)
    write_results(rows, out_dir)
    return SweepSummary(
        out_dir=out_dir,
        points=len(plan.points),
        done=done,
        skipped=len(plan.points) - len(todo),
        failed=failed,
        wall_time_s=time.perf_counter() - start,
        results=out_dir / RESULTS_PARQUET,
        failures=failures,
        warnings=caught,
    )


def _execute(client, todo, runs: Path, progress, failures: dict, caught: dict) -> tuple[int, int]:
    from distributed import as_completed

    futures = {
        client.submit(
            run_point, resolved_dict(p.config), str(runs / p.hash), key=f"attnflow-point-{p.hash}"
        ): p
        for p in todo
    }
    done = failed = 0
    for count, future in enumerate(as_completed(futures), start=1):
        point = futures[future]
        try:
            outcome = future.result()
        except Exception as error:  # the worker died (KilledWorker), the task was cancelled, ...
            _record_failure(runs / point.hash, error)
            outcome = {"status": "failed", "error": _error_record(error)["error"], "warnings": []}
        if outcome["status"] == "failed":
            failed += 1
            failures[point.hash] = outcome["error"]
        else:
            done += 1
        for message in outcome["warnings"]:
            caught[message] = caught.get(message, 0) + 1
        future.release()
        if progress is not None:
            progress(count, len(futures))
    return done, failed


# --- the results table -----------------------------------------------------------------------------


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _row(point: SweepPoint, folder: Path, keys: Sequence[str]) -> dict[str, Any]:
    from attnflow.viz.phase import classify_run

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


def _column(values: list[Any]):
    """A pyarrow array of one type: bool, int64, float64, or strings (JSON for lists)."""
    import pyarrow as pa

    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.bool_() if present else pa.null())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.int64())
    if all(_is_number(v) for v in present):
        floats = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]
        return pa.array(floats, type=pa.float64())
    return pa.array(
        [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], type=pa.string()
    )


def write_results(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.parquet`` and ``results.csv`` (atomically) in ``out_dir``; columns in
    first-seen order, missing entries null."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    table = pa.table({name: _column([row.get(name) for row in rows]) for name in names})
    paths = out_dir / RESULTS_PARQUET, out_dir / RESULTS_CSV
    for path, write in zip(paths, (pq.write_table, pa_csv.write_csv), strict=True):
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        write(table, tmp)
        os.replace(tmp, path)
    return paths


def read_results(sweep_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of ``sweep_dir/results.parquet`` as dicts."""
    import pyarrow.parquet as pq

    path = Path(sweep_dir) / RESULTS_PARQUET
    if not path.is_file():
        raise FileNotFoundError(
            f"phase: `DIR` must be a sweep folder with {RESULTS_PARQUET}; got {str(sweep_dir)!r}."
        )
    return pq.read_table(path).to_pylist()
