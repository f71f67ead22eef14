"""Tokens sharded across two processes of this machine (``jax.distributed``, CPU collectives by
gloo): the same sharded run as on 4 host devices of one process, each process holding 2 of the 4
devices (``tests/sharding_cases.py --process``), and a solve in the setting of the cluster script
of ``docs/large-runs.md``; the one-device reference is computed here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import attnflow  # noqa: F401  (float64)
from attnflow.core import sphere
from attnflow.numerics import integrators, solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sharding_cases as cases  # noqa: E402

FIELD_TOL = 1e-13  # the bound: row sums regrouped across the shards, round-off only
TRAJECTORY_TOL = 1e-12  # the bound: 10 RK4 steps of round-off-level differences


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_processes_run_the_sharded_field_and_solve_like_one_device(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    port, script = _free_port(), Path(cases.__file__)
    outs = [tmp_path / f"process{p}.npz" for p in (0, 1)]
    children = [
        subprocess.Popen(
            [sys.executable, str(script), "--process", str(p), str(port), str(outs[p])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in (0, 1)
    ]
    try:
        logs = [child.communicate(timeout=240)[0] for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for child, log in zip(children, logs, strict=True):
        assert child.returncode == 0, log[-4000:]

    x = sphere.sample_uniform(0, cases.N, cases.D)
    reference = {case: np.asarray(jax.jit(cases.build(case))(x)) for case in cases.PROCESS_CASES}
    field = cases.build(cases.PROCESS_CASES[0])
    trajectory = solve.solve(field, x, integrator=integrators.RK4(), **cases.SOLVE).xs
    assert float(np.max(np.abs(trajectory[-1] - trajectory[0]))) > 1e-3  # the tokens moved
    x = sphere.sample_uniform(0, cases.RECIPE_N, 3)
    recipe = solve.solve(cases.recipe(), x, integrator=integrators.RK4(), **cases.SOLVE).xs
    for out in outs:
        got = np.load(out)
        assert int(got["devices"]) == 4 and int(got["local"]) == 2  # 4 devices, 2 in each process
        for case in cases.PROCESS_CASES:
            assert float(np.max(np.abs(got[case] - reference[case]))) <= FIELD_TOL, case
        assert got["trajectory"].shape == trajectory.shape
        assert float(np.max(np.abs(got["trajectory"] - trajectory))) <= TRAJECTORY_TOL
        # the cluster script's setting (once read back sharded across the processes, now replicated)
        assert got["recipe"].shape == recipe.shape
        assert float(np.max(np.abs(got["recipe"] - recipe))) <= TRAJECTORY_TOL
