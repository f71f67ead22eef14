"""Cartesian sweeps over config keys on Dask distributed, resumable.

A sweep is a base config and a grid: one or more axes ``section.key = v1, v2, ...``; the points
are the Cartesian product (the first axis varies slowest). Planning is pure and needs no engine
(:mod:`attnflow.workflows.sweep_plan`); one point's run folder is :mod:`attnflow.workflows.sweep_points`;
the results table is :mod:`attnflow.io.results`::

    axes = [parse_grid("model.beta=1,2,4"), parse_grid("init.seed=0,1")]
    plan = plan_sweep(load_config("base.toml"), axes)   # 6 validated points, or a ConfigError
    summary = run_sweep(plan, "sweeps/beta")             # Dask LocalCluster, one worker per core

Grid syntax (``--grid``): ``section.key=v1,v2,...``. The values are split on the commas that lie
outside brackets and quotes, and each one is read like a ``--set`` value (a TOML value when it
parses as one, else a bare string) and validated with the field's type, so lists are written in
brackets: ``--grid 'gauge.frequencies=[1.0],[0.5,0.25]'`` is two points.

The sweep folder ``DIR``::

    DIR/sweep.json        the base config, the grid, the points (hash, grid values, base keys left out)
    DIR/runs/<hash>/      one run folder per point (``attnflow.workflows.run.run``), named by config_hash
    DIR/results.parquet   one row per point: hash, grid values (columns named by the keys),
    DIR/results.csv       status, error, every top-level scalar of metrics.json, wall_time_s,
                          and the shape class of the final state (``attnflow.analysis.shapes``)

Resumable: a point whose folder holds a ``metrics.json`` with ``run.status`` is finished and is
skipped. Each point runs in a staging folder ``runs/<hash>.<id>.partial`` that is renamed to
``runs/<hash>`` when the point is finished (or has failed), so a killed sweep leaves only finished
folders, failed folders and stray staging folders; the next run removes the last two and redoes
those points. A staging folder left by a killed worker (whose point Dask runs again elsewhere) is
removed by that next attempt and at the end of the sweep, once no live process writes it. A
failed point does not stop the sweep: its folder holds ``error.json`` (``status`` "failed",
``error``, ``traceback``) and its row has status "failed" and the message. The tables
are rebuilt from the run folders at the end of every run, so a resumed sweep has no duplicates.
A point is known by its config hash only: after a code change that alters results, use a new DIR.

A point whose run stopped early (status ``max_steps`` or ``nonfinite`` in its ``metrics.json``)
is finished: it is kept and a later run skips it, since its config alone decides that outcome (a
run is deterministic: a second attempt stops where the first did; raise ``solver.max_steps`` or
lower ``solver.dt``, a new config and so a new point, to go further). It did not finish as asked,
though: every run of the sweep, the one that ran it and each one that skips it, counts it in
:attr:`SweepSummary.failed` and names its status and folder in :attr:`SweepSummary.failures`, so
``attnflow sweep`` exits with 3 as long as a row of the results table has a status other than
"ok" (the row keeps the status and the metrics up to where the run stopped).

Execution: by default a ``LocalCluster`` on 127.0.0.1 with one single-threaded worker process per
core (``processes=True, threads_per_worker=1``): one single-threaded simulation per worker is the
fastest layout for small runs, and results do not depend on the thread count. Worker processes
get :data:`WORKER_ENVIRON` before they start (through the dask config
``distributed.nanny.pre-spawn-environ``): XLA, OpenMP, MKL and OpenBLAS limited to one thread, and
``MALLOC_TRIM_THRESHOLD_`` set deliberately (see the constant), plus JAX's compilation cache in
the user's private cache folder (:func:`compilation_cache_environ`; never a folder inside ``DIR``,
which others may be able to write) so that each worker process does not compile the same
programs again. ``scheduler="tcp://host:port"`` (or a scheduler file) uses an
existing cluster instead: start its workers with the same environment variables (see
``examples/sweeps/README.md``), on machines where ``DIR`` has the same path.

Security: the local cluster speaks TLS with credentials made for it alone and held in memory
(:func:`local_security`: distributed's ``Security.temporary()`` where the ``cryptography``
package is installed, else the same self-signed certificate made by the ``openssl`` command), so
another user of the machine cannot connect to it and run code as you; where neither exists, it
listens on plain TCP on 127.0.0.1 with a warning. A scheduler given with ``scheduler=`` is
**trusted with code execution**: it runs tasks as you and its results are unpickled here; reach
it over TLS with :class:`TlsFiles` (CA, certificate and key files) and connect only to one you
control.

Python scripts that call :func:`run_sweep` without ``scheduler`` must guard the call with
``if __name__ == "__main__":``: Dask spawns its worker processes by re-importing the main module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from attnflow.io.atomic import write_json
from attnflow.io.config import resolved_dict
from attnflow.io.results import RESULTS_PARQUET, write_results
from attnflow.io.run_folder import check_out_folder
from attnflow.io.version import __version__
from attnflow.numerics.batch import SINGLE_THREAD_ENVIRON, available_cores, single_thread_environ
from attnflow.numerics.status import Status
from attnflow.workflows.sweep_plan import GridAxis, SweepPlan, SweepPoint, parse_grid, plan_sweep
from attnflow.workflows.sweep_points import (
    clear_stale_staging,
    clear_unfinished,
    collect_results,
    error_record,
    is_finished,
    record_failure,
    run_point,
)

__all__ = [  # the planning names are re-exported: a sweep script needs this module only
    "GridAxis",
    "SweepPlan",
    "SweepPoint",
    "SweepSummary",
    "TlsFiles",
    "WORKER_ENVIRON",
    "compilation_cache_environ",
    "connect",
    "local_security",
    "parse_grid",
    "plan_sweep",
    "run_sweep",
]

SWEEP_JSON = "sweep.json"
RUNS = "runs"
CONNECT_TIMEOUT = "20s"  # how long the client waits for an existing scheduler

# Environment of each local worker process, set before it starts: single-threaded (small
# simulations only contend for cores, and results must not depend on the thread count; see
# attnflow.numerics.batch.SINGLE_THREAD_ENVIRON), and
# MALLOC_TRIM_THRESHOLD_: Dask's default (65536) returns freed memory to the OS eagerly, and a
# short run then pays to map it again; 128 MiB keeps freed memory in the worker between runs (a
# small probe of short runs found it no slower than the default or glibc's adaptive threshold).
WORKER_ENVIRON: dict[str, str] = {**SINGLE_THREAD_ENVIRON, "MALLOC_TRIM_THRESHOLD_": str(128 * 2**20)}


def compilation_cache_environ(cache_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Environment that makes JAX keep every compiled program in ``cache_dir`` (default: the user's
    private cache folder, :func:`attnflow.numerics.private_folder.cache_folder`), so that a worker
    process compiles each program once, not once per process; empty (each worker compiles its own
    programs) where another user could write or swap that folder
    (:func:`attnflow.numerics.private_folder.check_private_folder`: a cached program runs as code),
    and where the default is asked for and the cache is turned off (``ATTNFLOW_CACHE_DIR=off``)."""
    from attnflow.numerics.private_folder import (
        CacheFolderError,
        cache_folder,
        cache_turned_off,
        check_private_folder,
    )

    if cache_dir is None and cache_turned_off():
        return {}

    cache_dir = cache_folder() if cache_dir is None else Path(cache_dir)
    try:
        check_private_folder(cache_dir)
    except CacheFolderError as error:
        logging.getLogger(__name__).warning("no shared compilation cache: %s", error)
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


