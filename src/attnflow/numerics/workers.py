"""Batches of runs on a CPU in worker processes: one single-threaded simulation per core.

XLA splits every operation of a run over all the cores of its process, which does not pay for small
runs, and JAX cannot limit a device to one thread (jax issues #743, #1539, #6790): two runs in one
process, one per CPU device (``attnflow.numerics.lanes.batch_on_devices``), contend for the same threads.
Only a process's CPU affinity confines XLA to one core. Measured in one run on 2 cores (n = 256,
RK4, τ = 20, 10 seeds, snapshots every 0.1): 6.5–7.1 s in two worker processes, 8.4–11.7 s in one
process on two devices; 10 sequential NumPy runs took 23.0–24.3 s (``benchmarks/RESULTS.md`` has
the current figures).

So ``solve`` hands a CPU batch to worker processes, one per available core (``batch_workers``):
the program of a share of the batch (each run the unbatched program, ``lax.map`` over the share)
is exported once (``jax.export``), loaded and compiled by every worker, then called once per group
of snapshots. Each worker keeps its share's state between calls, so the next call is queued
before the last one is collected and no worker waits for this process. The results are bitwise
those of single runs in this process (tested): the worker runs the same program on one core, and
XLA's results do not depend on the core count (``tests/test_performance.py``).

A worker is ``python -c "import attnflow.numerics.workers as w; w.serve()"``, pinned to one core where the
OS allows it (Linux), speaking length-prefixed pickles over its stdin and stdout; stray output
goes to stderr. It exits when its stdin closes, so it never outlives this process. The workers
start with the first batch (about 2 s, part of that run's one-time start-up,
``Trajectory.compile_time_s``) and serve every later one; batches from several threads at once
get workers of their own.

``ATTNFLOW_CORES`` caps the cores a process uses (``lanes.available_cores``): the workers, and the
worker processes of ``attnflow reproduce`` and ``attnflow sweep``, run with ``ATTNFLOW_CORES=1``,
so that none starts workers of its own.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence

import jax
import numpy as np

from attnflow.numerics import lanes

# Environment of a single-threaded worker process (these workers, and those of reproduce and sweep).
SINGLE_THREAD_ENVIRON: dict[str, str] = {
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",  # "intra_op_parallelism_threads=1" is not an XLA flag
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    lanes.CORES_VARIABLE: "1",
}
# ... and for the workers here: CPU only, and no asynchronous dispatch: the thread that dispatches
# and the one that computes would share the worker's core (measured, the 10-seed batch above:
# 7.5–7.8 s without it, 9.1–9.9 s with it).
_WORKER_JAX = {"JAX_PLATFORMS": "cpu", "JAX_CPU_ENABLE_ASYNC_DISPATCH": "false"}
_HEADER = struct.Struct("<Q")
_SERVE = "import attnflow.numerics.workers as w; w.serve()"


def single_thread_environ() -> dict[str, str]:
    """The variables that make a child process single-threaded: ``SINGLE_THREAD_ENVIRON``, with the
    XLA flags of this process kept in front of its own."""
    user_flags = os.environ.get("XLA_FLAGS")
    flags = SINGLE_THREAD_ENVIRON["XLA_FLAGS"]
    return {**SINGLE_THREAD_ENVIRON, "XLA_FLAGS": f"{user_flags} {flags}" if user_flags else flags}


def one_core_per_process() -> None:
    """Initializer of a worker process of another pool (``attnflow reproduce``): it runs on one
    core's share and starts no workers of its own (``ATTNFLOW_CORES=1``)."""
    os.environ[lanes.CORES_VARIABLE] = "1"


def batch_workers(size: int, workers: int | None = None) -> int:
    """Worker processes for a batch of ``size`` runs: ``workers`` (None: one per available core, on
    a CPU only), at most ``size``; 1 means in this process."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"solve: `workers` must be a positive integer or None; got {workers!r}.")
    if workers is None:
        workers = lanes.available_cores() if jax.devices()[0].platform == "cpu" else 1
    return max(1, min(workers, size))


# --------------------------------------------------------------------------- the wire


def _write(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    """The next message, or None at the end of the stream."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size = _HEADER.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


# --------------------------------------------------------------------------- the worker side


