"""SIGTERM (a SLURM job's time limit, `kill`, `timeout`, a container's stop) takes Ctrl-C's path:
one line naming it, exit code 143, the folder's status `interrupted`, and `--resume` continues; the
batch workers block it, so that a signal that reaches them first does not become a dead worker's
error. Each SIGTERM case fails on the code that left SIGTERM its default action (exit -15)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app, interrupts
from attnflow.io.config import load_config
from attnflow.io.store import read_trajectory
from attnflow.workflows import run as run_module
from configs import small_toml
from test_batch import blocked, spawned_workers
from test_faults import _wait_for_snapshots, metrics_of

# about 1 s of steps after the first snapshot (81 snapshots): time for the signal to land mid-run
STEPS = small_toml({"solver": {"t_end": 40.0, "dt": 0.005}})
N_SNAPSHOTS = 81
CONSOLE_SCRIPT = "import sys; from attnflow_entry import main; sys.exit(main())"  # what pip's wrapper does


@pytest.fixture(autouse=True)
def _handlers_stay_as_they_were():
    """A command run here installs the command line's handlers in this process: undone after."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    interrupts.install()
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.slow
def test_sigterm_stops_a_run_cleanly_and_resume_finishes_it_bitwise(tmp_path):
    config, out = tmp_path / "steps.toml", tmp_path / "run"
    config.write_text(STEPS)
    command = [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_snapshots(out, 1, process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    (line,) = stderr.splitlines()
    kept = read_trajectory(out / "trajectory.zarr")
    assert line == (
        f"stopped by SIGTERM: kept {kept.ts.size} of {N_SNAPSHOTS} snapshots in {str(out)!r}; metrics.json "
        f"records status 'interrupted'. Continue with: attnflow run {config} --out {out} --resume"
    )
    assert metrics_of(out)["run"]["status"] == kept.status == "interrupted"
    reference = tmp_path / "reference"
    run_module.run(load_config(config, []), reference)
    whole = read_trajectory(reference / "trajectory.zarr")
    np.testing.assert_array_equal(kept.xs, whole.xs[: kept.ts.size])  # every snapshot kept reads back
    resumed = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    final = read_trajectory(out / "trajectory.zarr")
    assert final.status == "ok" and metrics_of(out)["run"]["status"] == "ok"
    np.testing.assert_array_equal(final.ts, whole.ts)
    np.testing.assert_array_equal(final.xs, whole.xs)


@pytest.mark.parametrize(
    ("sig", "cause"), [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM")]
)
def test_the_stop_line_names_what_stopped_the_command(sig, cause):
    """The handler takes both signals and raises either where it lands; the line begins with what
    stopped the command, the rest (what was kept, what continues) the same."""
    frame = types.SimpleNamespace(f_code=types.SimpleNamespace(co_name="run"))
    other = signal.SIGTERM if sig == signal.SIGINT else signal.SIGINT
    account = run_module.RunInterrupted(Path("runs/x"), 3, 9)
    continues = "Continue with: attnflow run x.toml --out runs/x --resume"
    lines = []
    for told, on_stop in [(account, {}), (account, {"continues": continues}), (KeyboardInterrupt(), {}),
                          (KeyboardInterrupt(), {"kept": "'runs' keeps every finished point"})]:  # fmt: skip
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is interrupts.handler
        interrupts.on_stop(**on_stop)
        with pytest.raises(KeyboardInterrupt):
            interrupts.handler(sig, frame)
        interrupts.handler(other, frame)  # while the command stops: noted, not raised
        assert interrupts.stopped_by() == sig
        lines.append(interrupts.stop_line(told, "run"))
    assert lines == [
        f"{cause}: kept 3 of 9 snapshots in 'runs/x'",
        f"{cause}: kept 3 of 9 snapshots in 'runs/x'; {continues}",
        f"{cause} before run started: nothing was written.",
        f"{cause}: 'runs' keeps every finished point",
    ]


@pytest.mark.parametrize(("sig", "code", "cause"), [(signal.SIGINT, 130, "interrupted"),
                                                    (signal.SIGTERM, 143, "stopped by SIGTERM")])  # fmt: skip
def test_a_command_stopped_by_sigterm_exits_143(tmp_path, monkeypatch, sig, code, cause):
    from attnflow.workflows import reproduce_plan

    def stopped(only):
        interrupts.handler(sig, sys._getframe())  # as if the signal landed here

    monkeypatch.setattr(reproduce_plan, "parse_only", stopped)
    out = tmp_path / "rep"
    result = CliRunner().invoke(app, ["reproduce", "--quick", "--only", "E0", "--out", str(out)])
    assert result.exit_code == code, result.output
    assert result.output.split() == f"{cause} before reproduce started: nothing was written.".split()
    assert not out.exists()


def test_sigterm_while_the_command_starts_prints_the_entry_line(tmp_path):
    """A SIGTERM while click parses the command's arguments (the entry's handler holds there)."""
    config = tmp_path / "config.toml"
    config.write_text("[model]\nn = 8\nd = 3\n")
    out = tmp_path / "run"
    terminated_parse = (
        "import os, signal, sys; from attnflow.cli.app import Command; parse = Command.parse_args; "
        "Command.parse_args = lambda self, *a: (os.kill(os.getpid(), signal.SIGTERM), parse(self, *a))[1]; "
    )
    command = [sys.executable, "-c", terminated_parse + CONSOLE_SCRIPT, "run", str(config), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (
        143,
        "stopped by SIGTERM while starting: nothing was done.\n",
        "",
    )
    assert not out.exists()


def test_sigterm_after_the_command_is_done_keeps_its_exit_code(tmp_path):
    """A SIGTERM during the interpreter's teardown (an exit handler here, JAX's in a real run) once
    the command is done: the command's exit code (2: no such run folder), not -15."""
    late_sigterm = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2)))\n" + CONSOLE_SCRIPT
    )
    done = subprocess.run([sys.executable, "-c", late_sigterm, "plot", str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


_BATCH_SCRIPT = textwrap.dedent(
    """
    import signal, time
    from attnflow.numerics import batch
    def stop(signum, frame):
        raise KeyboardInterrupt  # as the command line's handler does
    if __name__ == "__main__":
        signal.signal(signal.SIGTERM, stop)
        try:
            list(batch.run_tasks(time.sleep, [(60.0,), (60.0,), (60.0,)], workers=2))
        except KeyboardInterrupt:
            print("stopped", flush=True)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigterm_that_reaches_the_workers_first_stops_the_batch_cleanly(tmp_path):
    """SLURM may signal each process of a job step in turn (proctrack/linuxproc), workers before
    their parent: the workers block SIGTERM, the parent then stops the batch and kills them. (Not
    blocked, they died and the parent's stop became BrokenProcessPool: exit 3 at the command line.)"""
    script = tmp_path / "batch_main.py"
    script.write_text(_BATCH_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        workers = spawned_workers(parent, 2)
        assert all(blocked(pid, signal.SIGTERM) and blocked(pid, signal.SIGINT) for pid in workers)
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)  # a worker that took it is dead by now, and its parent has seen that
        parent.send_signal(signal.SIGTERM)
        stdout, stderr = parent.communicate(timeout=45)  # the tasks would sleep 60 s
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert stdout == "stopped\n" and "Traceback" not in stderr, stderr
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)
