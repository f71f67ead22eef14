"""The command line in-process: run folders, bad input (exit 2, one line, nothing written), kills."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.store import open_dataset, read_trajectory
from configs import small_config, small_toml

SMALL = small_toml()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_run_writes_a_complete_run_folder(config_file, tmp_path):
    out = tmp_path / "run"
    result = invoke("run", str(config_file), "--out", str(out), "--set", "model.beta=2.0")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".attnflow-run",
        "config.json",
        "figures",
        "metrics.json",
        "trajectory.zarr",
        "viewer.html",
    ]
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["beta"] == 2.0  # the override reached the resolved config
    assert config["solver"]["method"] == "rk4"  # defaults are filled in
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("energy", "mean_cosine", "resultant_deficit", "gauge_mean_cosine", "energy_monotone"):
        assert key in metrics
    assert metrics["run"]["status"] == "ok"
    assert metrics["run"]["steps"] == 40  # t_end / dt fixed steps
    assert metrics["series"]["t"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert metrics["energy_monotone"] is True
    stored = read_trajectory(out / "trajectory.zarr")
    assert stored.xs.shape == (5, 16, 3)
    assert stored.gauge.shape == (16, 3, 3)
    # The stored gauge maps the final snapshot to the gauge frame the metrics describe.
    u = np.einsum("nij,nj->ni", stored.gauge, stored.xs[-1])
    m = u.mean(axis=0)
    assert abs((16 * m @ m - 1) / 15 - metrics["gauge_mean_cosine"]) < 1e-12  # same formula, round-off
    for name in ("states.png", "energy.png", "collapse.png"):
        assert (out / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "status" in result.output and "ok" in result.output
    # the viewer shows every stored snapshot (5 <= its limit) of every token, in content and gauge frame
    viewer = (out / "viewer.html").read_text()
    assert '"times": [0.0, 0.5, 1.0, 1.5, 2.0]' in viewer and "16 of 16 tokens, 5 of 5 snapshots" in viewer
    assert '"panels": ["content x", "gauge frame u = Q(\\u03be) x"]' in viewer


def test_a_summary_off_s2_says_what_is_undefined_and_why(config_file, tmp_path, monkeypatch):
    from attnflow.cli import console, simulate

    printed = {}
    monkeypatch.setattr(simulate, "print_summary", lambda title, rows: printed.update(rows))
    args = ("run", str(config_file), "--out", str(tmp_path / "run"), "--set", "model.d=4")
    assert invoke(*args, "--set", "solver.t_end=0.5").exit_code == 0
    reason = "— (shape classes exist on S^2 only (d = 3); here d = 4)"
    assert printed["shape"] == reason and printed["gauge_shape"] == reason
    # in high d the 0.1 rad cluster angle is put beside the spacing of uniform tokens (16 on S^3)
    assert re.fullmatch(
        r"\d+ \(below 0\.1 rad; uniform tokens here are 0\.\d+ rad apart\)", printed["n_clusters"]
    )
    assert [console.shown(v) for v in (None, 0.1234567, 3, "ok")] == ["—", "0.123457", "3", "ok"]


def test_plot_redraws_figures(config_file, tmp_path):
    out = tmp_path / "run"
    assert invoke("run", str(config_file), "--out", str(out)).exit_code == 0
    for png in (out / "figures").iterdir():
        png.unlink()
    result = invoke("plot", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "figures" / "states.png").stat().st_size > 1000


BAD_INPUT = [
    (["--set", "solver.method=rk5"], "solver.method", "rk5"),
    (["--set", "model.n=-3"], "model.n", "-3"),
    (["--set", "model.beta=abc"], "model.beta", "abc"),
    (["--set", "model.colour=1"], "model.colour", "colour"),
    (["--set", "solver.dt=0.03"], "solver.save_every", "0.5"),
    (["--set", "model.normalization=sa", "--set", "factor.kind=toeplitz_cos"], "normalization", "sa"),
]


@pytest.mark.parametrize(("extra", "key", "value"), BAD_INPUT)
def test_bad_config_exits_2_naming_the_key(config_file, tmp_path, extra, key, value):
    out = tmp_path / "run"
    result = invoke("run", str(config_file), "--out", str(out), *extra)
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1  # one clear line
    assert key in message and value in message
    assert not out.exists()  # nothing half-written


def _bad_file_case(tmp_path: Path, kind: str) -> tuple[list[str], str]:
    n, d = 16, 3
    if kind == "gauge":
        q = np.tile(np.eye(d), (n, 1, 1))
        q[3, 0, 0] = 2.0  # not orthogonal
        np.save(tmp_path / "q.npy", q)
        return ["--set", "gauge.kind=file", "--set", f"gauge.path={tmp_path / 'q.npy'}"], "orthogonal"
    if kind == "init":
        x0 = np.ones((n, d))
        x0[2, 1] = np.nan
        np.save(tmp_path / "x0.npy", x0)
        return ["--set", "init.kind=file", "--set", f"init.path={tmp_path / 'x0.npy'}"], "init.path"
    if kind == "factor":
        w = -np.ones((n, n))
        np.save(tmp_path / "w.npy", w)
        sets = ["factor.kind=file", f"factor.path={tmp_path / 'w.npy'}", "model.normalization=sa"]
        # the library's check (numerics.dynamics), under its config key (io.parameters)
        needle = "`model.normalization` 'sa' requires a non-negative"
        return [arg for s in sets for arg in ("--set", s)], needle
    w = np.arange(n * n, dtype=float).reshape(n, n)  # not symmetric
    np.save(tmp_path / "w.npy", w)
    return ["--set", "factor.kind=file", "--set", f"factor.path={tmp_path / 'w.npy'}"], "symmetric"


@pytest.mark.parametrize("kind", ["gauge", "init", "factor", "asymmetric"])
def test_bad_arrays_exit_2(config_file, tmp_path, kind):
    extra, needle = _bad_file_case(tmp_path, kind)
    out = tmp_path / "run"
    result = invoke("run", str(config_file), "--out", str(out), *extra)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_missing_config_file_exits_2(tmp_path):
    result = invoke("run", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2
    assert "nope.toml" in result.stderr


def test_a_second_run_of_one_config_without_out_names_the_earlier_run(config_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folder is runs/<config hash> under the working directory
    assert invoke("run", str(config_file)).exit_code == 0
    (folder,) = (tmp_path / "runs").iterdir()
    metrics = (folder / "metrics.json").read_bytes()
    again = invoke("run", str(config_file))
    assert again.exit_code == 2
    assert again.stderr == (
        f"error: run: the default `--out` 'runs/{folder.name}' (named after the config's hash) must be new; "
        "got the folder of an earlier run of this same config. Pass --resume to continue it, --overwrite to "
        "run it again, or --out DIR for another folder.\n"
    )
    assert (folder / "metrics.json").read_bytes() == metrics  # left as it was


def test_non_empty_out_folder_is_refused(config_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    result = invoke("run", str(config_file), "--out", str(out))
    assert result.exit_code == 2 and "--out" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_sigkilled_run_leaves_a_readable_trajectory(tmp_path):
    config = tmp_path / "long.toml"
    config.write_text(small_toml({"solver": {"t_end": 5000.0, "dt": 0.01}}))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out)]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (out / "trajectory.zarr").exists() and read_trajectory(out / "trajectory.zarr").ts.size >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never stored 3 snapshots")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    stored = read_trajectory(out / "trajectory.zarr")
    assert stored.status == "incomplete"
    assert stored.ts.size >= 3
    assert np.all(np.isfinite(stored.xs))
    np.testing.assert_allclose(np.linalg.norm(stored.xs, axis=-1), 1.0, atol=1e-12)  # snapshots are whole
    assert np.allclose(np.diff(stored.ts), 0.5)  # a contiguous prefix of the save times
    assert open_dataset(out / "trajectory.zarr").sizes["t"] == stored.ts.size


def test_plot_of_a_folder_without_a_store_exits_2(tmp_path):
    result = invoke("plot", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "`RUN_DIR` must be a run folder with trajectory.zarr" in result.output
    (tmp_path / "trajectory.zarr").mkdir()  # a folder of that name that is not a store
    result = invoke("plot", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "`path` must be a trajectory store (a Zarr v3 group)" in result.output


def test_a_library_bug_is_not_reported_as_bad_input(config_file, tmp_path, monkeypatch):
    # A TypeError or FileNotFoundError raised inside the library is a bug (or the machine's
    # failure), not bad input: it keeps its traceback and does not exit with code 2.
    from attnflow.workflows import run as run_module

    for error in (TypeError("unsupported operand"), FileNotFoundError("lost a temporary file")):

        def broken(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(run_module, "run", broken)
        result = invoke("run", str(config_file), "--out", str(tmp_path / "out"))
        assert result.exit_code != 2
        assert result.exception is error


def test_a_write_refused_inside_the_run_folder_is_one_line_and_exit_3(config_file, tmp_path, monkeypatch):
    # the folder made read-only (chmod) after the start-up checks: the disk refused the run, not a bug
    import errno

    from attnflow.cli.app import disk_failure
    from attnflow.workflows import run as run_module

    out = tmp_path / "out"
    inside = PermissionError(errno.EACCES, "Permission denied", str(out / ".metrics.json.1.tmp"))
    elsewhere = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "cache" / "x"))
    assert disk_failure(inside, out) and not disk_failure(elsewhere, out)
    assert disk_failure(OSError(errno.ENOSPC, "No space left on device"), out)
    assert not disk_failure(FileNotFoundError(errno.ENOENT, "No such file", str(out / "x")), out)

    def refused(*args, **kwargs):
        raise inside

    monkeypatch.setattr(run_module, "run", refused)
    result = invoke("run", str(config_file), "--out", str(out))
    assert result.exit_code == 3, result.output
    assert result.stderr.splitlines() == [
        f"error: Permission denied ({out / '.metrics.json.1.tmp'}); the run folder keeps every completed "
        "snapshot and records the status where the disk allowed."
    ]

    def refused_elsewhere(*args, **kwargs):
        raise elsewhere

    monkeypatch.setattr(run_module, "run", refused_elsewhere)
    assert invoke("run", str(config_file), "--out", str(out)).exception is elsewhere  # a bug: its traceback


def test_a_run_that_goes_non_finite_exits_3_and_keeps_its_folder(tmp_path):
    # beta = 88 in float32: exp(beta) overflows within the first steps.
    config = tmp_path / "overflow.toml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    overrides = ["--set", "model.beta=88.0", "--set", 'solver.dtype="float32"']
    with pytest.warns(UserWarning, match="outside the stable range"):
        result = invoke("run", str(config), "--out", str(out), *overrides)
    assert result.exit_code == 3, result.output
    assert "did not finish as asked: status 'nonfinite'" in result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["status"] == "nonfinite"
    assert read_trajectory(out / "trajectory.zarr").xs.shape[0] >= 1


@pytest.mark.slow
def test_the_program_prints_a_warning_as_one_line(tmp_path):
    config = tmp_path / "overflow.toml"
    config.write_text(SMALL)
    args = ["run", str(config), "--out", str(tmp_path / "run"), "--set", "model.beta=88.0",
            "--set", 'solver.dtype="float32"']  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "attnflow", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if not line.startswith("run: ")]  # progress lines
    assert done.returncode == 3
    assert lines[0].startswith("warning: solver.dt = 0.05 is outside the stable range: ")
    assert lines[1].startswith("error: the run did not finish as asked") and len(lines) == 2, done.stderr


def test_version_and_exit_codes_in_help():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith("attnflow ")
    result = invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # rich wraps the help text
    assert "2 bad input" in text and "3 a run started but did not finish" in text


@pytest.mark.parametrize("command", ["run", "reproduce", "realize", "sweep"])
def test_an_out_that_cannot_be_a_folder_exits_2_before_anything_runs(config_file, tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = tmp_path / "target.npy"
    np.save(target, np.zeros(8))
    args = {
        "run": ["run", str(config_file)],
        "reproduce": ["reproduce", "--only", "E0"],
        "realize": ["realize", "--target", str(target), "--kind", "orbit"],
        "sweep": ["sweep", str(config_file), "--grid", "model.beta=1,2"],
    }[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(*args, "--out", str(blocker / "run"))
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: --out: Not a directory ({blocker / 'run'})\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("option", "value"),
    [("--seed", "-1"), ("--seed", str(2**64)), ("--t-end", "0"), ("--t-end", "-3"), ("--t-end", "1e300"),
     ("--n", "99999999999999999999")],
)  # fmt: skip
def test_realize_options_are_checked_before_anything_is_written(tmp_path, option, value):
    target = tmp_path / "target.npy"
    np.save(target, np.zeros(8))
    out = tmp_path / "out"
    result = invoke("realize", "--target", str(target), "--kind", "orbit", "--out", str(out), option, value)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: attnflow realize: Invalid value for '{option}'")
    assert result.stderr.count("\n") == 1  # one line, not a usage panel
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["rn"], "error: attnflow: No such command 'rn'. Did you mean 'run'?"),
        (["run"], "error: attnflow run: Missing argument 'CONFIG'."),
        (["run", "x.toml", "--bogus"], "error: attnflow run: No such option: --bogus"),
        (
            ["reproduce", "--seeds", "0"],
            "error: attnflow reproduce: Invalid value for '--seeds': must be an integer in [1, 10000]; "
            "got 0.",
        ),
        (
            ["reproduce", "--workers", "0"],
            "error: attnflow reproduce: Invalid value for '--workers': must be an integer in [1, 1024]; "
            "got 0.",
        ),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path, args, line):
    result = invoke(*args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.stderr


# --- absurd step counts (refused before anything starts) ------------------------------------------


@pytest.mark.parametrize("method", ["rk4", "euler", "geodesic_rk4"])
def test_a_run_of_absurdly_many_steps_is_refused_naming_dt(tmp_path, method):
    config = tmp_path / "tiny_dt.toml"
    config.write_text(small_toml({"solver": {"dt": 1e-12, "method": method}}))
    out = tmp_path / "run"
    result = invoke("run", str(config), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {config}: `solver.dt` must be at least `solver.t_end` / 1e+08 = 2e-08 (at most 1e+08 "
        "fixed steps); got 1e-12. That is 2e+12 steps, 5e+11 per snapshot (`solver.t_end` = 2.0, "
        "`solver.save_every` = 0.5); raise solver.dt or lower solver.t_end."
    ]
    assert not out.exists()


def test_the_step_bound_is_on_fixed_steps_only():
    from attnflow.io.config import ConfigError, config_from_dict
    from attnflow.io.config_rules import MAX_STEPS

    at_bound = {"solver": {"dt": 1e-8, "t_end": 1.0, "save_every": 0.5}}  # exactly MAX_STEPS steps
    assert config_from_dict(small_config(at_bound)).solver.t_end / 1e-8 == MAX_STEPS
    with pytest.raises(ConfigError, match=r"^config: `solver.dt` must be at least `solver.t_end` / 1e\+08"):
        config_from_dict(small_config({"solver": {"dt": 0.99e-8, "t_end": 1.0, "save_every": 0.5}}))
    # an adaptive run's dt is only its first trial step: the controller grows it
    adaptive = config_from_dict(small_config({"solver": {"dt": 1e-12, "method": "adaptive"}}))
    assert adaptive.solver.dt == 1e-12


# --- reproduce --set -------------------------------------------------------------------------------


def test_reproduce_passes_every_set_to_its_runs(tmp_path, monkeypatch):
    from attnflow.workflows import reproduce as reproduce_module

    seen = {}

    def fake(out_dir, **options):
        seen.update(options, out_dir=out_dir)
        raise ValueError("stop here")

    monkeypatch.setattr(reproduce_module, "reproduce", fake)
    out = tmp_path / "report"
    args = ["--quick", "--only", "E0", "--out", str(out)]
    sets = ["--set", 'solver.interaction="expansion"', "--set", "solver.method=rk4"]
    result = invoke("reproduce", *args, *sets)
    assert result.exit_code == 2 and result.output == "error: stop here\n"
    assert seen["overrides"] == ('solver.interaction="expansion"', "solver.method=rk4")
    assert seen["only"] == ["E0"] and seen["quick"] is True


@pytest.mark.parametrize(
    "override, message",
    [
        ("solver.dt", "error: --set: `solver.dt` must be given as section.key=value; got 'solver.dt'."),
        ("solver.foo=1", "error: --set: `solver.foo` must be one of the keys of [solver]; got 'foo'."),
        ('solver.interaction="nope"', "error: --set: `solver.interaction` must be one of 'auto', 'exact'"),
        ("solver.t_end=19.99", "error: --set: `solver.t_end` must be a whole multiple of"),
        ("model.layer_norm=peri", "error: --set: `model.layer_norm` must be 'post' in reproduce"),
    ],
)
def test_reproduce_refuses_a_bad_set_in_one_line_before_writing(tmp_path, override, message):
    out = tmp_path / "report"
    result = invoke("reproduce", "--quick", "--only", "E0", "--out", str(out), "--set", override)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.output
    assert not out.exists()


@pytest.mark.slow
def test_reproduce_set_reaches_the_recorded_runs(tmp_path):
    """E0 runs the adaptive solver; with ``--set solver.method=rk4`` its recorded runs take the
    fixed steps of the file's dt (t_end / dt of them, none rejected)."""
    out = tmp_path / "report"
    sets = ["--set", 'solver.interaction="expansion"', "--set", 'solver.method="rk4"']
    result = invoke("reproduce", "--quick", "--only", "E0", "--out", str(out), "--seeds", "1", *sets)
    assert result.exit_code == 0, result.output
    (run,) = json.loads((out / "results.json").read_text())["experiments"]["E0"]["runs"]
    assert run["status"] == "ok"
    assert run["timing"]["steps"] == 2000 and run["timing"].get("steps_rejected", 0) == 0  # 20 / 0.01