def serve(stdin=None, stdout=None) -> None:
    """A worker's loop over the messages ``(kind, key, payload)`` of ``stdin``:

    - ``("load", key, (exported, feedback))``: compile a serialized ``jax.export`` program;
    - ``("run", key, args)``: call it; ``("next", key, args)``: call it with its last outputs in
      place of its first ``feedback`` arguments (the state stays in the worker between calls);
    - ``("drop", key, None)``: forget it.

    Each message is answered, in order, with ``("ok", result)`` (outputs as NumPy arrays) or
    ``("error", traceback)``. Returns at the end of ``stdin``."""
    if stdout is None:  # the protocol keeps the real stdout; prints go to stderr
        stdout = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
    stdin = sys.stdin.buffer if stdin is None else stdin
    from jax import export

    programs: dict[int, tuple[Callable, int]] = {}
    last: dict[int, tuple] = {}
    while (message := _read(stdin)) is not None:
        kind, key, payload = message
        try:
            if kind == "load":
                exported, feedback = payload
                program = export.deserialize(exported)
                specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in program.in_avals]
                args, kwargs = jax.tree.unflatten(program.in_tree, specs)
                programs[key] = (jax.jit(program.call).lower(*args, **kwargs).compile(), feedback)
                result = None
            elif kind in ("run", "next"):
                compiled, feedback = programs[key]
                args = list(last[key][:feedback]) + list(payload) if kind == "next" else payload
                last[key] = compiled(*args)
                result = jax.tree.map(np.asarray, last[key])
            elif kind == "drop":
                last.pop(key, None)
                result = programs.pop(key, None) is not None
            else:
                raise ValueError(f"unknown message kind {kind!r}")
            _write(stdout, ("ok", result))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            _write(stdout, ("error", traceback.format_exc()))


# --------------------------------------------------------------------------- the parent side


class WorkerError(RuntimeError):
    """A worker process failed or died."""


class _Worker:
    def __init__(self, core: int | None):
        self.core = core
        command = [sys.executable, "-c", _SERVE]
        if core is not None and hasattr(os, "sched_setaffinity"):
            command = [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}}); {_SERVE}"]
        environ = {**os.environ, **single_thread_environ(), **_WORKER_JAX}
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environ)

    def send(self, message) -> None:
        try:
            _write(self.process.stdin, message)
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def receive(self):
        reply = _read(self.process.stdout)
        if reply is None:
            raise self._died()
        status, value = reply
        if status == "error":
            raise WorkerError(f"attnflow worker process (core {self.core}) failed:\n{value}")
        return value

    def _died(self) -> WorkerError:
        code = self.process.wait(timeout=10)
        return WorkerError(
            f"attnflow worker process (core {self.core}) exited with code {code}; its error, if "
            f"any, is on stderr above."
        )

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class _Pool:
    """This process's worker processes: started on demand, lent to one batch at a time, closed at
    exit. A batch gets workers on distinct cores (concurrent batches from several threads get
    workers of their own)."""

    def __init__(self):
        self.idle: list[_Worker] = []
        self.lock = threading.Lock()

    def take(self, count: int) -> list[_Worker]:
        with self.lock:
            self.idle = [w for w in self.idle if w.process.poll() is None]
            chosen: list[_Worker] = []
            for worker in list(self.idle):
                if len(chosen) < count and worker.core not in {w.core for w in chosen}:
                    chosen.append(worker)
                    self.idle.remove(worker)
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
        for core in cores:
            if len(chosen) < count and core not in {w.core for w in chosen}:
                chosen.append(_Worker(core))
        while len(chosen) < count:
            chosen.append(_Worker(None))
        return chosen

    def give_back(self, workers: list[_Worker]) -> None:
        with self.lock:
            self.idle.extend(w for w in workers if w.process.poll() is None)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.close()


_POOL = _Pool()
atexit.register(_POOL.close)
_KEYS = itertools.count()


def _is_key(a) -> bool:
    return isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def _key_impl(tree):
    """The PRNG implementation of the key leaves of ``tree`` (None if it has none)."""
    impls = {jax.random.key_impl(a) for a in jax.tree.leaves(tree) if _is_key(a)}
    if len(impls) > 1:
        names = sorted(map(str, impls))
        raise ValueError(f"attnflow.numerics.workers: PRNG keys of several implementations: {names}.")
    return impls.pop() if impls else None