Progress = Callable[[int, int], None]


# --- security --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """TLS credentials for an existing scheduler: the CA that signed the cluster's certificates,
    this client's certificate, and its private key (None: in the certificate file)."""

    ca_file: Path
    cert: Path
    key: Path | None = None

    def __post_init__(self) -> None:
        for option, path in (
            ("--tls-ca-file", self.ca_file),
            ("--tls-cert", self.cert),
            ("--tls-key", self.key),
        ):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"sweep: `{option}` must be a readable file; got {str(path)!r}.")

    def security(self) -> Any:
        from distributed.security import Security

        return Security(
            require_encryption=True,
            tls_ca_file=str(self.ca_file),
            tls_client_cert=str(self.cert),
            tls_client_key=None if self.key is None else str(self.key),
        )


_CREDENTIAL_NAME = "dask-internal"  # the name Security.temporary() gives its certificate


def _openssl_credentials() -> tuple[str, str] | None:
    """A self-signed certificate and its key (PEM text) made by the ``openssl`` command in a
    private temporary folder that is removed at once; None without a working ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    with tempfile.TemporaryDirectory(prefix="attnflow-tls-") as folder:  # mode 0700
        key, cert = Path(folder) / "key.pem", Path(folder) / "cert.pem"
        command = [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7",
            "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={_CREDENTIAL_NAME}",
            "-addext", f"subjectAltName=DNS:{_CREDENTIAL_NAME}",
        ]  # fmt: skip
        try:
            subprocess.run(command, capture_output=True, check=True, timeout=60, stdin=subprocess.DEVNULL)
            return cert.read_text(), key.read_text()
        except (OSError, subprocess.SubprocessError):
            return None


def local_security() -> Any:
    """Temporary TLS credentials for a local cluster (a ``distributed.Security`` that requires
    encryption and a certificate of every party), held in memory only: ``Security.temporary()``
    where ``cryptography`` is installed, else the same made by ``openssl``; None when neither is
    available."""
    from distributed.security import Security

    try:
        return Security.temporary()
    except ImportError:  # Security.temporary needs the cryptography package
        pass
    made = _openssl_credentials()
    if made is None:
        return None
    cert, key = made
    roles = ("client", "scheduler", "worker")
    credentials = {
        f"tls_{role}_{part}": text for role in roles for part, text in (("cert", cert), ("key", key))
    }
    return Security(require_encryption=True, tls_ca_file=cert, **credentials)


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
    scheduler: str | None = None,
    workers: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` (an address or a scheduler file; over TLS with
    ``tls``), or to a new LocalCluster on 127.0.0.1 with ``workers`` single-threaded worker
    processes (default: one per available core, ``attnflow.numerics.batch.available_cores``)
    whose environment is :data:`WORKER_ENVIRON` plus ``environ``, secured by
    :func:`local_security`."""
    import logging
    import warnings

    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        security = None if tls is None else tls.security()
        try:
            if Path(scheduler).is_file():
                client = Client(scheduler_file=scheduler, timeout=CONNECT_TIMEOUT, security=security)
            else:
                client = Client(scheduler, timeout=CONNECT_TIMEOUT, security=security)
        except (OSError, TimeoutError, ValueError) as error:
            raise ValueError(
                f"--scheduler: `ADDRESS` must be a reachable Dask scheduler (tcp://host:port or a "
                f"scheduler file); got {scheduler!r} ({' '.join(str(error).split())})."
            ) from None
        with client:
            yield client
        return
    environ = {**WORKER_ENVIRON, **single_thread_environ(), **(environ or {})}
    security = local_security()
    if security is None:
        warnings.warn(
            "sweep: the local Dask cluster listens without TLS on 127.0.0.1 (install the "
            "`cryptography` package or the `openssl` command for private credentials).",
            stacklevel=3,
        )
    with _restored_environ():
        for key in environ:  # the Nanny lets os.environ override the config; ours must win
            os.environ.pop(key, None)
        # no HTTP pages: any local user could read the scheduler's and workers' (plain HTTP)
        quiet = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ, **quiet}):
            cluster = LocalCluster(
                n_workers=workers or available_cores(),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                protocol="tcp://" if security is None else "tls://",
                security=security,
                dashboard_address=None,  # no dashboard; its HTTP server on a free loopback port:
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR,
            )
        with cluster, Client(cluster) as client:
            yield client


