"""The batch runner (attnflow.numerics.batch) and batches in solve: bitwise equal to single runs and
to the batch in this process (with noise, with adaptive steps), the workers' environment and
sys.path, failures, and the core count from the CPU affinity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.core.sphere import sample_uniform
from attnflow.numerics import batch, dynamics, integrators
from attnflow.numerics.solve import solve


def _field(n: int):
    gauge = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    factor = factors.DistanceBias(xi=jnp.arange(n) / n, slope=jnp.ones(()))
    kernel = Kernel(gauge, factor, make_profile("exp", beta=1.0))
    return dynamics.make_vector_field(kernel, normalization="sa")


@pytest.mark.slow
@pytest.mark.parametrize("method, noise", [("rk4", 0.1), ("adaptive", 0.0)])
def test_batch_in_processes_equals_single_runs_and_the_batch_here(method, noise):
    n, seeds = 12, 3  # 3 runs in 2 processes: shares of 2 and 1
    field = _field(n)
    x0 = jnp.stack([sample_uniform(s, n, 3) for s in range(seeds)])
    key = jax.random.key(7)
    opts = dict(
        integrator=integrators.make_integrator(method, rtol=1e-8, atol=1e-10),
        dt=0.05,
        t_end=1.0,
        save_every=0.25,
        noise=noise,
    )
    seen = []
    in_processes = solve(
        field, x0, key=key, workers=2, on_snapshot=lambda k, t, x: seen.append((k, t)), **opts
    )
    here = solve(field, x0, key=key, workers=1, **opts)
    assert in_processes.status == "ok" and in_processes.xs.shape == (5, seeds, n, 3)
    assert seen == [(k, 0.25 * k) for k in range(5)]  # every snapshot, in order, in this process
    np.testing.assert_array_equal(in_processes.xs, here.xs)
    assert in_processes.steps == here.steps
    for s in range(seeds):  # run s of a batch draws its noise from split(key, seeds)[s]
        single = solve(field, x0[s], key=jax.random.split(key, seeds)[s], **opts)
        np.testing.assert_array_equal(in_processes.xs[:, s], single.xs)
    if noise:  # the noise acts (a deterministic run could not depend on the key)
        other = solve(field, x0, key=jax.random.key(8), workers=1, **opts)  # here = in processes (above)
        assert np.abs(other.xs[-1] - in_processes.xs[-1]).max() > 1e-2


def _scaled(x, scale):
    return x * scale


def _fail(x):
    raise ArithmeticError(f"task {x} failed")


@pytest.mark.slow
def test_run_tasks_yields_every_result_and_raises_a_tasks_error():
    tasks = [(np.arange(3.0), s) for s in range(4)]
    results = dict(batch.run_tasks(_scaled, tasks, workers=2))
    assert sorted(results) == [0, 1, 2, 3]
    for index, (x, scale) in enumerate(tasks):
        np.testing.assert_array_equal(results[index], x * scale)
    with pytest.raises(ArithmeticError, match=r"^task [01] failed$"):
        list(batch.run_tasks(_fail, [(0,), (1,)], workers=2))
    assert list(batch.run_tasks(_scaled, [(2.0, 3.0)], workers=2)) == [(0, 6.0)]  # one task: here


def test_a_field_that_does_not_pickle():
    inner = _field(4)
    x0 = jnp.stack([sample_uniform(s, 4, 3) for s in range(2)])
    opts = dict(integrator=integrators.RK4(), dt=0.1, t_end=0.2, save_every=0.1)
    closure = solve(lambda x: inner(x), x0, **opts)  # workers=None: runs here
    np.testing.assert_array_equal(closure.xs, solve(inner, x0, workers=1, **opts).xs)
    with pytest.raises(ValueError, match=r"^solve: `field` must pickle to run a batch in 2 worker processes"):
        solve(lambda x: inner(x), x0, workers=2, **opts)


def test_worker_count_and_the_core_cap(monkeypatch):
    monkeypatch.delenv(batch.CORES_VARIABLE, raising=False)
    assert batch.available_cores() == len(os.sched_getaffinity(0))  # the affinity, not os.cpu_count()
    assert batch.worker_count(1) == 1  # a single task never goes to a process
    assert batch.worker_count(64) == batch.available_cores()
    assert batch.worker_count(3, 8) == 3  # at most one process per task
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"^solve: `workers` must be a positive integer or None; got "):
            batch.worker_count(4, bad)
    with pytest.raises(ValueError, match=r"`workers` must be a positive integer or None; got 0\."):
        solve(_field(4), jnp.stack([sample_uniform(0, 4, 3)] * 2), integrator=integrators.RK4(), dt=0.1,
              t_end=0.2, save_every=0.1, workers=0)  # fmt: skip
    monkeypatch.setenv(batch.CORES_VARIABLE, "1")
    assert batch.available_cores() == 1 and batch.worker_count(10) == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(batch.CORES_VARIABLE, bad)
        with pytest.raises(
            ValueError,
            match=rf"^environment variable ATTNFLOW_CORES must be a positive integer; got '{bad}'\.$",
        ):
            batch.available_cores()


def test_single_thread_environ_keeps_the_users_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    environ = batch.single_thread_environ()
    assert environ["XLA_FLAGS"] == "--xla_dump_to=/nowhere --xla_cpu_multi_thread_eigen=false"
    assert environ[batch.CORES_VARIABLE] == "1" and environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.delenv("XLA_FLAGS")
    assert batch.single_thread_environ() == batch.SINGLE_THREAD_ENVIRON


def _worker_view():
    import jax
    import numpy

    return dict(
        environ={k: os.environ.get(k) for k in (*batch.SINGLE_THREAD_ENVIRON, *batch.POOL_ENVIRON)},
        numpy=numpy.__file__,
        path=list(sys.path),
        platform=jax.default_backend(),
        devices=len(jax.devices()),
    )


_PLANTED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import test_batch
    from attnflow.numerics import batch
    if __name__ == "__main__":
        views = dict(batch.run_tasks(test_batch._worker_view, [(), ()], workers=2))
        report = {"views": list(views.values()), "xla": os.environ.get("XLA_FLAGS")}
        print(json.dumps(report))
    """
)