def _unkey(tree):
    """``tree`` with every PRNG key replaced by its data, and the mask of the key leaves."""
    data = jax.tree.map(lambda a: jax.random.key_data(a) if _is_key(a) else a, tree)
    return data, jax.tree.map(_is_key, tree)


def _rekey(tree, mask, impl):
    return jax.tree.map(lambda a, k: jax.random.wrap_key_data(a, impl=impl) if k else a, tree, mask)


class BatchProgram:
    """``fn`` over a batch, run by ``count`` worker processes, each on a contiguous share of the
    runs (the last share padded with copies of the last run).

    ``in_axes``: 0 (batched) or None (shared) per argument; every output is batched on axis 0.
    The first ``feedback`` outputs are the next call's first ``feedback`` arguments, kept in the
    workers: ``start(*args)`` dispatches a first call, ``advance(*rest)`` the next one (it may be
    dispatched before the previous one is collected), ``collect()`` waits for the oldest call
    and returns its outputs (host arrays; PRNG keys as keys), ``release()`` gives the workers back.
    """

    def __init__(self, fn, args: Sequence, in_axes: Sequence, count: int, feedback: int = 0):
        from jax import export

        self.in_axes, self.feedback = tuple(in_axes), feedback
        self.size = jax.tree.leaves(args[self.in_axes.index(0)])[0].shape[0]
        self.count = count
        self.impl = _key_impl(args)
        self.in_keys = _unkey(list(args))[1]
        self.out_keys = None
        self.key = next(_KEYS)
        self.in_flight = 0

        def share_program(*host_args):
            keyed = _rekey(list(host_args), self.in_keys, self.impl)
            with lanes._one_device():  # every lane of a run stays in its worker
                out, self.out_keys = _unkey(lanes.batch_on_devices(fn, self.in_axes)(*keyed))
            return out

        specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self._shares(args, 0)[0])
        payload = (export.export(jax.jit(share_program), platforms=["cpu"])(*specs).serialize(), feedback)
        self.workers = _POOL.take(count)
        try:
            self._send(["load"] * count, [payload] * count)
            self._answers()
        except WorkerError:
            self._discard()
            raise

    def _shares(self, args, offset: int) -> list[list]:
        """Each worker's arguments (from position ``offset`` on): host arrays, keys as their data,
        batched arguments cut into shares."""
        host = jax.tree.map(np.asarray, _unkey(list(args))[0])
        shares = []
        for rows in lanes.share_rows(self.size, self.count):
            cut = lambda a, axis, r=rows: a if axis is None else jax.tree.map(lambda b: b[r], a)  # noqa: E731
            shares.append([cut(a, axis) for a, axis in zip(host, self.in_axes[offset:], strict=True)])
        return shares

    def _send(self, kinds, payloads) -> None:
        for worker, kind, payload in zip(self.workers, kinds, payloads, strict=True):
            worker.send((kind, self.key, payload))
        self.in_flight += 1

    def start(self, *args) -> None:
        self._send(["run"] * self.count, self._shares(args, 0))

    def advance(self, *rest) -> None:
        self._send(["next"] * self.count, self._shares(rest, self.feedback))

    def collect(self):
        """The outputs of the oldest call not yet collected."""
        joined = jax.tree.map(lambda *p: np.concatenate(p)[: self.size], *self._answers())
        return _rekey(joined, self.out_keys, self.impl)

    def _answers(self) -> list:
        """Every worker's answer to the oldest message not yet answered (all are read, even after
        an error)."""
        self.in_flight -= 1
        answers, error = [], None
        for worker in self.workers:
            try:
                answers.append(worker.receive())
            except WorkerError as e:
                error = error or e
        if error is not None:
            raise error
        return answers

    def release(self) -> None:
        """Collect the calls in flight, drop the program from the workers and give them back."""
        try:
            while self.in_flight:
                self.collect()
            self._send(["drop"] * self.count, [None] * self.count)
            self._answers()
        except WorkerError:
            self._discard()
            return
        _POOL.give_back(self.workers)
        self.workers = []

    def _discard(self) -> None:
        for worker in self.workers:
            worker.process.kill()
        self.workers = []
