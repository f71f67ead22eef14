"""The console entry point (attnflow_entry): Ctrl-C while the command starts (importing attnflow,
JAX and the command line) ends it with one line on stderr and exit code 130, no traceback."""

import os
import signal
import subprocess
import sys
import time

import pytest

CONSOLE_SCRIPT = "import sys; from attnflow_entry import main; sys.exit(main())"  # what pip's wrapper does
LINE = "interrupted while starting: nothing was done."


def entry_started(fd: int) -> str:
    """A prefix for the child's script: once the entry point has installed its SIGINT handler, a
    byte is written to the pipe ``fd``. Before that moment only the interpreter runs (its own
    start-up and the import of the entry module), which no code of attnflow can guard: on a loaded
    machine a fixed 0.1 s after the spawn landed there (a KeyboardInterrupt in `import signal`)."""
    return (
        "import os, signal; install = signal.signal\n"
        "def spy(signum, handler):\n"
        "    previous = install(signum, handler)\n"
        f"    if signum == signal.SIGINT: os.write({fd}, b'.'); os.close({fd}); signal.signal = install\n"
        "    return previous\n"
        "signal.signal = spy\n"
    )


# within the start-up: by 0.6 s a process whose compiled programs are in its cache has already
# stored its first snapshot (then it keeps it: `run`'s own interrupted line, tested elsewhere)
@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.3])
def test_ctrl_c_while_the_command_starts_prints_one_line_and_exits_130(tmp_path, after_s):
    config = tmp_path / "config.toml"
    config.write_text("[model]\nn = 8\nd = 3\n")
    out = tmp_path / "run"
    ready, ready_w = os.pipe()
    script = entry_started(ready_w) + CONSOLE_SCRIPT
    command = [sys.executable, "-c", script, "run", str(config), "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               pass_fds=(ready_w,))  # fmt: skip
    os.close(ready_w)
    with os.fdopen(ready, "rb") as pipe:
        assert pipe.read(1) == b".", "the entry point never installed its SIGINT handler"
    time.sleep(after_s)  # within the start-up: the command line, then JAX and the build, take longer
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and stdout == "", stderr
    if lines[0].startswith("interrupted: kept "):
        # the signal landed where Python only prints it (a finaliser of the start-up): noted, then
        # raised at the first progress call, after the first snapshot (attnflow.cli.interrupts)
        assert lines[0].endswith(" --resume") and (out / "metrics.json").exists()
    else:  # the entry's line, or `run`'s own when the signal came after the command line was imported
        assert lines in ([LINE], ["interrupted before run started: nothing was written."])
        assert not out.exists()


def test_ctrl_c_while_the_command_parses_its_arguments_prints_the_entry_line(tmp_path):
    """A SIGINT while click parses the command's arguments (a path's type adapter is built then,
    importing pydantic): the entry's line, not the silent exit 130 that click makes of a
    KeyboardInterrupt raised there (seen in about one Ctrl-C in a hundred at 0.4-0.7 s)."""
    config = tmp_path / "config.toml"
    config.write_text("[model]\nn = 8\nd = 3\n")
    out = tmp_path / "run"
    interrupted_parse = (
        "import os, signal, sys; from attnflow.cli.app import Command; parse = Command.parse_args; "
        "Command.parse_args = lambda self, *a: (os.kill(os.getpid(), signal.SIGINT), parse(self, *a))[1]; "
    )
    script = interrupted_parse + CONSOLE_SCRIPT
    command = [sys.executable, "-c", script, "run", str(config), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (130, LINE + "\n", "")
    assert not out.exists()


def test_the_entry_runs_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, "--help"], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0 and "Exit codes: 0 done as asked" in done.stdout, done.stderr


def test_ctrl_c_in_a_gc_callback_is_noted_and_raised_at_the_next_progress_call():
    """A SIGINT that lands in JAX's garbage-collector callback would only be printed by Python (the
    run would go on): the handler notes it there and the next progress call raises it; a second
    SIGINT while the command stops is noted, not raised (its record of the first completes)."""
    import types

    from attnflow.cli import interrupts

    interrupts.install()
    try:
        in_gc = types.SimpleNamespace(f_code=types.SimpleNamespace(co_name="_xla_gc_callback"))
        interrupts.handler(signal.SIGINT, in_gc)  # no raise
        calls = []
        progress = interrupts.checked(lambda done, total: calls.append(done))
        with pytest.raises(KeyboardInterrupt):
            progress(1, 4)
        assert calls == []
        progress(2, 4)  # raised once: the command is stopping
        assert calls == [2]
        interrupts.install()
        elsewhere = types.SimpleNamespace(f_code=types.SimpleNamespace(co_name="run"))
        with pytest.raises(KeyboardInterrupt):
            interrupts.handler(signal.SIGINT, elsewhere)
        interrupts.handler(signal.SIGINT, elsewhere)  # the second: noted only
        assert len(interrupts.NOTED) == 2
    finally:
        interrupts.install()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_ctrl_c_inside_an_import_is_noted_and_raised_after_it(tmp_path, monkeypatch):
    """Raised inside an import (the commands import JAX when they run), a KeyboardInterrupt can
    leave a native module half initialised: jaxlib's crashed the process with SIGSEGV in about one
    Ctrl-C in ten at 0.6-1 s into a loaded `attnflow run`. The handler notes it there; the import
    completes and the next progress call raises it."""
    from attnflow.cli import interrupts

    (tmp_path / "being_imported.py").write_text(
        "import signal, sys\n"
        "from attnflow.cli import interrupts\n"
        "interrupts.handler(signal.SIGINT, sys._getframe())  # as if the signal landed here\n"
        "COMPLETE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    interrupts.install()
    try:
        try:
            import being_imported  # noqa: PLC0415
        except KeyboardInterrupt:
            pytest.fail("the SIGINT was raised inside the import")
        assert being_imported.COMPLETE and interrupts.NOTED == [signal.SIGINT] and not interrupts.RAISED
        with pytest.raises(KeyboardInterrupt):
            interrupts.checked(lambda done, total: None)(1, 4)
    finally:
        interrupts.install()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_ctrl_c_after_the_command_is_done_keeps_its_exit_code(tmp_path):
    """A SIGINT during the interpreter's teardown (an exit handler here, JAX's in a real run) once
    the command is done: the command's exit code (2: no such run folder), no traceback, not -2."""
    late_ctrl_c = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        "from attnflow_entry import main\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", late_ctrl_c, "plot", str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