# --- option strings: bounded and strict ------------------------------------------------------------

_MANY = ",".join(str(0.5 + k / 1000) for k in range(1001))


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["reproduce", "--only", "E1,,E2"],
         "error: reproduce: `--only` must be a comma-separated list of experiment ids with no empty item; "
         "got 'E1,,E2'."),
        (["reproduce", "--only", ","], "error: reproduce: `--only` must be a comma-separated list of"),
        (["reproduce", "--only", "E1,E1"],
         "error: reproduce: `--only` must be a list of distinct experiment ids; got 'E1,E1'."),
        (["reproduce", "--sizes", "64,"],
         "error: reproduce: `--sizes` must be a comma-separated list of token counts with no empty item; "
         "got '64,'."),
        (["reproduce", "--sizes", "1e3"],
         "error: reproduce: `--sizes` must be comma-separated token counts, integers in [2, 16777216]; "
         "got '1e3'."),
        (["reproduce", "--sizes", "64,99999999999"], "error: reproduce: `--sizes` must be comma-separated"),
        (["reproduce", "--seeds", "99999999999999999999"],
         "error: attnflow reproduce: Invalid value for '--seeds': must be an integer in [1, 10000]; "
         "got 99999999999999999999."),
        (["landscape", "{config}", "--continue", "model.beta=0:1e9:1e-9"],
         "error: landscape: `--continue` must be at most 10000 values ((STOP - START) / STEP + 1; here "
         "1e+18); got 'model.beta=0:1e9:1e-9'."),
        (["landscape", "{config}", "--starts", "100000"],
         "error: attnflow landscape: Invalid value for '--starts': must be an integer in [0, 10000]; "
         "got 100000."),
        (["sweep", "{config}", *["--grid", "model.beta=1,2"] * 33],
         "error: sweep: `--grid` must be given at most 32 times; got '33 times'."),
        (["sweep", "{config}", "--yes", "--grid", f"model.beta={_MANY}", "--grid", f"init.sigma={_MANY}"],
         "error: sweep: `--grid` must be a grid of at most 1000000 points; got '1002001 points (1001 x "
         "1001)'."),
        (["sweep", "{config}", "--grid", "model.beta=" + "1," * 40_000 + "1"],
         "error: sweep: `--grid` must be at most 65536 characters; got '80012 characters'."),
        (["animate", "{config}", "--fps", "100000000000000000000"],
         "error: attnflow animate: Invalid value for '--fps': must be an integer in [1, 1000]; got "
         "100000000000000000000."),
        (["animate", "{config}", "--max-frames", "1"],
         "error: attnflow animate: Invalid value for '--max-frames': must be an integer in [2, 100000]; "
         "got 1."),
        (["sweep", "{config}", "--grid", "model.beta=1,2", "--workers", "0"],
         "error: attnflow sweep: Invalid value for '--workers': must be an integer in [1, 1024]; got 0."),
        (["reproduce", "--only", "E0", "--set", "gauge.omega=2"],  # no simulation of E0 reads it: ran
         "error: --set: `gauge.omega` must be left out when `gauge.kind` = 'none' (which does not read it); "
         "got 2."),
        (["run", "{config}", "--set", "model.n=" + "[" * 5000 + "]" * 5000],
         "error: --set: `model.n` must be nested at most 16 tables or arrays deep"),
        (["run", "{config}", "--set", "model.n=" + "1" * 70_000],
         "error: --set: the configuration must be given in at most 65536 characters; got '70008 "
         "characters'."),
    ],
)  # fmt: skip
def test_a_bad_option_string_is_one_line_and_exit_2_writing_nothing(config_file, tmp_path, args, line):
    out = tmp_path / "out"
    args = [arg.format(config=config_file) if arg == "{config}" else arg for arg in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.perf_counter()
    result = invoke(*args, "--out", str(out))
    assert time.perf_counter() - start < 5.0  # refused before anything is planned or imported
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(line), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_reproduce_override_is_refused_only_when_no_simulation_reads_it():
    """`reproduce --set` applies to experiments of different kinds: a key is kept if one reads it."""
    from attnflow.cli.experiments import refuse_unread_overrides
    from attnflow.io.config import ConfigError, config_from_dict

    given = {"rtol": 1e-4, "atol": 1e-6}  # the runs' configs hold the --set values
    rk4, adaptive = (config_from_dict({"solver": {"method": m, **given}}) for m in ("rk4", "adaptive"))
    refuse_unread_overrides(["solver.atol=1e-6"], [rk4, adaptive])  # the adaptive run reads it
    refuse_unread_overrides(["solver.atol=1e-6"], [])  # no simulation (realisations only): not judged here
    refused = r"^--set: `solver\.rtol` must be left out when `solver\.method` = 'rk4'"  # the first one
    with pytest.raises(ConfigError, match=refused):
        refuse_unread_overrides(["solver.rtol=1e-4", "solver.atol=1e-6"], [rk4, rk4])


def test_ctrl_c_in_a_sweep_is_one_line_and_exit_130(config_file, tmp_path, monkeypatch):
    import logging
    import types

    from attnflow.cli import interrupts
    from attnflow.workflows import sweep as sweep_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "run_sweep", interrupted)
    out = tmp_path / "sweep"
    result = invoke("sweep", str(config_file), "--grid", "model.beta=1,2", "--out", str(out))
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == [
        f"interrupted: {str(out)!r} keeps every finished point; the same command continues (finished "
        "points are skipped)."
    ]
    # the handler silences the cluster's loggers (its teardown logs dropped tasks as errors), then raises
    logger = logging.getLogger("distributed")
    monkeypatch.setattr(logger, "level", logging.WARNING)
    frame = types.SimpleNamespace(f_code=types.SimpleNamespace(co_name="_execute"))
    interrupts.install()
    import distributed  # noqa: F401 - the handler silences its loggers once it is imported

    try:
        with pytest.raises(KeyboardInterrupt):
            interrupts.handler(signal.SIGINT, frame)
        assert logger.level == logging.CRITICAL
    finally:
        interrupts.install()
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
@pytest.mark.parametrize("command", ["run", "reproduce", "realize"])
def test_a_cache_folder_of_another_user_is_one_line_and_exit_2_writing_nothing(
    config_file, tmp_path, monkeypatch, command
):
    # ATTNFLOW_CACHE_DIR naming a folder the user does not own was a PermissionError from chmod (exit 1)
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 54321, -1)
    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(foreign))
    target, out = tmp_path / "t.npy", tmp_path / "out"
    np.save(target, np.zeros(8))
    args = {
        "run": ["run", str(config_file)],
        "reproduce": ["reproduce", "--only", "E0"],
        "realize": ["realize", "--target", str(target), "--kind", "orbit"],
    }[command]
    result = invoke(*args, "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cache: ") and "uid 54321" in lines[0], lines
    assert not out.exists() and list(foreign.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_the_early_cache_check_words_its_refusals_as_the_full_check(tmp_path):
    # io.cache_folder runs before JAX is imported (1 s, 50 MB instead of 6 s, 190 MB on a loaded VM);
    # numerics.program_cache.check_private_folder is the full rule: same message, same verdict
    from attnflow.io.cache_folder import CacheFolderError, check_cache_folder
    from attnflow.numerics import program_cache

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    foreign, link, file, mine = home / "foreign", home / "link", home / "file", home / "mine"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 54321, -1)
    link.symlink_to(foreign)
    file.write_text("x")
    for refused in (foreign, link, file):
        with pytest.raises(CacheFolderError) as early:
            check_cache_folder(refused)
        with pytest.raises(ValueError) as full:
            program_cache.check_private_folder(refused)
        if refused != file:  # a file: both refuse it (the full check when its mkdir fails)
            assert str(early.value).split(". Set ")[0] == str(full.value).split(". Set ")[0]  # hints differ
    assert check_cache_folder(mine) == mine and not mine.exists()  # made (private) by the full check