@pytest.mark.slow
def test_workers_are_single_threaded_and_never_import_from_the_working_directory(tmp_path):
    """A ``numpy.py`` and an ``attnflow/`` planted in the working directory would raise on import."""
    planted = tmp_path / "cwd"
    (planted / "attnflow").mkdir(parents=True)
    for module in (planted / "numpy.py", planted / "attnflow" / "__init__.py", planted / "jax.py"):
        module.write_text("raise ImportError('planted module imported from the working directory')\n")
    script = tmp_path / "script" / "main.py"
    script.parent.mkdir()
    script.write_text(_PLANTED_SCRIPT)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path[1:]])}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, str(script)], cwd=planted, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["xla"] is None  # the parent's environment is left as it was
    for view in report["views"]:
        assert view["environ"] == {**batch.SINGLE_THREAD_ENVIRON, **batch.POOL_ENVIRON}
        assert view["numpy"] != str(planted / "numpy.py") and str(planted) not in view["path"]
        assert "" not in view["path"] and view["platform"] == "cpu" and view["devices"] == 1


def _children() -> set[int]:
    pid = os.getpid()
    found: set[int] = set()
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            found.update(int(p) for p in open(f"/proc/{pid}/task/{thread}/children").read().split())
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return found


def _workers() -> set[int]:
    """This process's pool workers (the stdlib's resource tracker is a child that stays)."""
    found = set()
    for child in _children():
        try:
            if b"spawn_main" in open(f"/proc/{child}/cmdline", "rb").read():
                found.add(child)
        except FileNotFoundError:
            continue
    return found


def _exists(pid: int) -> bool:
    """Whether ``pid`` is still a process of this machine (running, or a zombie never waited for)."""
    return os.path.exists(f"/proc/{pid}")


def _sleep_or_fail(seconds: float, fail: bool) -> float:
    import time

    time.sleep(seconds)
    if fail:
        raise ArithmeticError("the short task failed")
    return seconds


