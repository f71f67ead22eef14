"""The ``attnflow`` command's entry point: Ctrl-C while the command starts ends it with one line
and exit code 130, never a traceback; SIGTERM likewise, with exit code 143.

It lives outside the ``attnflow`` package on purpose: importing any module of the package first
runs ``attnflow/__init__.py``, and a handler installed after that would leave the interpreter's
imports unguarded. Here the handler is in place before the first ``attnflow`` import (the command
line itself imports no JAX: each command imports what it needs when it runs), and it stays in
place while the command's arguments are parsed; the command then installs the one policy of
every command for both signals (:mod:`attnflow.cli.interrupts`: one line saying what was kept
and how to continue, exit code 130 or 143). Once the command is done, both signals are ignored:
the exit code is the command's, not a death by signal during the teardown.
"""

import os
import signal
import sys

EXIT_INTERRUPTED = 130  # as a shell reports SIGINT; the same as attnflow.cli.EXIT_INTERRUPTED
EXIT_TERMINATED = 143  # as a shell reports SIGTERM; the same as attnflow.cli.app.EXIT_TERMINATED
MESSAGE = b"interrupted while starting: nothing was done.\n"
STOPS = {  # each signal's line and exit code while the command starts
    signal.SIGINT: (MESSAGE, EXIT_INTERRUPTED),
    signal.SIGTERM: (b"stopped by SIGTERM while starting: nothing was done.\n", EXIT_TERMINATED),
}


def _stopped_while_starting(signum, frame) -> None:  # noqa: ARG001
    line, code = STOPS[signum]
    os.write(2, line)  # nothing else was written yet: no buffer to flush
    os._exit(code)


def main() -> None:
    """The console script ``attnflow`` (and ``python -m attnflow``)."""
    for signum in STOPS:
        signal.signal(signum, _stopped_while_starting)
    from attnflow.cli import main as cli_main  # after the handlers: the point of this module

    try:
        sys.exit(cli_main())  # the command line's callback hands both signals to the command
    finally:
        # The command is done and its exit code decided. A Ctrl-C or SIGTERM during the
        # interpreter's (and JAX's) teardown would turn that code into a death by signal (Python
        # restores the default action of a signal it handled before it finalises): both are
        # ignored instead.
        for signum in STOPS:
            signal.signal(signum, signal.SIG_IGN)
