"""``attnflow reproduce`` for long jobs: the output folder is refused unless new, resumed or
overwritten; each experiment is recorded as it finishes; ``--resume`` runs only what is missing;
Ctrl-C says in one line what was kept."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io import reproduce_folder
from attnflow.io.outcomes import FigureData, JobResult
from attnflow.io.run_folder import OutFolderError
from attnflow.workflows import reproduce

TINY = ("--quick", "--sizes", "8", "--seeds", "1", "--workers", "1")  # the smallest runs of the files


def invoke(*args: str):
    return CliRunner().invoke(app, ["reproduce", *TINY, *args])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def reported(folder: Path) -> list[str]:
    return list(json.loads((folder / "results.json").read_text())["experiments"])


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The experiments whose jobs ran (in this process)."""
    calls: list[str] = []
    run_job = reproduce.run_job

    def counted(job, tick):
        calls.append(job.experiment.id)
        return run_job(job, tick)

    monkeypatch.setattr(reproduce, "run_job", counted)
    return calls


# --------------------------------------------------------------------------- the folder rules


SETTINGS = reproduce_folder.make_settings(quick=True, sizes=[8], n_seeds=1, overrides=())


def test_a_folder_of_other_files_is_refused_whatever_the_options(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for options in ({}, {"resume": True}, {"overwrite": True}):
        options = {"resume": False, "overwrite": False} | options
        with pytest.raises(OutFolderError, match=r"or a reproduce folder; got other files"):
            reproduce_folder.check_folder(tmp_path, SETTINGS, **options)
    assert snapshot(tmp_path) == {"notes.txt": b"mine"}
    with pytest.raises(OutFolderError, match=r"`--resume` and `--overwrite` must not be given together"):
        reproduce_folder.check_folder(tmp_path / "new", SETTINGS, resume=True, overwrite=True)
    for folder in (tmp_path / "new", tmp_path / "empty"):  # new or empty: accepted with any option
        (tmp_path / "empty").mkdir(exist_ok=True)
        reproduce_folder.check_folder(folder, SETTINGS, resume=True, overwrite=False)
        reproduce_folder.check_folder(folder, SETTINGS, resume=False, overwrite=False)
    assert not (tmp_path / "new").exists()


def test_resume_with_other_settings_names_every_difference(tmp_path):
    reproduce_folder.prepare_folder(tmp_path, SETTINGS)
    other = reproduce_folder.make_settings(quick=False, sizes=[8], n_seeds=2, overrides=["solver.method=rk4"])
    with pytest.raises(OutFolderError) as error:
        reproduce_folder.check_folder(tmp_path, other, resume=True, overwrite=False)
    message = str(error.value)
    assert "\n" not in message
    assert (
        "got --quick off (folder: on); --seeds 2 (folder: 1); --set solver.method=rk4 (folder: unset)"
        in message
    )
    assert message.endswith("Pass --overwrite to start again.")
    reproduce_folder.check_folder(tmp_path, SETTINGS, resume=True, overwrite=False)  # the same: accepted


def test_a_record_reads_back_what_was_written(tmp_path):
    x, u = np.random.default_rng(0).normal(size=(2, 5, 3))
    figure = FigureData(color=np.arange(5.0), states={"t=0": (x, u), "final": (x, None)},
                        series={"energy": np.linspace(0, 1, 4)}, seed_series={"energy": np.ones((2, 4))},
                        beta=4.0, target=("orbit", np.arange(3.0), np.arange(3.0) + 1),
                        density=(np.linspace(0, 6, 7), np.full(7, 0.2)))  # fmt: skip
    values = [{"seed": 0, "final": {"energy": 1.5}}]
    jobs = [JobResult("E9", "a", "E9 a", 8, (0, 1), "ok", "", values, {"wall_s": 2.0}, figure),
            JobResult("E9", "b", "E9 b", 16, (0,), "nonfinite", "why")]  # fmt: skip
    rows = [{"experiment": "E9", "status": "PASS", "measured": None}]
    reproduce_folder.write_record(tmp_path, "E9", jobs, rows)
    (tmp_path / "experiments" / "E8.json").write_text("{")  # a killed write: not a complete record
    records = reproduce_folder.read_records(tmp_path)
    assert list(records) == ["E9"]
    read, read_rows = records["E9"]
    assert read_rows == rows
    for a, b in zip(read, jobs, strict=True):
        fields = ("experiment", "variant", "label", "n", "seeds", "status", "reason", "values", "timing")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
        assert a.figure.beta == b.figure.beta
    got = read[0].figure
    np.testing.assert_array_equal(got.color, figure.color)  # bitwise: the figures redraw the same
    assert got.states.keys() == figure.states.keys() and got.states["final"][1] is None
    np.testing.assert_array_equal(got.states["t=0"][1], u)
    np.testing.assert_array_equal(got.seed_series["energy"], figure.seed_series["energy"])
    assert got.target[0] == "orbit"
    np.testing.assert_array_equal(got.target[2], figure.target[2])
    np.testing.assert_array_equal(got.density[1], figure.density[1])
    assert read[1].figure.states == {} and read[1].figure.target is None and read[1].figure.density is None


def test_id_ranges_and_the_resume_command():
    assert reproduce.id_ranges(["E0", "E1", "E2", "E3", "E5", "E7", "E8"]) == "E0-E3, E5, E7-E8"
    assert reproduce.id_ranges([]) == ""
    settings = reproduce_folder.make_settings(quick=True, sizes=[8, 16], n_seeds=1, overrides=["a.b=c d"])
    command = reproduce.resume_command(Path("my out"), settings, ["E0", "E2"])
    assert command == ("attnflow reproduce --quick --only E0,E2 --sizes 8,16 --seeds 1 --set 'a.b=c d' "
                       "--out 'my out' --resume")  # fmt: skip


# --------------------------------------------------------------------------- the command line


def test_a_non_empty_out_is_refused_in_one_line_and_left_as_it_was(tmp_path, ran):
    out = tmp_path / "rep"
    first = invoke("--only", "E0", "--out", str(out))
    assert first.exit_code in (0, 1), first.output  # ran (an expectation may fail at n = 8)
    assert ran == ["E0"]
    assert (out / "experiments" / "E0.json").is_file() and (out / reproduce_folder.MARKER).is_file()
    before = snapshot(out)
    again = invoke("--only", "E0", "--out", str(out))
    assert again.exit_code == 2
    assert lines(again.output) == [
        f"error: --out: {str(out)!r} must be a new or empty folder; got a reproduce folder. Pass --resume to "
        "continue it or --overwrite to replace it."
    ]
    assert snapshot(out) == before and ran == ["E0"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = invoke("--only", "E0", "--out", str(other), "--overwrite")
    assert refused.exit_code == 2 and "must be a new or empty folder or a reproduce folder" in refused.output
    assert snapshot(other) == {"notes.txt": b"mine"}


def test_resume_runs_only_the_missing_experiments_and_reports_them_all(tmp_path, ran):
    out = tmp_path / "rep"
    assert invoke("--only", "E0", "--out", str(out)).exit_code in (0, 1)
    record = (out / "experiments" / "E0.json").read_bytes()
    resumed = invoke("--only", "E0,E7", "--out", str(out), "--resume")
    assert resumed.exit_code in (0, 1), resumed.output
    assert ran == ["E0", "E7"]  # E0 was not run again
    assert (out / "experiments" / "E0.json").read_bytes() == record
    assert reported(out) == ["E0", "E7"]
    assert (out / "figures" / "realisation_orbit.png").is_file()
    results, figures = json.loads((out / "results.json").read_text()), snapshot(out / "figures")
    # --only E0 with --resume: nothing runs, the report still covers the folder's experiments, and
    # the records redraw it exactly (the figures bitwise; results.json but for the wall time)
    assert invoke("--only", "E0", "--out", str(out), "--resume").exit_code in (0, 1)
    assert ran == ["E0", "E7"] and reported(out) == ["E0", "E7"]
    again = json.loads((out / "results.json").read_text())
    assert {k: v for k, v in again.items() if k != "wall_time_s"} == {
        k: v for k, v in results.items() if k != "wall_time_s"
    }
    assert snapshot(out / "figures") == figures
    differs = invoke("--only", "E0", "--seeds", "2", "--out", str(out), "--resume")
    assert differs.exit_code == 2
    assert len(lines(differs.output)) == 1 and "got --seeds 2 (folder: 1)" in differs.output


def test_overwrite_clears_only_what_reproduce_wrote_and_leaves_no_stale_figure(tmp_path, ran):
    out = tmp_path / "rep"
    assert invoke("--only", "E0,E7", "--out", str(out)).exit_code in (0, 1)
    assert (out / "figures" / "realisation_orbit.png").is_file()
    (out / "notes.txt").write_text("mine")  # a user's files in the folder survive
    (out / "figures" / "edited.png").write_bytes(b"mine")
    (out / "experiments" / "notes.txt").write_text("mine")
    (out / "experiments" / ".E3.npz.0123abcd.tmp").write_bytes(b"")  # left by a killed write
    (out / ".report.html.0123abcd.tmp").write_bytes(b"")
    result = invoke("--only", "E0", "--out", str(out), "--overwrite")
    assert result.exit_code in (0, 1), result.output
    assert reported(out) == ["E0"]
    assert not (out / "figures" / "realisation_orbit.png").exists()  # E7's figure went with its run
    assert sorted(p.name for p in (out / "experiments").iterdir()) == ["E0.json", "E0.npz", "notes.txt"]
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))
    assert (out / "notes.txt").read_text() == "mine" and (
        out / "figures" / "edited.png"
    ).read_bytes() == b"mine"
    assert "realisation" not in (out / "report.md").read_text()


