"""Progress of the long commands: off a terminal (CliRunner, CI, a SLURM log) plain lines with a
stage label, a count and the elapsed time, one per stage and per tenth; on a terminal a rich bar
whose count stays blank, never ``0/None``, until the total is known."""

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnflow.cli import app, console, progress
from configs import small_toml

STAGES = "compiling|simulating|measuring|drawing"
LINE = re.compile(
    rf"^(\w+): ({STAGES})(?: (\d+)/(\d+) (snapshots|frames|points) \((\d+)%\)"
    r"(?:, about \d+(?:\.\d)? (?:s|min|h) left)?)? \[(\d+\.\d) s\]$"
)


def progress_lines(output: str, command: str) -> list[re.Match]:
    """The progress lines of ``command`` in ``output``, each checked against the one format."""
    lines = [line for line in output.splitlines() if line.startswith(f"{command}: ")]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    return matches


def check_lines(matches: list[re.Match]) -> None:
    """Counts and times never go back; the last line is the drawing at 100 %; one line for the first
    call, then at most one per stage change and per tenth."""
    counts = [int(m[3]) for m in matches if m[3]]
    times = [float(m[7]) for m in matches]
    assert counts == sorted(counts) and times == sorted(times)
    assert matches[-1][2] == "drawing" and matches[-1][3] == matches[-1][4]
    assert len(matches) <= 10 + 4


def test_run_off_a_terminal_prints_stage_lines(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(small_toml())
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    matches = progress_lines(result.stdout, "run")
    stages = list(dict.fromkeys(m[2] for m in matches))
    assert stages == ["compiling", "simulating", "drawing"], result.stdout
    assert matches[0][3] == "1"  # the initial state is stored before the solve compiles
    check_lines(matches)
    assert result.stderr == ""  # stderr keeps to errors and warnings


def test_reproduce_off_a_terminal_prints_stage_lines(tmp_path):
    args = ["reproduce", "--quick", "--only", "E0", "--seeds", "1", "--out", str(tmp_path / "report")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    matches = progress_lines(result.stdout, "reproduce")
    stages = [m[2] for m in matches]
    assert stages[0] == "simulating" and stages[-1] == "drawing", result.stdout
    # the jobs (run here, --quick) measure their snapshots once solved: said once, not job after job
    assert stages.count("measuring") == 1 and set(stages) == {"simulating", "measuring", "drawing"}
    check_lines(matches)


def test_a_call_before_any_job_finished_reads_compiling(tmp_path, monkeypatch):
    """A reproduce that reports its total before the first job finishes (as it plans its jobs)."""
    from attnflow.workflows import reproduce as reproduce_module

    def fake(out_dir, *, progress, **options):  # noqa: ARG001
        for done in range(5):
            progress(done, 4)
        raise ValueError("stop here")

    monkeypatch.setattr(reproduce_module, "reproduce", fake)
    result = CliRunner().invoke(app, ["reproduce", "--out", str(tmp_path / "report")])
    assert result.exit_code == 2
    lines = [re.sub(r" \[\d+\.\d s\]$", "", line) for line in result.stdout.splitlines()]
    assert lines == [
        "reproduce: compiling 0/4 snapshots (0%)",
        "reproduce: simulating 1/4 snapshots (25%)",
        "reproduce: simulating 2/4 snapshots (50%)",
        "reproduce: simulating 3/4 snapshots (75%)",
        "reproduce: simulating 4/4 snapshots (100%)",
    ]  # no estimate of the time left before the count has run for a second
    assert result.stderr == "error: stop here\n"


def test_bad_input_stays_one_line(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(small_toml())
    result = CliRunner().invoke(
        app, ["run", str(config), "--out", str(tmp_path / "run"), "--set", "model.n=-3"]
    )
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output


@pytest.mark.parametrize(
    ("stages", "first"), [(progress.snapshot_stages, "compiling"), (progress.job_stages, "simulating")]
)
def test_on_a_terminal_the_bar_never_reads_none(monkeypatch, stages, first):
    screen = io.StringIO()
    monkeypatch.setattr(console, "stderr", Console(file=screen, force_terminal=True, width=100))
    with progress.progress_report("run", "building", "snapshots") as report:
        report.bar.refresh()
        assert "run: building" in screen.getvalue()  # the stage before the total is known
        call = stages(report)
        call(1, 10)
        report.bar.refresh()
        assert f"run: {first}" in screen.getvalue() and "1/10 snapshots (10%)" in screen.getvalue()
        for done in range(2, 11):
            call(done, 10)
            report.bar.refresh()
        report.stage("measuring")
        report.bar.refresh()
        report.stage("drawing")
        report.bar.refresh()
    shown = screen.getvalue()
    assert "None" not in shown and "10/10 snapshots (100%)" in shown
    assert "run: simulating" in shown and "run: drawing" in shown and "run: measuring" in shown


def test_the_time_left_is_the_rate_since_the_stage_began(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    report = progress.ProgressReport("run", "building", None, "snapshots")
    now[0] = 100.0
    report(1, 201, stage="compiling")  # the compilation: not counted in the rate
    now[0] = 101.0
    report(1, 201, stage="simulating")  # the rate's origin
    now[0] = 130.0
    assert report.left is None  # nothing counted since
    report(21, 201)  # 20 snapshots in 29 s: 180 more take 261 s
    assert report.left == "4 min" and report._count() == "21/201 snapshots (10%), about 4 min left"
    now[0] = 400.0
    report(200, 201)  # 199 in 299 s: 1 more, 1.5 s
    assert report.left == "2 s"
    report(201, 201)
    assert report.left is None and report._count() == "201/201 snapshots (100%)"
    assert progress.duration(5400) == "1.5 h" and progress.duration(0.2) == "1 s"
