"""Sweeps: grid expansion (pure), run folders and the results table, Dask execution (local cluster,
an external scheduler, a killed sweep resumed), bad grids on the command line, phase diagrams."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from attnflow.analysis.shapes import classify_shape, shape_features
from attnflow.cli import app
from attnflow.io.config import ConfigError, config_hash, load_config, resolved_dict
from attnflow.io.results import read_results, write_results
from attnflow.viz.phase import parse_metric, phase_figure, phase_table
from attnflow.workflows.build import build
from attnflow.workflows.run import run
from attnflow.workflows.sweep import run_sweep
from attnflow.workflows.sweep_plan import parse_grid, plan_sweep, split_values
from attnflow.workflows.sweep_points import clear_stale_staging, collect_results, is_finished, run_point

TINY = """
[model]
n = 8
d = 3
[aux]
kind = "positions"
[gauge]
kind = "rope"
[solver]
dt = 0.05
t_end = 1.0
save_every = 0.5
"""

GRID = ("model.beta=1,2", "init.seed=0,1")


@pytest.fixture
def base_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def tiny_plan(base_file: Path, grid=GRID):
    return plan_sweep(load_config(base_file), [parse_grid(spec) for spec in grid])


def scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not isinstance(v, dict | list)}


def assert_same_metrics(row: dict, metrics: dict) -> None:
    for key, expected in scalars(metrics).items():
        got = row[key]
        if isinstance(expected, float):
            # Same program and data; only the thread count differs (XLA is single-threaded on the
            # workers), which may reorder a sum in the last bits.
            assert got == pytest.approx(expected, rel=1e-12, abs=1e-14), key
        else:
            assert got == expected, key


# --- the grid, pure ------------------------------------------------------------------------------------


def test_split_values_splits_on_commas_outside_brackets_and_quotes():
    assert split_values("1, 2,3") == ["1", "2", "3"]
    assert split_values("[1.0],[0.5, 0.25]") == ["[1.0]", "[0.5, 0.25]"]
    assert split_values('"a,b",c') == ['"a,b"', "c"]
    assert split_values("[[1,2],[3,4]],[[5]]") == ["[[1,2],[3,4]]", "[[5]]"]


def test_parse_grid_reads_values_like_set():
    axis = parse_grid("model.beta=0.5,1,2e0")
    assert axis.key == "model.beta" and axis.values == (0.5, 1, 2.0)
    assert parse_grid("solver.method=euler,rk4").values == ("euler", "rk4")
    assert parse_grid("gauge.frequencies=[1.0],[0.5, 0.25],full_period").values == (
        [1.0],
        [0.5, 0.25],
        "full_period",
    )
    assert parse_grid("model.causal=true,false").values == (True, False)


def test_plan_is_the_cartesian_product_first_axis_slowest(base_file):
    plan = tiny_plan(base_file)
    assert plan.keys == ("model.beta", "init.seed")
    assert [p.values for p in plan.points] == [
        {"model.beta": 1.0, "init.seed": 0},
        {"model.beta": 1.0, "init.seed": 1},
        {"model.beta": 2.0, "init.seed": 0},
        {"model.beta": 2.0, "init.seed": 1},
    ]
    for point in plan.points:  # the point is exactly `attnflow run --set ...` of its values
        sets = [f"{k}={v}" for k, v in point.values.items()]
        assert point.config == load_config(base_file, sets)
        assert point.hash == config_hash(point.config)
    assert len({p.hash for p in plan.points}) == 4


def test_grid_of_lists_gives_one_point_per_list(base_file):
    plan = plan_sweep(
        load_config(base_file, ["model.d=5"]), [parse_grid("gauge.frequencies=[1.0],[0.5,0.25]")]
    )
    assert [p.config.gauge.frequencies for p in plan.points] == [(1.0,), (0.5, 0.25)]
    assert [p.values["gauge.frequencies"] for p in plan.points] == [[1.0], [0.5, 0.25]]


def test_a_grid_through_a_value_left_out_of_the_resolved_config_at_its_default(base_file):
    # `model.layer_norm = "post"` is the default and is not written in the resolved config (its hash
    # stays the paper model's): the grid's point still names it (it raised KeyError)
    plan = plan_sweep(load_config(base_file), [parse_grid("model.layer_norm=post,pre")])
    assert [p.values["model.layer_norm"] for p in plan.points] == ["post", "pre"]
    assert [p.config.model.layer_norm for p in plan.points] == ["post", "pre"]
    assert plan.points[0].hash == config_hash(load_config(base_file))


def test_a_density_config_is_refused_before_any_point_runs(tmp_path):
    example = Path(__file__).resolve().parents[1] / "examples" / "density_circle.toml"
    with pytest.raises(ConfigError, match=r"`density` must be absent in a sweep"):
        plan_sweep(load_config(example), [parse_grid("model.beta=1,2")])
    with pytest.raises(ConfigError, match=r"`density` must be absent here"):
        build(load_config(example))  # realize, reproduce, landscape: particles only


@pytest.mark.parametrize(
    ("grid", "selector"),
    [("solver.atol=1e-6,1e-7", "`solver.method` = 'rk4'"), ("init.sigma=0.1,0.2", "`init.kind` = 'uniform'")],
)
def test_a_grid_key_that_the_points_kind_does_not_read_is_refused_as_set_refuses_it(
    base_file, grid, selector
):
    key, first = grid.split("=")[0], grid.split("=")[1].split(",")[0]
    with pytest.raises(ConfigError) as refused:  # the rk4 points ran under two hashes, alike
        tiny_plan(base_file, [grid])
    assert str(refused.value).startswith(f"--grid: `{key}` must be left out when {selector}")
    with pytest.raises(ConfigError) as by_set:  # `attnflow config check --set` of the same value
        load_config(base_file, [f"{key}={first}"])
    assert str(by_set.value) == str(refused.value).replace("--grid:", "--set:", 1)


def test_unread_keys_are_checked_at_each_point_as_a_whole(base_file):
    # every point adaptive: atol is read at each (over the rk4 base alone, it would not be)
    plan = tiny_plan(base_file, ["solver.method=adaptive", "solver.atol=1e-6,1e-7"])
    assert [p.config.solver.atol for p in plan.points] == [1e-6, 1e-7]
    # a grid key at a point that does not read it: refused, naming the point
    with pytest.raises(ConfigError) as refused:
        tiny_plan(base_file, ["solver.method=rk4,adaptive", "solver.atol=1e-6,1e-7"])
    message = str(refused.value)
    assert message.startswith("--grid: `solver.atol` must be left out when `solver.method` = 'rk4'")
    assert message.endswith('At grid point solver.method="rk4", solver.atol=1e-06.')
    # a base key that some points read: left out of the others, each point being the config that
    # `attnflow run` accepts (the rk4 point's hash does not depend on an atol it does not read)
    base = load_config(base_file, ["solver.method=adaptive", "solver.atol=1e-8"])
    rk4, adaptive = plan_sweep(base, [parse_grid("solver.method=rk4,adaptive")]).points
    assert rk4.left_out == ("solver.atol",) and adaptive.left_out == ()
    assert rk4.config == load_config(base_file, ["solver.method=rk4"]) and adaptive.config == base
    # a base key that no point reads: refused
    with pytest.raises(ConfigError) as refused:
        plan_sweep(base, [parse_grid("solver.method=rk4,euler")])
    message = str(refused.value)
    assert message.startswith("--grid: `solver.atol` must be left out when `solver.method` = 'rk4'")
    assert "no point of the grid reads it" in message


PLAIN = """
[model]
n = 8
d = 3
[solver]
dt = 0.05
t_end = 1.0
save_every = 0.5
"""


@pytest.mark.parametrize("grid", ["gauge.kind=none,rope", "factor.kind=none,toeplitz_cos"])
def test_a_grid_point_implies_what_the_base_leaves_out(tmp_path, grid):
    # no aux.kind in the base: a positional kernel at a point implies aux.kind = "positions", as
    # `--set` does (it was refused: the grid was applied over the resolved base, aux.kind = "none")
    plain = tmp_path / "plain.toml"
    plain.write_text(PLAIN)
    key = grid.split("=")[0]
    plan = plan_sweep(load_config(plain), [parse_grid(grid)])
    assert [p.config.aux.kind for p in plan.points] == ["none", "positions"]
    for point in plan.points:
        assert point.config == load_config(plain, [f"{key}={point.values[key]}"])
    # aux.kind written "none" stays written: refused, as `--set` refuses it
    with pytest.raises(ConfigError, match=r"^--grid: `aux.kind` must be 'positions' or 'file' when"):
        plan_sweep(load_config(plain, ["aux.kind=none"]), [parse_grid(grid)])
    with pytest.raises(ConfigError, match=r"`aux.kind` must be 'positions' or 'file' when"):
        load_config(plain, ["aux.kind=none", f"{key}={grid.split(',')[-1]}"])


BAD_GRIDS = [
    # (grid options, what the one-line message must contain)
    (["model.bta=1,2"], ["--grid:", "`model.bta`", "one of the keys of [model]", "did you mean 'beta'"]),
    (["model.beta=1,abc"], ["--grid:", "`model.beta`", "a number > 0", "'abc'"]),
    (["model.beta=1,-2"], ["--grid:", "`model.beta`", "a number > 0", "-2"]),
    (["model.n=8,2.5"], ["--grid:", "`model.n`", "an integer", "2.5"]),
    (["model.beta="], ["--grid:", "`model.beta`", "non-empty", "''"]),
    (["model.beta=1,,2"], ["--grid:", "`model.beta`", "no empty entry", "'1,,2'"]),
    (["model.beta"], ["--grid:", "section.key=v1,v2", "'model.beta'"]),
    (["=1,2"], ["--grid:", "section.key=v1,v2", "'=1,2'"]),
    (["beta=1,2"], ["--grid:", "`beta`", "a dotted key section.key"]),
    (["gauge.frequencies=[1.0,[2.0]"], ["--grid:", "balanced brackets", "[1.0,[2.0]"]),
    (["model.beta=1,1.0"], ["--grid:", "`model.beta`", "distinct values", "'1.0' is repeated"]),
    (["model.beta=1", "model.beta=2"], ["--grid:", "`model.beta`", "one --grid option only"]),
    (["solver.method=rk5"], ["--grid:", "`solver.method`", "one of 'euler'", "'rk5'", "Did you mean 'rk4'?"]),
    # a rule across keys, broken by one combination only: the message names the grid point
    (["solver.dt=0.05,0.3"], ["--grid:", "`solver.save_every`", "whole multiple", "solver.dt=0.3"]),
    # a key that the point's kind does not read (as `--set` refuses it)
    (
        ["solver.atol=1e-6,1e-7"],
        ["--grid:", "`solver.atol`", "left out when `solver.method` = 'rk4'", "1e-06"],
    ),
    (["init.sigma=0.1,0.2"], ["--grid:", "`init.sigma`", "left out when `init.kind` = 'uniform'", "got 0.1"]),
]


@pytest.mark.parametrize(("grid", "expected"), BAD_GRIDS)
def test_bad_grid_is_one_clear_line_and_exit_2_before_anything_runs(base_file, tmp_path, grid, expected):
    out = tmp_path / "sweep"
    args = ["sweep", str(base_file), "--out", str(out)]
    for spec in grid:
        args += ["--grid", spec]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    for fragment in expected:
        assert fragment in line, (fragment, line)
    assert not out.exists()  # nothing ran, nothing was written


def test_plan_errors_are_config_errors(base_file):
    with pytest.raises(ConfigError, match=r"--grid: `model.beta` must be a number > 0; got 0"):
        tiny_plan(base_file, ["model.beta=1,0"])
    with pytest.raises(ConfigError, match="at least one axis"):
        plan_sweep(load_config(base_file), [])


def test_bad_execution_options_exit_2(base_file, tmp_path, monkeypatch):
    monkeypatch.setattr("attnflow.workflows.sweep.CONNECT_TIMEOUT", "2s")  # nothing listens on port 9
    out = tmp_path / "sweep"
    args = ["sweep", str(base_file), "--grid", "model.beta=1", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--workers", "0"])
    assert result.exit_code == 2 and "'--workers': must be an integer in [1, 1024]; got 0" in result.stderr
    result = CliRunner().invoke(app, [*args, "--scheduler", "tcp://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--scheduler: `ADDRESS` must be a reachable Dask scheduler" in result.stderr
    assert not out.exists()


# --- run folders and the table, no engine --------------------------------------------------------------


def test_failed_point_records_its_error_and_is_redone(base_file, tmp_path):
    x0 = tmp_path / "x0.npy"
    plan = plan_sweep(
        load_config(base_file, ["init.kind=file", f"init.path={x0}"]),
        [parse_grid("model.beta=1,2")],
    )
    runs = tmp_path / "sweep" / "runs"
    runs.mkdir(parents=True)
    first, second = plan.points
    outcome = run_point(resolved_dict(first.config), str(runs / first.hash))  # x0.npy does not exist yet
    assert outcome["status"] == "failed" and "init.path" in outcome["error"]
    record = json.loads((runs / first.hash / "error.json").read_text())
    assert record["status"] == "failed" and "init.path" in record["error"]
    assert "Traceback" in record["traceback"]
    assert not is_finished(runs / first.hash)
    rows = collect_results(plan, runs)
    assert [r["status"] for r in rows] == ["failed", "missing"]
    assert "init.path" in rows[0]["error"] and rows[0].get("energy") is None

    np.save(x0, np.tile([[0.0, 0.0, 1.0]], (8, 1)) + 0.1 * np.arange(24).reshape(8, 3))
    assert run_point(resolved_dict(first.config), str(runs / first.hash))["status"] == "ok"  # replaces
    assert run_point(resolved_dict(second.config), str(runs / second.hash))["status"] == "ok"
    assert not (runs / first.hash / "error.json").exists() and is_finished(runs / first.hash)
    assert sorted(p.name for p in runs.iterdir()) == sorted([first.hash, second.hash])  # no staging left
    paths = write_results(collect_results(plan, runs), tmp_path / "sweep")
    table = pq.read_table(paths[0])
    assert table.num_rows == 2 and table.column("status").to_pylist() == ["ok", "ok"]
    assert pa_csv.read_csv(paths[1]).num_rows == 2


# --- Dask -------------------------------------------------------------------------------------------


def metrics_mtimes(out: Path) -> dict[str, int]:
    """``{hash: mtime}`` of the finished point folders (staging folders are named ``<hash>.<id>.partial``)."""
    paths = (out / "runs").glob("*/metrics.json")
    return {p.parent.name: p.stat().st_mtime_ns for p in paths if "." not in p.parent.name}


@pytest.mark.slow
def test_local_cluster_sweep_matches_single_runs_and_resumes_without_work(base_file, tmp_path):
    plan = tiny_plan(base_file)
    out = tmp_path / "sweep"
    calls = []
    summary = run_sweep(plan, out, workers=2, progress=lambda done, total: calls.append((done, total)))
    assert (summary.points, summary.done, summary.skipped, summary.failed) == (4, 4, 0, 0)
    assert calls[0] == (0, 4) and calls[-1] == (4, 4)
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(p.hash for p in plan.points)
    rows = read_results(out)
    assert [r["hash"] for r in rows] == [p.hash for p in plan.points]
    assert pa_csv.read_csv(out / "results.csv").num_rows == 4
    for row, point in zip(rows, plan.points, strict=True):
        assert row["status"] == "ok" and row["error"] is None
        assert {k: row[k] for k in plan.keys} == point.values
        assert row["wall_time_s"] > 0
        single = run(point.config, tmp_path / "single" / point.hash).metrics  # `attnflow run`, in-process
        assert_same_metrics(row, single)
        stored = json.loads((out / "runs" / point.hash / "config.json").read_text())
        assert {k: v for k, v in stored.items() if k != "attnflow_version"} == resolved_dict(point.config)

    before = metrics_mtimes(out)
    again = run_sweep(plan, out, workers=2)
    assert (again.done, again.skipped, again.failed) == (0, 4, 0)  # no new simulation
    assert metrics_mtimes(out) == before
    assert read_results(out) == rows

    # An unfinished point folder (no metrics.json) and a stray staging folder: removed, redone.
    unfinished = out / "runs" / plan.points[1].hash
    (unfinished / "metrics.json").unlink()
    (out / "runs" / f"{plan.points[2].hash}.0123abcd.partial").mkdir()
    third = run_sweep(plan, out, workers=2)
    assert (third.done, third.skipped, third.failed) == (1, 3, 0)
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(p.hash for p in plan.points)
    assert_same_metrics(read_results(out)[1], json.loads((unfinished / "metrics.json").read_text()))
    assert len(read_results(out)) == 4


@pytest.fixture
def in_process_cluster(monkeypatch):
    """run_sweep's cluster as one worker thread in this process (a LocalCluster of processes takes
    tens of seconds to start on a busy machine); the points run as on a worker process."""
    from distributed import Client, LocalCluster

    @contextlib.contextmanager
    def connect(scheduler=None, workers=None, **_):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client

    monkeypatch.setattr("attnflow.workflows.sweep.connect", connect)


STOPPING_GRID = ["--set", "solver.method=adaptive", "--grid", "solver.max_steps=5,100000"]


def test_points_that_stopped_early_are_kept_reported_and_the_sweep_exits_3(
    base_file, tmp_path, in_process_cluster
):
    # one point runs out of adaptive steps (status max_steps, as `attnflow run` of it, which exits 3)
    plan = plan_sweep(
        load_config(base_file, ["solver.method=adaptive"]), [parse_grid("solver.max_steps=5,100000")]
    )
    stopped, ok = plan.points
    out = tmp_path / "sweep"
    summary = run_sweep(plan, out)
    assert (summary.points, summary.done, summary.skipped, summary.failed) == (2, 1, 0, 1)  # was (2, 2, 0, 0)
    assert list(summary.failures) == [stopped.hash]
    assert summary.failures[stopped.hash].startswith(
        f"stopped with status 'max_steps', recorded in {str(out / 'runs' / stopped.hash / 'metrics.json')!r}"
    )
    assert [r["status"] for r in read_results(out)] == ["max_steps", "ok"]

    # a second sweep keeps it (deterministic: it would stop again) and reports it again
    before = metrics_mtimes(out)
    again = run_sweep(plan, out)
    assert (again.done, again.skipped, again.failed) == (0, 2, 1) and list(again.failures) == [stopped.hash]
    result = CliRunner().invoke(app, ["sweep", str(base_file), *STOPPING_GRID, "--out", str(out)])
    assert result.exit_code == 3, result.output  # was 0
    assert f"failed {stopped.hash}: stopped with status 'max_steps'" in result.stderr
    assert "error: 1 of 2 points did not finish" in result.stderr
    assert metrics_mtimes(out) == before  # not run again
    assert [r["status"] for r in read_results(out)] == ["max_steps", "ok"]


@pytest.mark.slow
def test_a_sweep_whose_points_stopped_early_exits_3_on_every_run(base_file, tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "attnflow", "sweep", str(base_file), "--out", str(out), "--workers", "1"]
    args += ["--set", "solver.method=adaptive", "--set", "solver.max_steps=5", "--grid", "model.beta=1,2"]
    first = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False)
    assert first.returncode == 3, first.stderr[-2000:]
    assert first.stderr.count("stopped with status 'max_steps'") == 2
    assert "error: 2 of 2 points did not finish" in first.stderr
    assert [r["status"] for r in read_results(out)] == ["max_steps", "max_steps"]
    before = metrics_mtimes(out)
    again = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False)
    assert again.returncode == 3, again.stderr[-2000:]
    assert "error: 2 of 2 points did not finish" in again.stderr
    assert metrics_mtimes(out) == before  # skipped, not run again


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_killed_sweep_resumes_and_loses_no_finished_point(base_file, tmp_path):
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "attnflow", "sweep", str(base_file), "--out", str(out), "--workers", "1"]
    for spec in GRID:
        args += ["--grid", spec]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path
    )
    try:
        wait_for(lambda: metrics_mtimes(out), 120, "the first finished point")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the worker processes of this session, if any
        except ProcessLookupError:
            pass
        process.stderr.close()
    finished = metrics_mtimes(out)
    assert 1 <= len(finished) < 4
    assert not (out / "results.parquet").exists()  # killed before the end

    summary = run_sweep(tiny_plan(base_file), out, workers=2)
    assert summary.skipped == len(finished) and summary.done == 4 - len(finished) and summary.failed == 0
    after = metrics_mtimes(out)
    assert {k: after[k] for k in finished} == finished  # finished points were not redone
    rows = read_results(out)
    assert len(rows) == 4 and len({r["hash"] for r in rows}) == 4
    assert all(r["status"] == "ok" for r in rows)
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(r["hash"] for r in rows)  # no staging


@pytest.fixture
def external_cluster(tmp_path):
    """A scheduler and one worker, as separate processes on 127.0.0.1; killed afterwards."""
    scheduler_file = tmp_path / "scheduler.json"
    common = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": tmp_path}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(scheduler_file)],
        **common,
    )  # fmt: skip
    processes = [scheduler]
    try:
        wait_for(scheduler_file.exists, 60, "the scheduler file")
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
             "--host", "127.0.0.1", "--nthreads", "1", "--nworkers", "1", "--no-dashboard"],
            **common,
        )  # fmt: skip
        processes.append(worker)
        yield scheduler_file
    finally:
        for process in reversed(processes):  # the worker first, then the scheduler
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.slow
def test_sweep_through_an_existing_scheduler(base_file, tmp_path, external_cluster):
    address = json.loads(external_cluster.read_text())["address"]
    assert address.startswith("tcp://127.0.0.1:")
    out = tmp_path / "sweep"
    result = CliRunner().invoke(
        app,
        ["sweep", str(base_file), "--grid", "model.beta=1,2", "--out", str(out), "--scheduler", address],
    )
    assert result.exit_code == 0, result.output
    rows = read_results(out)
    assert [r["status"] for r in rows] == ["ok", "ok"] and [r["model.beta"] for r in rows] == [1.0, 2.0]
    assert all(is_finished(out / "runs" / r["hash"]) for r in rows)


# --- shapes and phase diagrams -------------------------------------------------------------------------


def on_circle(angles):
    return np.stack([np.cos(angles), np.sin(angles), np.zeros_like(angles)], axis=1)


def test_shape_classes_of_model_states():
    n = 64
    rng = np.random.default_rng(0)
    uniform = 2 * np.pi * np.arange(n) / n
    assert classify_shape(on_circle(uniform)) == "great_circle"
    tilted = on_circle(uniform) @ np.linalg.qr(rng.normal(size=(3, 3)))[0]
    assert classify_shape(tilted) == "great_circle"  # any plane
    assert classify_shape(on_circle(np.full(n, 0.3) + 1e-4 * rng.normal(size=n))) == "dirac"
    arc = np.linspace(-1.0, 1.0, n)
    assert classify_shape(on_circle(arc)) == "arc"
    halves = np.concatenate([np.linspace(-0.4, 0.4, n // 2), np.pi + np.linspace(-0.4, 0.4, n // 2)])
    assert classify_shape(on_circle(halves)) == "antipodal_arcs"
    assert shape_features(on_circle(halves))["arc_cosine"] == pytest.approx(-1.0)
    pair = on_circle(np.repeat([0.2, 0.2 + np.pi], n // 2))
    assert classify_shape(pair) == "antipodal_arcs"  # two antipodal clusters are narrow arcs
    assert classify_shape(on_circle(np.repeat([0.2, 1.7], [56, 8]))) == "clusters"  # not an arc
    three = np.repeat(np.eye(3), [22, 21, 21], axis=0)  # three clusters, off any great circle
    assert classify_shape(three) == "clusters"
    lat = np.stack([0.8 * np.cos(uniform), 0.8 * np.sin(uniform), np.full(n, 0.6)], axis=1)
    assert classify_shape(lat) == "small_circle"  # a latitude circle is not a great circle
    assert classify_shape(np.concatenate([lat[::2], -lat[1::2]])) == "clusters"  # two latitudes


def rows_for_phase():
    rows = []
    for beta in (1.0, 2.0):
        for n in (8, 16):
            for seed in range(4):
                clusters = 2 if (beta == 2.0 and seed < n // 8 + 1) else 1
                shape = "great_circle" if beta == 1.0 else ("arc" if seed < 3 else "clusters")
                rows.append(
                    {"hash": f"{beta}{n}{seed}", "model.beta": beta, "model.n": n, "init.seed": seed,
                     "status": "ok", "n_clusters": clusters, "energy": beta * n + seed, "shape": shape}
                )  # fmt: skip
    failed = {
        "hash": "x",
        "model.beta": 1.0,
        "model.n": 8,
        "init.seed": 9,
        "status": "failed",
        "error": "boom",
    }
    rows.append(failed)
    return rows


def test_phase_table_aggregates_over_the_other_keys():
    rows = rows_for_phase()
    mean = phase_table(rows, "model.beta", "model.n", "energy")
    assert mean.xs == (1.0, 2.0) and mean.ys == (8, 16)
    # the mean over seeds 0..3; the failed row (no energy) is left out
    assert mean.values[0, 1] == pytest.approx(2.0 * 8 + 1.5)
    assert mean.counts[0, 0] == 4
    prob = phase_table(rows, "model.beta", "model.n", "n_clusters>=2")
    assert prob.probability and prob.values.tolist() == [[0.0, 0.5], [0.0, 0.75]]
    cat = phase_table(rows, "model.beta", "model.n", "shape")
    assert cat.categorical and cat.values[0, 0] == "great_circle" and cat.values[1, 1] == "arc"
    assert cat.share[1, 1] == pytest.approx(0.75)
    assert phase_table(rows, "model.beta", "model.n", "shape==arc").values[1, 1] == pytest.approx(0.75)
    assert parse_metric("n_clusters >= 2") == ("n_clusters", ">=", 2.0)
    expected = r"phase: `--x` must be a column .* got 'model.bta'. Did you mean 'model.beta'"
    with pytest.raises(ValueError, match=expected):
        phase_table(rows, "model.bta", "model.n", "energy")
    with pytest.raises(ValueError, match="`--metric` must be a column name or NAME OP VALUE"):
        phase_table(rows, "model.beta", "model.n", "n_clusters>=")
    fig = phase_figure(rows, "model.beta", "model.n", "n_clusters>=2")
    assert len(fig.axes) == 2  # the diagram and its colour bar


def test_phase_command_writes_a_png(tmp_path):
    write_results(rows_for_phase(), tmp_path)
    out = tmp_path / "phase.png"
    axes = ["--x", "model.beta", "--y", "init.seed"]
    result = CliRunner().invoke(app, ["phase", str(tmp_path), *axes, "--metric", "shape", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = CliRunner().invoke(
        app, ["phase", str(tmp_path), "--x", "beta", "--y", "init.seed", "--metric", "x"]
    )
    assert result.exit_code == 2 and "`--x` must be a column" in result.stderr
    result = CliRunner().invoke(app, ["phase", str(tmp_path / "nope"), *axes, "--metric", "shape"])
    assert result.exit_code == 2 and "`DIR` must be a sweep folder" in result.stderr


def test_results_columns_have_one_type_each(tmp_path):
    rows = [
        {"hash": "a", "gauge.omega": "full_period", "x": 1, "y": None, "z": True},
        {"hash": "b", "gauge.omega": 0.5, "x": 2.5, "y": None, "z": None},
    ]
    write_results(rows, tmp_path)
    back = read_results(tmp_path)
    assert back[0]["gauge.omega"] == "full_period" and back[1]["gauge.omega"] == "0.5"
    assert back[1]["x"] == 2.5 and back[0]["y"] is None and back[0]["z"] is True
    assert not math.isnan(back[0]["x"])


def test_the_json_writer_is_atomic_and_writes_non_finite_floats_as_null(tmp_path):
    from attnflow.io.atomic import replacing, write_json

    path = tmp_path / "metrics.json"
    data = {"a": float("nan"), "b": [np.float64(np.inf), np.int64(3), (1.5, None)], "c": np.bool_(True)}
    write_json(path, data)
    assert json.loads(path.read_text()) == {"a": None, "b": [None, 3, [1.5, None]], "c": True}
    with pytest.raises(TypeError, match="`data` must hold JSON values only; got object"):
        write_json(path, {"a": object()})
    # A writer that fails half way leaves the previous file whole and no temporary file behind.
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text('{"half": ')
        raise RuntimeError("killed")
    assert json.loads(path.read_text())["b"][1] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# --- faults: huge grids and bad scheduler addresses, refused before anything runs ----------------


def test_a_grid_above_the_limit_is_refused_unless_confirmed(base_file, tmp_path):
    values = ",".join(str(0.5 + k / 1000) for k in range(1000))
    out = tmp_path / "sweep"
    seeds = ",".join(str(k) for k in range(1000))
    args = ["sweep", str(base_file), "--grid", f"model.beta={values}", "--grid", f"init.seed={seeds}"]
    start = time.perf_counter()
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert time.perf_counter() - start < 30  # refused before planning 10^6 points (~28 min)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert (
        "must be a grid of at most 1000 points; got '1000000 points (1000 x 1000)'. Pass --yes"
        in result.stderr
    )
    assert not out.exists()
    axes = [parse_grid("model.beta=1,2"), parse_grid("init.seed=0,1")]
    with pytest.raises(ConfigError, match="at most 3 points"):
        plan_sweep(load_config(base_file), axes, max_points=3)
    assert len(plan_sweep(load_config(base_file), axes, max_points=None).points) == 4


@pytest.mark.parametrize(
    ("scheduler", "reason"),
    [
        ("/etc/passwd", "not JSON"),
        ("not-an-address", "neither an address nor an existing file"),
        ("tcp://localhost:99999", "its port must be in 1-65535"),  # refused before a 20 s connection try
        ("tcp://localhost:0", "its port must be in 1-65535"),
        ("{tmp}/empty.json", 'a JSON file without an "address"'),
        ("{tmp}", "Is a directory"),
    ],
)
def test_a_scheduler_that_is_not_an_address_or_file_is_one_line(base_file, tmp_path, scheduler, reason):
    (tmp_path / "empty.json").write_text("{}")
    scheduler = scheduler.format(tmp=tmp_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(base_file), "--grid", "model.beta=1", "--out", str(out), "--scheduler", scheduler]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert "must be a Dask address (tcp://host:port) or a scheduler file" in result.stderr
    assert reason in result.stderr
    assert not out.exists()


def _hold_lock(folder: Path) -> subprocess.Popen:
    """A process that holds ``folder`` as a run writing it does (its marker, the folder's lock:
    attnflow.io.run_folder), until it is killed."""
    (folder / ".attnflow-run").touch()
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_a_killed_workers_staging_folder_is_removed_by_the_next_attempt(base_file, tmp_path):
    """A Dask worker killed mid-point leaves ``<hash>.<id>.partial``; Dask runs the point again
    elsewhere. That attempt removes the dead writer's folder and keeps a live writer's."""
    point = tiny_plan(base_file).points[0]
    runs = tmp_path / "runs"
    dead, live, fresh, old = (
        runs / f"{point.hash}.{tag}.partial" for tag in ("dead0000", "live0000", "new0", "old0")
    )
    for folder in (dead, live, fresh, old):
        folder.mkdir(parents=True)
    (dead / "trajectory.zarr").mkdir()  # what a killed run leaves: its store and its marker
    killed = _hold_lock(dead)
    killed.kill()  # SIGKILL: its lock dies with it
    killed.wait()
    writer = _hold_lock(live)
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))  # no marker, never published: stale
    try:
        outcome = run_point(resolved_dict(point.config), str(runs / point.hash))
        assert outcome["status"] == "ok" and is_finished(runs / point.hash)
        left = sorted(p.name for p in runs.iterdir())
        assert left == sorted([point.hash, live.name, fresh.name])  # a live writer's folder is kept
    finally:
        writer.kill()
        writer.wait()
    assert clear_stale_staging(runs / point.hash) == [live]  # the end of the sweep: its writer is gone
    assert sorted(p.name for p in runs.iterdir()) == sorted([point.hash, fresh.name])


# A client's attempt, in a process of its own: a plain-TCP client of a TLS scheduler was seen to
# hang past its own timeout (900 s, in Client.__init__); a process can be killed at a deadline.
CLIENT_ATTEMPT = """
import sys
from distributed import Client
from attnflow.workflows.sweep import local_security
try:  # TypeError (no TLS context), CommClosedError, OSError, TimeoutError
    client = Client(sys.argv[1], timeout=5, security=local_security() if sys.argv[2] == "own" else None)