def test_ctrl_c_keeps_the_finished_experiments_and_resume_completes_them(tmp_path, ran, monkeypatch):
    out = tmp_path / "rep"
    run_job = reproduce.run_job

    def interrupted(job, tick):
        if job.experiment.id == "E7":
            raise KeyboardInterrupt
        return run_job(job, tick)

    monkeypatch.setattr(reproduce, "run_job", interrupted)
    result = invoke("--only", "E0,E7", "--out", str(out))
    assert result.exit_code == 130
    assert lines(result.stderr) == [  # stdout holds the progress lines (not a terminal)
        f"interrupted: E0 kept in {str(out)!r}; `attnflow reproduce --quick --only E0,E7 --sizes 8 --seeds 1 "
        f"--out {out} --resume` continues"
    ]
    assert "Traceback" not in result.output
    assert sorted(p.name for p in (out / "experiments").iterdir()) == ["E0.json", "E0.npz"]
    assert not (out / "report.html").exists()  # no report presents E0 alone as the run's
    monkeypatch.setattr(reproduce, "run_job", run_job)
    assert invoke("--only", "E0,E7", "--out", str(out), "--resume").exit_code in (0, 1)
    assert ran == ["E0", "E7"] and reported(out) == ["E0", "E7"]  # E0 once, E7 by the resume