def test_a_value_that_spells_an_emoji_code_is_shown_as_given(tmp_path):
    missing = tmp_path / ":fire:b.toml"  # rich would print ':fire:' as an emoji
    result = invoke("run", str(missing))
    assert result.exit_code == 2
    reason = "the configuration must be a readable TOML file; got 'No such file or directory'."
    assert result.stderr == f"error: {missing}: {reason}\n"


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999999"])
def test_a_realize_seed_out_of_range_names_the_range_and_the_value(seed):
    result = invoke("realize", "--seed", seed, "--kind", "orbit", "--target", "x.npy")
    assert result.exit_code == 2
    assert f"'--seed': must be an integer in [0, 9223372036854775807]; got {seed}." in result.stderr


def test_an_error_found_while_building_names_the_file_or_set(tmp_path):
    np.save(tmp_path / "x0.npy", np.ones((5, 3)))  # 5 tokens for a model of 8
    config = tmp_path / "c.toml"
    config.write_text(
        small_toml({"model": {"n": 8}, "init": {"kind": "file", "path": str(tmp_path / "x0.npy")}})
    )
    reason = f"`init.path` must be an array of shape (8, 3); got '{tmp_path / 'x0.npy'} with shape (5, 3)'."
    result = invoke("run", str(config), "--out", str(tmp_path / "a"))
    assert (result.exit_code, result.stderr) == (2, f"error: {config}: {reason}\n")  # was 'config:'
    result = invoke("run", str(config), "--out", str(tmp_path / "b"), "--set", "model.n=8")
    assert (result.exit_code, result.stderr) == (2, f"error: {config}: {reason}\n")  # init.path: the file's
    config.write_text(small_toml({"model": {"n": 8}}))
    given = ["--set", 'init.kind="file"', "--set", f'init.path="{tmp_path / "x0.npy"}"']
    result = invoke("run", str(config), "--out", str(tmp_path / "c"), *given)
    assert (result.exit_code, result.stderr) == (2, f"error: --set: {reason}\n")
    assert not any((tmp_path / name).exists() for name in "abc")
