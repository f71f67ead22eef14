"""Runs under faults: Ctrl-C and SIGKILL (resumable, bitwise), failures while finishing, two runs
into one folder, undefined metrics. Each run that started leaves metrics.json with its status."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io import run_folder
from attnflow.io.config import load_config
from attnflow.io.store import read_trajectory
from attnflow.workflows import run as run_module
from configs import small_toml

SMALL = small_toml({"solver": {"t_end": 4.0}})
N_SNAPSHOTS = 9  # t_end / save_every + 1


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "small.toml"
    path.write_text(SMALL)
    return path


@pytest.fixture(scope="module")
def reference(config_file, tmp_path_factory):
    """An uninterrupted run of the small config (the bitwise reference)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run_module.run(load_config(config_file, []), out)
    return read_trajectory(out / "trajectory.zarr")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def metrics_of(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def stop_at(k_stop: int):
    def progress(done: int, total: int) -> None:  # noqa: ARG001
        if done == k_stop:
            raise KeyboardInterrupt

    return progress


@pytest.mark.parametrize("kept", [1, 2, 5, N_SNAPSHOTS - 1])
def test_interrupted_run_records_its_status_and_resumes_bitwise(config_file, reference, tmp_path, kept):
    config, out = load_config(config_file, []), tmp_path / "run"
    with pytest.raises(run_module.RunInterrupted, match=f"kept {kept} of {N_SNAPSHOTS} snapshots"):
        run_module.run(config, out, progress=stop_at(kept))
    assert metrics_of(out)["run"]["status"] == "interrupted"
    assert metrics_of(out)["run"]["snapshots"] == kept
    assert read_trajectory(out / "trajectory.zarr").status == "interrupted"
    result = run_module.run(config, out, resume=True)
    assert result.metrics["run"]["status"] == "ok"
    resumed = read_trajectory(out / "trajectory.zarr")
    assert resumed.status == "ok"
    np.testing.assert_array_equal(resumed.ts, reference.ts)  # bitwise: same times
    np.testing.assert_array_equal(resumed.xs, reference.xs)  # bitwise: same states
    assert (out / "figures").is_dir()


def test_a_failure_while_drawing_leaves_error_not_ok(config_file, tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "figures/energy.png")

    monkeypatch.setattr(run_module, "write_figures", full_disk)
    out = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        run_module.run(load_config(config_file, []), out)
    metrics = metrics_of(out)
    assert metrics["run"]["status"] == "error"
    assert "No space left" in metrics["run"]["error"]
    assert "energy" in metrics  # the metrics computed before the failure are kept
    assert read_trajectory(out / "trajectory.zarr").status == "error"


@pytest.mark.parametrize("existing", [False, True])
def test_input_the_store_refuses_leaves_the_folder_as_it_was(config_file, tmp_path, monkeypatch, existing):
    """Bad input found only when the store opens (past the config's rules): nothing is left behind,
    not even the folder a new run made."""

    def refuse(*args, **kwargs):
        raise ValueError("store: `xi` must be finite; got 1 non-finite entries, the first at index (2,).")

    monkeypatch.setattr(run_module.store, "TrajectoryWriter", refuse)
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    with pytest.raises(ValueError, match="must be finite"):
        run_module.run(load_config(config_file, []), out)
    assert out.exists() == existing
    assert not existing or list(out.iterdir()) == []


def test_a_failure_mid_run_leaves_error_and_is_resumable(config_file, reference, tmp_path):
    def broken(done: int, total: int) -> None:  # noqa: ARG001
        if done == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    config, out = load_config(config_file, []), tmp_path / "run"
    with pytest.raises(OSError):
        run_module.run(config, out, progress=broken)
    assert metrics_of(out)["run"]["status"] == "error"
    run_module.run(config, out, resume=True)
    np.testing.assert_array_equal(read_trajectory(out / "trajectory.zarr").xs, reference.xs)


def test_a_run_folder_is_refused_without_resume_or_overwrite(config_file, tmp_path):
    out = tmp_path / "run"
    assert invoke("run", str(config_file), "--out", str(out)).exit_code == 0
    before = (out / "metrics.json").stat().st_mtime_ns
    result = invoke("run", str(config_file), "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "got a run folder. Pass --resume to continue it or --overwrite to replace it." in result.stderr
    assert (out / "metrics.json").stat().st_mtime_ns == before  # nothing touched
    result = invoke("run", str(config_file), "--out", str(out), "--overwrite", "--set", "model.beta=2.0")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["model"]["beta"] == 2.0
    assert read_trajectory(out / "trajectory.zarr").attrs["config"]["model"]["beta"] == 2.0


def test_resume_with_another_config_is_refused(config_file, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(run_module.RunInterrupted):
        run_module.run(load_config(config_file, []), out, progress=stop_at(3))
    with warnings.catch_warnings(record=True) as advice:  # beta = 3 makes dt = 0.05 too long a step
        warnings.simplefilter("always")
        result = invoke("run", str(config_file), "--out", str(out), "--resume", "--set", "model.beta=3.0")
    assert result.exit_code == 2
    assert "must continue the run's own config; got one that differs in model.beta" in result.stderr
    assert advice == []  # one line: no advice about the step of a run that is refused
    assert read_trajectory(out / "trajectory.zarr").ts.size == 3  # untouched


def test_resume_of_a_noisy_run_is_refused(config_file, tmp_path):
    config, out = load_config(config_file, ["model.noise=0.1"]), tmp_path / "run"
    with pytest.raises(run_module.RunInterrupted):
        run_module.run(config, out, progress=stop_at(3))
    with pytest.raises(ValueError, match="must continue a deterministic fixed-step run"):
        run_module.run(config, out, resume=True)


def test_folder_locked_by_a_running_run_is_refused(tmp_path):
    out = tmp_path / "run"
    with run_folder.claimed(out, run_folder.RUN):
        assert run_folder.in_use(out)
        with pytest.raises(ValueError, match="must not be in use; got a folder another run is writing now"):
            with run_folder.claimed(out, run_folder.RUN, resume=True):
                pass
    assert not run_folder.in_use(out)
    with pytest.raises(ValueError, match="got a run folder. Pass --resume"):
        with run_folder.claimed(out, run_folder.RUN):
            pass


def test_zero_factor_writes_a_null_gap(tmp_path):
    # E_max = 0 for a zero factor: the relative gap is undefined (null), not a ZeroDivisionError.
    np.save(tmp_path / "w.npy", np.zeros((16, 16)))
    config = tmp_path / "zero.toml"
    config.write_text(
        small_toml({"solver": {"t_end": 4.0}, "factor": {"kind": "file", "path": str(tmp_path / "w.npy")}})
    )
    out = tmp_path / "run"
    result = invoke("run", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    metrics = metrics_of(out)
    assert metrics["energy_max"] == 0.0
    assert metrics["energy_gap"] is None
    assert metrics["run"]["status"] == "ok"


@pytest.mark.parametrize("overrides", [["model.beta=800.0"], ["model.beta=88.0", 'solver.dtype="float32"']])
def test_an_overflowing_run_exits_3_with_valid_metrics(tmp_path, overrides):
    config = tmp_path / "overflow.toml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    sets = [arg for value in overrides for arg in ("--set", value)]
    with pytest.warns(UserWarning, match="outside the stable range"):  # said before the run starts
        result = invoke("run", str(config), "--out", str(out), *sets)
    assert result.exit_code == 3, result.output
    metrics = json.loads((out / "metrics.json").read_text())  # strict JSON: no NaN or Infinity
    assert metrics["run"]["status"] in ("nonfinite", "max_steps")


LONG = small_toml({"solver": {"t_end": 400.0, "dt": 0.005}})


def _start(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_snapshots(out: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        store = out / "trajectory.zarr"
        if store.exists() and read_trajectory(store).ts.size >= count:
            return
        time.sleep(0.1)
    pytest.fail(f"the run never stored {count} snapshots")


@pytest.fixture(scope="module")
def long_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("long") / "long.toml"
    path.write_text(LONG)
    return path


@pytest.fixture(scope="module")
def long_reference(long_config, tmp_path_factory):
    """An uninterrupted run of LONG through the CLI, once for both signals: a deterministic run of
    one config (the bitwise reference each resumed run must equal; it was run once per signal)."""
    ref = tmp_path_factory.mktemp("long_reference") / "run"
    assert invoke("run", str(long_config), "--out", str(ref)).exit_code == 0
    return read_trajectory(ref / "trajectory.zarr")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_cli_run_resumes_bitwise(tmp_path, long_config, long_reference, sig):
    config, out = long_config, tmp_path / "run"
    process = _start(config, out)
    try:
        _wait_for_snapshots(out, 5, process)
    finally:
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert process.returncode == 130
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("interrupted: kept ")
        assert lines[0].endswith(f"--out {out} --resume")
        assert metrics_of(out)["run"]["status"] == "interrupted"
    else:
        assert not (out / "metrics.json").exists()
        assert read_trajectory(out / "trajectory.zarr").status == "incomplete"
    resumed = subprocess.run(
        [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    a, b = read_trajectory(out / "trajectory.zarr"), long_reference
    assert a.status == b.status == "ok"
    np.testing.assert_array_equal(a.xs, b.xs)
    np.testing.assert_array_equal(a.ts, b.ts)


@pytest.mark.slow
def test_two_runs_into_one_folder_exactly_one_succeeds(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    first, second = _start(config, out), _start(config, out)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert refused.count("\n") == 1 and "--out" in refused
    assert read_trajectory(out / "trajectory.zarr").status == "ok"
    assert metrics_of(out)["run"]["status"] == "ok"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has finished: only its exit status is left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_of_a_killed_parent_exit():
    code = (
        "import time\nfrom attnflow.numerics.batch import run_tasks\n"
        "list(run_tasks(time.sleep, [(60,), (60,)], workers=2))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    children_file = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            pids = [int(p) for p in children_file.read_text().split()]
            workers = [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
            time.sleep(0.2)
        assert len(workers) == 2, "the two workers never started"
        time.sleep(1.0)  # let each worker run its initializer and start its task
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10  # the tasks would sleep 60 s: the workers must not wait for them
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)