@pytest.mark.slow
def test_sigint_after_the_first_experiment_exits_130_with_one_line(tmp_path):
    """A real Ctrl-C in a fresh process (about 10 s: imports, compilations, E0 and part of E2)."""
    out = tmp_path / "rep"
    env = {**os.environ, "PYTHONPATH": str(Path(reproduce.__file__).parents[2])}
    cmd = [sys.executable, "-m", "attnflow", "reproduce", *TINY, "--only", "E0,E2", "--out", str(out)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not (out / "experiments" / "E0.json").exists() and process.poll() is None:
            assert time.monotonic() < deadline, "E0 was never recorded"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        f"interrupted: E0 kept in {str(out)!r}; `attnflow reproduce --quick --only E0,E2 --sizes 8 --seeds 1 "
        f"--out {out} --resume` continues"
    ]
    assert sorted(p.name for p in (out / "experiments").iterdir()) == ["E0.json", "E0.npz"]


def test_resume_runs_again_an_experiment_that_ended_in_an_error(tmp_path, ran, monkeypatch):
    out = tmp_path / "rep"
    run_job = reproduce.run_job

    def broken(job, tick):
        run_job(job, tick)  # counted
        return JobResult(job.experiment.id, job.variant.name, job.label, job.n, job.seeds, "error", "boom")

    monkeypatch.setattr(reproduce, "run_job", broken)
    assert invoke("--only", "E0", "--out", str(out)).exit_code == 1  # its expectations fail
    monkeypatch.setattr(reproduce, "run_job", run_job)
    assert invoke("--only", "E0", "--out", str(out), "--resume").exit_code in (0, 1)
    assert ran == ["E0", "E0"]
    (run,) = json.loads((out / "results.json").read_text())["experiments"]["E0"]["runs"]
    assert run["status"] == "ok"


def test_ctrl_c_while_the_report_is_written_leaves_no_half_report(tmp_path, monkeypatch):
    from attnflow.viz import report

    out = tmp_path / "rep"

    def half(out_dir, outcome, *, clock=None):  # report.write_report's signature
        (out_dir / "figures").mkdir()
        (out_dir / "figures" / "comparison.png").write_bytes(b"half")
        (out_dir / "results.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", half)
    result = invoke("--only", "E0", "--out", str(out))
    assert result.exit_code == 130 and lines(result.stderr)[0].startswith("interrupted: E0 kept in ")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        reproduce_folder.MARKER,
        "experiments",
        "experiments/E0.json",
        "experiments/E0.npz",
    ]
    monkeypatch.undo()
    assert invoke("--only", "E0", "--out", str(out), "--resume").exit_code in (0, 1)
    assert reported(out) == ["E0"] and (out / "report.html").is_file()


def test_a_folder_another_reproduce_is_writing_is_refused(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running reproduce holds it
        result = invoke("--only", "E0", "--out", str(out))
    finally:
        os.close(fd)
    assert result.exit_code == 2
    assert lines(result.output) == [
        f"error: --out: {str(out)!r} must not be in use; got a folder another reproduce is writing now."
    ]
    assert list(out.iterdir()) == []


def test_ctrl_c_before_the_folder_is_touched_says_nothing_was_written(tmp_path, monkeypatch):
    from attnflow.workflows import reproduce_plan

    def interrupted(only):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce_plan, "parse_only", interrupted)
    out = tmp_path / "rep"
    result = invoke("--only", "E0", "--out", str(out))
    assert result.exit_code == 130
    assert lines(result.output) == ["interrupted before reproduce started: nothing was written."]
    assert not out.exists()