except Exception as error:
    print(type(error).__name__)
else:
    client.close()
    print("connected")
"""
CLIENT_DEADLINE_S = 60


def _refused(address: str, *, own_certificate: bool = False) -> str:
    """Why a client (without credentials, or with a certificate of its own) got no connection to
    ``address``; empty if it connected."""
    command = [sys.executable, "-c", CLIENT_ATTEMPT, address, "own" if own_certificate else "none"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_DEADLINE_S, check=False)
    except subprocess.TimeoutExpired:
        return f"no connection within {CLIENT_DEADLINE_S} s"
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]  # an attempt, not a crash
    return "" if done.stdout.strip() == "connected" else done.stdout.strip()


@pytest.mark.slow
def test_the_local_cluster_refuses_a_client_without_its_credentials():
    """Another local user could reach 127.0.0.1: plain TCP, TLS without credentials and TLS with
    credentials of their own are all refused; the sweep's own client runs tasks."""
    from attnflow.workflows.sweep import connect

    with connect(workers=1) as client:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(abs, -3).result() == 3
        assert _refused(address)
        assert _refused(address.replace("tls://", "tcp://"))
        assert _refused(address, own_certificate=True)  # a certificate the cluster never signed


@pytest.mark.parametrize(
    "options, message",
    [
        (["--tls-cert", "{cert}"],
         "sweep: `--tls-ca-file` and `--tls-cert` must be given together; got only --tls-cert."),
        (["--tls-ca-file", "{cert}", "--tls-cert", "{cert}"],
         "sweep: `--tls-ca-file` must be left out without `--scheduler`"),
        (["--scheduler", "tls://127.0.0.1:1", "--tls-ca-file", "{cert}", "--tls-cert", "{missing}"],
         "sweep: `--tls-cert` must be a readable file; got "),
    ],
)  # fmt: skip
def test_tls_options_are_checked_before_any_connection(base_file, tmp_path, options, message):
    cert = tmp_path / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    filled = [o.format(cert=cert, missing=tmp_path / "missing.pem") for o in options]
    out = tmp_path / "sweep"
    result = CliRunner().invoke(
        app, ["sweep", str(base_file), "--grid", "model.beta=1,2", "--out", str(out), *filled]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output
    assert not out.exists()
