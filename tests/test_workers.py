"""Batches in worker processes (attnflow.numerics.workers): bitwise equal to single runs and to the batch in
this process, the state kept in the workers between calls, the wire protocol, failures, the core cap."""

from __future__ import annotations

import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.core.sphere import sample_uniform
from attnflow.numerics import dynamics, integrators, lanes, workers
from attnflow.numerics.solve import solve


def _field(n: int):
    gauge = gauges.make_rope(np.arange(n), 3, gauges.rope_frequencies(3, kind="full_period", n=n))
    factor = factors.DistanceBias(xi=jnp.arange(n) / n, slope=jnp.ones(()))
    kernel = Kernel(gauge, factor, make_profile("exp", beta=1.0))
    return dynamics.make_vector_field(kernel, normalization="sa")


@pytest.mark.parametrize("method, noise", [("rk4", 0.1), ("adaptive", 0.0)])
def test_batch_in_workers_equals_single_runs_and_the_batch_here(method, noise):
    n, seeds = 12, 3  # 3 runs on 2 workers: shares of 2, the second padded with a copy of run 2
    field = _field(n)
    x0 = jnp.stack([sample_uniform(s, n, 3) for s in range(seeds)])
    key = jax.random.key(7)
    opts = dict(
        integrator=integrators.make_integrator(method, rtol=1e-8, atol=1e-10),
        dt=0.05,
        t_end=1.0,
        save_every=0.25,  # 4 snapshots: several calls, the state kept in the workers between them
        noise=noise,
    )
    in_workers = solve(field, x0, key=key, workers=2, **opts)
    here = solve(field, x0, key=key, workers=1, **opts)
    assert in_workers.status == "ok" and in_workers.xs.shape == (5, seeds, n, 3)
    np.testing.assert_array_equal(in_workers.xs, here.xs)
    assert in_workers.steps == here.steps
    for s in range(seeds):  # run s of a batch draws its noise from split(key, seeds)[s]
        single = solve(field, x0[s], key=jax.random.split(key, seeds)[s], **opts)
        np.testing.assert_array_equal(in_workers.xs[:, s], single.xs)
    if noise:  # the noise acts (a deterministic run could not depend on the key)
        other = solve(field, x0, key=jax.random.key(8), workers=2, **opts)
        assert np.abs(other.xs[-1] - in_workers.xs[-1]).max() > 1e-2


def test_workers_are_reused_and_given_back_after_a_failing_callback():
    field = _field(8)
    x0 = jnp.stack([sample_uniform(s, 8, 3) for s in range(2)])
    opts = dict(integrator=integrators.RK4(), dt=0.05, t_end=0.5, save_every=0.1, workers=2)
    first = solve(field, x0, **opts)
    pids = {w.process.pid for w in workers._POOL.idle}
    assert len(pids) >= 2

    def fail(k, t, x):
        if k == 2:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt, match="stop"):
        solve(field, x0, on_snapshot=fail, **opts)
    again = solve(field, x0, **opts)  # the workers were given back with nothing left in flight
    np.testing.assert_array_equal(again.xs, first.xs)
    assert {w.process.pid for w in workers._POOL.idle} == pids


def _double(x, scale):
    return 2.0 * x * scale, x + 1.0


def test_serve_answers_each_message_in_order():
    spec = (jax.ShapeDtypeStruct((2, 3), jnp.float64), jax.ShapeDtypeStruct((), jnp.float64))
    program = export.export(jax.jit(_double))(*spec).serialize()
    x = np.arange(6.0).reshape(2, 3)
    messages = [
        ("load", 1, (program, 1)),  # feedback 1: output 0 replaces argument 0 in "next"
        ("run", 1, [x, np.float64(1.0)]),
        ("next", 1, [np.float64(0.5)]),
        ("drop", 1, None),
        ("run", 1, [x, np.float64(1.0)]),  # dropped: an error, and the worker goes on
        ("bogus", 1, None),
    ]
    stdin, stdout = io.BytesIO(), io.BytesIO()
    for message in messages:
        workers._write(stdin, message)
    stdin.seek(0)
    workers.serve(stdin, stdout)
    stdout.seek(0)
    answers = [workers._read(stdout) for _ in messages]
    assert workers._read(stdout) is None  # one answer per message, then the end
    assert answers[0] == ("ok", None)
    np.testing.assert_array_equal(answers[1][1][0], 2 * x)
    np.testing.assert_array_equal(answers[2][1][0], 2 * (2 * x) * 0.5)  # fed back from the first call
    np.testing.assert_array_equal(answers[2][1][1], 2 * x + 1)
    assert answers[3] == ("ok", True)
    assert answers[4][0] == "error" and "KeyError: 1" in answers[4][1]
    assert answers[5][0] == "error" and "unknown message kind 'bogus'" in answers[5][1]


def test_a_failure_in_a_worker_and_a_dead_worker_are_reported():
    x = jnp.ones((4, 3))
    program = workers.BatchProgram(_double, (x, jnp.ones(())), (0, None), 2)
    program.start(jnp.ones((4, 5)), jnp.ones(()))  # not the compiled shape: each worker fails
    with pytest.raises(workers.WorkerError, match=r"attnflow worker process \(core \d+\) failed:\n"):
        program.collect()
    program.start(x, jnp.ones(()))  # both workers answered: still usable
    np.testing.assert_array_equal(program.collect()[0], 2 * np.ones((4, 3)))
    victim = program.workers[1].process
    victim.kill()
    victim.wait()
    with pytest.raises(workers.WorkerError, match=r"exited with code -9; its error, if any, is on stderr"):
        program.start(x, jnp.ones(()))
        program.collect()
    program.release()  # discards the workers of a broken batch
    assert program.workers == [] and victim not in [w.process for w in workers._POOL.idle]


def test_worker_count_and_the_core_cap(monkeypatch):
    monkeypatch.delenv(lanes.CORES_VARIABLE, raising=False)
    assert workers.batch_workers(1) == 1  # a single run never goes to a worker
    assert workers.batch_workers(64) == lanes.available_cores()
    assert workers.batch_workers(3, 8) == 3  # at most one worker per run
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"^solve: `workers` must be a positive integer or None; got "):
            workers.batch_workers(4, bad)
    with pytest.raises(ValueError, match=r"`workers` must be a positive integer or None; got 0\."):
        solve(_field(4), jnp.stack([sample_uniform(0, 4, 3)] * 2), integrator=integrators.RK4(), dt=0.1,
              t_end=0.2, save_every=0.1, workers=0)  # fmt: skip
    monkeypatch.setenv(lanes.CORES_VARIABLE, "1")
    assert lanes.available_cores() == 1 and workers.batch_workers(10) == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(lanes.CORES_VARIABLE, bad)
        with pytest.raises(
            ValueError,
            match=rf"^environment variable ATTNFLOW_CORES must be a positive integer; got '{bad}'\.$",
        ):
            lanes.available_cores()
    monkeypatch.delenv(lanes.CORES_VARIABLE)
    workers.one_core_per_process()  # what the processes of attnflow reproduce run first
    assert os.environ.pop(lanes.CORES_VARIABLE) == "1"


def test_single_thread_environ_keeps_the_users_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    environ = workers.single_thread_environ()
    assert environ["XLA_FLAGS"] == "--xla_dump_to=/nowhere --xla_cpu_multi_thread_eigen=false"
    assert environ[lanes.CORES_VARIABLE] == "1" and environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.delenv("XLA_FLAGS")
    assert workers.single_thread_environ() == workers.SINGLE_THREAD_ENVIRON
