"""The one batch runner: independent tasks in single-threaded worker processes, one per core.

XLA splits every operation of a run over all the cores of its process, which does not pay for
small runs, and JAX cannot limit a device to one thread; one single-threaded process per core can
(``benchmarks/RESULTS.md`` has the measurements). So every place that runs many independent things
at once uses this module: ``solve`` hands each process a share of a CPU batch of seeds,
``attnflow reproduce`` its jobs, and a local ``attnflow sweep`` sizes its Dask cluster with
``available_cores`` and starts its workers with ``SINGLE_THREAD_ENVIRON``.

The machinery is the standard one: ``concurrent.futures.ProcessPoolExecutor`` with a *spawn*
context (never fork a process that runs JAX). A task is a picklable function and its picklable
arguments (JAX arrays and pytrees of them pickle as NumPy data). Each worker process starts with
``SINGLE_THREAD_ENVIRON`` (set in this process while the workers are spawned, so that it is in
place before the child imports NumPy or starts XLA) and ``POOL_ENVIRON`` (CPU only; Python's
``safe_path``: the bootstrap of a spawned child never puts the working directory on ``sys.path``,
and multiprocessing gives it this process's ``sys.path``, so a stray ``numpy.py`` or ``attnflow/``
in the working directory is never imported by a worker). A worker dies with its parent
(``die_with_parent``: Linux's parent-death signal), so a killed run leaves no worker behind.
Workers never see Ctrl-C or SIGTERM: they are spawned with both blocked (a signal mask survives
the start of a process), so the SIGINT a terminal sends to its whole process group, and the
SIGTERM that SLURM may send each process of a job in turn at its time limit (``timeout``: to its
process group), reach only the parent, which stops the batch and kills its workers (SIGKILL: they
block SIGTERM); no worker dies half-started printing a traceback, and none dies before the parent
has stopped, which would turn its clean stop into a dead worker's error (CPython's multiprocessing
resource tracker, a child too, ignores both signals likewise).

``ATTNFLOW_CORES`` caps the cores a process uses (``available_cores``); the workers run with
``ATTNFLOW_CORES=1``, so that none starts workers of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

CORES_VARIABLE = "ATTNFLOW_CORES"  # caps the cores a process uses (set to 1 in worker processes)

# The environment of a single-threaded worker process (this module's, and a local sweep's Dask workers).
SINGLE_THREAD_ENVIRON: dict[str, str] = {
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",  # "intra_op_parallelism_threads=1" is not an XLA flag
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    # no asynchronous dispatch: the thread that dispatches and the one that computes share one core
    "JAX_CPU_ENABLE_ASYNC_DISPATCH": "false",
    CORES_VARIABLE: "1",
}
# ... and for this module's workers: CPU only, and never the working directory on sys.path.
POOL_ENVIRON: dict[str, str] = {"JAX_PLATFORMS": "cpu", "PYTHONSAFEPATH": "1"}
_SPAWN = threading.Lock()  # one pool spawns at a time: the environment of this process is borrowed


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (where the OS reports one), at most
    ``$ATTNFLOW_CORES`` when that is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    cap = os.environ.get(CORES_VARIABLE)
    if cap is None:
        return cores
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"environment variable {CORES_VARIABLE} must be a positive integer; got {cap!r}.")
    return min(cores, int(cap))


def single_thread_environ() -> dict[str, str]:
    """``SINGLE_THREAD_ENVIRON``, with the XLA flags of this process kept in front of its own."""
    user_flags = os.environ.get("XLA_FLAGS")
    flags = SINGLE_THREAD_ENVIRON["XLA_FLAGS"]
    return {**SINGLE_THREAD_ENVIRON, "XLA_FLAGS": f"{user_flags} {flags}" if user_flags else flags}


def worker_count(tasks: int, workers: int | None = None, *, where: str = "solve") -> int:
    """Processes for ``tasks`` independent tasks: ``workers`` (None: one per available core), at
    most one per task; 1 means in this process."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"{where}: `workers` must be a positive integer or None; got {workers!r}.")
    return max(1, min(available_cores() if workers is None else workers, tasks))


@contextlib.contextmanager
def _borrowed_environ(environ: dict[str, str]) -> Iterator[None]:
    with _SPAWN:
        saved = {key: os.environ.get(key) for key in environ}
        os.environ.update(environ)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # what a worker never sees (the module doc says why)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread (one that arrives meanwhile is delivered after,
    not lost); processes started here inherit the mask and keep both blocked."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# The wait for the tasks wakes this often. A signal is handled by Python in the main thread only,
# but the kernel may deliver it to another thread of this process (the pool's threads); the main
# thread, asleep in a wait without a deadline, then saw it only when a task finished (a Ctrl-C
# ignored for the 60 s of the test's tasks, twice in clean-clone test runs). Woken, it raises the
# KeyboardInterrupt at once.
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """A worker's initializer: on Linux the kernel sends this process SIGKILL when the process that
    started it dies (a SIGKILLed parent included), so no worker computes on for nobody; and a
    worker whose parent died before this ran exits at once."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def run_tasks(fn: Callable[..., Any], tasks: Sequence[tuple], *, workers: int) -> Iterator[tuple[int, Any]]:
    """``fn(*task)`` for every task, in ``workers`` single-threaded spawned processes (1: here, in
    order); yields ``(index, result)`` as each finishes. Tasks start in the order given; an
    exception in a task (or ``BrokenProcessPool`` for a worker that died) is raised here when its
    result is reached. Whenever the tasks do not all finish (an exception, a dead worker, the
    caller closing this generator), every other worker is killed and waited for at once."""
    if workers <= 1 or len(tasks) <= 1:
        for index, task in enumerate(tasks):
            yield index, fn(*task)
        return
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent, initargs=(os.getpid(),),
    )  # fmt: skip
    finished = False
    try:
        # a spawn pool starts its processes as tasks are submitted: all of them start here
        with _borrowed_environ({**single_thread_environ(), **POOL_ENVIRON}), _stop_signals_blocked():
            futures = {pool.submit(fn, *task): index for index, task in enumerate(tasks)}
        pending = set(futures)
        while pending:  # woken every POLL_S: see POLL_S
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.__getitem__):
                yield futures[future], future.result()
        finished = True
    finally:
        if not finished:  # a task failed, a worker died, or the caller stopped early
            _stop_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill every worker of ``pool`` and wait for each (none left running, none a zombie): a pool
    shut down normally would let the running tasks finish first. SIGKILL: the workers block SIGTERM
    (the module doc says why), whose default action, which ended them before, is as abrupt."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.kill()
    for process in processes:
        process.join()