# --- the sweep -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepSummary:
    """What a :func:`run_sweep` call did: counts, the table paths, and failures/warnings.

    ``failed`` counts the points that did not finish as asked (the rows of the results table whose
    status is not "ok"): those that failed now, and those whose run stopped early with a status
    such as ``max_steps`` or ``nonfinite``, now or in an earlier call (kept, and skipped now).
    ``done`` + ``skipped`` + the points that failed or stopped now = ``points``."""

    out_dir: Path
    points: int
    done: int  # simulated now and finished as asked (status "ok")
    skipped: int  # finished before this call, whatever their status (not simulated again)
    failed: int  # did not finish as asked: failed now, or stopped early (now or before)
    wall_time_s: float
    results: Path
    failures: dict[str, str]  # hash -> error message, or the status that stopped it and where
    warnings: dict[str, int]  # distinct worker warnings -> number of points


def _check_execution(out_dir: Path, scheduler: str | None, workers: int | None) -> None:
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"sweep: `--workers` must be a positive integer; got {workers!r}.")
    if workers is not None and scheduler is not None:
        raise ValueError(
            f"sweep: `--workers` must be left out with `--scheduler` (the cluster has its own "
            f"workers); got {workers!r}."
        )
    check_out_folder(out_dir)  # the one out-folder check (attnflow.io.run_folder)
    if scheduler is not None:
        check_scheduler(scheduler)