def _kill_a_worker_later(seen: list[set[int]]) -> None:
    import threading
    import time

    def kill() -> None:
        deadline = time.monotonic() + 60
        while len(_workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # both workers have started their 60 s tasks
        workers = _workers()
        seen.append(workers)
        os.kill(min(workers), signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("fault", ["a task fails", "a worker is killed", "the caller stops early"])
def test_a_fault_terminates_and_reaps_every_sibling_worker(fault):
    """The sibling tasks sleep 60 s: only terminating them ends the batch within the bound below,
    and a terminated worker must also be waited for (no zombie left in /proc)."""
    import time
    from concurrent.futures.process import BrokenProcessPool

    before = _workers()
    tasks = [(60.0, False), (60.0, False), (60.0, False)]
    start = time.monotonic()
    seen: list[set[int]] = []
    if fault == "a task fails":
        tasks[0] = (0.5, True)
        with pytest.raises(ArithmeticError, match="^the short task failed$"):
            list(batch.run_tasks(_sleep_or_fail, tasks, workers=2))
    elif fault == "a worker is killed":
        _kill_a_worker_later(seen)
        with pytest.raises(BrokenProcessPool):
            list(batch.run_tasks(_sleep_or_fail, tasks, workers=2))
    else:
        results = batch.run_tasks(_sleep_or_fail, [(0.5, False), *tasks], workers=2)
        assert next(results) == (0, 0.5)
        seen.append(_workers())
        results.close()
    assert time.monotonic() - start < 45  # far less than the siblings' 60 s: they were terminated
    left = _workers() - before
    assert not left, f"worker processes left behind: {sorted(left)}"
    assert not any(_exists(pid) for pids in seen for pid in pids - before)  # reaped, not zombies


def _as_from_a_shell() -> None:
    """The child's SIGINT as a shell starts a program: default action, not blocked. A signal mask
    and an ignored signal survive exec, and a test worker may hold either (a clean-clone run had its
    Ctrl-C children wait out their 60 s tasks: SIGINT blocked in the worker, so in them)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


_CTRL_C_SCRIPT = textwrap.dedent(
    """
    import faulthandler, signal, sys, time
    from attnflow.numerics import batch
    if __name__ == "__main__":
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
        try:
            list(batch.run_tasks(time.sleep, [(60.0,), (60.0,), (60.0,)], workers=2))
        except KeyboardInterrupt:
            print("stopped", flush=True)
    """
)


def spawned_workers(parent: subprocess.Popen, count: int) -> list[int]:
    """The pids of the ``count`` spawned pool workers of ``parent`` (waited for, at most 60 s)."""
    import time

    deadline, workers = time.monotonic() + 60, []
    while len(workers) < count and time.monotonic() < deadline:
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        workers = [int(p) for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        time.sleep(0.1)
    assert len(workers) == count, f"the {count} workers never started"
    return workers


def blocked(pid: int, signum: int) -> bool:
    """Whether process ``pid`` blocks ``signum`` (bit ``signum - 1`` of SigBlk in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_a_batch_without_worker_tracebacks(tmp_path):
    """Ctrl-C reaches every process of the terminal's group, workers still starting included: the
    parent stops the batch (its workers terminated and reaped) and no worker prints a traceback."""
    import time

    script = tmp_path / "batch_main.py"
    script.write_text(_CTRL_C_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True, preexec_fn=_as_from_a_shell)  # fmt: skip
    try:
        workers = spawned_workers(parent, 2)
        assert all(blocked(pid, signal.SIGINT) for pid in workers)  # from the worker's start on
        time.sleep(0.3)  # the workers are starting (importing attnflow and JAX) or have started a task
        os.killpg(parent.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            stdout, stderr = parent.communicate(timeout=45)  # the tasks would sleep 60 s
        except subprocess.TimeoutExpired:
            parent.send_signal(signal.SIGUSR1)  # every thread's stack, then the failure shows it
            time.sleep(2)
            os.killpg(parent.pid, signal.SIGKILL)
            pytest.fail("the batch did not stop within 45 s of Ctrl-C:\n" + parent.communicate()[1][-6000:])
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert stdout == "stopped\n" and "Traceback" not in stderr, stderr
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)


_SIGINT_ELSEWHERE = textwrap.dedent(
    """
    import signal, threading, time
    from attnflow.numerics import batch
    def elsewhere():
        time.sleep(3.0)  # the batch waits for its tasks by then
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread, not the main one
    if __name__ == "__main__":
        threading.Thread(target=elsewhere, daemon=True).start()
        try:
            list(batch.run_tasks(time.sleep, [(60.0,), (60.0,), (60.0,)], workers=2))
        except KeyboardInterrupt:
            print("stopped", flush=True)
    """
)


@pytest.mark.slow
def test_a_ctrl_c_taken_by_another_thread_stops_the_batch_at_once(tmp_path):
    """The kernel may hand a process's SIGINT to any thread that does not block it; Python handles
    it in the main thread, which waits for the tasks: it wakes every POLL_S and raises it then (it
    had slept until a task finished, 60 s here)."""
    script = tmp_path / "elsewhere.py"
    script.write_text(_SIGINT_ELSEWHERE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=40,
                          check=False, preexec_fn=_as_from_a_shell)  # fmt: skip
    assert done.stdout == "stopped\n" and "Traceback" not in done.stderr, done.stderr