_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://\S+$")


def check_scheduler(scheduler: str) -> None:
    """``scheduler`` must be a Dask address (``tcp://host:port``, ``tls://...``) or a scheduler
    file (JSON with an ``address``); checked before any connection. A scheduler runs code as
    the sweep's user and results come back pickled: connect only to one you trust."""
    where = "--scheduler: `ADDRESS` must be a Dask address (tcp://host:port) or a scheduler file"
    where = f"{where}; got {scheduler!r}"
    path = Path(scheduler)
    if not path.exists():
        if not _ADDRESS.match(scheduler):
            raise ValueError(f"{where} (neither an address nor an existing file).")
        try:
            port = urlsplit(scheduler).port  # raises for a port beyond 65535
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError(f"{where} (its port must be in 1-65535).")
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not JSON"
        raise ValueError(f"{where} ({reason}).") from None
    if not isinstance(record, dict) or not isinstance(record.get("address"), str):
        raise ValueError(f'{where} (a JSON file without an "address").')


def _sweep_record(plan: SweepPlan) -> dict[str, Any]:
    return {
        "attnflow_version": __version__,
        "base": resolved_dict(plan.base),
        "grid": {axis.key: list(axis.values) for axis in plan.axes},
        "points": [  # with the base keys a point leaves out (its choices do not read them)
            {"hash": p.hash, "values": p.values, **({"left_out": list(p.left_out)} if p.left_out else {})}
            for p in plan.points
        ],
    }


def run_sweep(
    plan: SweepPlan,
    out_dir: str | os.PathLike,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
    tls: TlsFiles | None = None,
) -> SweepSummary:
    """Run every unfinished point of ``plan`` on Dask and write the results tables in ``out_dir``.

    Finished points are skipped, whatever their status; failed and unfinished ones are (re)done.
    A point whose run stopped early (status ``max_steps``, ``nonfinite``: kept, not run again)
    counts in the summary's ``failed`` and ``failures`` on every call (see the module). ``progress(done,
    total)`` is called as points complete (``total`` counts the points to run now). Nothing is
    written before the cluster is reached. Call under ``if __name__ == "__main__":`` when
    ``scheduler`` is None (Dask spawns worker processes). ``tls``: credentials for ``scheduler``.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir).absolute()
    _check_execution(out_dir, scheduler, workers)
    if tls is not None and scheduler is None:
        raise ValueError(
            "sweep: `--tls-ca-file` must be left out without `--scheduler` (the local cluster makes "
            f"its own credentials); got {str(tls.ca_file)!r}."
        )
    runs = out_dir / RUNS
    todo = [p for p in plan.points if not is_finished(runs / p.hash)]
    done = failed = 0
    failures: dict[str, str] = {}
    caught: dict[str, int] = {}
    if progress is not None:
        progress(0, len(todo))
    with contextlib.ExitStack() as stack:
        if todo:  # reach the cluster before writing anything
            cache = compilation_cache_environ()
            client = stack.enter_context(connect(scheduler, workers, environ=cache, tls=tls))
        runs.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / SWEEP_JSON, _sweep_record(plan))
        clear_unfinished(runs, [p.hash for p in plan.points])
        if todo:
            done, failed = _execute(client, todo, runs, progress, failures, caught)
            for point in todo:  # a killed worker's staging folder, its point finished elsewhere
                clear_stale_staging(runs / point.hash)
    rows = collect_results(plan, runs)
    write_results(rows, out_dir)
    ran = {point.hash for point in todo}
    for row in rows:  # stopped early (now, or kept from an earlier call): not finished as asked
        if row["status"] != "ok" and row["hash"] not in failures:
            failures[row["hash"]] = _not_ok(row["status"], runs / row["hash"])
            failed += 1
            done -= row["hash"] in ran  # _execute counted it as done
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


def _not_ok(status: str, folder: Path) -> str:
    """One line for a point whose row status is not "ok": a run that stopped early (its status,
    what it means, and where it is recorded), or a folder without a result."""
    if status in Status.__members__:
        where, why = str(folder / "metrics.json"), Status(status).message
        return f"stopped with status {status!r}, recorded in {where!r} and the results table: {why}"
    return f"no result (status {status!r}) in {str(folder)!r}"


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
            record_failure(runs / point.hash, error)
            outcome = {"status": "failed", "error": error_record(error)["error"], "warnings": []}
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
